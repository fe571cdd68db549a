"""This machine's NVIDIA GPUs, asked once in one place: NVML (nvidia-ml-py) first, else `nvidia-smi`.

Every reader (machine facts, `status`'s live memory, the environment record of a run, the sweep queue's free
memory) takes its rows from here, so the two ways of asking and their failure modes live once. pynvml is imported
lazily: `rlctl --help`, `render`, `preflight` and `status` on a CPU machine never load it.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

GiB = 1024**3
# nvidia-smi's --query-gpu fields, in the order of the row keys below (memory in MiB, nounits)
_SMI_FIELDS = ("index", "name", "memory.total", "memory.used", "memory.free", "driver_version")


def nvml_rows(utilization: bool = False) -> list[dict[str, Any]]:
    """One row per GPU through NVML (raises when there is no pynvml or no driver)."""
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        name = pynvml.nvmlDeviceGetName(h)
        row: dict[str, Any] = {"index": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                               "memory_total_gib": mem.total / GiB, "memory_used_gib": mem.used / GiB,
                               "memory_free_gib": mem.free / GiB}
        if utilization:
            row["utilization"] = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
        out.append(row)
    return out


def smi_rows(timeout: float = 20.0) -> list[dict[str, Any]] | None:
    """One row per GPU from `nvidia-smi --query-gpu` (memory in GiB), None when it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    rows = []
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != len(_SMI_FIELDS) or not parts[0].isdigit():
            continue
        row: dict[str, Any] = {"index": int(parts[0]), "name": parts[1], "driver": parts[5]}
        for key, raw in zip(("memory_total_gib", "memory_used_gib", "memory_free_gib"), parts[2:5], strict=True):
            try:
                row[key] = float(raw) / 1024  # MiB
            except ValueError:  # "[N/A]" on some boards
                row[key] = None
        rows.append(row)
    return rows


def list_gpus() -> tuple[list[dict[str, Any]] | None, str | None]:
    """(rows, None) through NVML, else nvidia-smi; (None, why) when neither sees a GPU."""
    try:
        return nvml_rows(), None
    except Exception as e:  # no pynvml, or no driver
        nvml_err = f"{type(e).__name__}: {e}"
    rows = smi_rows()
    if rows is not None:
        return rows, None
    smi = "failed" if shutil.which("nvidia-smi") else "not installed"
    return None, f"no NVIDIA GPU found (NVML: {nvml_err}; nvidia-smi {smi})"


def check_gpu_list(value: str, where: str, written: Any = None) -> str:
    """A CUDA_VISIBLE_DEVICES list as a user gives it (`--gpu 6,7`, `eval.gpu = "7"`): an empty one or an empty
    element is an error. CUDA stops reading the variable at its first invalid entry, so `0,,1` would hide GPU 1 and
    an empty one every GPU, where the user meant some."""
    from rlctl.errors import RlctlError

    written = written or (lambda v: f"{where} {v}")  # how the fix is written: an option, or a recipe's key
    if not value.strip():
        raise RlctlError(f"{where} {value!r}: an empty GPU list.",
                         hint=f"{written('7')} (or {written('6,7')}: CUDA_VISIBLE_DEVICES); in a script, check that "
                              "the variable holding it is set")
    parts = [p.strip() for p in value.split(",")]
    if not all(parts):
        raise RlctlError(f"{where} {value!r}: an empty element in the GPU list (CUDA stops reading "
                         "CUDA_VISIBLE_DEVICES at it: the GPUs after it are not seen).",
                         hint=written(",".join(p for p in parts if p)))
    return value


# an idle GPU: NVML shows only the driver's own reservation (~0.5 GiB on an H100) in use
IDLE_USED_GIB = 1.0


def idle_gpus(exclude: set[str] | frozenset[str] = frozenset(),
              rows: list[dict[str, Any]] | None = None) -> list[str]:
    """Indices (NVML / PCI bus order, as CUDA_VISIBLE_DEVICES with CUDA_DEVICE_ORDER=PCI_BUS_ID) of this machine's
    GPUs with nothing on them, those in `exclude` left out; [] when no GPU can be asked. `rows`: list_gpus's, where
    the caller has them already (preflight reads the GPUs once), else asked now."""
    if rows is None:
        rows, _ = list_gpus()
    return [str(r["index"]) for r in rows or []
            if str(r["index"]) not in exclude and isinstance(r.get("memory_used_gib"), (int, float))
            and r["memory_used_gib"] < IDLE_USED_GIB]
