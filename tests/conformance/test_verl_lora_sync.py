"""A verl LoRA run's weight sync into vLLM, with verl's and vLLM's own code (tests/conformance/_verl_lora_sync.py).

On an H100 (verl 0.9.1, vLLM 0.24.0, peft 0.21.0, torch 2.11; 1 GPU, hybrid engine) rlctl's render of a LoRA recipe
(rank 16, alpha 32, "all-linear") died before step 1 at the first sync: vLLM's worker in add_lora ->
model_manager.py _create_merged_loras_inplace -> `first_lora = next(iter(lora_model.loras.values()))` StopIteration.
vLLM had built an empty LoRA model because verl sent no tensor: under FSDP1 (verl's default strategy "fsdp") verl's
collect_lora_params calls peft's get_peft_model_state_dict on the wrapped PeftModel, and peft 0.21 selects the
adapter's keys from the model's module names (tuners_utils.py _get_tuner_state_dict_key_prefixes), which carry FSDP1's
nested `_fsdp_wrapped_module.` (decoder layers and each lora_A/lora_B are FSDP units, fsdp_utils.py
get_fsdp_wrap_policy is_lora) while the state dict's keys do not: nothing matches. rlctl now renders FSDP2 for LoRA
(and a load_format that has vLLM load the base itself) and refuses a recipe that forces FSDP1 back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.backends import get_backend
from rlctl.recipe.loader import load
from tests.conformance import _verl_lora_sync as sync
from tests.conformance import _verl_support as vs

pytest.importorskip("hydra")
pytest.importorskip("torch")
pytest.importorskip("peft")

VERL = get_backend("verl")
A = "actor_rollout_ref"
# the H100 run's recipe (/work/gpulogs evidence parts.lora.recipe), on rlctl's tiny Qwen2 and a local data file
RECIPE = """
name = "verl-lora"
[backend]
name = "verl"
version = "0.9.1"
[backend.verl.extra]
"+actor_rollout_ref.model.override_config.attn_implementation" = "sdpa"
{extra}
[model]
path = "{model}"
dtype = "bfloat16"
max_model_len = 256
[lora]
rank = 16
alpha = 32
target_modules = {targets}
[data]
train = "{data}"
input_key = "prompt"
label_key = "ground_truth"
max_prompt_tokens = 32
[rollout]
group_size = 8
prompts_per_step = 4
max_tokens = 96
gpu_memory_utilization = 0.3
[algorithm]
name = "grpo"
kl_coef = 0.04
use_kl_loss = true
[optim]
lr = 1e-5
schedule = "constant"
[train]
steps = 4
train_batch_size = 32
micro_batch_size = 8
gradient_checkpointing = false
[resources]
gpus_per_node = 1
gpu = "H100-80GB"
colocate = true
"""
FSDP1 = f'"{A}.actor.strategy" = "fsdp"'
CASES = {"rendered": ('"all-linear"', ""), "list": ('["q_proj", "v_proj"]', ""), "fsdp1": ('"all-linear"', FSDP1)}


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    from rlctl.recipe.tiny_model import make_tiny

    d = tmp_path_factory.mktemp("verl-lora")
    tiny = vs.CACHE / "tiny-qwen2"
    if not (tiny / "config.json").is_file():
        make_tiny(tiny)
    data = d / "train.jsonl"
    data.write_text('{"prompt": "a", "ground_truth": "a"}\n' * 16)
    out = {}
    for name, (targets, extra) in CASES.items():
        p = d / f"{name}.toml"
        p.write_text(RECIPE.format(model=tiny, data=data, targets=targets, extra=extra))
        out[name] = p
    return out


@pytest.fixture(scope="module")
def synced(recipes):
    """{case: what verl sent and what vLLM made of it}: one verl interpreter for all cases."""
    jobs = [{"id": name, "overrides": VERL.render(load(p).recipe, 16).argv[3:]} for name, p in recipes.items()]
    return {res["id"]: res for res in sync.run("0.9.1", jobs)}


def test_rendered_lora_reaches_vllm_whole(synced):
    """rlctl's render: every module peft adapted is sent (lora_A and lora_B) and parsed by vLLM, and every LoRA layer
    vLLM builds for Qwen2 (qkv_proj, o_proj, gate_up_proj, down_proj of each layer) gets its weights. Before the fix
    (FSDP1, verl's default) verl sent nothing and vLLM stopped at StopIteration: the fsdp1 case below."""
    res = synced["rendered"]
    assert "error" not in res, f"{res['error']} (verl sent {len(res['sent'])} tensors, {res['strategy']})"
    targets = res["peft_target_modules"]  # peft expands "all-linear" to the model's linear layers, lm_head not
    assert len(targets) == 2 * 7 and not any("lm_head" in t for t in targets)
    assert res["sent"] == sorted(f"base_model.model.{t}.lora_{ab}.weight" for t in targets for ab in "AB")
    assert res["parsed"] == targets
    assert res["layers_with_weights"] == res["layers"] and len(res["layers"]) == 2 * 4
    assert (res["strategy"], res["fsdp_version"], res["load_format"]) == ("fsdp2", 2, "auto")


def test_a_list_of_target_modules_reaches_vllm_as_listed(synced):
    """target_modules as a list: peft adapts those layers alone; vLLM packs q_proj and v_proj into qkv_proj (k_proj
    absent) and leaves the other LoRA layers without weights (reset at activation), as it should."""
    res = synced["list"]
    assert "error" not in res, res["error"]
    assert res["parsed"] == sorted(f"model.layers.{i}.self_attn.{m}" for i in range(2) for m in ("q_proj", "v_proj"))
    assert res["layers_with_weights"] == [f"model.layers.{i}.self_attn.qkv_proj" for i in range(2)]


def test_fsdp1_lora_is_the_h100_failure_and_rlctl_refuses_it(synced, recipes, cli):
    """A recipe forcing FSDP1 back (backend.verl.extra): verl sends no tensor, vLLM builds an empty LoRA model and
    add_lora stops at StopIteration, as on the H100. rlctl refuses it at render and preflight, naming the key."""
    res = synced["fsdp1"]
    assert (res["strategy"], res["fsdp_version"]) == ("fsdp", 1)
    assert res["sent"] == [] and res["parsed"] == [] and len(res["peft_target_modules"]) == 14
    assert res["error"].startswith("_create_merged_loras_inplace: StopIteration")
    key = f'backend.verl.extra."{A}.actor.strategy"'
    found = [f for f in VERL.unhonoured(load(recipes["fsdp1"]).recipe) if f.key == key]
    assert [f.level for f in found] == ["error"] and "fsdp2" in found[0].fix and "StopIteration" in found[0].message
    r = cli("render", str(recipes["fsdp1"]))
    assert r.code == 1 and key in r.err, r.err  # render refuses (exit 1), as for a key verl does not have
    results = json.loads(cli("preflight", str(recipes["fsdp1"]), "--json").out)["results"]
    assert [x["verdict"] for x in results if key in (x["fix"] or "")] == ["fail"]
    assert not [f for f in VERL.unhonoured(load(recipes["rendered"]).recipe) if "strategy" in f.key]


def test_render_says_why(recipes):
    plan = VERL.render(load(recipes["rendered"]).recipe, 16)
    assert any("StopIteration" in n and "fsdp2" in n for n in plan.notes)
    assert not any("StopIteration" in n for n in VERL.render(load(recipes["fsdp1"]).recipe, 16).notes)


def test_the_harness_runs_the_wheels_files(synced):
    """The vLLM side ran the wheel's own files (not a copy in this repository)."""
    root = sync.vllm_root()
    assert all((root / f).is_file() for f in sync.VLLM_FILES)
    assert not (Path(__file__).parent / "vllm").exists()


def test_a_dummy_load_format_is_said_and_with_layered_summon_refused(recipes, tmp_path):
    """load_format "dummy" put back: a warning (the first sync pushes the whole base); with layered_summon verl raises
    at that first sync (utils/fsdp_utils.py collect_lora_params: "To use layered_summon, you must make sure
    base-model is preloaded in vllm"): an error. Both name the key."""
    key = f'backend.verl.extra."{A}.rollout.load_format"'
    text = recipes["rendered"].read_text()
    for extra, level in ((f'"{A}.rollout.load_format" = "dummy"', "warn"),
                         (f'"{A}.rollout.load_format" = "dummy"\n"{A}.rollout.layered_summon" = true', "error")):
        p = tmp_path / f"{level}.toml"
        p.write_text(text.replace("[model]", f"{extra}\n[model]", 1))
        found = [f for f in VERL.unhonoured(load(p).recipe) if f.key == key]
        assert [f.level for f in found] == [level] and '"auto"' in found[0].fix
