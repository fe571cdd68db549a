"""Stall detection that fits RL, and the evidence saved before a stuck or failed attempt is restarted.

A run is stalled when no new step arrived for max(k x the median step time so far, a floor); before the first step,
and around evaluation and checkpoint saves, a longer grace applies. A log line matching one of the backend's stall
patterns (`Backend.stall_patterns()`: a dead inference server, NCCL timeouts, ...) cuts the wait to the floor.
Where NVML is present and any of the run's GPUs is busy, the run is not stalled by that rule (a long generation is
work, and so is a training step while the rollout GPU idles: seeds 001 and 002 split them).

The inference engine is watched on its own (InferenceWatch): a run whose engine is gone — its GPU's memory dropped
to ~0 after it had loaded, or its process gone — while the run's processes live, or whose engine GPU and trainer GPU
both sit idle, makes no progress (seed 004: vLLM died after step 6, GPU 0 showed 0 MiB, the trainer waited three
hours); without a new step for `inference_idle_s` it is stalled, whatever the generic limit says.

vLLM's own line that its engine failed (rlctl.runs.causes.ENGINE_FAILED) with no step for `engine_failed_s` after it
is a stall too, before any other rule: the engine may fail while its process and memory live on (verl 0.9.1 on an
H100: the Ray actor hosting vLLM lived, the trainer waited with no step), and the first step's grace is long.

Rollouts that fail (the backend's lines for them: `Backend.rollout_failure`) with no step since the first of them are
a stall sign of that kind: counted, and with no step for the stall floor `floor_s` (after a first step: as long as a
step may take, k x the median step time) the attempt is stalled, whatever the first step's grace or a busy GPU say
(prime-rl v0.8.0 on 2 x H100: every rollout failed on an ImportError, its orchestrator logged each and went on).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
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
    inference_idle_s: float = 600.0  # no step while the inference engine is gone, or its GPU and the trainer's idle
    engine_failed_s: float = 300.0  # no step after vLLM said its engine failed (rlctl.runs.causes.ENGINE_FAILED)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> StallConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (d or {}).items() if k in names and v is not None})


@dataclass
class RolloutFailures:
    """The rollouts that failed since the last step (or the attempt's start): when the first did, how many."""

    at: float
    count: int
    first: str  # the first one's error, verbatim
    line: str  # the line that said it, colours removed


class StallDetector:
    def __init__(self, cfg: StallConfig, patterns: list[str], started_at: float, every: tuple[int, ...] = (),
                 rollout_failure: Callable[[str], str | None] | None = None):
        self.cfg = cfg
        self.rollout_failure = rollout_failure  # the backend's reading of a line (Backend.rollout_failure)
        self.rollouts_failed: RolloutFailures | None = None
        self.patterns = [re.compile(p) for p in patterns]
        self.every = tuple(e for e in every if e)
        self.started_at = started_at
        self.last_step: int | None = None
        self.last_step_at: float | None = None
        self.intervals: list[float] = []
        self.pattern_hit: str | None = None
        self.pattern_hit_at: float | None = None
        self.engine_failed: tuple[float, str] | None = None  # (when, vLLM's line) since the last step

    def observe_step(self, step: int | None, now: float) -> None:
        if step is None or (self.last_step is not None and step <= self.last_step):
            return
        if self.last_step_at is not None and self.last_step is not None:
            self.intervals.append((now - self.last_step_at) / max(step - self.last_step, 1))
            self.intervals = self.intervals[-200:]
        self.last_step, self.last_step_at = step, now
        self.pattern_hit = self.pattern_hit_at = None
        self.engine_failed = None  # steps came after it: the engine that failed was not this run's end
        self.rollouts_failed = None  # some rollouts failed, enough of the others made a step

    def observe_log(self, text: str, now: float) -> None:
        if not text:
            return
        from rlctl.runs.causes import engine_failed_line
        from rlctl.runs.tracebacks import split

        for line in text.splitlines():
            if self.engine_failed is None and engine_failed_line(line):
                self.engine_failed = (now, " ".join(x for x in split(line) if x).strip()[:300])
            error = self.rollout_failure(line) if self.rollout_failure is not None else None
            if error and self.rollouts_failed is None:
                self.rollouts_failed = RolloutFailures(now, 1, error[:1000], " ".join(split(line)).strip()[:1000])
            elif error and self.rollouts_failed is not None:
                self.rollouts_failed.count += 1
            for p in self.patterns:
                if p.search(line):
                    if self.pattern_hit is None:
                        self.pattern_hit, self.pattern_hit_at = line.strip()[:300], now
                    break

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

    def idle_limit(self) -> float:
        """How long the inference engine may be gone or idle without a new step: inference_idle_s, with the longer
        grace of a step that saves a checkpoint or evaluates (the trainer writes, the engine waits for weights)."""
        c = self.cfg
        return max(c.inference_idle_s, c.slow_step_s) if self.last_step_at is not None and self._slow_step_next() \
            else c.inference_idle_s

    def engine_failed_stall(self, now: float) -> str | None:
        """vLLM said its engine failed and no step came for engine_failed_s since: the trainer waits for an engine
        that will not answer (verl 0.9.1 on an H100: the Ray actor hosting vLLM lived on, so nothing looked gone),
        whatever the first step's grace or a busy GPU say."""
        if self.engine_failed is None:
            return None
        at, line = self.engine_failed
        limit = self.cfg.engine_failed_s
        if now - at < limit:
            return None
        return (f"the inference engine failed ({line}) and no step came for {now - at:.0f}s after it (limit "
                f"{limit:.0f}s, run.stall.engine_failed_s)")

    def rollouts_limit(self) -> tuple[float, str]:
        """How long rollouts may fail with no step: the floor before the first step (a stall sign cuts the first
        step's grace to it); after one, as long as a step may take (k x the median step time, at least the floor)."""
        if self.last_step_at is None:
            return self.cfg.floor_s, "run.stall.floor_s"
        return self.threshold()[0], "k x the median step time, at least run.stall.floor_s"

    def rollouts_late_s(self) -> float:
        """How old the first failure must be before it is news: at once before the first step; after one, the median
        step time (a few rollouts failing between steps that still come is a run going on)."""
        return statistics.median(self.intervals) if self.last_step_at is not None and self.intervals else 0.0

    def rollouts_failed_stall(self, now: float) -> str | None:
        """Rollouts failed and no step came for rollouts_limit() since the first of them: the trainer waits for a
        batch that does not fill, the orchestrator goes on (prime-rl logs each failure and retries none of them)."""
        seen = self.rollouts_failed
        if seen is None:
            return None
        limit, key = self.rollouts_limit()
        if now - seen.at < limit:
            return None
        return (f"{seen.count} rollouts failed (the first: {seen.first}) and no step came for {now - seen.at:.0f}s "
                f"since (limit {limit:.0f}s, {key})")

    def failure_stall(self, now: float) -> str | None:
        """A stall that is a failure the trainer did not notice: vLLM's engine failed, or the rollouts fail."""
        return self.engine_failed_stall(now) or self.rollouts_failed_stall(now)

    def check(self, now: float, gpus_busy: bool | None = None, watch: InferenceWatch | None = None) -> str | None:
        """A reason when the attempt is stalled, else None."""
        since = self.last_step_at or self.started_at
        failed = self.failure_stall(now)
        if failed is not None:
            return failed
        if self.pattern_hit is not None and now - max(since, self.pattern_hit_at or since) >= self.cfg.floor_s:
            return f"no new step for {now - since:.0f}s after the log said: {self.pattern_hit}"
        if watch is not None:
            limit = self.cfg.inference_idle_s  # an engine that is gone stays gone, checkpoint save or not
            gone = watch.gone()
            if gone is not None and now - max(since, gone[0]) >= limit:
                return (f"the inference engine is gone ({gone[1]}) while the trainer waits: no new step for "
                        f"{now - since:.0f}s (limit {limit:.0f}s, run.stall.inference_idle_s)")
            limit = self.idle_limit()
            idle = watch.idle() if self.last_step_at is not None else None  # loading a model idles GPUs too
            if idle is not None and now - max(since, idle[0]) >= limit:
                return (f"{idle[1]}: no new step for {now - since:.0f}s (limit {limit:.0f}s, "
                        "run.stall.inference_idle_s)")
        limit, what = self.threshold()
        if now - since < limit:
            return None
        if gpus_busy:
            return None
        return f"no new step for {now - since:.0f}s (waiting for {what}; limit {limit:.0f}s)"


GONE_GIB = 0.3  # above what was in use before the run: nothing of the engine left on its GPU (seed 004: 0 MiB)
LOADED_GIB = 1.0  # an engine that held at least this much had loaded


class InferenceWatch:
    """The run's inference engine as the supervisor sees it while the attempt lives: its dedicated GPUs (NVML
    samples: memory used, utilisation) beside the trainer's, and its process (a component's `process` regex)."""

    def __init__(self, inference_gpus: list[int], trainer_gpus: list[int], busy_pct: float = 5.0,
                 process: str | None = None):
        self.inference_gpus = list(inference_gpus)
        self.trainer_gpus = list(trainer_gpus)
        self.busy_pct = busy_pct
        self.process = re.compile(process) if process else None
        self.peak: dict[int, float] = {}
        self.gpu_gone_at: float | None = None
        self.gpu_gone_why = ""
        self.idle_at: float | None = None
        self.idle_why = ""
        self.seen: dict[int, str] = {}  # engine processes seen in this attempt: pid -> command line
        self.proc_gone_at: float | None = None
        self.samples: list[str] = []  # the last NVML samples, as evidence

    @property
    def active(self) -> bool:
        return bool(self.inference_gpus) or self.process is not None

    def observe_gpus(self, now: float, used: dict[int, float], util: dict[int, float | None],
                     before: dict[int, float]) -> None:
        """One NVML sample of the run's GPUs (GiB used, % busy; what was in use before the run)."""
        inf = [i for i in self.inference_gpus if i in used]
        if not inf:
            return
        row = ", ".join(f"GPU {i}: {used[i]:.2f} GiB, {util.get(i) if util.get(i) is not None else '?'}%"
                        for i in sorted(used))
        self.samples = (self.samples + [f"{time.strftime('%H:%M:%S', time.localtime(now))} {row}"])[-6:]
        for i in inf:
            self.peak[i] = max(self.peak.get(i, 0.0), used[i])
        gone = [i for i in inf if self.peak[i] - before.get(i, 0.0) >= LOADED_GIB
                and used[i] - before.get(i, 0.0) <= GONE_GIB]
        if gone:
            if self.gpu_gone_at is None:
                self.gpu_gone_at = now
            i = gone[0]
            self.gpu_gone_why = f"GPU {i} at {used[i]:.2f} GiB, it held {self.peak[i]:.1f}"
        else:
            self.gpu_gone_at = None
        busy = lambda ids: any((util.get(i) or 0) > self.busy_pct for i in ids)  # noqa: E731
        known = all(util.get(i) is not None for i in inf + [t for t in self.trainer_gpus if t in used])
        if known and not busy(inf) and not busy([t for t in self.trainer_gpus if t in used]):
            if self.idle_at is None:
                self.idle_at = now
            self.idle_why = (f"inference GPU {', '.join(map(str, inf))} idle ({used[inf[0]]:.1f} GiB held) and the "
                             f"trainer's GPU {', '.join(str(t) for t in self.trainer_gpus if t in used) or '-'} idle")
        else:
            self.idle_at = None  # generating, or training while the rollout GPU idles: work (seeds 001, 002)

    def observe_processes(self, now: float, cmdlines: dict[int, str]) -> None:
        """The attempt's live processes (pid -> command line)."""
        if self.process is None:
            return
        live = {pid: c for pid, c in cmdlines.items() if self.process.search(c)}
        self.seen.update(live)
        if live or not self.seen:
            self.proc_gone_at = None
        elif self.proc_gone_at is None:
            self.proc_gone_at = now

    def gone(self) -> tuple[float, str] | None:
        """(since when, how) the engine is gone: its process ended, or its GPU's memory dropped to ~0."""
        whys, since = [], []
        if self.proc_gone_at is not None:
            pid, cmd = next(iter(self.seen.items()))
            short = " ".join(a.rsplit("/", 1)[-1] for a in cmd.split())  # paths as their last part
            whys.append(f"its process {pid} `{short[:100]}` is gone")
            since.append(self.proc_gone_at)
        if self.gpu_gone_at is not None:
            whys.append(self.gpu_gone_why)
            since.append(self.gpu_gone_at)
        return (min(since), "; ".join(whys)) if whys else None

    def idle(self) -> tuple[float, str] | None:
        return (self.idle_at, self.idle_why) if self.idle_at is not None else None

    def record(self) -> dict[str, Any]:
        """What state.json keeps (`inference`): rlctl.runs.causes names the cause from it."""
        out: dict[str, Any] = {"gpus": self.inference_gpus, "samples": self.samples}
        g = self.gone()
        if g is not None:
            out["gone"] = {"at": g[0], "summary": g[1], "evidence": [f"NVML {s}" for s in self.samples]
                           + [f"process {p}: {c[:120]}" for p, c in self.seen.items()]}
        i = self.idle()
        if i is not None:
            out["idle"] = {"at": i[0], "summary": i[1], "evidence": [f"NVML {s}" for s in self.samples]}
        return out


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


def save_evidence(out: Path, log: Path, reason: str, pids: list[int],
                  extra: dict[str, str] | None = None) -> Path | None:
    """What to look at after a restart: the last log lines (and each component's: `extra`, e.g. the inference
    log's), `py-spy dump` of the stuck processes (the trainer's stack; when py-spy is installed), and the GPUs'
    state. Returns the file written, or None when it could not be written."""
    parts = [f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {reason}\n", "\n## last log lines\n", tail_lines(log)]
    for title, text in (extra or {}).items():
        parts += [f"\n## {title}\n", text if text.endswith("\n") or not text else text + "\n"]
    # on PATH, else beside this interpreter (a venv's py-spy when the supervisor runs with the venv's python)
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
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
