"""verl's memory answers (VerlBackend.memory_features / micro_tokens / the token-budget preflight), checked against each
release's own code: Hydra compose of its packaged ppo_trainer config with what rlctl renders, its FSDPActorConfig,
its micro-batch builder (workers/engine/utils.py prepare_micro_batches), its train-mode offload context
(workers/engine/base.py BaseEngineCtx + BaseEngine.train_batch) and its activation-offload handler
(utils/activation_offload.py). One subprocess per release (`python -m tests.backends.test_verl_memory ROOT < jobs`),
as tests/conformance/_verl_support.py does; heavy imports are stubbed there.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rlctl.backends import get_backend
from rlctl.backends.verl import memory
from rlctl.recipe.loader import load
from tests.conformance import _verl_support as vs

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "recipes" / "verl-qwen2.5-math-1.5b-1xh100.toml"
A = "actor_rollout_ref"
LAYERS = 28  # Qwen2.5-1.5B's decoder layers: how many groups verl's activation-offload handler sees


def _extra(**kv: Any) -> str:
    """A `--set` replacing backend.verl.extra with these verl keys (`__` stands for `.`)."""
    items = ",".join(f'"{A}.{k.replace("__", ".")}"={json.dumps(v)}' for k, v in kv.items())
    return "backend.verl.extra={" + items + "}"


# name -> (--set overrides, releases)
VARIANTS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "seed": ([], ("0.9.0", "0.9.1")),  # use_dynamic_bsz, 20000 tokens, liger
    "static": ([_extra(actor__use_dynamic_bsz=False)], ("0.9.0", "0.9.1")),
    "static_full": ([_extra(actor__use_dynamic_bsz=False)], ("0.9.0", "0.9.1")),  # every sample at its longest
    "no_checkpointing": (["train.gradient_checkpointing=false", _extra(actor__use_dynamic_bsz=False)],
                         ("0.9.0", "0.9.1")),
    "offload": (["train.offload=true"], ("0.9.0", "0.9.1")),
    # passthrough wins over what rlctl renders (gradient checkpointing), values as Hydra reads them ("true", "12000")
    "passthrough": (["train.gradient_checkpointing=true",
                     _extra(model__enable_gradient_checkpointing=False, model__enable_activation_offload=True,
                            actor__use_dynamic_bsz="true", actor__ppo_max_token_len_per_gpu="12000",
                            actor__ulysses_sequence_parallel_size=2, actor__pad_to_length=True,
                            model__use_fused_kernels=True, actor__fsdp_config__param_offload=True)],
                    ("0.9.0", "0.9.1")),
    "sp_static": ([_extra(actor__use_dynamic_bsz=False, actor__fsdp_config__ulysses_sequence_parallel_size=2,
                          model__enable_activation_offload=True)], ("0.9.0", "0.9.1")),
    "fsdp2_policy": ([_extra(actor__strategy="fsdp2", actor__fsdp_config__offload_policy=True)], ("0.9.0", "0.9.1")),
    "policy_fsdp1": ([_extra(actor__fsdp_config__offload_policy=True)], ("0.9.1",)),
    "log_prob_budget": ([_extra(actor__use_dynamic_bsz=True, rollout__log_prob_max_token_len_per_gpu=30000)],
                        ("0.9.0", "0.9.1")),
    "no_sync": ([_extra(actor__fsdp_config__use_no_sync_for_gradient_accumulation=True,
                        actor__use_dynamic_bsz=False)], ("0.9.1",)),
    "entropy": (["algorithm.entropy_coef=0.001"], ("0.9.0", "0.9.1")),
    "lots": ([_extra(actor__use_dynamic_bsz=True, actor__ppo_max_token_len_per_gpu="lots")], ("0.9.0", "0.9.1")),
    "negative": ([_extra(actor__use_dynamic_bsz=True, actor__ppo_max_token_len_per_gpu=-5)], ("0.9.1",)),
    "fraction": ([_extra(actor__use_dynamic_bsz=True, actor__ppo_max_token_len_per_gpu=1.5)], ("0.9.1",)),
    "too_small": ([_extra(actor__use_dynamic_bsz=True, actor__ppo_max_token_len_per_gpu=1000)], ("0.9.1",)),
}


# ---------------------------------------------------------------------------------------------------------------
# the worker side: a fresh interpreter per release, with verl's heavy imports stubbed


def _micro_batches(cfg: Any, engine: Any, lengths: list[int]) -> dict[str, Any]:
    """verl's own prepare_micro_batches on a mini-batch of these sample lengths, with the update's settings as
    engine_workers.py init_model / TrainingWorker.train_batch / FSDPEngine.forward_backward_batch assign them."""
    import torch
    from verl.utils import seqlen_balancing
    from verl.workers.engine import utils as engine_utils

    class Batch(dict):  # the TensorDict fields prepare_micro_batches and rearrange_micro_batches read
        def __len__(self):
            return len(self["lens"])

    tu = engine_utils.tu
    tu.get_non_tensor_data = lambda data, key, default=None: data.get(key, default)
    tu.chunk_tensordict = lambda data, n: [Batch(lens=c) for c in torch.chunk(data["lens"], n)]
    seqlen_balancing.tu.index_select_tensor_dict = lambda batch, idx: Batch(lens=batch["lens"][idx])
    lens = torch.tensor(lengths)
    width = max(lengths)
    mask = (torch.arange(width)[None, :] < lens[:, None]).long()
    actor = cfg.actor_rollout_ref.actor
    data = Batch(input_ids=torch.zeros(len(lengths), width), attention_mask=mask, lens=lens,
                 use_dynamic_bsz=actor.use_dynamic_bsz, max_token_len_per_gpu=actor.ppo_max_token_len_per_gpu,
                 micro_batch_size_per_gpu=actor.ppo_micro_batch_size_per_gpu,
                 sp_size=engine.ulysses_sequence_parallel_size)
    try:
        batches, _ = engine_utils.prepare_micro_batches(data=data, dp_group=None, same_micro_num_in_dp=True)
    except Exception as e:  # verl's own refusal (a budget below the longest sample, a budget that is no number)
        return {"error": f"{type(e).__name__}: {e}"}
    sp = engine.ulysses_sequence_parallel_size
    return {"max_tokens_per_gpu": max(math.ceil(int(b["lens"].sum()) / sp) for b in batches),
            "count": len(batches)}


def _offload_events(engine: Any) -> list[Any]:
    """What verl's train-mode context does around one update of two mini-batches: TrainingWorker.train_mini_batch
    holds train_mode over all of them, train_batch enters it again per mini-batch with disable_auto_offload=True, and
    BaseEngine.train_batch runs zero_grad, forward/backward, optimizer step."""
    from verl.workers.engine import base

    base.get_device_name = lambda: "cuda"  # the GPU machine's answer (this one has none)
    base.maybe_fix_3d_position_ids = lambda data: None
    events: list[Any] = []

    class Engine:
        is_param_offload_enabled = bool(engine.param_offload)
        is_optimizer_offload_enabled = bool(engine.optimizer_offload)
        mode = None

        def to(self, device, model=True, optimizer=True, grad=True):
            events.append(["to", device, model, optimizer, grad])

        def optimizer_zero_grad(self):
            events.append("zero_grad")

        def forward_backward_batch(self, data, loss_function, forward_only=False):
            events.append("forward_backward")
            return {"metrics": {}}

        def optimizer_step(self):
            events.append("optimizer_step")
            return 1.0

        def is_mp_src_rank_with_outputs(self):
            return True

    e = Engine()
    with base.BaseEngineCtx(e, mode="train", disable_auto_offload=False):
        for _ in range(2):
            with base.BaseEngineCtx(e, mode="train", disable_auto_offload=True):
                base.BaseEngine.train_batch(e, {}, loss_function=None)
    return events


def _resident_offload_groups(layers: int) -> int:
    """The most layer groups whose saved activations verl's activation-offload handler keeps on the GPU during the
    forward (enable_activation_offloading: len(layers) - 1 offload groups over len(layers) layers)."""
    import contextlib

    import torch
    from verl.utils import activation_offload as ao

    class Stream:
        def wait_stream(self, other):
            pass

    ao.get_torch_device = lambda: types.SimpleNamespace(Stream=Stream, current_stream=Stream,
                                                        stream=lambda s: contextlib.nullcontext())
    ao.SynchronizedGroupOffloadHandler.offload = staticmethod(lambda t, pin_memory=True: (t.device, t.clone()))
    handler = ao.AsyncDoubleBufferGroupOffloadHandler(num_offload_group=layers - 1, num_model_group=layers)
    most = 0
    for _ in range(layers):
        handler.tensor_push(torch.zeros(4))  # one saved activation of this layer
        resident = {tag[0] for tag, t in handler.tensor_tag_to_buf.items() if t is not None}
        resident |= {tag[0] for tag, t in handler.tensor_tag_to_state.items() if isinstance(t, torch.Tensor)}
        most = max(most, len(resident))
        handler.on_group_commit_forward()
    return most


def _job(job: dict[str, Any], compose: Any) -> dict[str, Any]:
    from verl.utils.config import omega_conf_to_dataclass

    out: dict[str, Any] = {"id": job["id"]}
    cfg = compose(config_name="ppo_trainer", overrides=job["overrides"])
    out["values"] = {k: vs._select(cfg, k) for k in job["select"]}
    try:  # the actor's config as engine_workers.py init_model builds it (FSDPActorConfig.__post_init__)
        engine = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).engine
    except Exception as e:
        out["actor_config_error"] = f"{type(e).__name__}: {e}"
        return out
    out["engine"] = {k: getattr(engine, k) for k in ("strategy", "ulysses_sequence_parallel_size", "param_offload",
                                                     "optimizer_offload", "offload_policy")}
    out["micro_batches"] = _micro_batches(cfg, engine, job["lengths"])
    out["offload_events"] = _offload_events(engine)
    out["resident_offload_groups"] = _resident_offload_groups(LAYERS)
    return out


def worker(root: Path) -> None:
    import contextlib

    jobs = json.load(sys.stdin)
    vs._install(root)
    from hydra import compose, initialize_config_dir

    with contextlib.redirect_stdout(sys.stderr), initialize_config_dir(
            config_dir=str(root / "verl/trainer/config"), version_base=None):
        results = [_job(job, compose) for job in jobs]
    print("@@RESULTS " + json.dumps(results, default=str))


# ---------------------------------------------------------------------------------------------------------------
# the tests (pytest side)

VERL = get_backend("verl")


def recipe(version: str, name: str):
    return load(SEED, [f"backend.version={version}", *VARIANTS[name][0]]).recipe


def lengths_for(r: Any, name: str) -> list[int]:
    """A mini-batch on one GPU: train_batch_size samples of random lengths up to prompt + response, one of each
    extreme (static_full: all at prompt + response)."""
    rng = random.Random(7)
    longest = memory.longest_sample(r)
    if name == "static_full":
        return [longest] * r.train.train_batch_size
    return [longest, 1] + [rng.randint(1, longest) for _ in range(r.train.train_batch_size - 2)]


@pytest.fixture(scope="module")
def verl_results():
    """{version: {variant: result}}: one verl subprocess per release, run side by side."""
    pytest.importorskip("hydra")
    pytest.importorskip("omegaconf")
    pytest.importorskip("torch")

    def run(version: str) -> dict[str, Any]:
        try:
            root = vs.verl_root(version)
        except RuntimeError as e:
            pytest.skip(str(e))
        jobs = []
        for name, (_, versions) in VARIANTS.items():
            if version not in versions:
                continue
            r = recipe(version, name)
            jobs.append({"id": name, "overrides": VERL.render(r).argv[3:], "select": list(memory.DEFAULTS[version]),
                         "lengths": lengths_for(r, name)})
        p = subprocess.run([sys.executable, "-m", "tests.backends.test_verl_memory", str(root)],
                           input=json.dumps(jobs), capture_output=True, text=True, cwd=ROOT, timeout=600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("@@RESULTS ")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"verl {version} worker failed (rc {p.returncode}):\n{p.stderr[-4000:]}")
        return {res["id"]: res for res in json.loads(lines[-1][len("@@RESULTS "):])}

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(VERL.known_versions, pool.map(run, VERL.known_versions), strict=True))


CASES = [(v, name) for name, (_, versions) in VARIANTS.items() for v in versions]


@pytest.mark.parametrize("version,name", CASES)
def test_settings_are_what_verl_composes(verl_results, version, name):
    """Every key the adapter reads, as rlctl resolves it (verl's default, rlctl's render, the passthrough rendered
    last, the value as Hydra parses it, `${oc.select:...}` defaults), equals what verl's Hydra compose gives."""
    composed = verl_results[version][name]["values"]
    s, _ = VERL.memory_settings(recipe(version, name))
    assert set(composed) == set(s)
    for key, value in composed.items():
        assert (s[key], type(s[key])) == (value, type(value)), key


@pytest.mark.parametrize("version,name", CASES)
def test_features_follow_verls_code(verl_results, version, name):
    res = verl_results[version][name]
    v = res["values"]
    r = recipe(version, name)
    f = VERL.memory_features(r)
    # activation checkpointing: FSDPEngine._build_module calls gradient_checkpointing_enable (every layer)
    assert f.checkpoint_every == (1 if v[f"{A}.model.enable_gradient_checkpointing"] else None)
    if name == "passthrough":
        assert r.train.gradient_checkpointing and f.checkpoint_every is None  # the passthrough won
    if "actor_config_error" in res:  # verl's FSDPActorConfig refuses the config itself (not a number)
        assert f.token_budget is None
        return
    engine = res["engine"]
    # activation offload: how many layer groups verl's handler keeps on the GPU
    assert f.activation_offload == (res["resident_offload_groups"] if v[f"{A}.model.enable_activation_offload"]
                                    else None)
    assert res["resident_offload_groups"] == 2
    # optimizer: on the GPU through forward and backward whenever verl moves it at all (train_mode's context)
    events = res["offload_events"]
    moves = [(i, e) for i, e in enumerate(events) if isinstance(e, list) and any(e[2:])]  # what really moves
    first_fb, last_step = events.index("forward_backward"), len(events) - 1 - events[::-1].index("optimizer_step")
    if engine["optimizer_offload"] or engine["param_offload"]:
        flags = [engine["param_offload"], engine["optimizer_offload"], engine["param_offload"]]
        assert [e for _, e in moves] == [["to", "cuda", *flags], ["to", "cpu", *flags]]
        assert moves[0][0] < first_fb and moves[1][0] > last_step  # on the GPU for every forward and backward
        assert any("back on the GPU for the whole update" in n for n in f.notes)
    else:
        assert moves == []
    policy = engine["strategy"] == "fsdp2" and engine["offload_policy"]
    assert f.optimizer == ("cpu" if policy else "gpu")
    # micro batches: verl's own builder on a mini-batch of random lengths up to prompt + response
    mb = res["micro_batches"]
    if v[f"{A}.actor.use_dynamic_bsz"]:
        if "error" in mb:  # verl refuses the budget: so does preflight, and the plan does not use it
            assert f.token_budget is None or f.token_budget[1] * engine["ulysses_sequence_parallel_size"] < \
                memory.longest_sample(r)
            assert VERL.token_budget_rules(r)
            return
        key, budget = f.token_budget
        assert key == 'backend.verl.extra."actor_rollout_ref.actor.ppo_max_token_len_per_gpu"'
        assert budget == v[f"{A}.actor.ppo_max_token_len_per_gpu"]
        longest = memory.longest_sample(r)
        if version == "0.9.1":  # a hard cap, and it binds
            assert budget - longest < mb["max_tokens_per_gpu"] <= budget
        else:  # 0.9.0 balances ceil(tokens / budget) micro batches without capping: within a sample of it
            assert budget - longest < mb["max_tokens_per_gpu"] < budget + longest
            assert any("0.9.0" in n and "exceed" in n for n in f.notes)
    else:
        assert f.token_budget is None
        # every sample at its longest: verl's micro batch is exactly what micro_tokens says per GPU
        micro = v[f"{A}.actor.ppo_micro_batch_size_per_gpu"]
        assert micro == r.train.micro_batch_size
        assert mb["max_tokens_per_gpu"] <= VERL.micro_tokens(r, micro)
        assert VERL.micro_tokens(r, micro) == math.ceil(micro * memory.longest_sample(r)
                                                        / engine["ulysses_sequence_parallel_size"])
    # the log-prob head: materialised unless verl's fused kernels are on
    assert (f.logits_chunk is None) == (not v[f"{A}.model.use_fused_kernels"])
    if f.logits_chunk is not None:
        assert f.logits_chunk == memory.FUSED_CHUNK_TOKENS * 151936  # Qwen2.5-Math-1.5B's vocabulary


def test_static_micro_tokens_equal_verls_full_micro_batch(verl_results):
    """All samples at prompt + response: verl's micro batch is exactly micro_tokens (the plan's bound is reached)."""
    for version in VERL.known_versions:
        r = recipe(version, "static_full")
        res = verl_results[version]["static_full"]
        assert res["micro_batches"]["max_tokens_per_gpu"] == VERL.micro_tokens(r, r.train.micro_batch_size) == \
            r.train.micro_batch_size * (r.data.max_prompt_tokens + r.rollout.max_tokens)


def test_hydra_value_reads_overrides_as_hydra_does():
    pytest.importorskip("hydra")
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for text in ["20000", "-5", "+3", "-0", "2_000", "007", "0", "1.5", "1e4", "1E+3", "1.", ".5", "1_0.5", "inf",
                 "true", "False", "TRUE", "null", "NULL", "lots", "'12'", '"12"', "12abc", "1e", "0x10", " 12 "]:
        want = parser.parse_override(f"k={text}").value()
        got = memory.hydra_value(text)
        assert (got, type(got)) == (want, type(want)) or (got != got and want != want), text


def test_notes_say_what_the_plan_does_not_count():
    r91 = recipe("0.9.1", "seed")
    notes = VERL.memory_features(r91).notes
    assert any("reference policy" in n for n in notes)
    assert not any("defers FSDP's gradient" in n for n in notes)  # 0.9.1's fsdp.yaml: no_sync off
    assert any("defers FSDP's gradient" in n for n in VERL.memory_features(recipe("0.9.0", "seed")).notes)
    assert any("defers FSDP's gradient" in n for n in VERL.memory_features(recipe("0.9.1", "no_sync")).notes)
    # ... and counts them: 2 bytes per trainable parameter, whatever the number of GPUs
    assert VERL.memory_features(recipe("0.9.0", "seed")).unsharded_grad_bytes == 2.0
    assert VERL.memory_features(r91).unsharded_grad_bytes == 0.0
    assert any("about 6 bytes" in n for n in VERL.memory_features(recipe("0.9.1", "entropy")).notes)
    # the temperature-scaled copy of the logits: 0.9.1 skips it at temperature 1, 0.9.0 never does
    assert not any("temperature 1" in n for n in notes)  # the seed samples at 0.6
    at_one = {v: load(SEED, [f"backend.version={v}", "rollout.temperature=1.0"]).recipe for v in VERL.known_versions}
    assert any("no temperature-scaled copy" in n for n in VERL.memory_features(at_one["0.9.1"]).notes)
    assert not any("no temperature-scaled copy" in n for n in VERL.memory_features(at_one["0.9.0"]).notes)
    assert any("30000 tokens" in n for n in VERL.memory_features(recipe("0.9.1", "log_prob_budget")).notes)
    assert any("16 samples" in n for n in VERL.memory_features(recipe("0.9.1", "static")).notes)
    assert any("only applies with strategy fsdp2" in n
               for n in VERL.memory_features(recipe("0.9.1", "policy_fsdp1")).notes)


@pytest.mark.parametrize("name", ["lots", "negative", "fraction", "too_small"])
def test_hostile_budget_is_a_preflight_failure_not_a_traceback(cli, name):
    sets = [x for s in VARIANTS[name][0] for x in ("--set", s)]
    res = cli("preflight", str(SEED), *sets, "--json")
    assert "Traceback" not in res.err and "internal error" not in res.out, res.err
    results = json.loads(res.out)["results"]
    budget = [x for x in results if x["check"] == "placement.token_budget"]
    assert res.code == 1 and [x["verdict"] for x in budget] == ["fail"]
    assert "ppo_max_token_len_per_gpu" in budget[0]["figure"] and "backend.verl.extra" in budget[0]["fix"]
    memory_checks = [x for x in results if x["check"].startswith("memory.")]
    assert all("internal error" not in x["figure"] for x in memory_checks)


def test_mismatched_log_prob_dynamic_is_caught():
    r = load(SEED, [_extra(actor__use_dynamic_bsz=True, rollout__log_prob_use_dynamic_bsz=False)]).recipe
    assert ["asserts they are equal" in x.figure for x in VERL.token_budget_rules(r)] == [True]
    assert VERL.token_budget_rules(load(SEED, []).recipe) == []


def test_unknown_release_falls_back_to_the_neutral_answer():
    r = load(SEED, []).recipe
    r.backend.version = "0.8.0"
    f = VERL.memory_features(r)
    assert f.token_budget is None and f.checkpoint_every == 1
    assert VERL.micro_tokens(r, 2) == 2 * r.train_seq_len and VERL.token_budget_rules(r) == []


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
