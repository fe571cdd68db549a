"""OpenRLHF's own broadcast_to_vllm on a LoRA actor, on the CPU: what the vLLM engines would be sent.

On 2 x H100 (OpenRLHF 0.10.4, vLLM 0.24.0, ZeRO-2, `--ds.lora.rank 16 --ds.lora.alpha 32`; the run in
/work/gpulogs/openrlhf-lora) every attempt trained step 1 and died at the first weight sync: vLLM's
`ValueError: There is no module or parameter named 'base_model' in Qwen2ForCausalLM`, after
`update weight: base_model.model.model.embed_tokens.weight`. Here the release's ActorPPOTrainer.broadcast_to_vllm
runs (its heavy imports stubbed: _openrlhf_support.py; torch, transformers and peft real) on a real peft LoRA of
rlctl's tiny Qwen2, built as the release's Actor builds it (models/actor.py: LoraConfig(task_type=CAUSAL_LM, r, alpha,
target_modules, dropout, bias="none")) from the arguments the release's own parser makes of what rlctl renders. Each
engine's `update_weight(name, dtype, shape)` and the tensor broadcast to it over the NCCL group are recorded.

Unpatched, the names are the PeftModel's (the failure seen on the GPU). With the bundled patch set applied by rlctl's
own patch mechanism (`rlctl patch apply`'s code) to the released wheel, every name is a parameter of the plain HF
model and every tensor is the merged weight (peft's own merge_and_unload; W + alpha/r * B @ A), under ZeRO-2 and under
ZeRO-3 (each parameter an empty shard outside DeepSpeed's GatheredParameters, as on a ZeRO-3 rank), and the actor's
own weights are left as they were.
"""

from __future__ import annotations

import copy
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from rlctl import patching
from rlctl.backends.openrlhf.releases import KNOWN_VERSIONS, release
from rlctl.recipe.planning import prepare
from tests.conformance import test_openrlhf
from tests.conformance._openrlhf_support import OpenRLHF, dest
from tests.conformance._openrlhf_sync import ZeroThree, lora_actor, plain_names, sent_to_engines
from tests.conformance.test_openrlhf import entry, recipe_file

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch not installed")

files = test_openrlhf.files  # its fixture: the data and reward files the recipe names
PATCHED = ["0.9.3", "0.10.4"]  # the releases a bundled set fixes (0.10.4: the GPU run's; 0.9.3: seed 001's)


def test_no_release_syncs_a_lora_actor_to_vllm():
    """The snapshot fact, established from each wheel's broadcast_to_vllm by scripts/snapshot_openrlhf.py (its
    freshness is test_openrlhf's snapshot test): every release sends model.named_parameters() as named."""
    assert {v: release(v).facts["lora_vllm_sync"] for v in KNOWN_VERSIONS} == {v: False for v in KNOWN_VERSIONS}


def parsed_args(files: dict, version: str, zero: int) -> Any:
    prep = prepare(recipe_file(files, version), ["lora.rank=8", "lora.alpha=16", f"train.zero_stage={zero}"])
    with OpenRLHF(version) as o:
        args, _, _ = o.parse(entry(prep))
    return args


def site_with_bundled_set(released_source: Any, tmp_path: Path, version: str) -> Path:
    """The released wheel in a site-packages of its own, the bundled set applied as `rlctl patch apply` does."""
    purelib = released_source("openrlhf", version)
    sp = tmp_path / "site-packages"
    shutil.copytree(purelib / "openrlhf", sp / "openrlhf")
    for d in purelib.parent.parent.glob("*.dist-info"):
        shutil.copytree(d, sp / d.name)
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH="{sp}" exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    ps = patching.find_set(f"openrlhf/{version}")
    assert "lora.vllm_sync" in ps.fixes
    out = patching.apply(ps, patching.locate("openrlhf", str(py)))
    assert out.changed == [e.file.name for e in ps.patches]
    return sp


@pytest.mark.parametrize("version", PATCHED)
def test_unpatched_release_sends_the_peft_names_vllm_refused(version, files, released_source):
    args = parsed_args(files, version, zero=2)
    got = sent_to_engines(released_source("openrlhf", version), version, args, lora_actor(version, args))
    names = [n for n, _ in got]
    assert names[0] == "base_model.model.model.embed_tokens.weight"  # the first `update weight:` of the GPU log
    assert all(n.startswith("base_model.model.") for n in names) and not set(names) & plain_names()
    assert any(".base_layer." in n for n in names) and any(".lora_A." in n for n in names)


@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("version", PATCHED)
def test_patched_release_sends_merged_weights_under_the_plain_names(version, zero, files, released_source, tmp_path):
    args = parsed_args(files, version, zero)
    assert dest(args, "--zero_stage" if version == "0.9.3" else "--ds.zero_stage") == zero
    model = lora_actor(version, args)
    merged = {n: p.detach().clone() for n, p in copy.deepcopy(model).merge_and_unload().named_parameters()}
    own = {n: p.detach().clone() for n, p in model.named_parameters()}
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    w, a, b = (layer.base_layer.weight.detach().float(), layer.lora_A["default"].weight.detach().float(),
               layer.lora_B["default"].weight.detach().float())
    scale = dest(args, release(version).flag("lora_alpha")) / dest(args, release(version).flag("lora_rank"))

    zero3 = ZeroThree(model) if zero == 3 else None
    got = dict(sent_to_engines(site_with_bundled_set(released_source, tmp_path, version), version, args, model,
                               zero3))

    plain = plain_names()
    assert sorted(got) == sorted(plain) and len(got) == len(plain)  # each parameter of the plain model, once
    for n, t in got.items():
        torch.testing.assert_close(t, merged[n], msg=n)  # peft's own merge
    q = got["model.layers.0.self_attn.q_proj.weight"].float()
    torch.testing.assert_close(q, w + scale * b @ a, atol=2e-2, rtol=2e-2)
    assert not torch.allclose(q, w)  # the adapter is in it
    if zero3:  # outside the gathers every parameter is a shard again
        assert all(p.numel() == 0 for p in model.parameters())
        zero3.restore(model)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), own[n]), n  # the actor's weights are never changed by a sync


@pytest.mark.parametrize("version", PATCHED)
def test_patched_release_syncs_a_full_fine_tune_as_before(version, files, released_source, tmp_path):
    """The set is applied to the whole site-packages (the GPU kit's other OpenRLHF parts run it too): without LoRA
    the engines get what the release itself sends, name for name and tensor for tensor."""
    from transformers import AutoModelForCausalLM

    from tests.conformance._openrlhf_sync import tiny

    args = parsed_args(files, version, zero=2)
    model = AutoModelForCausalLM.from_pretrained(tiny(), dtype=torch.bfloat16)
    before = sent_to_engines(released_source("openrlhf", version), version, args, model)
    after = sent_to_engines(site_with_bundled_set(released_source, tmp_path, version), version, args, model)
    assert [n for n, _ in after] == [n for n, _ in before] and {n for n, _ in after} == plain_names()
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(after, before, strict=True))
