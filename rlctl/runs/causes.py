"""Why a run died (or hangs), named from evidence it shows: the one place that decides. `status`, `status RUN`,
`--json`, `doctor` and the supervisor's record of each attempt all ask here.

The rules read the run's logs — the trainer's output and each component's own log (rlctl.runs.components: vLLM's
log under OpenRLHF/verl Ray workers, prime-rl's inference server log) — what the supervisor saw while the run lived
(the inference engine's process gone, or its GPU's memory dropped to ~0: state.json `inference`), and the disk. The
first rule that finds evidence names the cause, most specific first: a full disk, out of memory and an illegal memory
access are roots that the other ranks' collective timeouts only follow; a dead inference engine and rollout requests
it refuses are roots of the trainer's wait (and of a timeout it may then hit).

A cause is plain JSON, kept in state.json `cause` (and in each attempt's record):
{"what", "summary", "component", "evidence": ["FILE:LINE: text", ...], "fix"} (+ "checkpoint" for a full disk).
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.core.components import Component

TAIL = 1 << 20  # bytes read from the end of each log: a cause of death is near where the attempt ended
MAX_EVIDENCE = 4
LONG = 200  # characters of an error's message a summary keeps
LOG = "stdout.log"

# CUDA's own text for cudaErrorIllegalAddress (cudaGetErrorString(700)); torch prints "CUDA error: " + it
# (c10/cuda/CUDAException.cpp), NCCL "Cuda failure 'an illegal memory access was encountered'", vLLM re-raises it
ILLEGAL = ("an illegal memory access was encountered", "cudaErrorIllegalAddress")
# PyTorch's NCCL watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL::checkTimeout):
# "[Rank R] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=S, OpType=OP, NumelIn=.., NumelOut=..,
# Timeout(ms)=T) ran for N milliseconds before timing out."
WATCHDOG = re.compile(r"(?:\[(?:PG [^\]]*?)?Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: "
                      r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)[^)]*?Timeout\(ms\)=(?P<limit>\d+)\) ran for "
                      r"(?P<ran>\d+) milliseconds")
NCCL_AFTER = "Some NCCL operations have failed or timed out"
# the inference server refusing rollout requests: vLLM's request validation (0.26: renderers/params.py raises
# VLLMValidationError "This model's maximum context length is ..."; older releases: "'max_tokens' or
# 'max_completion_tokens' is too large"), and the HTTP 400s its access log prints for each refused request
REFUSED = re.compile(r"VLLMValidationError|maximum context length is \d+|'max_tokens' or 'max_completion_tokens' is "
                     r"too large|max_tokens.{0,40}(is too large|cannot be greater than)")
HTTP_400 = re.compile(r'"POST /v1/(chat/)?completions HTTP/[\d.]+" 400')
MANY_400 = 3  # a few refused requests in a row are a pattern; one may be a client's mistake
# vLLM's own words for an engine that failed (vllm 0.24-0.26: v1/engine/core.py "EngineCore failed to start." and
# "EngineCore encountered a fatal error."; v1/engine/utils.py "Engine core initialization failed. See root cause
# above."; v1/executor/multiproc_executor.py "Worker failed with error '...', please check the stack trace above for
# the root cause", "WorkerProc failed", "Worker proc X died unexpectedly"; v1/engine/exceptions.py EngineDeadError
# "EngineCore encountered an issue."; async_llm.py "AsyncLLM output_handler failed."; the V0 engine loop's). Not
# "Invocation of X method failed": one call failed there and the engine goes on.
ENGINE_FAILED = re.compile(r"EngineCore encountered (?:a fatal error|an issue)|EngineCore failed to start|"
                           r"Engine core initialization failed|Worker failed with error|WorkerProc failed|"
                           r"Worker proc \S+ died unexpectedly|EngineDeadError|Engine loop has died|"
                           r"AsyncLLM output_handler failed|RuntimeError: Executor failed")
ROOT_WINDOW = 500  # lines before an engine's fatal line searched for the exception that caused it


def engine_failed_line(text: str) -> bool:
    """vLLM said its engine failed (not rlctl's own line quoting it)."""
    return not text.startswith("rlctl: ") and ENGINE_FAILED.search(text) is not None


OUTPUT = "output"  # the run's stdout.log: what the command rlctl started printed (Logs.lines)
MAIN = Component(OUTPUT, main_log=True, where="the run's stdout.log")


class Logs:
    """The run's components and the tails of their logs, each read once."""

    def __init__(self, run_dir: Path, state: dict[str, Any], light: bool = False):
        from rlctl.runs.components import run_components

        self.run_dir = run_dir
        try:
            self.comps = run_components(run_dir, state, light=light)
        except Exception:
            self.comps = {"trainer": Component("trainer", main_log=True)}
        self._tails: dict[tuple[str, bool], list[tuple[str, int | None, str]]] = {}
        attempts = state.get("attempts") if isinstance(state.get("attempts"), list) else []
        last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
        # where the current attempt began writing the run's stdout.log (recorded when it started)
        self.since = last.get("log_offset") if type(last.get("log_offset")) is int else 0

    def lines(self, name: str, current: bool = False) -> list[tuple[str, int | None, str]]:
        """The component's last lines; `current`: only those the current attempt wrote to the run's stdout.log."""
        if (name, current) not in self._tails:
            from rlctl.runs.components import tail

            comp = self.comps.get(name) or (MAIN if name == OUTPUT else None)
            try:
                self._tails[name, current] = tail(self.run_dir, comp, TAIL, self.since if current else 0) \
                    if comp is not None else []
            except Exception:
                self._tails[name, current] = []
        return self._tails[name, current]

    def search(self, match: Callable[[str], bool], names: tuple[str, ...] = ("trainer", "inference")
               ) -> list[tuple[str, str]]:
        """(component, "FILE:LINE: text") of every matching line, trainer's first."""
        out = []
        for name in names:
            for src, n, text in self.lines(name):
                if match(text):
                    out.append((name, evidence_line(src, n, text)))
        return out


def evidence_line(src: str, n: int | None, text: str) -> str:
    """"FILE:LINE: text" (a Ray actor's prefix stays: it says which process printed the line; colours go)."""
    clean = re.sub(r"\x1b\[[0-9;]*m", "", text).strip()
    return f"{src}:{n}: {clean[:400]}" if n else f"{src}: {clean[:400]}"


def _cause(what: str, summary: str, component: str, evidence: list[str], fix: str, **extra: Any) -> dict[str, Any]:
    return {"what": what, "summary": summary, "component": component, "evidence": evidence[:MAX_EVIDENCE],
            "fix": fix, **extra}


# ---- the rules, most specific first ------------------------------------------------------------------------------
def disk_full(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    from rlctl.runs.disk_full import find_cause

    found = find_cause(run_dir, state)
    if found is None:
        return None
    ck = found.get("checkpoint")
    return _cause("disk full", "disk full" + (f" while saving {ck}" if ck else ""), "disk", found["evidence"],
                  "free space where the run writes (or set checkpoint.min_free_gb and keep_last: rlctl prunes before a "
                  "checkpoint would not fit), then rlctl resume RUN", checkpoint=ck)


def out_of_memory(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    from rlctl.metrics.oom import SIGNS, find_oom

    hits = logs.search(lambda t: any(needle in t for needle, _ in SIGNS))
    if not hits:
        return None
    component, line = hits[-1]
    oom = find_oom(run_dir / "stdout.log")
    for f in _files(run_dir, logs.comps.get(component)):
        oom = find_oom(f) or oom
    what = f"{oom.what}" + (f": {oom.detail}" if oom and oom.detail else "") if oom else "out of memory"
    where = " in the inference engine" if component == "inference" else ""
    return _cause("out of memory", f"out of memory{where} ({what})", component, [line],
                  "the same recipe runs out again: change it (preflight's memory checks say what fits; `rlctl status "
                  "RUN` puts the measured peak next to the plan), rather than raising --max-restarts")


def illegal_memory_access(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    hits = logs.search(lambda t: any(s in t for s in ILLEGAL))
    if not hits:
        return None
    component = hits[0][0]
    return _cause("cuda illegal memory access",
                  "CUDA illegal memory access (cudaErrorIllegalAddress)" + (" in the inference engine"
                                                                            if component == "inference" else ""),
                  component, [h for _, h in hits],
                  "a kernel read or wrote outside its memory: rerun with CUDA_LAUNCH_BLOCKING=1 to name the kernel; a "
                  "restart may pass, a repeat at the same step is a bug (a custom kernel, attention, the vLLM build)")


def _gone(state: dict[str, Any]) -> dict[str, Any] | None:
    """What the supervisor saw of the engine going (its process ended, its GPU's memory at ~0)."""
    seen = state.get("inference") if isinstance(state.get("inference"), dict) else {}
    return seen.get("gone") if isinstance(seen.get("gone"), dict) else None


def inference_failed(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    """vLLM's own line that its engine failed, in this attempt's output (the engine's log first, then the trainer's:
    a colocated engine prints there), named with the exception that caused it: the traceback vLLM's line points at
    ("see root cause above"), or the one it logged right after it."""
    from rlctl.runs.tracebacks import tracebacks

    for name in ("inference", "trainer"):
        lines = logs.lines(name, current=True)
        hits = [i for i, (_, _, t) in enumerate(lines) if engine_failed_line(t)]
        if hits:
            break
    else:
        return None
    # the first line of the last burst: what followed it is the engine going down (an engine's own log file holds
    # every attempt's; the run's stdout.log is read from the current attempt's start)
    k = len(hits) - 1
    while k and hits[k] - hits[k - 1] <= ROOT_WINDOW:
        k -= 1
    fatal = hits[k]
    lo = max(fatal - ROOT_WINDOW, 0)
    tbs = tracebacks([t for _, _, t in lines[lo:fatal + ROOT_WINDOW]])
    # a message vLLM logs with its traceback (logger.exception) comes right before it; "see the stack trace above
    # for the root cause" (a RuntimeError ending the engine's own traceback) after the worker's
    after = [r for tb in tbs if 0 < tb.start + lo - fatal <= 2 for r in tb.raised[-1:]
             if not engine_failed_line(r.text)]
    before = [r for tb in tbs for r in tb.raised if r.index + lo < fatal and not engine_failed_line(r.text)]
    root = after[0] if after else max(before, key=lambda r: r.index) if before else None
    src, n, text = lines[fatal]
    evidence = []
    if root is not None:
        rs, rn, rt = lines[root.index + lo]
        evidence.append(evidence_line(rs, rn, rt))
    evidence.append(evidence_line(src, n, text))
    gone = _gone(state)
    evidence += [str(e) for e in (gone or {}).get("evidence") or []]
    if root is not None:
        where = root.where()
        what = root.short if len(root.short) <= 160 else root.short[:159] + "…"
        summary = f"the inference engine failed: {what}" + (f" (raised in {where})" if where else "")
    else:
        from rlctl.runs.tracebacks import split

        summary = f"the inference engine failed (vLLM: {split(text)[1].strip()[:200]})"
    return _cause("inference engine failed", summary, "inference", evidence,
                  "the first evidence line is what the engine raised (`rlctl logs RUN --component inference` shows its "
                  "traceback); a restart meets it again unless that changes. rlctl restarts a run whose engine failed "
                  "and logs no step for run.stall.engine_failed_s, as [run] restart says, but not into the same "
                  "failure twice")


def inference_dead(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    gone = _gone(state)
    if gone is None:
        return None
    evidence = [str(e) for e in gone.get("evidence") or []]
    how = gone.get("summary") or "its process is gone"
    return _cause("inference engine dead", f"the inference engine died ({how}) while the trainer waited",
                  "inference", evidence,
                  "restart from the last checkpoint ([run] restart = \"on-stall\" does it); a repeat: `rlctl logs RUN "
                  "--component inference` shows why the engine died (seed 004 raised ulimit -n to 65536)")


def rollouts_refused(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    if "inference" not in logs.comps:
        return None
    refused = [evidence_line(s, n, t) for s, n, t in logs.lines("inference") if REFUSED.search(t)]
    http = [evidence_line(s, n, t) for s, n, t in logs.lines("inference") if HTTP_400.search(t)]
    if not refused and len(http) < MANY_400:
        return None
    first = refused[-1] if refused else http[-1]
    detail = re.sub(r"^.*?(VLLMValidationError: |ValueError: |Error: )", "", first.split(": ", 1)[-1]) \
        if refused else "the server answered 400 Bad Request"
    count = f"{len(http)} requests answered 400 Bad Request; " if http else ""
    return _cause("rollout requests refused",
                  f"rollouts refused by the inference server ({count}{detail[:240]})", "inference",
                  ([refused[-1]] if refused else []) + http[-2:],
                  "rollout.max_tokens plus the prompt must fit model.max_model_len: lower rollout.max_tokens (or "
                  "data.max_prompt_tokens) or raise model.max_model_len; `rlctl preflight` checks it before a run")


def rollouts_failing(run_dir: Path, state: dict[str, Any], logs: Logs, now: float | None = None
                     ) -> dict[str, Any] | None:
    """Rollouts failed and no step completed since the first of them, as the supervisor counted them from the
    backend's lines (state.json `rollouts_failed`, cleared by a step): an orchestrator that logs each failure and goes
    on leaves nothing that exits, and a trainer that waits for a batch that never fills. `now`: a run still running,
    said once the first failure is older than its `late_s` (at once before the first step; after one, the median
    step time)."""
    seen = state.get("rollouts_failed") if isinstance(state.get("rollouts_failed"), dict) else None
    if seen is None or not seen.get("first"):
        return None
    at, late = seen.get("at"), seen.get("late_s")
    if now is not None and isinstance(at, (int, float)) and isinstance(late, (int, float)) and now - at < late:
        return None
    first = str(seen["first"])
    first = first if len(first) <= LONG else first[:LONG - 1] + "…"
    component = "orchestrator" if "orchestrator" in logs.comps else "trainer"
    return _cause("rollouts failing", f"rollouts fail and no step completes: {seen.get('count')} failed, the first: "
                                      f"{first}", component,
                  [evidence_line(LOG, None, str(seen["line"]))] if seen.get("line") else [],
                  "every rollout meets the first error (an environment's dependency or code, the inference server); "
                  "the orchestrator logs each and goes on, so no step completes: fix that, then `rlctl resume RUN`. "
                  "rlctl stops an attempt whose rollouts fail with no step for run.stall.floor_s (after a first "
                  "step: as long as a step may take) and restarts it as [run] restart says, but not into the same "
                  "failure twice")


def nccl_timeout(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    hits = logs.search(lambda t: "Watchdog caught collective operation timeout" in t)
    if not hits:
        return None
    m = WATCHDOG.search(hits[0][1])
    detail = (f"{m['op']} (SeqNum {m['seq']}) ran {m['ran']} ms, limit {m['limit']} ms"
              + (f", rank {m['rank']}" if m["rank"] else "")) if m else "a collective timed out"
    after = [h for _, h in logs.search(lambda t: NCCL_AFTER in t)][:1]
    ranks: dict[str, str] = {}
    for _, h in hits:
        r = WATCHDOG.search(h)
        ranks.setdefault(r["rank"] if r and r["rank"] else h, h)
    return _cause("nccl timeout", f"NCCL timeout: {detail}", hits[0][0], list(ranks.values())[:3] + after,
                  "a rank stopped taking part in a collective: the other ranks' last lines and stacks "
                  "(attempts/N/evidence.txt) say where it waits; raise the timeout only when a step legitimately "
                  "takes that long (a long generation, a checkpoint save)")


def exited(state: dict[str, Any]) -> bool:
    """The current attempt ended on its own: its command exited (rlctl did not end it for a stall; it does not run
    on). What the supervisor saw of an attempt's progress while it lived (idle GPUs) says why one hangs, not why one
    exited: a process that died at its first import leaves GPUs idle that nothing was ever loaded on."""
    attempts = state.get("attempts") if isinstance(state.get("attempts"), list) else []
    last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
    return last.get("exit_code") is not None and not last.get("stall")


def inference_idle(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    seen = state.get("inference") if isinstance(state.get("inference"), dict) else {}
    idle = seen.get("idle") if isinstance(seen.get("idle"), dict) else None
    if idle is None or exited(state):
        return None
    return _cause("inference engine idle", f"{idle.get('summary') or 'the inference engine idled'}, no progress",
                  "inference", [str(e) for e in idle.get("evidence") or []],
                  "the engine and the trainer each wait for the other: `rlctl logs RUN --component inference` and "
                  "the trainer's stack (attempts/N/evidence.txt) show where")


# what the command backend's runner prints (and exits 2) when checkpoint.resume names a step its directory lacks
RESUME_MISSING = re.compile(r"no complete checkpoint of step (?P<step>\d+) in (?P<dir>\S.*?)\s*$")


def resume_missing(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    """The step the recipe resumes from is not there: the trainer never started. The fix is the recipe's key."""
    hits = logs.search(lambda t: RESUME_MISSING.search(t) is not None, ("trainer",))
    if not hits:
        return None
    m = RESUME_MISSING.search(hits[-1][1])
    if m is None:
        return None
    key = f"checkpoint.resume = {m['step']}"
    src = state.get("recipe")
    if isinstance(src, str) and src:
        from rlctl.recipe.loader import locate

        try:
            line = locate(Path(src).read_text(errors="replace"), "checkpoint.resume")
        except (OSError, ValueError):
            line = None
        key += f" ({src}:{line})" if line else f" ({src} or a --set)"
    return _cause("resume checkpoint missing", f"no complete checkpoint of step {m['step']} to resume from",
                  hits[-1][0], [hits[-1][1]],
                  f"{key} names a step {m['dir']} does not have: set it to one there is (rlctl ckpt list RUN) or "
                  "\"latest\", or resume a run's checkpoint with rlctl launch RECIPE --resume RUN (preflight's "
                  "checkpoint.resume check says this before a launch)")


NEW_ATTEMPT = re.compile(r"^rlctl: (attempt \d+|restarting|resumed)")


def exception(run_dir: Path, state: dict[str, Any], logs: Logs) -> dict[str, Any] | None:
    """The last: the trainer died of a Python exception its log shows (a reward function that raised, a missing
    module, a bad config value), said with the innermost exception line of its last traceback — through Ray's
    RayTaskError chain, and where that line relays another process's error (a Ray actor's, vLLM's engine's), that
    process's own line — and the frame that raised it, unless a later attempt started after it. A trainer that logs
    to a file of its own may never have started: then the output of the command rlctl started (the run's stdout.log)
    holds the traceback (a launcher that failed at an import)."""
    from rlctl.runs.tracebacks import relayed_from, tracebacks

    own = logs.comps.get("trainer")
    apart = own is None or not (own.main_log or own.ray_actors)  # its lines are not the run's stdout.log's
    for name in ("trainer",) + ((OUTPUT,) if apart else ()):
        lines = logs.lines(name, current=True)
        tbs = tracebacks([t for _, _, t in lines])
        if tbs:
            break
    else:
        return None
    last = max(tbs, key=lambda tb: tb.innermost.index)  # type: ignore[union-attr]
    inner = last.innermost
    assert inner is not None
    if any(NEW_ATTEMPT.match(t) for _, _, t in lines[inner.index:]):
        return None
    src, n, text = lines[inner.index]
    evidence = [evidence_line(src, n, text)]
    root, component = inner, "trainer"
    others = [tb for tb in tbs if tb is not last]
    inf = logs.lines("inference", current=True) if "inference" in logs.comps else []
    from_inf = tracebacks([t for _, _, t in inf])
    origin = relayed_from(inner, others + from_inf)
    if origin is not None:
        root = origin
        if any(origin is r for tb in from_inf for r in tb.raised):
            component = "inference"
            os_, on, ot = inf[origin.index]
        else:
            os_, on, ot = lines[origin.index]
        evidence.insert(0, evidence_line(os_, on, ot))
    msg = root.short if len(root.short) <= LONG else root.short[:LONG - 1] + "…"
    where = root.where()
    return _cause("exception", msg + (f" (raised in {where})" if where else ""), component, evidence,
                  "the traceback above it in `rlctl logs RUN` says where it was raised; fix that, then "
                  "rlctl resume RUN", **({"raised_in": where} if where else {}))


RULES: tuple[tuple[str, Callable[[Path, dict[str, Any], Logs], dict[str, Any] | None]], ...] = (
    ("disk full", disk_full),
    ("out of memory", out_of_memory),
    ("cuda illegal memory access", illegal_memory_access),
    ("inference engine failed", inference_failed),
    ("inference engine dead", inference_dead),
    ("rollout requests refused", rollouts_refused),
    ("rollouts failing", rollouts_failing),
    ("nccl timeout", nccl_timeout),
    ("inference engine idle", inference_idle),
    ("resume checkpoint missing", resume_missing),
    ("exception", exception),
)


# what the supervisor saw of an attempt's progress while it lived: of an attempt that exited on its own, a cause only
# where its log names none (the exception it printed comes first; GPUs idle are none: inference_idle)
NO_PROGRESS = ("rollouts failing",)


def _files(run_dir: Path, comp: Component | None) -> list[Path]:
    from rlctl.runs.components import files_of

    return files_of(run_dir, comp) if comp is not None else []


def find(run_dir: Path, state: dict[str, Any] | None = None, light: bool = False) -> dict[str, Any] | None:
    """The cause of the run's end (or hang), or None when nothing it shows names one. `light`: never parse the
    run's recipe to find its components (the status table's fast path)."""
    from rlctl.core.state import read_state

    state = read_state(run_dir) if state is None else state
    logs = Logs(run_dir, state, light)
    rules = RULES
    if exited(state):
        rules = tuple(r for r in RULES if r[0] not in NO_PROGRESS) + tuple(r for r in RULES if r[0] in NO_PROGRESS)
    for _, rule in rules:
        try:
            found = rule(run_dir, state, logs)
        except Exception:  # a damaged log or state never breaks status
            found = None
        if found is not None:
            return found
    return None


def settle(run_dir: Path, state: dict[str, Any], status: str, light: bool = False
           ) -> tuple[str, dict[str, Any] | None]:
    """(status, cause) of a run as status shows it. A run that ended failed, or lost with its disk full, says why
    (found once, then kept in state.json when the disk lets rlctl write it); a stalled run says why it waits."""
    cached = state.get("cause")
    if status == "stopped":  # rlctl stopped it (a disk that could not hold the next checkpoint) and said why
        return status, cached if isinstance(cached, dict) else None
    if status == "running":  # an engine that failed, or rollouts that fail, said at once while the trainer waits
        # its supervisor reads every line: none said the engine failed, or a step came after it
        engine = not (_watched(state) and not isinstance(state.get("engine_failed"), dict))
        if not engine and not isinstance(state.get("rollouts_failed"), dict):
            return status, None
        try:
            logs = Logs(run_dir, state, light)
            failed = inference_failed(run_dir, state, logs) if engine else None
            return status, failed or rollouts_failing(run_dir, state, logs, time.time())
        except Exception:
            return status, None
    if status not in ("failed", "lost", "stalled"):
        return status, None
    if isinstance(cached, dict) and status != "stalled":
        return ("failed" if cached.get("what") == "disk full" else status), cached
    attempts = state.get("attempts") if isinstance(state.get("attempts"), list) else []
    last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
    if isinstance(last.get("cause"), dict) and status == "failed":  # named by the supervisor when it ended
        return status, last["cause"]
    cause = find(run_dir, state, light)
    if cause is None or status == "stalled":
        return status, cause
    from rlctl.core.state import write_state

    disk = cause["what"] == "disk full"
    with contextlib.suppress(OSError):  # a disk still full: said now, written once there is room
        write_state(run_dir, cause=cause, **({"status": "failed"} if disk else {}),
                    **({"settled_by": "disk full (its outcome could not be written)"} if disk and status == "lost"
                       else {}))
    return ("failed" if disk else status), cause


def _watched(state: dict[str, Any]) -> bool:
    """A live supervisor follows the current attempt's output (it records where that began): what it saw of vLLM's
    engine is in state.json `engine_failed`, cleared again when a step follows."""
    from rlctl.core.state import process_alive

    attempts = state.get("attempts") if isinstance(state.get("attempts"), list) else []
    last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
    return type(last.get("log_offset")) is int and bool(state.get("supervisor_pid")) and \
        process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time"))


def say(cause: dict[str, Any] | None, host: str | None = None) -> str | None:
    """The cause in a few words, for the status table: "disk full on HOST while saving checkpoint-N" (HOST: the
    host's name as hosts.toml has it, else this machine's), else the cause's summary."""
    if not isinstance(cause, dict):
        return None
    if cause.get("what") == "disk full":
        from rlctl.runs.disk_full import full_while

        if cause.get("checkpoint"):
            return full_while(f"saving {cause['checkpoint']}", host)
        return f"disk full on {host or socket.gethostname()}"
    if cause.get("what") == "disk pressure":  # rlctl stopped it before its disk filled (rlctl.runs.disk_pressure)
        return f"out of disk on {host or socket.gethostname()}: {cause.get('summary')}"
    summary = cause.get("summary")
    return str(summary) if summary else str(cause.get("what") or "") or None


def signature(cause: Any) -> str | None:
    """What stays the same when a failure repeats: the kind and summary of a cause without what changes from one
    attempt to the next (process ids, addresses, numbers, the contents of a printed set or list). None: no cause."""
    if not isinstance(cause, dict) or not cause.get("what"):
        return None
    text = str(cause.get("summary") or "")
    text = re.sub(r"\{[^}]*\}?|\[[^\]]*\]?", "{}", text)  # a printed collection (a set's order varies per process)
    text = re.sub(r"0x[0-9a-fA-F]+|\d+", "N", text)
    return f"{cause['what']}: {' '.join(text.split())}"
