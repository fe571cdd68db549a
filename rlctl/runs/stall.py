"""Stall detection that fits RL, and the evidence saved before a stuck or failed attempt is restarted.

A run is stalled when no new step arrived for max(k x the median step time so far, a floor); before the first step,
and around evaluation and checkpoint saves, a longer grace applies. A log line matching one of the backend's stall
patterns (`Backend.stall_patterns()`: a dead inference server, NCCL timeouts, ...) cuts the wait to the floor.
Where NVML is present and any of the run's GPUs is busy, the run is not stalled (a long generation is work).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


@dataclass
class StallConfig:
    k: float = 5.0  # x the median step time
    floor_s: float = 600.0  # never sooner than this without a step
    first_step_s: float = 1800.0  # model loading, engine start-up, compilation
    slow_step_s: float = 1800.0  # a step with an evaluation or a checkpoint save
    gpu_busy_pct: float = 5.0  # NVML: a GPU above this utilisation counts as working

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> StallConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (d or {}).items() if k in names and v is not None})


class StallDetector:
    def __init__(self, cfg: StallConfig, patterns: list[str], started_at: float, every: tuple[int, ...] = ()):
        self.cfg = cfg
        self.patterns = [re.compile(p) for p in patterns]
        self.every = tuple(e for e in every if e)
        self.started_at = started_at
        self.last_step: int | None = None
        self.last_step_at: float | None = None
        self.intervals: list[float] = []
        self.pattern_hit: str | None = None
        self.pattern_hit_at: float | None = None

    def observe_step(self, step: int | None, now: float) -> None:
        if step is None or (self.last_step is not None and step <= self.last_step):
            return
        if self.last_step_at is not None and self.last_step is not None:
            self.intervals.append((now - self.last_step_at) / max(step - self.last_step, 1))
            self.intervals = self.intervals[-200:]
        self.last_step, self.last_step_at = step, now
        self.pattern_hit = self.pattern_hit_at = None

    def observe_log(self, text: str, now: float) -> None:
        if not self.patterns or not text:
            return
        for line in text.splitlines():
            for p in self.patterns:
                if p.search(line):
                    if self.pattern_hit is None:
                        self.pattern_hit, self.pattern_hit_at = line.strip()[:300], now
                    return

    def _slow_step_next(self) -> bool:
        s = self.last_step or 0
        return any(s % e == 0 or (s + 1) % e == 0 for e in self.every)

    def threshold(self) -> tuple[float, str]:
        c = self.cfg
        if self.last_step_at is None:
            return max(c.first_step_s, c.floor_s), "the first step"
        limit = max(c.k * statistics.median(self.intervals), c.floor_s) if self.intervals else max(c.first_step_s,
                                                                                                c.floor_s)
        if self._slow_step_next():
            return max(limit, c.slow_step_s), f"step {self.last_step + 1} (with an eval or a checkpoint save)"
        return limit, f"step {self.last_step + 1}"

    def check(self, now: float, gpus_busy: bool | None = None) -> str | None:
        """A reason when the attempt is stalled, else None."""
        since = self.last_step_at or self.started_at
        if self.pattern_hit is not None and now - max(since, self.pattern_hit_at or since) >= self.cfg.floor_s:
            return f"no new step for {now - since:.0f}s after the log said: {self.pattern_hit}"
        limit, what = self.threshold()
        if now - since < limit:
            return None
        if gpus_busy:
            return None
        return f"no new step for {now - since:.0f}s (waiting for {what}; limit {limit:.0f}s)"


def gpus_busy(threshold_pct: float = 5.0, indices: list[int] | None = None) -> bool | None:
    """True if any (of the given) GPUs works, False if all idle, None without NVML."""
    try:
        import pynvml  # nvidia-ml-py; optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        busy = False
        for i in range(n):
            if indices is not None and i not in indices:
                continue
            util = pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i))
            busy = busy or util.gpu > threshold_pct
        return busy
    except Exception:
        return None


def visible_gpus(env: dict[str, str]) -> list[int] | None:
    v = env.get("CUDA_VISIBLE_DEVICES")
    if not v:
        return None
    with contextlib.suppress(ValueError):
        return [int(x) for x in v.split(",") if x.strip()]
    return None


def _run(cmd: list[str], timeout: float = 30.0) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{cmd[0]}: {e}\n"
    return r.stdout + (r.stderr if r.returncode else "")


def tail_lines(path: Path, n: int = 200, max_bytes: int = 256 * 1024) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-n:]) + "\n"


def save_evidence(out: Path, log: Path, reason: str, pids: list[int]) -> Path | None:
    """What to look at after a restart: the last log lines, `py-spy dump` of the stuck processes (when py-spy is
    installed), and the GPUs' state. Returns the file written, or None when it could not be written."""
    parts = [f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {reason}\n", "\n## last log lines\n", tail_lines(log)]
    spy = shutil.which("py-spy")
    parts.append("\n## py-spy dump\n")
    if spy is None:
        parts.append("py-spy is not installed (pip install py-spy)\n")
    elif not pids:
        parts.append("no live process to dump\n")
    for pid in pids if spy else []:
        parts.append(f"### pid {pid}\n")
        parts.append(_run([spy, "dump", "--pid", str(pid)], timeout=20))
    parts.append("\n## GPUs\n")
    smi = shutil.which("nvidia-smi")
    parts.append(_run([smi]) if smi else "no nvidia-smi on this machine\n")
    try:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "evidence.txt"
        path.write_text("".join(parts))
        return path
    except OSError:
        return None
