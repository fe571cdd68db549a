"""Gathering this machine's MachineFacts (rlctl/core/facts.py): GPUs through NVML or nvidia-smi, free disk, each
backend's installed runtime and the state of its patch set, rlctl's version."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from rlctl.core.facts import MachineFacts
from rlctl.core.gpus import list_gpus


def gpus() -> tuple[list[dict[str, Any]] | None, str | None]:
    """(GPUs, note): through NVML, else `nvidia-smi`; None with the reason when neither is there."""
    rows, note = list_gpus()
    if rows is None:
        return None, note
    return [{"index": r["index"], "name": r["name"],
             **{k: None if r.get(k) is None else round(r[k], 1) for k in ("memory_total_gib", "memory_used_gib")}}
            for r in rows], None


def backend_facts() -> dict[str, dict[str, Any]]:
    """Each registered backend's runtime package, its installed version, and the state of the matching patch set."""
    from rlctl.backends import available, get_backend
    from rlctl.backends._static import installed_version

    out: dict[str, dict[str, Any]] = {}
    for name in sorted(available()):
        try:
            pkgs = tuple(getattr(get_backend(name), "packages", ()) or ())
        except Exception:
            continue
        if not pkgs:
            continue
        version = installed_version(pkgs[0])
        out[name] = {"package": pkgs[0], "installed": version, "patches": _patch_state(name, version)}
    return out


def _patch_state(backend: str, version: str | None) -> str | None:
    if version is None:
        return None
    try:
        from rlctl import patching

        sets = [s for s in patching.discover() if s.backend == backend and s.version == version]
        if not sets:
            return "no patch set for this version"
        inst = patching.locate(sets[0].package)
        states, _ = patching.status(sets[0], inst)
        counts: dict[str, int] = {}
        for s in states:
            counts[s.state] = counts.get(s.state, 0) + 1
        return f"{sets[0].name}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    except Exception as e:
        return f"unknown ({type(e).__name__}: {e})"


def local_facts(disk_path: str | Path = ".") -> MachineFacts:
    from rlctl import __version__

    path = Path(disk_path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    g, note = gpus()
    return MachineFacts(machine=socket.gethostname(), rlctl_version=__version__, python=sys.executable, gpus=g,
                        gpu_note=note, disk_path=str(path.resolve()), disk_free=shutil.disk_usage(path).free,
                        backends=backend_facts())
