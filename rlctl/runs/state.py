"""A run's true status: its recorded state settled by its executor (the processes or job behind it), its metrics
ingested, stalls told apart from progress. The state file itself and the run handle live on the floor, in
rlctl.runs.state; they are re-exported here for the callers that know this module."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.core.state import *  # noqa: F403  (re-exported)
from rlctl.core.state import ACTIVE, read_state


@dataclass
class RunStatus:
    name: str
    path: Path
    state: dict[str, Any]
    status: str  # running | finished | failed | stopped | stalled | lost | starting
    step: int | None
    total: int | None
    latest: dict[str, Any]
    last_step_time: float | None
    records: list[dict[str, Any]] = field(default_factory=list)  # the tail of metrics.jsonl that was read
    cause: dict[str, Any] | None = None  # why a failed run failed, when rlctl can tell (rlctl.runs.disk_full)

    @property
    def attempts(self) -> list[dict[str, Any]]:
        """The recorded attempts, the last one ended as the run is when it is not running any more (killed with its
        supervisor: nobody wrote the end down, and `lost` or the settled outcome decides it, as it does the header)."""
        out = [a for a in self.state.get("attempts") or [] if isinstance(a, dict)]
        if out and self.status not in ACTIVE + ("stalled", "unreachable") and out[-1].get("outcome") is None:
            out[-1] = {**out[-1], "outcome": self.status}
        return out

    def _ran(self, a: dict[str, Any], now: float, next_start: float | None = None) -> float | None:
        """How long attempt `a` ran; `next_start`: when the attempt after it began."""
        start, end = a.get("started_at"), a.get("ended_at")
        if not _num(start):
            return None
        if not _num(end):
            if _num(next_start):  # ended unrecorded before the next attempt began (recorded before rlctl wrote a
                end = next_start  # lost attempt's last sign of life): at the next attempt's start at the latest
            elif self.status in ACTIVE + ("stalled",):
                end = now  # the current attempt, running
            else:  # the last attempt, ended unrecorded: the run's end, else its last sign of life
                end = self.state.get("ended_at") or last_sign_of_life(self.path, a, self.last_step_time, now)
        return max(end - start, 0.0) if _num(end) else None

    @property
    def elapsed(self) -> float | None:
        """The time the run's attempts ran: a run stopped for an hour and resumed did not train in that hour. What
        came before its first recorded attempt counts whole (the launch; a pool run's generations on other hosts)."""
        now = time.time()
        start = self.state.get("started_at")
        attempts = self.attempts
        ran = [self._ran(a, now, attempts[i + 1].get("started_at") if i + 1 < len(attempts) else None)
               for i, a in enumerate(attempts)]
        if ran and None not in ran:
            first = attempts[0].get("started_at")
            lead = max(first - start, 0.0) if _num(start) and _num(first) else 0.0
            return lead + sum(r for r in ran if r is not None)
        if not start:  # no attempts recorded (a run rlctl follows but did not start)
            return None
        end = self.state.get("ended_at") if self.status not in ACTIVE + ("stalled",) else None
        return (end or now) - start

    @property
    def wall(self) -> float | None:
        """From launch to the run's end (or now, while it goes on): what a GPU bill counts, lost and stopped time
        included, beside `elapsed` (the time the attempts ran)."""
        start = self.state.get("started_at")
        if not _num(start):
            return None
        end = self.state.get("ended_at") if self.status not in ACTIVE + ("stalled",) else None
        return max((end if _num(end) else time.time()) - start, 0.0)

    @property
    def this_attempt(self) -> float | None:
        """How long the current attempt has run, when the run has had more than one."""
        if len(self.attempts) < 2 or self.status not in ("running", "stalled"):
            return None
        return self._ran(self.attempts[-1], time.time())

    @property
    def eta(self) -> float | None:
        """From the current attempt's own step rate (its steps since the checkpoint it started from): neither a
        stopped gap nor an earlier attempt's pace counts."""
        if self.status not in ("running", "stalled") or not self.step or not self.total:
            return None
        left = max(self.total - self.step, 0)
        if self.attempts:
            last = self.attempts[-1]
            frm = last.get("from_step") if _num(last.get("from_step")) else 0
            ran = self._ran(last, time.time())
            if self.step > frm and ran:
                return ran / (self.step - frm) * left
            return None  # no step of this attempt yet: no rate to tell from
        return self.elapsed / self.step * left if self.elapsed else None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def last_sign_of_life(run_dir: Path, attempt: dict[str, Any], last_step_time: float | None = None,
                      until: float | None = None) -> float | None:
    """When an attempt that ended unrecorded (everything killed at once: `lost`) was last seen alive: the newest of
    its last log line (the mtime of the files its trainer writes: stdout.log, a backend's metrics file, an attached
    run's logs), what its supervisor last wrote of it (attempts/<n>/) and its last step's record; never before it
    started nor after `until` (the resume that starts the next attempt). None: nothing tells."""
    from rlctl.core.state import attempt_dir
    from rlctl.metrics.stream import log_files

    start = attempt.get("started_at")
    seen = [last_step_time] if _num(last_step_time) else []
    paths = [run_dir / n for n in log_files(run_dir)]
    if isinstance(attempt.get("attempt"), int):
        adir = attempt_dir(run_dir, attempt["attempt"])
        with contextlib.suppress(OSError):
            paths += list(adir.iterdir())
    for p in paths:
        with contextlib.suppress(OSError):
            seen.append(p.stat().st_mtime)
    if _num(start):  # nothing newer than its start: it died as it began
        seen = [t for t in seen if t >= start] or [start]
    if not seen:
        return None
    end = max(seen)
    return min(end, until) if _num(until) else end


def settled_status(run_dir: Path, state: dict[str, Any] | None = None) -> str:
    """The run's true status, as its executor tells from the processes or job behind it (and the exit record the
    wrapper left where the child ended). Never imports an executor's runtime."""
    state = read_state(run_dir) if state is None else state
    status = state.get("status", "unknown")
    if status not in ACTIVE:
        return status
    from rlctl import executors

    name = state.get("executor")
    if name not in executors.registry():
        name = "local"  # e.g. a run rlctl follows but did not start: its processes still tell
    return executors.get(name).status(run_dir, state)


def true_status(run_dir: Path, state: dict[str, Any], last_step_time: float | None,
                stall_after: float) -> str:
    status = settled_status(run_dir, state)
    reference = last_step_time or state.get("started_at")
    if status == "running" and reference and time.time() - reference > stall_after:
        return "stalled"
    if status == "running" and any(failed_stall(state, key, last_step_time) for key in FAILURES):
        return "stalled"
    return status


# what the supervisor records of a failure the trainer does not notice: vLLM said its engine failed; rollouts failed
FAILURES = ("engine_failed", "rollouts_failed")


def failed_stall(state: dict[str, Any], key: str, last_step_time: float | None, now: float | None = None) -> bool:
    """The supervisor recorded a failure the trainer does not notice (state.json `key`: when, the limit) and no step
    came for that limit since: stalled, whether or not the restart policy acts on it."""
    seen = state.get(key)
    if not isinstance(seen, dict) or not _num(seen.get("at")) or not _num(seen.get("limit_s")):
        return False
    if last_step_time is not None and last_step_time > seen["at"]:
        return False
    return (now or time.time()) - seen["at"] >= seen["limit_s"]


def _elsewhere(state: dict[str, Any]) -> bool:
    """The run lives on another machine (its executor says so)."""
    from rlctl import executors

    name = state.get("executor")
    return name in executors.registry() and bool(getattr(executors.get(name), "remote", False))


def run_status(run_dir: Path, stall_after: float = 1800.0, ingest: bool = True) -> RunStatus:
    from rlctl.metrics.stream import METRICS, by_step, is_progress, tail_records
    from rlctl.metrics.stream import ingest as do_ingest

    state = read_state(run_dir)
    if state.get("status") in ACTIVE:
        with contextlib.suppress(Exception):
            # the executor settles the outcome (and copies a remote job's new logs when nobody follows it), so
            # the ingest below sees everything and true_status reads the settled state
            settled_status(run_dir, state)
            state = read_state(run_dir)
    elif state.get("status") == "attached" and _elsewhere(state):
        with contextlib.suppress(Exception):  # a run rlctl follows on another machine: its log may have grown there
            from rlctl import executors

            executors.get(state["executor"]).catch_up_logs(run_dir, state)
            state = read_state(run_dir)
    if ingest and state.get("backend"):
        with contextlib.suppress(Exception):  # status must answer even on a damaged run directory
            do_ingest(run_dir, state["backend"], final=state.get("status") not in ACTIVE)
    records = tail_records(run_dir / METRICS)
    merged = by_step(records)
    step = max(merged) if merged else None
    if step is None and type(state.get("nothing_left_at")) is int:  # resumed from its final checkpoint: no records
        step = state["nothing_left_at"]
    latest = merged.get(step, {})
    # the last step the trainer logged: rlctl's own records (GPU samples, evals) are no step (a damaged record's
    # time, null or text, is none)
    times = [t for r in records if isinstance(t := r.get("time"), (int, float)) and not isinstance(t, bool)
             and is_progress(r)]
    last_time = max(times, default=None)
    status = true_status(run_dir, state, last_time, stall_after)
    summ = state.get("remote_summary") if isinstance(state.get("remote_summary"), dict) else {}
    if _elsewhere(state) and status in ("stalled", "running"):  # a live run's host told why it waits (its poll)
        told = summ.get("cause")
        cause = told if isinstance(told, dict) else None
    else:  # an ended run, on any executor: the one place that decides (state.json, the last attempt, the logs)
        from rlctl.runs.causes import settle

        status, cause = settle(run_dir, state, status)
    return RunStatus(run_dir.name, run_dir, state, status, step, state.get("total_steps"), latest, last_time,
                     records, cause)
