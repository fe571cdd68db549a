"""The index of run directories: what `rlctl status` lists without reading every run.

`<runs root>/.index.json` keeps, per run directory, the row `status` shows and the stat signature it was made from
(the directory's mtime — state.json and experiment.json are only replaced by rename or created, which changes it —
and metrics.jsonl's size and mtime). A run that ended costs one stat of its directory (its metrics change only
through an ingest, which renames .ingest.json into the directory); a listing rebuilds only the rows whose signature
changed, and settles every run that may still be running through its executor (processes, stalls). Nothing is ingested
here: the metrics are the tail of metrics.jsonl the supervisor already wrote.

The index is a cache, never the truth: written as a temp file renamed over the old one (a crash leaves the old or
the new one), rebuilt from the run directories when missing, unreadable, or of another version. No daemon. A run
directory that is damaged (a state.json that does not parse) is listed as `unknown`; a directory that is not a run
(no state.json) is not listed; neither stops the listing.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.core.state import ACTIVE, STATE, read_state

INDEX = ".index.json"
VERSION = 4  # 2: rows keep the host of a run on an SSH host; 3: and why a failed run failed; 4: when each attempt ran
EXPERIMENT = "experiment.json"  # written into a run directory by the experiment queue
METRICS = "metrics.jsonl"
TAIL = 16 * 1024  # bytes of metrics.jsonl read for the latest step and reward (many records of one step)


def _sig(st: os.stat_result | None) -> list[int] | None:
    return None if st is None else [st.st_mtime_ns, st.st_size]


def _stat(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def signature(run_dir: str) -> list[Any] | None:
    """What a row depends on, from two stats: the directory (state.json and experiment.json are only ever
    replaced by rename or created, which changes it) and metrics.jsonl (appended to). None: not a directory."""
    try:
        st = os.stat(run_dir)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return [st.st_mtime_ns, _sig(_stat(os.path.join(run_dir, METRICS)))]


def _tail(path: Path, max_lines: int = 64) -> tuple[int | None, float | None, float | None]:
    """(latest step, the newest reward/mean, time of the last record) from the last lines of metrics.jsonl, read
    backwards until a reward is found (status needs no more)."""
    st = _stat(str(path))
    if st is None or st.st_size == 0:
        return None, None, None
    with path.open("rb") as fh:
        fh.seek(max(0, st.st_size - TAIL))
        data = fh.read()
    lines = data.splitlines()
    if st.st_size > TAIL:
        lines = lines[1:]  # the first may be cut
    from rlctl.metrics.stream import is_progress

    step = reward = last = None
    for raw in reversed(lines[-max_lines:]):
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        s = rec.get("step") if isinstance(rec, dict) else None
        if not isinstance(s, int) or isinstance(s, bool):
            continue
        step = s if step is None else max(step, s)
        t = rec.get("time")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and (last is None or t > last) \
                and is_progress(rec):  # rlctl's own records (GPU samples, evals) are no step of the trainer's
            last = float(t)
        r = rec.get("reward/mean")
        if isinstance(r, (int, float)) and not isinstance(r, bool) and r == r:
            reward = r
            break
    if last is None and st.st_size > TAIL:  # the newest lines are GPU samples: the last step is further back
        last = _last_progress(path, st.st_size)
    return step, reward, last


def _last_progress(path: Path, size: int) -> float | None:
    """The time of the newest record of the trainer's own, read backwards over more of the file (a long step under
    rlctl's GPU sampler writes a record every 10 s)."""
    from rlctl.metrics.stream import is_progress

    for span in (256 * 1024, 4 * 1024 * 1024):
        with path.open("rb") as fh:
            fh.seek(max(0, size - span))
            lines = fh.read().splitlines()[1 if size > span else 0:]
        for raw in reversed(lines):
            with contextlib.suppress(ValueError, RecursionError, AttributeError):
                rec = json.loads(raw)
                t = rec.get("time")
                if isinstance(t, (int, float)) and not isinstance(t, bool) and is_progress(rec):
                    return float(t)
        if size <= span:
            break
    return None


def _final_ingest(run_dir: Path, state: dict[str, Any]) -> None:
    """An ended run whose log is newer than its metrics (its supervisor died before the last ingest, or a run
    attached from a log) is ingested once, here; the index then keeps the row until the directory changes. Running
    runs are their supervisor's to ingest."""
    if state.get("status") in ACTIVE or not isinstance(state.get("backend"), str):
        return
    log = _stat(str(run_dir / "stdout.log"))
    metrics = _stat(str(run_dir / METRICS))
    if log is None or (metrics is not None and metrics.st_mtime_ns >= log.st_mtime_ns):
        return
    from rlctl.metrics.stream import ingest

    with contextlib.suppress(Exception):  # a log that cannot be read leaves the row without metrics, not broken
        ingest(run_dir, state["backend"], final=True)


def build_row(run_dir: Path) -> dict[str, Any]:
    """The row of one run, read from its directory (state.json, the tail of metrics.jsonl, experiment.json)."""
    state = read_state(run_dir)
    _final_ingest(run_dir, state)
    step, reward, last = _tail(run_dir / METRICS)
    exp: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((run_dir / EXPERIMENT).read_text())
        exp = data if isinstance(data, dict) else {}
    keep = ("status", "backend", "started_at", "ended_at", "exit_code", "total_steps", "executor", "host", "cause",
            "disk_full")
    kept = {k: state.get(k) for k in keep if state.get(k) is not None}
    if isinstance(state.get("attempts"), list):  # elapsed is the time attempts ran (rlctl.runs.state.RunStatus)
        kept["attempts"] = [{k: a.get(k) for k in ("started_at", "ended_at", "from_step", "outcome")}
                            for a in state["attempts"] if isinstance(a, dict)]
    return {"name": run_dir.name, "state": kept,
            "step": step, "reward": reward, "last_time": last,
            "experiment": exp.get("experiment") if isinstance(exp.get("experiment"), str) else None}


def _load(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / INDEX).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("runs"), dict):
        return {}
    return data


def _save(root: Path, runs: dict[str, Any], summary_key: str) -> None:
    tmp = root / f".{INDEX}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"version": VERSION, "summary": summary_key, "runs": runs}, separators=(",", ":"),
                                  default=str))
        os.replace(tmp, root / INDEX)
    except OSError:  # a read-only or full disk: the listing is still right, only slower next time
        with contextlib.suppress(OSError):
            tmp.unlink()


def _candidates(root: Path, experiment: str | None) -> list[str]:
    """Run directory names: all under root, or one experiment's (from its queue record, no scan)."""
    if experiment is not None:
        from rlctl.experiments.manifest import find_experiment, read_queue

        d = find_experiment(experiment, root)
        names = []
        for r in read_queue(d)["variants"].values():
            rd = r.get("run_dir")
            if isinstance(rd, str) and Path(rd).parent.resolve() == root.resolve():
                names.append(Path(rd).name)
        return names
    try:
        with os.scandir(root) as it:
            return [e.name for e in it if not e.name.startswith((".", "_")) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _summary_key(summary: Callable[[Any], dict[str, Any]]) -> str:
    """Which summary function made the cached rows (another rlctl's rows are made again)."""
    code = getattr(summary, "__code__", None)
    return f"{getattr(summary, '__module__', '')}.{getattr(summary, '__qualname__', '')}:" + (
        str(zlib.crc32(code.co_code + repr(code.co_consts).encode())) if code else "")


def rows(summary: Callable[[Any], dict[str, Any]], root: Path | None = None, experiment: str | None = None,
         stall_after: float = 1800.0) -> list[dict[str, Any]]:
    """The status rows (as `summary`, rlctl.runs.status's, makes them from a RunStatus; plus `experiment`), oldest
    first. A run that ended is answered from the index alone when its directory did not change."""
    from rlctl.core.state import runs_root

    root = root or runs_root()
    if not root.is_dir():
        return []
    if experiment is not None:  # a few runs, named by the experiment's queue record: read them, no index
        out = []
        for name in _candidates(root, experiment):
            dpath = root / name
            if signature(str(dpath)) is not None and _stat(str(dpath / STATE)) is not None:
                out.append(_summary(dpath, _safe_row(dpath), stall_after, summary))
        return sorted(out, key=lambda r: (r.get("started_at") or 0.0, r["name"]))
    data = _load(root)
    key = _summary_key(summary)
    cached: dict[str, Any] = data.get("runs", {})
    same_summary = data.get("summary") == key
    fresh: dict[str, Any] = {}
    changed = not same_summary
    out = []
    root_s = str(root)
    for name in _candidates(root, None):
        dpath = os.path.join(root_s, name)
        entry = cached.get(name)
        if isinstance(entry, dict) and (entry.get("foreign") or (same_summary and isinstance(entry.get("out"), dict))):
            # ended (or not a run) and the directory unchanged: one stat, nothing read. An ended run's metrics
            # change only through an ingest, which also renames .ingest.json into the directory.
            try:
                dir_mtime = os.stat(dpath).st_mtime_ns
            except OSError:
                continue
            old = entry.get("sig")
            if isinstance(old, list) and old and old[0] == dir_mtime:
                fresh[name] = entry
                if not entry.get("foreign"):
                    out.append(entry["out"])
                continue
        sig = signature(dpath)
        if sig is None:
            continue
        hit = isinstance(entry, dict) and entry.get("sig") == sig
        if hit and isinstance(entry.get("row"), dict):
            row = entry["row"]
        else:
            changed = True
            if _stat(os.path.join(dpath, STATE)) is None:
                fresh[name] = {"sig": sig, "foreign": True}
                continue
            row = _safe_row(Path(dpath))
            sig = signature(dpath) or sig  # reading may have ingested (and so changed the directory)
        summ = _summary(Path(dpath), row, stall_after, summary)
        if (row.get("state") or {}).get("status") in ACTIVE:
            fresh[name] = {"sig": sig, "row": row}
        else:  # an ended run's row does not change until its directory does
            fresh[name] = {"sig": sig, "out": summ}
            changed = True
        out.append(summ)
    if changed or set(fresh) != set(cached):
        _save(root, fresh, key)
    out.sort(key=lambda r: (r.get("started_at") or 0.0, r["name"]))
    return out


def _safe_row(run_dir: Path) -> dict[str, Any]:
    try:
        return build_row(run_dir)
    except Exception:  # whatever is in there, the listing goes on
        return {"name": run_dir.name, "state": {"status": "unknown"}, "step": None, "reward": None,
                "last_time": None, "experiment": None}


def _summary(path: Path, row: dict[str, Any], stall_after: float, summary: Callable[[Any], dict[str, Any]]
             ) -> dict[str, Any]:
    from rlctl.runs.state import RunStatus, true_status

    state = dict(row.get("state") or {})
    status = state.get("status", "unknown")
    # may have ended or stalled since it was written: its executor tells (no ingest); a run on another host is
    # settled by the caller, one round trip per host for all its runs (rlctl.runs.status.remote_rows)
    if status in ACTIVE and not state.get("host"):
        try:
            status = true_status(path, read_state(path), row.get("last_time"), stall_after)
        except Exception:
            status = "unknown"
    cause = None
    if not state.get("host"):  # a run here that died or hangs says why (runs.causes); its whole state is read then
        from rlctl.runs.causes import settle

        with contextlib.suppress(Exception):
            status, cause = settle(path, read_state(path) if status in ("failed", "lost", "stalled", "running")
                                   else state, status, light=True)
    rs = RunStatus(row.get("name", path.name), path, state, status, row.get("step"), state.get("total_steps"),
                   {"reward/mean": row.get("reward")}, row.get("last_time"), cause=cause)
    s = summary(rs)
    started = state.get("started_at")
    s["started_at"] = started if isinstance(started, (int, float)) else None
    s["experiment"] = row.get("experiment")
    return s


def grouped(rs: list[dict[str, Any]]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """Rows by experiment: runs of no experiment first, then each experiment in the order its first run started."""
    groups: dict[str | None, list[dict[str, Any]]] = {None: []}
    for r in rs:
        groups.setdefault(r.get("experiment"), []).append(r)
    return [(k, v) for k, v in groups.items() if v]
