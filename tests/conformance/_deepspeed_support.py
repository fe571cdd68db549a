"""DeepSpeed's own checkpoint pointer code, run without a GPU: `DeepSpeedEngine.save_checkpoint` (the tag's files, then
`latest`) and `load_checkpoint` (with no tag: the tag `latest` names) from the release an OpenRLHF wheel pins.

DeepSpeed ships sdists only: `pip download --no-deps --no-build-isolation` fetches it once into the wheel cache (its
metadata step imports torch, which the dev environment has), and only deepspeed/runtime/engine.py is kept. The two
methods are compiled from that file's source and bound to an engine whose heavy parts (the model and optimizer state
files, the process group) write or read a small file each: what runs around them is DeepSpeed's code as released.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import subprocess
import sys
import tarfile
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conformance._openrlhf_support import CACHE

METHODS = ("save_checkpoint", "load_checkpoint")


def pinned(openrlhf_version: str) -> str:
    """The DeepSpeed release an OpenRLHF wheel requires (`Requires-Dist: deepspeed==X`)."""
    wheel = next(CACHE.glob(f"openrlhf-{openrlhf_version}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        m = re.search(r"^Requires-Dist: deepspeed==([\w.]+)", zf.read(meta).decode(), re.M)
    assert m, f"openrlhf {openrlhf_version} pins no deepspeed release"
    return m.group(1)


def engine_source(version: str) -> str:
    """deepspeed/runtime/engine.py of a released DeepSpeed, fetched once."""
    out = CACHE / "unpacked" / f"deepspeed-{version}" / "engine.py"
    if out.is_file():
        return out.read_text()
    sdist = CACHE / f"deepspeed-{version}.tar.gz"
    if not sdist.is_file():
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "-q",
                            "-d", str(CACHE), f"deepspeed=={version}"], capture_output=True, text=True)
        if r.returncode != 0 or not sdist.is_file():
            raise RuntimeError(f"cannot download deepspeed=={version}: {r.stderr.strip()[-300:]}")
    with tarfile.open(sdist) as tf:
        text = tf.extractfile(f"deepspeed-{version}/deepspeed/runtime/engine.py").read().decode()  # type: ignore
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return text


def engine_methods(version: str, before_open: Callable[[str], None]) -> dict[str, Any]:
    """DeepSpeedEngine.save_checkpoint and load_checkpoint, compiled from the release's source; `before_open` hears of
    every file they open themselves (the `latest` pointer)."""
    tree = ast.parse(engine_source(version))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepSpeedEngine")
    funcs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in METHODS]
    assert sorted(f.name for f in funcs) == sorted(METHODS), f"deepspeed {version}: {[f.name for f in funcs]}"

    def opener(path: Any, *a: Any, **k: Any) -> Any:
        before_open(str(path))
        return open(path, *a, **k)

    ns: dict[str, Any] = {
        "os": os, "open": opener, "logger": types.SimpleNamespace(warning=lambda *a, **k: None,
                                                                   info=lambda *a, **k: None),
        "dist": types.SimpleNamespace(barrier=lambda *a, **k: None),
        "CheckpointCommitInfo": lambda **k: types.SimpleNamespace(**k), "dp_index_to_str": str,
    }
    exec(compile(ast.Module(body=funcs, type_ignores=[]), f"deepspeed-{version}/engine.py", "exec"), ns)
    return {name: ns[name] for name in METHODS}


class _CheckpointEngine:
    """torch_checkpoint_engine's part in a save: makedirs, no staging, commit at once."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def create(self, info: Any) -> None:
        pass

    def is_decoupled(self) -> bool:
        return False

    def commit(self, info: Any) -> bool:
        return True


MODEL = "mp_rank_00_model_states.pt"
OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def engine_class(base: type, version: str, event: Callable[[str], None]) -> type:
    """A DeepSpeedEngine (a subclass of `base`, the engine class OpenRLHF's code checks against) whose save_checkpoint
    and load_checkpoint are DeepSpeed's own; `event(what)` is called before each file a save writes."""
    real = engine_methods(version, lambda p: event("latest") if os.path.basename(p) == "latest" else None)

    class Engine(base):  # type: ignore[misc, valid-type]
        global_rank = local_rank = 0
        global_steps = 0
        has_moe_layers = False
        save_zero_checkpoint = True
        mpu = None
        optimizer = None
        checkpoint_engine = _CheckpointEngine()
        save_checkpoint = real["save_checkpoint"]
        load_checkpoint = real["load_checkpoint"]

        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        def _optimizer_has_ckpt_event_prologue(self) -> bool:
            return False

        _optimizer_has_ckpt_event_epilogue = _optimizer_has_ckpt_event_prologue
        zero_nvme_offload_optimizer = zero_optimization = load_universal_checkpoint = _optimizer_has_ckpt_event_prologue

        def use_node_local_storage(self) -> bool:
            return False

        def _checkpoint_tag_validation(self, tag: str) -> None:
            pass

        def _create_checkpoint_file(self, save_dir: str, tag: str, zero_checkpoint: bool) -> None:
            os.makedirs(os.path.join(save_dir, tag), exist_ok=True)

        def _create_zero_checkpoint_files(self, save_dir: str, tag: str) -> None:
            os.makedirs(os.path.join(save_dir, tag), exist_ok=True)

        def _save_checkpoint(self, save_dir: str, tag: str, client_state: Any = None, **k: Any) -> None:
            event("model states")
            with open(os.path.join(save_dir, tag, MODEL), "w") as fh:
                json.dump(client_state or {}, fh)

        def _save_zero_checkpoint(self, save_dir: str, tag: str) -> None:
            event("optimizer states")
            with open(os.path.join(save_dir, tag, OPTIM), "w") as fh:
                fh.write("o")

        def _load_checkpoint(self, load_dir: str, tag: str, **k: Any) -> tuple[str, dict[str, Any]]:
            files = sorted(glob.glob(os.path.join(load_dir, str(tag), "mp_rank_*_model_states.pt")))
            assert len(files) > 0, f"no checkpoint files of tag {tag!r}"  # SDLoaderBase.check_ckpt_list
            with open(files[0]) as fh:
                return os.path.join(load_dir, str(tag)), json.load(fh)

    return Engine


def loaded_step(engine: Any, actor_dir: Path) -> int | None:
    """What OpenRLHF's --load_checkpoint loads (ppo_actor: `strategy.load_ckpt` when `_actor` exists, which is
    DeepSpeed's load_checkpoint with no tag): the step of its client state, None when it loads nothing."""
    if not actor_dir.exists():
        return None
    path, states = engine.load_checkpoint(str(actor_dir))
    return None if path is None else int(states["global_step"])
