"""verl's LoRA weight sync into vLLM, run on this CPU from the two releases' own code (the path an H100 run of verl
0.9.1 + vLLM 0.24 + peft 0.21 died on, before step 1: vLLM's add_lora -> _create_merged_loras_inplace ->
`next(iter(lora_model.loras.values()))` StopIteration; docs/backends/verl.md, LoRA).

The trainer side is verl's FSDP engine (workers/engine/fsdp/transformer_impl.py FSDPEngineWithLMHead, built from the
Hydra-composed config of the rendered overrides): _build_model_optimizer (the HF model, peft's LoRA, FSDP1 or FSDP2
as `actor.strategy` says, the optimizer), then get_per_tensor_param(layered_summon, base_sync_done=True): the adapter
tensors and peft config that engine_workers.py update_weights hands vLLM at every sync. The receiving side is verl's
own vLLM hook (utils/vllm/utils.py VLLMHijack: LRUCacheWorkerLoRAManager._load_adapter for a TensorLoRARequest) with
vLLM's own PEFTHelper and LoRAModel.from_lora_tensors, then vLLM's LoRAModelManager._create_merged_loras_inplace
(model_manager.py, compiled from the wheel) over the LoRA layers vLLM builds for Qwen2 (qwen2.py
packed_modules_mapping), and the look-up _activate_adapter does for each of them.

Where the code needs an accelerator the harness stands in, and says so: a CPU platform registered through verl's own
platform plugin API (gloo, devices "cpu"); FSDP1's sync_module_states broadcast (a copy from rank 0 to itself at world
size 1, refused for CPU tensors) off; load_fsdp_model_to_gpu a no-op (nothing is offloaded); TRL hidden (verl patches
TRL's value-head class at model build, no part of the LoRA sync); vLLM's PIN_MEMORY False (pinning needs CUDA: where
a tensor lives, not which). Everything else of vLLM is stubbed as tests/conformance/_verl_support.py stubs it.

Run as `python -m tests.conformance._verl_lora_sync VERL_ROOT VLLM_ROOT < jobs.json` (one fresh interpreter).
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

from tests.conformance import _verl_support as vs

VLLM = "0.24.0"  # the release the H100 ran
# the vLLM files this harness runs (lora/) or reads (qwen2.py): unpacked alone, the wheel is large
VLLM_FILES = ("vllm/lora/lora_model.py", "vllm/lora/lora_weights.py", "vllm/lora/peft_helper.py",
              "vllm/lora/utils.py", "vllm/lora/model_manager.py", "vllm/config/lora.py",
              "vllm/model_executor/models/qwen2.py")
REAL = {f[:-3].replace("/", ".") for f in VLLM_FILES if "/lora/" in f or f.endswith("config/lora.py")} - {
    "vllm.lora.model_manager"}  # its methods are compiled one by one: the module imports the whole engine


# ---------------------------------------------------------------------------------------------------------------
# the parent side (pytest)


def vllm_root(version: str = VLLM) -> Path:
    """The files of VLLM_FILES from the released vLLM wheel (pip download --no-deps, cached)."""
    wheels, out = vs.CACHE / "wheels", vs.CACHE / "unpacked" / f"vllm-{version}-lora"
    if all((out / f).is_file() for f in VLLM_FILES):
        return out
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                            f"vllm=={version}"], capture_output=True, text=True)
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
        if r.returncode != 0 or not found:
            raise RuntimeError(f"cannot download vllm=={version}: {r.stderr.strip()[-300:]}")
    with zipfile.ZipFile(found[0]) as zf:
        for f in VLLM_FILES:
            (out / f).parent.mkdir(parents=True, exist_ok=True)
            (out / f).write_bytes(zf.read(f))
    return out


def run(version: str, jobs: list[dict[str, Any]], timeout: float = 600) -> list[dict[str, Any]]:
    """Each job: {"id", "overrides"} (the rendered overrides, model.path a tiny local model)."""
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "tests.conformance._verl_lora_sync", str(vs.verl_root(version)),
                        str(vllm_root())], input=json.dumps(jobs), capture_output=True, text=True, cwd=repo,
                       timeout=timeout, env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _free_port(),
                                             "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("@@RESULTS ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"verl {version} LoRA sync worker failed (rc {r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(lines[-1][len("@@RESULTS "):])


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------------------------
# the worker side


class _VllmFiles(importlib.abc.MetaPathFinder):
    """vLLM's modules under test from the wheel's files; every other vllm module falls to _verl_support's stubs."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, name, path, target=None):
        if name in REAL:
            return importlib.util.spec_from_file_location(name, self.root / (name.replace(".", "/") + ".py"))
        return None


class _NoTrl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "trl":
            raise ModuleNotFoundError(name)  # what importlib.util.find_spec("trl") says where TRL is absent
        return None


def _cpu_platform() -> None:
    """A CPU platform through verl's platform plugin API (plugin/platform: set_platform), before anything asks."""
    import torch
    from verl.plugin.platform import platform_manager
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    class Device(types.ModuleType):  # torch.cpu, and no device memory to report (performance.py reads it)
        def __getattr__(self, name):
            if hasattr(torch.cpu, name):
                return getattr(torch.cpu, name)
            return (lambda *a, **k: (0, 0)) if name == "mem_get_info" else (lambda *a, **k: 0)

    class CPU(PlatformCUDA):
        device_name = property(lambda self: "cpu")
        device_module = property(lambda self: Device("cpu"))

        def current_device(self):
            return torch.device("cpu")

        def communication_backend_name(self):
            return "gloo"

        def synchronize(self, device_index=None):
            pass

        def empty_cache(self):
            pass

        def set_allocator_settings(self, settings):
            pass

    platform_manager.set_platform(CPU())


def _engine_module(root: Path) -> Any:
    import importlib

    for pkg in ("verl.workers.engine", "verl.workers.engine.fsdp"):  # hollow: the other engines need Megatron etc.
        m = types.ModuleType(pkg)
        m.__path__ = [str(root / pkg.replace(".", "/"))]
        sys.modules[pkg] = m
    ti = importlib.import_module("verl.workers.engine.fsdp.transformer_impl")

    class FSDP(ti.FSDP):
        def __init__(self, *a, sync_module_states=False, **k):
            super().__init__(*a, sync_module_states=False, **k)

    ti.FSDP = FSDP
    ti.load_fsdp_model_to_gpu = lambda module: None
    return ti


def _manager(vroot: Path, lora_model_cls: Any, layers: int) -> Any:
    """vLLM's LoRAModelManager as far as add_adapter goes for a Qwen2 model: its packed modules registered from the
    LoRA layers vLLM wraps (qkv_proj, o_proj, gate_up_proj, down_proj per decoder layer), model_manager.py's own
    _register_packed_modules, _get_lora_layer_weights and _create_merged_loras_inplace."""
    from vllm.lora import lora_weights

    src = (vroot / "vllm/lora/model_manager.py").read_text()
    wanted = {"_register_packed_modules", "_get_lora_layer_weights", "_create_merged_loras_inplace"}
    fns = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name in wanted]
    ns: dict[str, Any] = {"LoRAModel": lora_model_cls, "LoRALayerWeights": lora_weights.LoRALayerWeights,
                          "PackedLoRALayerWeights": lora_weights.PackedLoRALayerWeights,
                          "FusedMoE3DWithLoRA": type("FusedMoE3DWithLoRA", (), {}),
                          "FusedMoEWithLoRA": type("FusedMoEWithLoRA", (), {}), "PIN_MEMORY": False}
    exec(compile(ast.Module(body=fns, type_ignores=[]), "vllm/lora/model_manager.py", "exec"), ns)
    qwen2 = ast.parse((vroot / "vllm/model_executor/models/qwen2.py").read_text())
    cls = next(n for n in qwen2.body if isinstance(n, ast.ClassDef) and n.name == "Qwen2ForCausalLM")
    mapping = next(ast.literal_eval(st.value) for st in cls.body if isinstance(st, ast.Assign)
                   and getattr(st.targets[0], "id", "") == "packed_modules_mapping")
    Manager = type("LoRAModelManager", (), {n: ns[n] for n in wanted})
    m = Manager()
    m.packed_modules, m.packed_modules_mapping, m.is_pooling_model = {}, mapping, False
    m._is_non_gated_moe = m._enable_mixed_moe_lora_format = False
    m.modules = {f"model.layers.{i}.{part}": object() for i in range(layers)
                 for part in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
    for name in m.modules:
        m._register_packed_modules(name)
    m.supported_lora_modules = sorted({n.rsplit(".", 1)[1] for n in m.modules})
    m.model = types.SimpleNamespace()  # Qwen2ForCausalLM has no hf_to_vllm_mapper
    return m


def _sync(root: Path, vroot: Path, ti: Any, cfg: Any) -> dict[str, Any]:
    import torch
    from verl.utils.config import omega_conf_to_dataclass

    A = cfg.actor_rollout_ref
    out: dict[str, Any] = {"strategy": str(A.actor.strategy), "load_format": str(A.rollout.load_format),
                           "layered_summon": bool(A.rollout.get("layered_summon", False))}
    mc = omega_conf_to_dataclass(A.model)
    ac = omega_conf_to_dataclass(A.actor)
    engine = ti.FSDPEngineWithLMHead(model_config=mc, engine_config=ac.fsdp_config, optimizer_config=ac.optim,
                                     checkpoint_config=ac.checkpoint)
    engine._build_model_optimizer()
    out["fsdp_version"] = ti.fsdp_version(engine.module)
    # engine_workers.py update_weights, step 2: the adapter, whatever base sync comes before it
    try:
        params, peft_config = engine.get_per_tensor_param(layered_summon=out["layered_summon"], base_sync_done=True)
    except Exception as e:  # verl's own refusal (layered_summon before the base is in vLLM)
        out["error"] = f"verl get_per_tensor_param: {type(e).__name__}: {e}"[:400]
        return out
    tensors = {k: v.detach().clone() for k, v in params}
    out["sent"] = sorted(tensors)
    out["peft_target_modules"] = sorted(peft_config["target_modules"]) if peft_config else None

    # the receiving worker: vllm_rollout/utils.py _update_weights builds a TensorLoRARequest and calls add_lora
    from verl.utils.vllm import utils as verl_vllm
    from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank
    from vllm.lora.lora_model import LoRAModel

    verl_vllm.VLLMHijack.hijack()
    load_adapter = verl_vllm.LRUCacheWorkerLoRAManager._load_adapter
    req = verl_vllm.TensorLoRARequest()
    req.lora_name, req.lora_int_id, req.lora_path = "123", 123, "simon_lora_path"  # vllm_rollout/utils.py's
    req.peft_config, req.lora_tensors = peft_config, tensors
    manager = _manager(vroot, LoRAModel, mc.hf_config.num_hidden_layers)
    # the server starts vLLM with --max_lora_rank from verl's own rounding (vllm_async_server.py)
    lora_config = types.SimpleNamespace(max_lora_rank=get_vllm_max_lora_rank(mc.lora_rank), lora_dtype=torch.bfloat16)
    worker = types.SimpleNamespace(_adapter_manager=manager, _lora_model_cls=LoRAModel, lora_config=lora_config,
                                   vocab_size=mc.hf_config.vocab_size)
    try:
        lora = load_adapter(worker, req)
    except Exception as e:
        out["error"] = f"_load_adapter: {type(e).__name__}: {e}"[:400]
        return out
    out["parsed"] = sorted(lora.loras)
    try:  # LoRAModelManager.add_adapter -> _add_adapter
        manager._create_merged_loras_inplace(lora)
    except Exception as e:  # StopIteration on an empty LoRA model, as on the H100
        out["error"] = f"_create_merged_loras_inplace: {type(e).__name__}: {e}"[:400]
        return out
    # _activate_adapter: the weights each LoRA layer of vLLM's model gets (None: reset, the adapter is not there)
    out["layers_with_weights"] = sorted(n for n in manager.modules if manager._get_lora_layer_weights(lora, n))
    out["layers"] = sorted(manager.modules)
    return out


def worker(root: Path, vroot: Path) -> None:
    jobs = json.load(sys.stdin)
    vs._install(root)
    sys.modules.pop("vllm.config.lora", None)  # the real one below: verl's max_lora_rank reads its MaxLoRARanks
    sys.meta_path[:0] = [_VllmFiles(vroot), _NoTrl()]
    pinned = types.ModuleType("vllm.utils.torch_utils")
    pinned.PIN_MEMORY = False
    sys.modules["vllm.utils.torch_utils"] = pinned
    _cpu_platform()
    import torch.distributed as dist

    dist.init_process_group("gloo")
    ti = _engine_module(root)
    from hydra import compose, initialize_config_dir

    results = []
    with initialize_config_dir(config_dir=str(root / "verl/trainer/config"), version_base=None):
        for job in jobs:
            cfg = compose(config_name="ppo_trainer", overrides=job["overrides"])
            results.append({"id": job["id"], **_sync(root, vroot, ti, cfg)})
    dist.destroy_process_group()
    print("@@RESULTS " + json.dumps(results, default=str))


if __name__ == "__main__":
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
