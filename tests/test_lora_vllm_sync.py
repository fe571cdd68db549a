"""lora.vllm_sync: a LoRA actor with vLLM engines on an OpenRLHF release whose broadcast_to_vllm cannot sync it.

On 2 x H100 (OpenRLHF 0.10.4, vLLM 0.24.0, ZeRO-2, `--ds.lora.rank 16`; docs/gpu/): every attempt trained step 1 and
died at the first weight sync, `ValueError: There is no module or parameter named 'base_model' in Qwen2ForCausalLM`:
broadcast_to_vllm sends the PeftModel's parameters as named (`base_model.model.…base_layer.weight`, `lora_A`,
`lora_B`). No release 0.9.3-0.11.2 handles a LoRA actor there (the snapshot fact `lora_vllm_sync`, established from
each wheel by scripts/snapshot_openrlhf.py; tests/conformance/test_openrlhf_lora_sync.py runs the code). rlctl
restarted the run three times from the start with the same error and said nothing beforehand: preflight (and render)
now fail, naming the keys and the fixes, unless the recipe's patch set declares `fixes = ["lora.vllm_sync"]`.
"""

from __future__ import annotations

import json
import shutil

import pytest

from rlctl import preflight as pf
from rlctl.recipe.planning import prepare
from rlctl.resources import patches_dir

LORA_2GPU = """
name = "orl-lora"
[backend]
name = "openrlhf"
version = "{version}"
[model]
path = "Qwen/Qwen2.5-0.5B"
max_model_len = 128
[lora]
rank = 16
alpha = 32
[data]
train = "prompts.jsonl"
input_key = "prompt"
max_prompt_tokens = 32
[rollout]
group_size = 8
prompts_per_step = 4
max_tokens = 96
engines = 1
gpu_memory_utilization = 0.3
[algorithm]
name = "grpo"
[train]
steps = 4
train_batch_size = 32
micro_batch_size = 8
zero_stage = 2
[resources]
gpus_per_node = 2
gpu = "H100-80GB"
executor = "ray"
[reward]
function = "reward.py"
[checkpoint]
dir = "checkpoints"
{patches}
"""


@pytest.fixture
def lora_recipe(write):
    write("prompts.jsonl", "".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(16)))
    write("reward.py", "def reward_func(queries, prompts, labels):\n    return [0.0 for _ in queries]\n")

    def make(version: str = "0.10.4", patch_set: str | None = None, name: str = "r.toml"):
        patches = f'[patches]\nset = "{patch_set}"' if patch_set else ""
        return write(name, LORA_2GPU.format(version=version, patches=patches))

    return make


def sync_results(path, *sets):
    return [r for r in pf.run(prepare(path, list(sets)), ["lora"]) if r.check == "lora.vllm_sync"]


def test_lora_with_vllm_engines_fails_where_the_release_cannot_sync_it(lora_recipe):
    [r] = sync_results(lora_recipe("0.10.4"))
    assert r.verdict == "fail"
    # the keys and the release's own flags that make the combination, and what broadcast_to_vllm would do
    for said in ("lora.rank", "rollout.engines", "--ds.lora.rank", "--vllm.num_engines", "broadcast_to_vllm",
                 "base_model.model.", "openrlhf 0.10.4"):
        assert said in r.figure, (said, r.figure)
    # the fixes: the bundled set that declares it, or a full fine-tune
    assert 'patches.set = "openrlhf/0.10.4"' in r.fix and "full fine-tune" in r.fix and "[lora]" in r.fix, r.fix
    assert r.set == {"patches.set": "openrlhf/0.10.4"}


def test_the_bundled_set_that_declares_the_fix_silences_it(lora_recipe):
    [r] = sync_results(lora_recipe("0.10.4", "openrlhf/0.10.4"))
    assert r.verdict == "ok" and "openrlhf/0.10.4" in r.figure and "lora.vllm_sync" in r.figure, r.figure


def test_a_set_that_does_not_declare_the_fix_does_not_silence_it(lora_recipe, tmp_path):
    d = tmp_path / "sets" / "openrlhf" / "0.10.4"
    shutil.copytree(patches_dir() / "openrlhf" / "0.10.4", d)
    manifest = d / "manifest.toml"
    text = manifest.read_text()
    assert 'fixes = ["lora.vllm_sync"]\n' in text
    manifest.write_text(text.replace('fixes = ["lora.vllm_sync"]\n', ""))  # the same patch, the fix not declared
    [r] = sync_results(lora_recipe("0.10.4", str(d)))
    assert r.verdict == "fail" and 'patches.set = "openrlhf/0.10.4"' in r.fix


def test_a_release_without_a_bundled_fix_names_what_would_fix_it(lora_recipe):
    [r] = sync_results(lora_recipe("0.11.2"))
    assert r.verdict == "fail" and "--ds.lora.rank" in r.figure and "openrlhf 0.11.2" in r.figure
    assert 'fixes = ["lora.vllm_sync"]' in r.fix and "full fine-tune" in r.fix and r.set is None, r.fix
    [flat] = sync_results(lora_recipe("0.9.10"))  # the flat dialect names its own flags
    assert "--lora_rank" in flat.figure and "--vllm_num_engines" in flat.figure, flat.figure


def test_a_full_fine_tune_is_not_concerned(lora_recipe, write):
    p = lora_recipe("0.10.4")
    p.write_text(p.read_text().replace("[lora]\nrank = 16\nalpha = 32\n", ""))
    assert sync_results(p) == []


def test_render_says_it_and_passes_with_the_patch_set(lora_recipe, cli):
    bad = cli("render", str(lora_recipe("0.10.4")), "--json")
    assert bad.code == 1, (bad.code, bad.err)
    found = [f for f in json.loads(bad.out)["findings"] if "lora.vllm_sync" in f["message"]]
    assert found and found[0]["key"] == "lora.rank" and 'patches.set = "openrlhf/0.10.4"' in found[0]["fix"]
    good = cli("render", str(lora_recipe("0.10.4", "openrlhf/0.10.4", name="p.toml")), "--json")
    assert good.code == 0 and not [f for f in json.loads(good.out)["findings"] if f["level"] == "error"], good.out
    pre = cli("preflight", str(lora_recipe("0.10.4", "openrlhf/0.10.4", name="p.toml")), "--only", "lora", "--json")
    assert [r["verdict"] for r in json.loads(pre.out)["results"] if r["check"] == "lora.vllm_sync"] == ["ok"]
