"""OpenRLHF's own weight sync to the vLLM engines, run on the CPU: what `ActorPPOTrainer.broadcast_to_vllm` sends.

`sent_to_engines(root, version, args, model)` runs the release's broadcast_to_vllm (from `root`: the unpacked wheel,
or a site-packages rlctl patched) inside `OpenRLHF(...)` (heavy imports stubbed; torch, transformers and peft real)
on `model` (the actor's module: a PeftModel for LoRA) with `args` (what the release's parser made of a rendered
recipe), on rank 0 of the NCCL path: each engine's `update_weight.remote(name, dtype, shape)` (vllm_engine.py) and the
tensor broadcast to it over the model-update group are recorded, as (name, tensor). What stands in for the outside:
torch.distributed's rank (0), the CUDA stream (none on the CPU), DeepSpeed's GatheredParameters (a no-op under ZeRO-2;
`ZeroThree` plays a ZeRO-3 rank's partitioned parameters). `refused_by_vllm(version, args)` is the first name the
release sends for a LoRA actor that the plain model does not have: vLLM's load_weights refuses it (seen on 2 x H100:
"There is no module or parameter named 'base_model' in Qwen2ForCausalLM"), None when every name is one of its own.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlctl.backends.openrlhf.releases import release
from tests.conformance._openrlhf_support import OpenRLHF, dest, wheel_root

ACTOR = "openrlhf.trainer.ray.ppo_actor"


def tiny() -> Path:
    """rlctl's tiny Qwen2 (`rlctl model tiny`), written once per session next to the agreement tests' files."""
    from rlctl.recipe.tiny_model import make_tiny
    from tests.conformance._agreement import workdir

    path = workdir() / "tiny"
    if not (path / "config.json").is_file():
        make_tiny(path)
    return path


def lora_actor(version: str, args: Any, seed: int = 0) -> Any:
    """The release's actor model for `args`: bf16 (the --param_dtype default) with the LoRA its Actor adds
    (models/actor.py: LoraConfig(task_type=CAUSAL_LM, r, lora_alpha, target_modules, lora_dropout, bias="none"));
    lora_B, zero at init, made nonzero as training makes it (else the merged weights equal the base)."""
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    rel = release(version)
    model = AutoModelForCausalLM.from_pretrained(tiny(), dtype=torch.bfloat16)
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=dest(args, rel.flag("lora_rank")),
                        lora_alpha=dest(args, rel.flag("lora_alpha")),
                        target_modules=dest(args, rel.flag("target_modules")),
                        lora_dropout=dest(args, rel.flag("lora_dropout")), bias="none")
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return peft_model


class ZeroThree:
    """A ZeRO-3 rank's view of a model: outside DeepSpeed's GatheredParameters every parameter is an empty shard
    (`ds_shape` keeps its full shape), inside it the whole tensor (deepspeed/runtime/zero/partition_parameters.py)."""

    def __init__(self, model: Any):
        import torch

        self.empty = lambda p: torch.empty(0, dtype=p.dtype)
        self.full = {}
        for p in model.parameters():
            p.ds_shape = p.shape
            self.full[p] = p.data
            p.data = self.empty(p)

    @contextlib.contextmanager
    def GatheredParameters(self, params: Any, modifier_rank: Any = None, fwd_module: Any = None,  # noqa: N802
                           enabled: bool = True) -> Iterator[None]:
        params = list(params) if isinstance(params, (list, tuple)) else [params]
        if enabled:
            for p in params:
                p.data = self.full[p]
        try:
            yield
        finally:
            if enabled:
                for p in params:
                    p.data = self.empty(p)

    def restore(self, model: Any) -> None:
        for p in model.parameters():
            p.data = self.full[p]


@contextlib.contextmanager
def _no_gather(params: Any, modifier_rank: Any = None, fwd_module: Any = None, enabled: bool = True):
    yield  # ZeRO-2: every parameter is whole on every rank; GatheredParameters(enabled=False) does nothing


@contextlib.contextmanager
def _replaced(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def sent_to_engines(root: Path, version: str, args: Any, model: Any,
                    zero3: ZeroThree | None = None) -> list[tuple[str, Any]]:
    import torch

    sent: list[dict[str, Any]] = []

    class Remote:
        def __init__(self, what: str):
            self.what = what

        def remote(self, name: str = "", dtype: Any = None, shape: Any = None, empty_cache: bool = False) -> None:
            if self.what == "update_weight":
                sent.append({"name": name, "dtype": dtype, "shape": tuple(shape)})

    engine = types.SimpleNamespace(update_weight=Remote("update_weight"), reset_prefix_cache=Remote("reset"))

    class Group:  # stateless_init_process_group's NCCL group to the engines: rank 0 broadcasts each weight
        def broadcast(self, tensor: Any, src: int = 0, stream: Any = None) -> None:
            sent[-1]["tensor"] = tensor.detach().clone()

    gather = zero3.GatheredParameters if zero3 else _no_gather
    with _replaced(torch.distributed, "get_rank", lambda *a, **k: 0), \
            _replaced(torch.cuda, "current_stream", lambda *a, **k: None), \
            OpenRLHF(version, {ACTOR, "openrlhf.utils.logging_utils"}, root=root, real_deps=("peft",)) as o:
        mod = o.module(ACTOR)
        mod.deepspeed = types.SimpleNamespace(zero=types.SimpleNamespace(GatheredParameters=gather))
        me = types.SimpleNamespace(strategy=types.SimpleNamespace(args=args), vllm_engines=[engine],
                                   actor=types.SimpleNamespace(model=types.SimpleNamespace(module=model),
                                                               is_vlm=False),
                                   use_cuda_ipc=False, _model_update_group=Group())
        mod.ActorPPOTrainer.broadcast_to_vllm(me)
    for s in sent:
        assert s["shape"] == tuple(s["tensor"].shape) and s["dtype"] == s["tensor"].dtype, s["name"]
    return [(s["name"], s["tensor"]) for s in sent]


def plain_names() -> set[str]:
    """The parameter names of the plain HF model: what vLLM's load_weights knows (its own fusions aside)."""
    from transformers import AutoModelForCausalLM

    return {n for n, _ in AutoModelForCausalLM.from_pretrained(tiny()).named_parameters()}


_refused: dict[str, str | None] = {}


def refused_by_vllm(version: str, args: Any) -> str | None:
    """The first name the released broadcast_to_vllm sends for a LoRA actor that vLLM's model does not have (once per
    release: the names do not depend on the rank or the targets)."""
    if version not in _refused:
        names = [n for n, _ in sent_to_engines(wheel_root(version), version, args, lora_actor(version, args))]
        known = plain_names()
        _refused[version] = next((n for n in names if n not in known), None)
    return _refused[version]
