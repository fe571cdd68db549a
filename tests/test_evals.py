"""Held-out evals (issue 24, docs/eval.md): eval sets and their modes, pass@k, graders, doctor's baseline rules,
the best-checkpoint mark in pruning; the end-to-end runs on the CPU quickstart are in test_evals_e2e.py."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import pytest

from rlctl.evals.scoring import extract_answer, math_equal, pass_at_k
from rlctl.evals.sets import eval_sets, mode_label, primary_set, split_in_loop
from rlctl.recipe.loader import load
from rlctl.runs.doctor import diagnose_records
from tests.conftest import RECIPES

QUICK = RECIPES / "quickstart.toml"
PROMPTS = RECIPES / "quickstart" / "prompts.jsonl"


def direct_pass_at_k(samples: list[bool], k: int) -> float:
    """The fraction of k-subsets of the samples with at least one correct: pass@k by enumeration."""
    subsets = list(itertools.combinations(samples, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(direct_pass_at_k(samples, k), abs=1e-12), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)  # k > n is an error, never a silent clamp


def test_math_grader():
    assert extract_answer(r"so \boxed{\frac{1}{2}} is it") == r"\frac{1}{2}"
    assert extract_answer("the answer is 1,000.") == "1,000"
    assert math_equal("1,000", 1000) and math_equal(r"\dfrac{1}{2}", r"\frac{1}{2}") and math_equal("042", "42")
    assert not math_equal(None, "3") and not math_equal("4", "3")


def recipe_with_sets(write, extra: str = "") -> Path:
    return write("r.toml", f'''extends = "{QUICK}"
[eval]
primary = "ood"
[eval.sets.ood]
data = "{PROMPTS}"
[eval.sets.aime]
data = "{PROMPTS}"
temperature = 0.6
n = 8
[eval.sets.probe]
data = "{PROMPTS}"
n = 8
k = 8
{extra}''')


def test_sets_modes_and_metric_names(write):
    r = load(recipe_with_sets(write)).recipe
    sets = {s.name: s for s in eval_sets(r)}
    assert sets["ood"].key == "eval/ood/greedy_pass@1"
    assert sets["aime"].key == "eval/aime/sampling_pass@8"
    assert sets["probe"].key == "eval/probe/nondet_proxy_pass@8"  # temperature 0 with n > 1: seed 001's third mode
    assert primary_set(r).name == "ood"
    assert mode_label(0.0, 1, 1) == "greedy_pass@1"


def test_single_set_form_is_the_set_default(write):
    p = write("r.toml", f'extends = "{QUICK}"\n[data]\neval = "{PROMPTS}"\n[eval]\nevery = 5\ntemperature = 0.6\n'
                        'n_samples = 4\n')
    (s,) = eval_sets(load(p).recipe)
    assert (s.name, s.mode, s.every, s.legacy) == ("default", "sampling_pass@4", 5, True)


def test_backends_say_what_they_cannot_run_in_loop(write, cli):
    from rlctl.backends import get_backend

    p = write("r.toml", f'''extends = "{QUICK}"
[backend]
name = "openrlhf"
version = "0.9.3"
[data]
eval = "{PROMPTS}"
[eval]
every = 5
[eval.sets.aime]
data = "{PROMPTS}"
temperature = 0.6
n = 8
''')
    r = load(p).recipe
    inside, outside = split_in_loop(r, get_backend("openrlhf"))
    assert [s.name for s in inside] == ["default"]  # data.eval is rendered into --eval_dataset as before
    assert [s.name for s, _ in outside] == ["aime"]
    res = cli("render", str(p))
    assert "eval set 'aime' (sampling_pass@8) cannot run in-loop on openrlhf 0.9.3" in res.err
    assert "evaluated by rlctl on each checkpoint instead (eval/aime/sampling_pass@8)" in res.err
    # TRL's own eval samples like training: every set goes to rlctl
    res = cli("render", str(recipe_with_sets(write)))
    assert res.code == 0 and res.err.count("cannot run in-loop on trl") == 3


def test_bad_eval_keys_are_clear_errors(write, cli):
    res = cli("render", str(recipe_with_sets(write, "tempurature = 1\n")))
    assert res.code == 2 and "eval.sets.probe.tempurature" in res.err
    res = cli("render", str(recipe_with_sets(write, '[run]\nstop_when = ["eval_divergense:2"]\n')))
    assert res.code == 2 and "unknown doctor rule" in res.err and "eval_divergence" in res.err
    res = cli("render", str(recipe_with_sets(write)), "--set", 'eval.primary="nope"')
    assert res.code == 2 and "eval.primary 'nope' is not a set" in res.err


def records(evals: dict[int, float], key: str = "eval/ood/greedy_pass@1") -> list[dict]:
    recs = [{"step": s, "reward/mean": 0.1 + 0.01 * s} for s in range(1, 41)]
    return recs + [{"step": s, key: v} for s, v in evals.items()]


def test_doctor_compares_evals_with_the_baseline():
    t = {"primary": "eval/ood/greedy_pass@1"}
    found = {f.rule: f for f in diagnose_records(records({0: 0.40, 10: 0.50, 20: 0.45, 30: 0.35}), t)}
    assert "below the pre-training baseline (0.4 at step 0)" in found["eval_divergence"].message
    assert found["eval_divergence"].evidence["best_step"] == 10  # the baseline is not a checkpoint of the run
    assert "eval_below_baseline" not in found  # one eval below it, not two
    found = {f.rule: f for f in diagnose_records(records({0: 0.40, 10: 0.30, 20: 0.35, 30: 0.38}), t)}
    assert "eval_below_baseline" in found and "eval_divergence" not in found
    # the primary eval is judged, not whichever eval key comes first
    recs = records({0: 0.4, 10: 0.5, 20: 0.45, 30: 0.35}) + [{"step": s, "eval/aaa/pass@1": 0.1 * s}
                                                            for s in (10, 20, 30)]
    assert "eval_divergence" in {f.rule for f in diagnose_records(recs, t)}


def test_prune_keeps_the_checkpoint_marked_best(tmp_path):
    from rlctl.core.state import write_state
    from rlctl.runs.checkpoints import prune

    run = tmp_path / "run-20261125-000000"
    for step in (2, 4, 6, 8):
        d = run / "checkpoints" / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text("{}")
    write_state(run, backend="trl", best_checkpoint={"step": 4, "key": "eval/ood/greedy_pass@1", "value": 0.5})
    (run / "metrics.jsonl").write_text(json.dumps({"step": 6, "eval/x/pass@1": 0.9}) + "\n")
    doomed = [c.step for c in prune("trl", run, 1, keep_best=True, dry_run=True)]
    assert doomed == [2, 6]  # the mark wins over the largest eval number in the stream
    assert [c.step for c in prune("trl", run, 1, keep_best=False, dry_run=True)] == [2, 4, 6]


def test_one_best_checkpoint_rule_for_prune_rotation_resume_and_by_hand_evals(tmp_path):
    """Issue 30 2.3: prune, in-run rotation and resume read one rule (runs.checkpoints.best_checkpoint); a run with
    evals but no mark yet (evaluated by hand) is ranked the same way, and an eval at a step with no checkpoint
    (step 5) cannot make a checkpoint the best."""
    from rlctl.backends import get_backend
    from rlctl.core.state import read_state, write_state
    from rlctl.evals.loop import record_by_hand
    from rlctl.runs.checkpoints import best_checkpoint, prune, prune_during_run
    from rlctl.runs.launch import _parent_checkpoint

    run = tmp_path / "run-20261125-000000"
    for step in (2, 4, 6, 8):
        d = run / "checkpoints" / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text("{}")
    (run / "recipe.toml").write_text(f'[eval.sets.probe]\ndata = "{PROMPTS}"\n')
    key = "eval/probe/greedy_pass@1"
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, key: v}) + "\n" for s, v in
                                               ((0, 0.1), (2, 0.3), (4, 0.8), (5, 0.95), (6, 0.5), (8, 0.4))))
    write_state(run, backend="trl", status="stopped", stopped_by={"rule": "eval_divergence"})
    assert best_checkpoint(run)["step"] == 4
    assert [c.step for c in prune("trl", run, 1, dry_run=True)] == [2, 6]  # kept by default
    assert _parent_checkpoint(get_backend("trl"), run).step == 4  # resume after stop_when: the best
    prune_during_run(run, {"backend": "trl", "prune_during_run": True}, 1)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-4", "checkpoint-8"]
    record_by_hand(run, 8, {key: 0.99}, None, ["probe"])  # a by-hand eval marks the best as the supervisor does
    assert read_state(run)["best_checkpoint"]["step"] == 8 and best_checkpoint(run)["step"] == 8


def test_eval_on_a_host_needs_ssh_hosts(cli, write):
    from rlctl import executors

    if "ssh" in executors.available():
        pytest.skip("an ssh executor is registered here")
    res = cli("eval", "some-run", "--on", "spare-box")
    assert res.code == 2 and "hosts not available" in res.err


SCRIPT = '''import json, sys
step, name, model, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
if name == "bad":
    sys.exit(3)
json.dump({"primary": 0.1 * step, "n_prompts": 64, "eval/custom/key": 1}, open(out, "w"))
'''


def command_recipe(write, tmp_path: Path) -> Path:
    script = write("eval_posthoc.py", SCRIPT)
    return write("cmd.toml", f'''extends = "{QUICK}"
[eval]
evaluator = "command"
command = "{sys.executable} {script} {{step}} {{set}} {{checkpoint}} {{output}}"
[eval.sets.probe]
data = "{PROMPTS}"
temperature = 0.6
n = 4
[eval.sets.bad]
data = "{PROMPTS}"
''')


def test_rlctl_eval_by_hand_with_a_command(write, tmp_path, cli, monkeypatch):
    from rlctl.core.state import write_state
    from rlctl.recipe.loader import dump_toml

    recipe = command_recipe(write, tmp_path)
    # a base model: the baseline on the recipe's sets, nothing needed but the recipe
    monkeypatch.chdir(tmp_path)
    res = cli("eval", "my-base-model", "--recipe", str(recipe), "--set", "probe", "--json")
    assert res.code == 0, res.err
    (row,) = json.loads(res.out)["results"]
    assert row["metrics"] == {"eval/probe/sampling_pass@4": 0.0, "eval/probe/sampling_pass@4/n_prompts": 64.0,
                              "eval/custom/key": 1.0}
    # a finished run: --all = the baseline and every complete checkpoint, into its stream at their steps
    runs = tmp_path / "runs"
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(runs))
    run = runs / "r-20261125-000000"
    for step in (2, 4):
        (run / "checkpoints" / f"checkpoint-{step}").mkdir(parents=True)
        (run / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "checkpoint-6").mkdir()  # being written: not evaluated
    (run / "recipe.toml").write_text(dump_toml(load(recipe).recipe.model_dump(mode="json", exclude_none=True)))
    write_state(run, backend="trl", status="finished")
    res = cli("eval", run.name, "--all")
    assert res.code == 1 and "failed: set bad" in res.out  # the failing set is reported, exit 1
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"]: r["eval/probe/sampling_pass@4"] for r in recs} == {0: 0.0, 2: 0.2, 4: 0.4}
    assert (run / "evals" / "step-4.json").is_file()
    res = cli("eval", run.name, "--step", "6")
    assert res.code == 2 and "no complete checkpoint at step 6" in res.err
    res = cli("eval", run.name, "--set", "nope")
    assert res.code == 2 and "no such eval set" in res.err


def test_stop_when_knows_every_doctor_rule():
    from rlctl.recipe import schema
    from rlctl.runs.doctor import RULES

    assert set(schema.RULES) == set(RULES)


def test_by_hand_evals_survive_the_supervisors_ledger_writes(tmp_path):
    from rlctl.evals.ledger import read_ledger, write_ledger
    from rlctl.evals.loop import record_by_hand

    run = tmp_path / "run"
    run.mkdir()
    supervisor_copy = {"done": {"0": {"outcome": "ok"}}}
    write_ledger(run, supervisor_copy)
    record_by_hand(run, 2, {"eval/x/greedy_pass@1": 0.5}, None, ["x"], host="spare")
    supervisor_copy["done"]["2"] = {"outcome": "ok"}
    write_ledger(run, supervisor_copy)  # a running supervisor rewrites its own copy
    led = read_ledger(run)
    assert set(led["done"]) == {"0", "2"} and led["by_hand"][0]["host"] == "spare"
    rec = json.loads((run / "metrics.jsonl").read_text())
    assert rec["step"] == 2 and rec["eval/x/greedy_pass@1"] == 0.5


def test_status_shows_a_by_hand_eval_failure_until_a_later_success(tmp_path, cli, monkeypatch):
    from rlctl.core.state import write_state
    from rlctl.evals.loop import record_by_hand
    from rlctl.runs.status import by_hand_failures

    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "runs"))
    run = tmp_path / "runs" / "r-20261125-000000"
    run.mkdir(parents=True)
    write_state(run, backend="trl", status="finished")
    record_by_hand(run, 2, {}, "set gsm8k: CUDA out of memory", ["gsm8k"], host="spare")
    record_by_hand(run, 4, {}, "timed out after 60 s (eval.timeout_s)", ["gsm8k"])
    (f2, f4) = by_hand_failures(run)
    assert (f2["step"], f2["host"], f4["step"]) == (2, "spare", 4) and "out of memory" in f2["error"]
    assert f4["log"].endswith("evals/step-4.log")
    res = cli("status", run.name)
    assert "eval by hand on spare failed at step 2: set gsm8k: CUDA out of memory" in res.out, res.out
    record_by_hand(run, 2, {"eval/gsm8k/greedy_pass@1": 0.5}, None, ["gsm8k"], host="spare")  # the retry worked
    assert [f["step"] for f in by_hand_failures(run)] == [4]


def test_vllm_max_lora_rank_is_one_vllm_accepts():
    """vLLM's LoRAConfig refuses a max_lora_rank outside its fixed list (a rank-12 adapter with max_lora_rank=12 is a
    ValueError): rlctl's evaluator rounds an adapter's rank up to the next accepted value."""
    from rlctl.evals.generate import VLLM_LORA_RANKS, vllm_max_lora_rank

    assert [vllm_max_lora_rank(r) for r in (1, 8, 12, 16, 24, 64, 100, 300, 512)] == [8, 8, 16, 16, 32, 64, 128, 320,
                                                                                      512]
    assert all(vllm_max_lora_rank(r) in VLLM_LORA_RANKS and vllm_max_lora_rank(r) >= r for r in range(1, 513))


def test_vllm_greedy_pass_at_k_sends_each_prompt_k_times(monkeypatch):
    """vLLM's SamplingParams refuses n > 1 at temperature 0 (its _verify_greedy_sampling, every release): a greedy
    pass@k set (nondet_proxy_pass@k) goes as k requests of n = 1 per prompt, regrouped in order. No vLLM here: its
    SamplingParams' rule and the shape of its outputs stand in, nothing else."""
    import sys
    import types

    from rlctl.evals.generate import generate_vllm

    class SamplingParams:
        def __init__(self, n, temperature, top_p, max_tokens, seed):
            if temperature < 1e-5 and n > 1:
                raise ValueError(f"n must be 1 when using greedy sampling, got {n}.")
            self.n = n

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams))

    class LLM:
        def generate(self, prompts, params, lora_request=None):
            out = types.SimpleNamespace
            return [out(outputs=[out(text=f"{p}#{j}", token_ids=[0] * len(p)) for j in range(params.n)])
                    for p in prompts]

    texts, lens = generate_vllm(LLM(), None, ["ab", "c"], 3, 0.0, 8, 0)
    assert texts == [["ab#0"] * 3, ["c#0"] * 3] and lens == [[2, 2, 2], [1, 1, 1]]
    texts, _ = generate_vllm(LLM(), None, ["ab", "c"], 2, 0.6, 8, 0)
    assert texts == [["ab#0", "ab#1"], ["c#0", "c#1"]]


def test_transformers_greedy_pass_at_k_sends_each_prompt_k_times(tmp_path):
    """transformers' generate refuses num_return_sequences > 1 without sampling ("Greedy methods ... do not support
    num_return_sequences different than 1"): seed 001's third mode (temperature 0, n = 4, nondet_proxy_pass@4) on
    a CPU failed every eval job. Each prompt goes k times, as on vLLM; regrouped in order."""
    pytest.importorskip("transformers")
    from rlctl.evals.generate import Generator
    from rlctl.recipe.tiny_model import resolve_model

    base = resolve_model("random:qwen2?hidden=64&layers=2", tmp_path / "models")
    gen = Generator(base, None)
    prompts = ["a sing sky tell:", "cats sea:", "of the:"]
    one, one_lens = gen.generate(prompts, 1, 0.0, 8)
    texts, lens = gen.generate(prompts, 3, 0.0, 8)
    assert [len(t) for t in texts] == [3, 3, 3] and [len(x) for x in lens] == [3, 3, 3]
    assert [t[0] for t in texts] == [t[0] for t in one]  # greedy: each copy is the prompt's greedy completion
    assert [x[0] for x in lens] == [x[0] for x in one_lens]


def test_adopt_job_takes_only_the_same_job(tmp_path):
    """A job picked up after a cut connection must be the very job asked for: same spec, its result written."""
    from rlctl.evals.loop import adopt_job, job_files, pid_file, write_job

    ev = {"evaluator": "command", "command": "x {output}", "timeout_s": 5}
    sets = [{"name": "s", "data": "d.jsonl"}]
    out = tmp_path / "evals"
    write_job(out, ev, 4, "/m/checkpoint-4", sets, None)
    pid_file(out, 4).write_text(json.dumps({"pid": 2 ** 22 + 7, "job": "x"}))  # no such process
    assert adopt_job(ev, 4, "/m/checkpoint-4", sets, out, None) is None  # it died before writing results
    job_files(out, 4)[1].write_text(json.dumps({"metrics": {"eval/s/greedy_pass@1": 0.25}}))
    assert adopt_job(ev, 4, "/m/checkpoint-4", sets, out, None) == ({"eval/s/greedy_pass@1": 0.25}, None)
    assert adopt_job(ev, 4, "/m/checkpoint-6", sets, out, None) is None  # another model: not this job
    assert adopt_job({**ev, "command": "y {output}"}, 4, "/m/checkpoint-4", sets, out, None) is None
    pid_file(out, 4).unlink()
    os.mkfifo(pid_file(out, 4))  # hostile: never read (it would block), nothing adopted
    assert adopt_job(ev, 4, "/m/checkpoint-4", sets, out, None) is None


CHECK_MODEL = '''import json, os, sys
json.dump({"primary": 1.0 if os.path.isdir(sys.argv[1]) else 0.0}, open(sys.argv[2], "w"))
'''


def test_eval_job_with_relative_paths_finds_its_spec_and_checkpoint(tmp_path, monkeypatch):
    """`rlctl eval RUN` with the README's default ./runs hands the job relative paths; the job runs in its spec's
    folder, so it read none of them: 'cannot read runs/.../evals/step-8.json' (found by scripts/gpu/run.py's CPU
    run). Every path in the job is absolute now."""
    from rlctl.evals.loop import read_result, start_job, write_job

    monkeypatch.chdir(tmp_path)
    (tmp_path / "check.py").write_text(CHECK_MODEL)
    ckpt = Path("runs/r/checkpoints/checkpoint-2")
    ckpt.mkdir(parents=True)
    ev = {"evaluator": "command", "command": f"{sys.executable} {tmp_path / 'check.py'} {{checkpoint}} {{output}}"}
    sets = [{"name": "probe", "data": str(PROMPTS), "temperature": 0.0, "n": 1}]
    spec_file, out_file, log = write_job(Path("runs/r/evals"), ev, 2, str(ckpt), sets, Path("runs/r"))
    proc = start_job(spec_file, log, None)
    assert proc.wait(timeout=120) == 0, log.read_text()
    metrics, failure = read_result(out_file, log, 0)
    assert failure is None, log.read_text()
    assert metrics == {"eval/probe/greedy_pass@1": 1.0}


def test_vllm_serves_a_verl_lora_adapter_on_the_runs_base_with_the_checkpoints_tokenizer(tmp_path, monkeypatch):
    """verl's merger writes an adapter that names no base model (base_model_name_or_path null) into
    huggingface/lora_adapter/, the tokenizer verl saved staying in huggingface/: vLLM gets the run's base model, the
    checkpoint's tokenizer and the adapter as its LoRA request (an adapter read as a full model would not load)."""
    import sys
    import types

    from rlctl.evals.generate import load_vllm

    hf = tmp_path / "actor" / "huggingface"
    (hf / "lora_adapter").mkdir(parents=True)
    (hf / "tokenizer_config.json").write_text("{}")
    (hf / "lora_adapter" / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"],
         "base_model_name_or_path": None}))
    seen = {}

    class LLM:
        def __init__(self, **kw):
            seen.update(kw)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setitem(sys.modules, "vllm.lora", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.lora.request", types.SimpleNamespace(
        LoRARequest=lambda name, i, path: (name, i, path)))
    _, lora = load_vllm(str(hf / "lora_adapter"), "/models/base", 0, "bfloat16", {"gpu_memory_utilization": 0.1})
    assert seen["model"] == "/models/base" and seen["tokenizer"] == str(hf) and seen["enable_lora"], seen
    assert seen["max_lora_rank"] == 16 and seen["gpu_memory_utilization"] == 0.1
    assert lora == ("checkpoint", 1, str(hf / "lora_adapter"))
    with pytest.raises(ValueError, match="names no base model"):
        load_vllm(str(hf / "lora_adapter"), None, 0, "bfloat16")
