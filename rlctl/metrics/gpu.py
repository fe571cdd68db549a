"""Per-GPU memory of a run, sampled through NVML (nvidia-ml-py) by the supervisor: what an OOM sees.

The supervisor calls `GpuSampler.tick()` on every poll (every 0.5 s); the sampler reads NVML's `used` per GPU,
keeps the peak, and every `every_s` seconds (and at the end) appends one record to the metrics stream:
`gpu/<i>/memory_used_gib` (now) and `gpu/<i>/memory_peak_gib` (peak so far), at the run's latest step. The summary
`gpu_memory.json` in the run directory holds the peaks, the GPU size, what was in use before the run started and the
memory plan rlctl made for the recipe, so `rlctl status` can put measured next to planned. No NVML (a CPU machine,
CI, no driver): the summary says so and nothing else happens. pynvml is imported lazily, here only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from rlctl.metrics.stream import METRICS, write_records

SUMMARY = "gpu_memory.json"
GiB = 1024**3


def _visible(env: dict[str, str] | None) -> list[int] | None:
    """NVML indices of the GPUs the run sees (CUDA_VISIBLE_DEVICES as integers), None = all."""
    spec = (env or os.environ).get("CUDA_VISIBLE_DEVICES")
    if spec is None or not spec.strip():
        return None
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:  # GPU UUIDs: sample all
        return None


def _last_step(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - 8192, 0))
            lines = fh.read().splitlines()
        for line in reversed(lines):
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                return int(json.loads(line)["step"])
    except (OSError, KeyError):
        pass
    return 0


class GpuSampler:
    def __init__(self, run_dir: Path, env: dict[str, str] | None = None, every_s: float = 10.0):
        self.run_dir = run_dir
        self.every_s = float((env or os.environ).get("RLCTL_GPU_RECORD_S", every_s))
        self.handles: list[tuple[int, Any]] = []
        self.peak: dict[int, float] = {}
        self.now: dict[int, float] = {}
        self.total: dict[int, float] = {}
        self.before: dict[int, float] = {}
        self.samples = 0
        self.last_record = 0.0
        self.nvml = None
        self.reason = ""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            wanted = _visible(env)
            count = pynvml.nvmlDeviceGetCount()
            for i in (wanted if wanted is not None else range(count)):
                if 0 <= i < count:
                    self.handles.append((i, pynvml.nvmlDeviceGetHandleByIndex(i)))
            self.nvml = pynvml
            if not self.handles:
                self.reason = "NVML sees no GPU for this run"
        except ImportError:
            self.reason = "nvidia-ml-py is not installed: GPU memory not sampled"
        except Exception as e:  # no driver, no GPU
            self.reason = f"NVML unavailable ({type(e).__name__}): GPU memory not sampled"
        for i, h in self.handles:
            with contextlib.suppress(Exception):
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                self.total[i] = mem.total / GiB
                self.before[i] = mem.used / GiB
        self.plan = self._plan()
        self._write_summary()

    @property
    def active(self) -> bool:
        return bool(self.handles)

    def _plan(self) -> dict[str, Any] | None:
        """rlctl's memory plan for the run's recipe (per trainer GPU), to put the measurement next to it."""
        try:
            from rlctl.estimate.memory import GiB as G
            from rlctl.estimate.memory import gpu_memory_gib, trainer_memory
            from rlctl.recipe.loader import load
            from rlctl.recipe.models import resolve_arch

            recipe = load(self.run_dir / "recipe.toml").recipe
            if recipe.resources.gpus_per_node == 0:
                return None
            b = trainer_memory(recipe, resolve_arch(recipe.model.path))
            return {"trainer_gib": round(b.total / G, 2), "terms_gib": {k: round(v / G, 3) for k, v in b.terms.items()},
                    "gpu": recipe.resources.gpu, "gpu_gib": gpu_memory_gib(recipe.resources.gpu)}
        except Exception:
            return None

    def tick(self, final: bool = False) -> None:
        if not self.handles:
            return
        for i, h in self.handles:
            try:
                used = self.nvml.nvmlDeviceGetMemoryInfo(h).used / GiB
            except Exception:
                continue
            self.now[i] = used
            self.peak[i] = max(self.peak.get(i, 0.0), used)
        self.samples += 1
        t = time.time()
        if final or t - self.last_record >= self.every_s:
            self.last_record = t
            rec: dict[str, Any] = {"step": _last_step(self.run_dir / METRICS)}
            for i in self.now:
                rec[f"gpu/{i}/memory_used_gib"] = round(self.now[i], 3)
                rec[f"gpu/{i}/memory_peak_gib"] = round(self.peak[i], 3)
            with contextlib.suppress(OSError):
                write_records(self.run_dir / METRICS, [rec], now=t)
            self._write_summary()

    def close(self) -> None:
        self.tick(final=True)
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def summary(self) -> dict[str, Any]:
        return {"nvml": self.active, "reason": self.reason or None, "samples": self.samples,
                "gpus": {str(i): {"peak_gib": round(self.peak.get(i, 0.0), 3), "total_gib": round(self.total[i], 3),
                                  "used_before_gib": round(self.before.get(i, 0.0), 3)} for i in self.total},
                "plan": self.plan}

    def _write_summary(self) -> None:
        with contextlib.suppress(OSError):
            tmp = self.run_dir / (SUMMARY + ".tmp")
            tmp.write_text(json.dumps(self.summary(), indent=2) + "\n")
            os.replace(tmp, self.run_dir / SUMMARY)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None


def _num(v: Any) -> float | None:
    """A positive finite number from a summary, or None (a damaged file says nothing)."""
    import math

    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 \
        else None


def _preflight_word(plan: float, gpu: float) -> str:
    """What preflight's memory.trainer said for this plan on this GPU (FAIL above it, WARN within 10%)."""
    return "FAIL" if plan > gpu else "WARN" if plan > 0.9 * gpu else "OK"


def oom_line(run_dir: Path, summary: dict[str, Any] | None) -> str | None:
    """`GPU memory: ran out of memory at step 12 (torch OutOfMemoryError: ...) (plan: 118.8 GiB needed of 79.6 —
    preflight said FAIL)`, when the run's log holds an out-of-memory message; None otherwise."""
    from rlctl.metrics.oom import find_oom

    oom = find_oom(run_dir / "stdout.log")
    if oom is None:
        return None
    step = _last_step(run_dir / METRICS)
    where = f"at step {step}" if step else "before the first logged step"
    line = f"GPU memory: ran out of memory {where} ({oom.what}" + (f": {oom.detail})" if oom.detail else ")")
    s = summary if isinstance(summary, dict) else {}
    plan_d = s.get("plan") if isinstance(s.get("plan"), dict) else {}
    gpus = {k: g for k, g in (s.get("gpus") or {}).items() if isinstance(g, dict)} \
        if isinstance(s.get("gpus"), dict) else {}
    plan = _num(plan_d.get("trainer_gib"))
    gpu = _num(plan_d.get("gpu_gib")) or max((_num(g.get("total_gib")) or 0.0 for g in gpus.values()), default=0.0)
    if plan and gpu:
        word = _preflight_word(plan, gpu)
        line += (f" (plan: {plan:.1f} GiB per trainer GPU needed of {gpu:.1f} — preflight said {word}"
                 + (")" if word == "FAIL" else "; the plan did not foresee this OOM, see docs/memory.md)"))
    elif plan:
        line += f" (plan: {plan:.1f} GiB per trainer GPU)"
    peaks = [(k, _num(g.get("peak_gib")), _num(g.get("total_gib"))) for k, g in gpus.items()]
    peaks = [p for p in peaks if p[1] and p[2]]
    if s.get("nvml") and peaks:
        i, peak, total = max(peaks, key=lambda p: p[1])
        line += f"; measured peak {peak:.1f} GiB of {total:.1f} (GPU {i}), capped by the GPU: not a test of the plan"
    return line


def asks_for_gpus(run_dir: Path) -> bool:
    """False for a run whose recipe asks for no GPU (`resources.gpus_per_node = 0`: the CPU quickstart): its GPU
    memory is no question, so no line says it was "not measured". A run without its recipe (attached) may have
    used one."""
    import tomllib

    try:
        resources = tomllib.loads((run_dir / "recipe.toml").read_text()).get("resources")
    except (OSError, ValueError):
        return True
    return not (isinstance(resources, dict) and resources.get("gpus_per_node") == 0)


def verdict_line(run_dir: Path) -> str | None:
    """`GPU memory: peak 31.2 GiB of 79.6 (GPU 0), plan said 29.8 GiB per trainer GPU: within 15%`, or why not; a run
    whose log says it ran out of memory gets that instead (oom_line)."""
    s = read_summary(run_dir)
    oom = oom_line(run_dir, s)
    if oom is not None:
        return oom
    if s is None or not asks_for_gpus(run_dir):
        return None
    if not s.get("nvml"):
        return f"GPU memory: not measured ({s.get('reason') or 'no NVML'}); check skipped"
    gpus = s.get("gpus") or {}
    if not gpus:
        return None
    i, g = max(gpus.items(), key=lambda kv: kv[1]["peak_gib"])
    own = g["peak_gib"] - g.get("used_before_gib", 0.0)
    line = f"GPU memory: peak {g['peak_gib']:.1f} GiB of {g['total_gib']:.1f} (GPU {i}"
    line += f", {g['used_before_gib']:.1f} in use before the run)" if g.get("used_before_gib", 0) > 0.6 else ")"
    plan = (s.get("plan") or {}).get("trainer_gib")
    if plan:
        ratio = plan / own if own > 0 else float("inf")
        verdict = ("within 15%" if abs(ratio - 1) <= 0.15 else
                   f"plan {'over' if ratio > 1 else 'UNDER'}estimated by {abs(ratio - 1) * 100:.0f}%")
        line += f", plan said {plan:.1f} GiB per trainer GPU: {verdict}"
    return line
