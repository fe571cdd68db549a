"""`rlctl status`: the table of runs, or one run in detail. Reads metrics from the end: fast on huge logs."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from rlctl.core.sizes import human_bytes
from rlctl.runs.state import RunStatus, find_run, read_state, run_status
from rlctl.ui.progress import fmt_duration, fmt_num

ENDED = ("finished", "failed", "stopped")  # a run's outcome: it changes no more
KEY_METRICS = ("reward/mean", "correctness", "kl", "entropy", "grad_norm", "policy_loss", "response_length/mean",
               "response_length/clip_ratio", "clip_ratio", "lr")


def summary(rs: RunStatus) -> dict[str, Any]:
    from rlctl.runs.causes import say

    return {
        "name": rs.name, "backend": rs.state.get("backend"), "status": rs.status, "step": rs.step,
        "total_steps": rs.total, "reward": rs.latest.get("reward/mean"), "elapsed_s": rs.elapsed, "eta_s": rs.eta,
        "wall_s": rs.wall, "started_at": rs.state.get("started_at"), "ended_at": rs.state.get("ended_at"),
        "exit_code": rs.state.get("exit_code"), "path": str(rs.path), "host": rs.state.get("host"),
        "reason": say(rs.cause, rs.state.get("host")), "cause": rs.cause,
    }


def gpu_stats() -> list[dict[str, Any]] | None:
    """GPU memory and utilisation through NVIDIA's management library, when it is there."""
    from rlctl.core.gpus import nvml_rows

    try:
        return [{k: r[k] for k in ("index", "memory_used_gib", "memory_total_gib", "utilization")}
                for r in nvml_rows(utilization=True)]
    except Exception:  # no pynvml, or no driver
        return None


def detail(rs: RunStatus, window: int = 40) -> dict[str, Any]:
    from rlctl.estimate.schedules import sparkline
    from rlctl.metrics.stream import by_step, ingest_stats
    from rlctl.runs.checkpoints import find_checkpoints
    from rlctl.runs.health import health_flags, series

    merged = by_step(rs.records)  # the tail run_status already read: status never reads the whole stream
    metrics = {}
    for key in KEY_METRICS:
        s = series(merged, key)
        if s:
            vals = [v for _, v in s[-window:]]
            metrics[key] = {"latest": vals[-1], "first": vals[0], "trend": sparkline(vals, width=min(window, 30))}
    ckpts = find_checkpoints(rs.state.get("backend", ""), rs.path)
    ing = ingest_stats(rs.path)
    from rlctl.metrics.gpu import verdict_line as gpu_verdict  # measured peak (NVML) next to the plan

    doctor = None
    try:
        from rlctl.runs.doctor import headline

        doctor = headline(rs.path, rs.records)
    except Exception:
        doctor = None
    return {
        **summary(rs),
        "metrics": metrics,
        "evals": eval_lines(rs, merged),
        "eval_failures": standing_failures(rs.path, rs.state) + by_hand_failures(rs.path),
        "eval_stopped": stopped_evals(rs.path),
        "stopped_by": _dict(rs.state.get("stopped_by")),
        "best_checkpoint": _dict(rs.state.get("best_checkpoint")),
        "health": [f.__dict__ for f in health_flags(merged)],
        "doctor": doctor,
        "checkpoints": [{"step": c.step, "complete": c.complete, "bytes": c.size(), "path": str(c.path)}
                        for c in ckpts],
        "ingest": {"lines": ing.lines, "records": ing.records, "skipped": ing.skipped, "restarts": ing.restarts},
        "gpus": None if _elsewhere(rs.state) else gpu_stats(),  # this machine's GPUs are not the run's
        # the last one ended as the header says, where nobody wrote its end; a pool run's, each generation's
        "attempts": _pool_attempts(rs),
        "this_attempt_s": rs.this_attempt,
        "restart": rs.state.get("restart"),
        "gave_up": rs.state.get("gave_up"),
        "disk_full": rs.state.get("disk_full")
        or ("; ".join(rs.cause["evidence"]) if rs.cause and rs.cause.get("what") == "disk full" else None)
        or (None if _elsewhere(rs.state) else _disk_full_now(rs)),  # a host's disk is measured there
        "gpu_memory": gpu_verdict(rs.path),
        "last_step_age_s": (time.time() - rs.last_step_time) if rs.last_step_time else None,
        "unreachable": rs.state.get("unreachable") if rs.status == "unreachable" else None,
        # what the supervisor sees of the inference engine while the run lives (gone, or idle beside the trainer)
        "inference": _dict(rs.state.get("inference")) if rs.status in ("running", "stalled") else None,
        # vLLM's line that its engine failed, as the supervisor read it (when, the line, the stall limit)
        "engine_failed": _dict(rs.state.get("engine_failed")) if rs.status in ("running", "stalled") else None,
        # the rollouts that failed since the last step, as the supervisor counted them (when, how many, the first)
        "rollouts_failed": _dict(rs.state.get("rollouts_failed")) if rs.status in ("running", "stalled") else None,
        "where": _executor_lines(rs),
        "pool": _dict(rs.state.get("pool")) and {k: rs.state["pool"].get(k) for k in
                                                  ("hosts", "failover_after_s", "sync", "on_event")},
        "lineage": _lineage(rs.state),
        "supervisor_gone": _supervisor_gone(rs),
        "sync": _sync(rs.path, ckpts),
        "next": way_forward(rs, ckpts),
    }


def way_forward(rs: RunStatus, ckpts: list[Any]) -> str | None:
    """What to type next for a run that needs a hand, from one place (status RUN's `next:` line, --json `next`): a
    run going on without its supervisor, or lost (everything killed at once), is picked up by `rlctl resume` (a
    variant of an experiment whose queue is dead: by `rlctl experiment resume EXP`, which also launches the variants
    still queued); a run that failed or stalled of a cause rlctl names has that cause's fix; None: nothing to do
    (or nothing known)."""
    gone = _supervisor_gone(rs)
    if gone:
        exp = _dead_experiment(rs.path)
        return (f"rlctl experiment resume {exp} (its queue is dead: it adopts {rs.path.name} and launches the "
                "variants still queued)") if exp else str(gone["fix"])
    if rs.status == "lost":
        done = [c.step for c in ckpts if c.complete]
        frm = f"checkpoint step {done[-1]}" if done else \
            "its newest complete checkpoint" if _elsewhere(rs.state) else "the start: no complete checkpoint yet"
        exp = _dead_experiment(rs.path)
        if exp:  # the experiment's resume: the run's alone would leave its other variants queued for ever
            return (f"rlctl experiment resume {exp} (its queue is dead: it resumes {rs.path.name} from {frm} and "
                    "launches the variants still queued)")
        return f"rlctl resume {rs.path.name} (starts attempt {len(rs.attempts) + 1} from {frm})"
    if rs.status in ("failed", "stalled") and isinstance(rs.cause, dict) and rs.cause.get("fix"):
        # the causes' fixes are written for any run: here the run is known, so the command is ready to type
        return re.sub(r"(\brlctl (?:[a-z]+ )+)RUN\b", lambda m: m.group(1) + rs.path.name, str(rs.cause["fix"]))
    return None


def _dead_experiment(run_dir: Path) -> str | None:
    """The experiment the run is a variant of (its experiment.json, written by the queue), where that experiment's
    queue is dead; None for a run of no experiment or one whose queue lives (it resumes its runs itself)."""
    from rlctl.experiments.manifest import read_json

    name = read_json(run_dir / "experiment.json").get("experiment")
    if not isinstance(name, str):
        return None
    from rlctl.experiments.manifest import MANIFEST, exp_dir
    from rlctl.experiments.queue import queue_alive

    try:
        d = exp_dir(name, run_dir.parent)
    except Exception:  # a name rlctl would not have written: no experiment to name
        return None
    return name if (d / MANIFEST).is_file() and not queue_alive(d) else None


def _sync(run_dir: Any, ckpts: list[Any]) -> dict[str, Any] | None:
    from rlctl.runs.sync import sync_health

    return sync_health(run_dir, max((c.step for c in ckpts if c.complete), default=None))


def _supervisor_gone(rs: RunStatus) -> dict[str, Any] | None:
    """A run that trains on this machine while its supervisor is dead (SIGKILLed, OOM-killed): nothing restarts,
    prunes or evaluates it until `rlctl resume`; status says so rather than `running` alone."""
    from rlctl.core.state import process_alive

    st = rs.state
    if rs.status not in ("running", "stalled", "starting", "restarting") or st.get("executor", "local") != "local":
        return None
    pid = st.get("supervisor_pid")
    if not pid or process_alive(pid, st.get("supervisor_create_time")):
        return None
    return {"pid": pid, "fix": f"rlctl resume {rs.path.name}"}


def _executor_lines(rs: RunStatus) -> list[str]:
    from rlctl import executors

    name = rs.state.get("executor")
    lines = getattr(executors.get(name), "status_lines", None) if name in executors.registry() else None
    try:
        return list(lines(rs.path, rs.state)) if lines else []
    except Exception:  # status must answer whatever an executor does
        return []


def _pool_attempts(rs: RunStatus) -> list[dict[str, Any]]:
    """The attempts as status lists them (a pool run's: each host's), each evidence file named as it reads from
    here (a run on an SSH host: the mirror's copy, else HOST:PATH)."""
    from rlctl.runs.failover import lineage_attempts

    return [{**a, "evidence": path_here(rs.path, rs.state, a["evidence"], a.get("host"))}
            if isinstance(a.get("evidence"), str) else a for a in lineage_attempts(rs.state, rs.attempts)]


def path_here(run_dir: Path, state: dict[str, Any], path: str, host: str | None = None) -> str:
    """A path the run recorded where it runs, as it reads from here (its executor knows: Executor.path_here)."""
    from rlctl import executors

    name = state.get("executor")
    try:
        return executors.get(name).path_here(run_dir, state, path, host) if name in executors.registry() else path
    except Exception:  # status must answer whatever an executor does
        return path


def _lineage(state: dict[str, Any]) -> list[dict[str, Any]]:
    """A pool run's attempts, one per host it was placed on (rlctl.runs.failover)."""
    from rlctl.runs.failover import lineage_of

    keys = ("generation", "host", "from_step", "from", "started_at", "gone_since", "gone_why", "host_answered",
            "settled", "launching")
    return [{k: e.get(k) for k in keys if k in e} for e in lineage_of(state)]


def standing_failures(run_dir: Path, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The supervisor's eval failures (state.json) still standing: one is cleared by a later ok eval of its step,
    the run's own (the ledger's `done`) or by hand (docs/eval.md: "until a later eval of that step succeeds")."""
    from rlctl.evals.ledger import read_ledger

    ledger = read_ledger(run_dir)
    done = ledger.get("done") if isinstance(ledger.get("done"), dict) else {}
    hand_ok = [e for e in _list(ledger.get("by_hand")) if isinstance(e, dict) and e.get("outcome") == "ok"]
    out = []
    for f in _list(state.get("eval_failures")):
        if not isinstance(f, dict):
            continue
        step, at = f.get("step"), f.get("at")
        if (done.get(str(step)) or {}).get("outcome") == "ok" or any(
                e.get("step") == step and not (isinstance(at, (int, float)) and isinstance(e.get("at"), (int, float))
                                               and e["at"] < at) for e in hand_ok):
            continue
        out.append(f)
    return out


def stopped_evals(run_dir: Path) -> list[dict[str, Any]]:
    """Checkpoint evals the supervisor stopped (its attempt ended) that no eval has done since."""
    from rlctl.evals.ledger import read_ledger

    ledger = read_ledger(run_dir)
    stopped = ledger.get("stopped") if isinstance(ledger.get("stopped"), dict) else {}
    hand_ok = {e.get("step") for e in _list(ledger.get("by_hand")) if isinstance(e, dict) and e.get("outcome") == "ok"}
    return [{"step": int(k), "why": v.get("why")} for k, v in sorted(stopped.items(), key=lambda kv: kv[0])
            if k.isdigit() and isinstance(v, dict) and int(k) not in hand_ok]


def by_hand_failures(run_dir: Path) -> list[dict[str, Any]]:
    """`rlctl eval` failures (here or --on a host) still standing: a step whose latest by-hand eval failed. The
    supervisor's own eval failures are in state.json; these live only in the eval ledger (a run on an SSH host: the
    host's, mirrored here; an entry without a host ran where the run lives, its log there)."""
    from rlctl.evals.ledger import EVALS, read_ledger
    from rlctl.evals.loop import job_files

    state = read_state(run_dir)
    run_host, remote_dir = state.get("host"), state.get("remote_run_dir")
    latest: dict[int, dict[str, Any]] = {}
    for e in _list(read_ledger(run_dir).get("by_hand")):
        if isinstance(e, dict) and isinstance(e.get("step"), int):
            latest[e["step"]] = e  # appended in order: a later success clears an earlier failure
    out = []
    for step, e in sorted(latest.items()):
        if e.get("outcome") != "failed":
            continue
        log = job_files(run_dir / EVALS, step)[2]
        host = e.get("host") or run_host
        where = str(log) if log.is_file() or not (host == run_host and remote_dir) else \
            path_here(run_dir, state, str(job_files(Path(remote_dir) / EVALS, step)[2]))
        out.append({"step": step, "error": e.get("error") or "failed", "by_hand": True, "host": host, "log": where})
    return out


def _dict(v: Any) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None  # a damaged state.json must not break status


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _baseline(rs: RunStatus) -> dict[str, float]:
    """The step-0 eval record (written before training, so near the start of metrics.jsonl)."""
    from rlctl.metrics.stream import METRICS

    out: dict[str, float] = {}
    if not (rs.path / METRICS).is_file():  # a FIFO or device named metrics.jsonl would block
        return out
    try:
        with (rs.path / METRICS).open("rb") as fh:
            head = fh.read(1 << 16).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return out
    for line in head:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("step") == 0:
            out.update({k: float(v) for k, v in rec.items() if k.startswith("eval/")
                        and isinstance(v, (int, float)) and not isinstance(v, bool) and v == v})
    return out


def eval_lines(rs: RunStatus, merged: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each eval metric's latest value next to its step-0 baseline (a set's detail keys left out)."""
    from rlctl.runs.health import series

    base = _baseline(rs)
    keys = sorted({k for rec in merged.values() for k in rec if k.startswith("eval/")} | set(base))
    out = []
    for k in keys:
        if k.endswith(("/mean_correct", "/response_tokens")):
            continue
        s = [(st, v) for st, v in series(merged, k) if st != 0]
        out.append({"key": k, "latest": s[-1][1] if s else None, "step": s[-1][0] if s else None,
                    "baseline": base.get(k)})
    return out


STATE_WIDTH = 60  # the table's state column: the state word and a short cause (status RUN says it whole)


def state_cell(r: dict[str, Any]) -> str:
    """A row's state in the table: the state word, its cause cut at a word's end to fit STATE_WIDTH (ending in
    "..."), and the last known state of a host that did not answer."""
    last = f" (last: {r['last_known']})" if r.get("last_known") else ""
    reason = str(r.get("reason") or "")
    if not reason:
        return r["status"] + last
    room = max(STATE_WIDTH - len(r["status"]) - len(last) - 2, 12)
    if len(reason) > room:
        short = reason[:room - 3]
        if " " in short[-16:]:
            short = short[:short.rindex(" ")]
        reason = short.rstrip(" +:;,(") + "..."
    return f"{r['status']}: {reason}{last}"


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("run", "host", "backend", "state", "step", "reward", "elapsed", "eta")
    body = []
    cut = False
    for r in rows:
        step = f"{r['step'] if r['step'] is not None else '-'}" + (f"/{r['total_steps']}" if r["total_steps"] else "")
        state = state_cell(r)
        cut = cut or (bool(r.get("reason")) and str(r["reason"]) not in state)
        body.append((r["name"], r.get("host") or "local", r["backend"] or "-", state, step, fmt_num(r["reward"]),
                     fmt_duration(r["elapsed_s"]), fmt_duration(r["eta_s"])))
    widths = [max(len(h), *(len(str(b[i])) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    if cut:
        lines.append("(a state ending in ... is cut short: rlctl status RUN says it whole)")
    return "\n".join(lines)


def _detail_text(d: dict[str, Any]) -> str:
    total = f"/{d['total_steps']}" if d["total_steps"] else ""
    lines = [f"{d['name']}  ({d['backend']})  {d['status']}" + (f": {d['reason']}" if d.get("reason") else "")
             + (f"  exit code {d['exit_code']}" if d["exit_code"] is not None else ""),
             f"step {d['step'] if d['step'] is not None else '-'}{total}   elapsed {fmt_duration(d['elapsed_s'])}"
             + (f" (this attempt {fmt_duration(d['this_attempt_s'])})" if d.get("this_attempt_s") is not None else "")
             # the attempts' time leaves out lost and stopped spells: the wall clock since launch is said beside it
             + (f" (wall {fmt_duration(d['wall_s'])} since launch)" if d.get("wall_s") is not None
                and d.get("elapsed_s") is not None and d["wall_s"] - d["elapsed_s"] >= 5 else "")
             + f"   eta {fmt_duration(d['eta_s'])}   "
             + (f"last step {fmt_duration(d['last_step_age_s'])} ago" if d.get("last_step_age_s") is not None
                else "no step logged yet")]
    if d.get("unreachable"):
        lines.append(f"  ! {d['unreachable']}; what is shown is the last known state")
    lines += d.get("where") or []  # the executor's own words (a batch job: its queue state, how it ended)
    if d.get("pool") and d.get("lineage"):
        from rlctl.runs.failover import lineage_lines

        lines += lineage_lines({"pool": d["pool"], "lineage": d["lineage"]})
    for kind in ("gone", "idle"):
        seen = (d.get("inference") or {}).get(kind)
        if isinstance(seen, dict) and isinstance(seen.get("at"), (int, float)) and not d.get("cause"):
            lines.append(f"  ! the inference engine is {kind} ({seen.get('summary')}) since "
                         f"{time.strftime('%H:%M:%S', time.localtime(seen['at']))}: the run is stalled after "
                         "run.stall.inference_idle_s without a step")
    seen = d.get("engine_failed") or {}
    if isinstance(seen.get("at"), (int, float)) and isinstance(seen.get("limit_s"), (int, float)):
        lines.append(f"  ! vLLM said its inference engine failed at "
                     f"{time.strftime('%H:%M:%S', time.localtime(seen['at']))}: stalled without a step by "
                     f"{time.strftime('%H:%M:%S', time.localtime(seen['at'] + seen['limit_s']))} "
                     f"(run.stall.engine_failed_s = {seen['limit_s']:g} s)")
    seen = d.get("rollouts_failed") or {}
    if isinstance(seen.get("at"), (int, float)) and isinstance(seen.get("limit_s"), (int, float)):
        lines.append(f"  ! {seen.get('count')} rollouts failed since "
                     f"{time.strftime('%H:%M:%S', time.localtime(seen['at']))}, no step since: stalled without a step "
                     f"by {time.strftime('%H:%M:%S', time.localtime(seen['at'] + seen['limit_s']))} "
                     f"({seen.get('limit') or 'run.stall.floor_s'} = {seen['limit_s']:g} s)")
    lines += cause_lines(d.get("cause"))
    lines += _attempt_lines(d)
    if d["metrics"]:
        lines.append("")
        width = max(len(k) for k in d["metrics"])
        for k, m in d["metrics"].items():
            lines.append(f"  {k:<{width}}  {fmt_num(m['latest']):>10}  {m['trend']}")
    if d.get("evals"):
        lines.append("")
        width = max(len(e["key"]) for e in d["evals"])
        for e in d["evals"]:
            delta = (f"  ({e['latest'] - e['baseline']:+.3g} vs baseline {e['baseline']:.3g})"
                     if e["latest"] is not None and e["baseline"] is not None else
                     (f"  (baseline {e['baseline']:.3g})" if e["baseline"] is not None else "  (no baseline)"))
            at = f" at step {e['step']}" if e["step"] is not None else ""
            lines.append(f"  {e['key']:<{width}}  {fmt_num(e['latest']):>10}{at}{delta}")
    if d.get("best_checkpoint"):
        b = d["best_checkpoint"]
        value = b.get("value") if isinstance(b.get("value"), (int, float)) else None
        if b.get("step") == 0:  # the base model, no checkpoint: no checkpoint evaluated beats it (yet)
            lines.append(f"  best: the baseline (base model, step 0: {b.get('key')} = {fmt_num(value)}); "
                         "no checkpoint evaluated beats it")
        else:
            lines.append(f"  best checkpoint: step {b.get('step')} ({b.get('key')} = {fmt_num(value)})")
    if d.get("stopped_by"):
        by = "" if d["stopped_by"].get("by") == "disk" else "stop_when "
        lines.append(f"  stopped by {by}{d['stopped_by'].get('rule')}: {d['stopped_by'].get('message')}")
    for e in d.get("eval_stopped") or []:
        lines.append(f"  eval of step {e.get('step')} {e.get('why')}")
    for f in d.get("eval_failures") or []:
        how = (" by hand" + (f" on {f['host']}" if f.get("host") else "")) if f.get("by_hand") else ""
        lines.append(f"  ! eval{how} failed at step {f.get('step')}: {f.get('error')} (log {f.get('log')})")
    if d["health"]:
        lines.append("")
        lines += [f"  ! {f['message']}: {f['action']}" for f in d["health"]]
    if d.get("doctor"):
        lines.append(f"  doctor: {d['doctor']}")
    if d["checkpoints"]:
        total_bytes = sum(c["bytes"] for c in d["checkpoints"])
        done = [c["step"] for c in d["checkpoints"] if c["complete"]]
        lines.append(f"\n  checkpoints: {len(d['checkpoints'])} ({human_bytes(total_bytes)}), newest complete "
                     f"step {done[-1] if done else '-'}")
    if d["gpus"]:
        lines.append("  gpus: " + ", ".join(f"{g['index']}: {g['memory_used_gib']:.0f}/{g['memory_total_gib']:.0f} "
                                            f"GiB {g['utilization']}%" for g in d["gpus"]))
    if d.get("gpu_memory"):
        lines.append(f"  {d['gpu_memory']}")
    ing = d["ingest"]
    if ing["skipped"]:
        lines.append(f"  log: {ing['lines']} lines, {ing['records']} metric records, {ing['skipped']} unreadable "
                     "metric lines skipped")
    return "\n".join(lines)


def cause_lines(cause: Any, indent: str = "  ") -> list[str]:
    """Why the run died or hangs, with the evidence it shows and what to do (rlctl.runs.causes)."""
    if not isinstance(cause, dict) or cause.get("what") == "disk full" and not cause.get("summary"):
        return []
    out = [f"{indent}cause: {cause.get('summary') or cause.get('what')}"]
    out += [f"{indent}  evidence: {e}" for e in cause.get("evidence") or [] if isinstance(e, str)]
    if cause.get("fix"):
        out.append(f"{indent}  fix: {cause['fix']}")
    return out


def _elsewhere(state: dict[str, Any]) -> bool:
    """The run's processes live on other machines (its executor says so)."""
    from rlctl import executors

    try:
        return bool(executors.get(state.get("executor") or "local").remote)
    except Exception:
        return False


def _disk_full_now(rs: RunStatus) -> str | None:
    """A run whose disk is full cannot record it: status looks for itself (less than 1 MiB free)."""
    from rlctl.runs.disk_full import low_disk

    return low_disk(rs.path)


def _attempt_lines(d: dict[str, Any]) -> list[str]:
    """The attempts of a supervised run: when, why, from which checkpoint, how each ended."""
    out = []
    if d.get("disk_full"):
        out.append(f"  ! disk full: {d['disk_full']} (the run stays supervised; free space to let rlctl write)")
    from rlctl.runs.sync import sync_warning

    if sync := sync_warning(d.get("sync")):
        out.append(f"  ! {sync}")
    if d.get("supervisor_gone"):
        g = d["supervisor_gone"]
        out.append(f"  ! its supervisor (pid {g['pid']}) is gone: the run goes on unwatched, with no restart, pruning "
                   f"or checkpoint eval; `{g['fix']}` adopts it")
    attempts = d.get("attempts") or []
    pol = d.get("restart") or {}
    mode = pol.get("mode", "never")
    if len(attempts) > 1 or mode != "never":
        # the policy that applied: under `never` nothing restarts (an attempt after the first was `rlctl resume`'s)
        limit = pol.get("max_restarts", "-")
        out.append(f"  attempts: {len(attempts)} (restart {mode}" + (
            "" if mode == "never" else f", max {limit} restart{'' if limit == 1 else 's'}") + ")")
        for a in attempts:
            when = time.strftime("%H:%M:%S", time.localtime(a["started_at"])) if a.get("started_at") else "-"
            frm = _started_from(a)
            end = a.get("outcome") or "running"
            if a.get("exit_code") is not None:
                end += f", exit code {a['exit_code']}"
            on = f" on {a['host']}" if a.get("host") else ""
            out.append(f"    #{a.get('attempt')} {when} {a.get('reason', '-')}{on}, {frm} -> {end}"
                       + (f" (last step {a['last_step']})" if a.get("last_step") is not None else ""))
            if a.get("stall"):
                out.append(f"       stalled: {a['stall']}")
            if isinstance(a.get("cause"), dict):
                from rlctl.runs.causes import say

                out.append(f"       cause: {say(a['cause'], d.get('host'))}")
            if a.get("evidence"):
                out.append(f"       evidence: {a['evidence']}")
    if d.get("gave_up"):
        out.append(f"  gave up: {d['gave_up']}")
    said = {(d.get("cause") or {}).get("fix"), (d.get("supervisor_gone") or {}).get("fix")}
    if d.get("next") and d["next"] not in said:  # the cause's fix and the supervisor's line say theirs above
        out.append(f"  next: {d['next']}")
    return out


def _started_from(a: dict[str, Any]) -> str:
    """Where an attempt started: a checkpoint of the run's own, another run's (`launch --resume RUN`) or a store's
    (`--resume URL`) copied into it, the step its recipe names, or the start."""
    src, step = a.get("from_run"), a.get("from_step")
    if src and step is not None:
        return f"from the checkpoint synced to {src} at step {step}" if "://" in str(src) else \
            f"from {src}'s checkpoint at step {step}"
    if step is not None:
        return f"from step {step}"
    return f"from the recipe's {a['from_recipe']}" if a.get("from_recipe") else "from the start"


def remote_rows(paths: list[Any], stall_after: float, timeout: float) -> dict[Any, dict[str, Any]]:
    """Rows of the runs that live on SSH hosts: one round trip per host, hosts in parallel; an unreachable host's
    runs show as unreachable with their last known state."""
    from rlctl.core.state import read_state
    from rlctl.runs.causes import say

    remote = [p for p in paths if read_state(p).get("executor") == "ssh"]
    if not remote:
        return {}
    from rlctl import executors

    # a run that ended there is shown as last recorded (it changes no more): its host is not asked, so a host that
    # is down or removed since leaves it as it ended
    asked = [p for p in remote if read_state(p).get("status") not in ENDED]
    polled = executors.get("ssh").poll_many(asked, timeout=timeout, stall_after=stall_after) if asked else {}
    rows = {}
    for p in remote:
        st = read_state(p)
        row = dict(st.get("remote_summary") or {})
        row.update(name=p.name, path=str(p), host=st.get("host"))
        for k in ("backend", "step", "total_steps", "reward", "elapsed_s", "eta_s", "exit_code"):
            row.setdefault(k, st.get(k))
        row["status"] = polled.get(p, {}).get("status") or st.get("status", "unknown")
        # why it died (as recorded here, with the host's name as hosts.toml has it) or why it hangs (told there)
        row["reason"] = say(st.get("cause"), st.get("host")) if row["status"] in ("failed", "stopped") else \
            say(row.get("cause"), st.get("host")) if row["status"] in ("stalled", "running") else None
        if row["status"] == "unreachable":
            row["last_known"] = st.get("status")
        rows[p] = row
    return rows


def table_rows(root: Path | None = None, experiment: str | None = None, stall_after: float = 1800.0,
               timeout: float = 5.0) -> list[dict[str, Any]]:
    """The rows `rlctl status` lists, each run's status settled as it is everywhere (`experiment show` reads its runs'
    from here too): the index's for the runs of this machine, one round trip per host for those on SSH hosts."""
    from rlctl.runs.index import rows as index_rows

    rows = index_rows(summary, root=root, experiment=experiment, stall_after=stall_after)
    # runs on SSH hosts: one round trip per host, hosts in parallel (the index settles none of them)
    remote = remote_rows([Path(r["path"]) for r in rows if r.get("host")], stall_after, timeout)
    return [{**r, **remote[Path(r["path"])]} if Path(r["path"]) in remote else {**r, "host": r.get("host")}
            for r in rows]


def render(run: str | None, as_json: bool, stall_after: float, experiment: str | None = None,
           timeout: float = 5.0, all_dirs: bool = False, root: Path | None = None) -> str:
    if run is None and all_dirs:
        return _render_all(as_json, stall_after, experiment, timeout)
    if run is None:  # the listing reads the index (rlctl.runs.index), never every run's logs
        from rlctl.runs.index import grouped

        rows = table_rows(root, experiment, stall_after, timeout)
        if as_json:
            return json.dumps(rows, indent=2, default=str)
        groups = [(f"experiment {e} ({len(g)} runs)" if e else None, _table(g)) for e, g in grouped(rows)]
        text = "\n\n".join(f"{h}\n{t}" if h else t for h, t in groups)
        if rows or root is not None:
            return text if rows else ""
        from rlctl.core.state import FIND_A_RUN, WHERE_RUNS_LIVE, runs_root

        return (f"no runs in {runs_root().absolute()}: {WHERE_RUNS_LIVE}. rlctl launch RECIPE starts one here; "
                f"rlctl status --all lists the runs of every directory you launched from; a run is also found by "
                f"its name from here (rlctl status NAME); or {FIND_A_RUN}.")
    d = detail(run_status(find_run(run), stall_after))
    return json.dumps(d, indent=2, default=str) if as_json else _detail_text(d)


def _render_all(as_json: bool, stall_after: float, experiment: str | None, timeout: float) -> str:
    """`status --all`: the table of each runs directory this user launched in (rlctl.core.run_places), ./runs first;
    each from its own index, as a plain `status` there."""
    from rlctl.core.run_places import known_roots
    from rlctl.core.state import runs_root

    here = runs_root().absolute()
    roots = [here] + [r for r in reversed(known_roots()) if r != here]
    if as_json:
        out = []
        for r in roots:
            out += [{**row, "runs_dir": str(r)} for row in json.loads(render(None, True, stall_after, experiment,
                                                                             timeout, root=r))]
        return json.dumps(out, indent=2, default=str)
    parts = []
    for r in roots:
        text = render(None, False, stall_after, experiment, timeout, root=r) if r.is_dir() else ""
        if text.strip():
            parts.append(f"runs in {r}\n{text}")
    return "\n\n".join(parts) or "no runs in any directory rlctl launched in for you"


def show_status(run: str | None, as_json: bool = False, watch: bool = False, interval: float = 2.0,
                stall_after: float = 1800, experiment: str | None = None, timeout: float = 5.0,
                all_dirs: bool = False) -> None:
    if not watch:
        sys.stdout.write(render(run, as_json, stall_after, experiment, timeout, all_dirs) + "\n")
        return
    shown = None
    try:
        while True:
            text = render(run, as_json, stall_after, experiment, timeout, all_dirs)
            if text != shown:  # what did not change is not said again (a terminal keeps it on screen)
                if sys.stdout.isatty():
                    sys.stdout.write("\x1b[2J\x1b[H")
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
                shown = text
            time.sleep(interval)
    except KeyboardInterrupt:
        return

