"""The index of run directories: what `rlctl status` lists without reading every run.

`<runs root>/.index.json` keeps, per run directory, the row `status` shows and the stat signature it was made from
(the directory's mtime — state.json is replaced by rename, which changes it — and metrics.jsonl's and
experiment.json's size and mtime). A listing stats each directory and rebuilds only the rows whose signature
changed, plus every run that may still be running (its executor settles it: processes, stalls). Nothing is ingested
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.core.state import ACTIVE, STATE, read_state

INDEX = ".index.json"
VERSION = 1
EXPERIMENT = "experiment.json"  # written into a run directory by the experiment queue
METRICS = "metrics.jsonl"
TAIL = 64 * 1024  # bytes of metrics.jsonl read for the latest step and reward


def _sig(st: os.stat_result | None) -> list[int] | None:
    return None if st is None else [st.st_mtime_ns, st.st_size]


def _stat(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def signature(run_dir: str) -> list[Any] | None:
    """What a row depends on, from three stats; None when the directory is not a run."""
    state = _stat(os.path.join(run_dir, STATE))
    if state is None:
        return None
    try:
        dir_mtime = os.stat(run_dir).st_mtime_ns
    except OSError:
        return None
    return [dir_mtime, _sig(state), _sig(_stat(os.path.join(run_dir, METRICS))),
            _sig(_stat(os.path.join(run_dir, EXPERIMENT)))]


def _tail(path: Path) -> tuple[int | None, float | None, float | None]:
    """(latest step, its reward/mean, time of the last record) from the end of metrics.jsonl."""
    from rlctl.metrics.stream import tail_records

    records = tail_records(path, TAIL)
    if not records:
        return None, None, None
    step = max(r["step"] for r in records)
    reward = None
    for r in records:
        if r["step"] == step and isinstance(r.get("reward/mean"), (int, float)):
            reward = r["reward/mean"]
    if reward is None:  # the last step may carry other keys only: the newest reward logged
        rewards = [r for r in records if isinstance(r.get("reward/mean"), (int, float))]
        reward = rewards[-1]["reward/mean"] if rewards else None
    last = max((r.get("time", 0) for r in records), default=None)
    return step, reward, last


def build_row(run_dir: Path) -> dict[str, Any]:
    """The row of one run, read from its directory (state.json, the tail of metrics.jsonl, experiment.json)."""
    state = read_state(run_dir)
    step, reward, last = _tail(run_dir / METRICS)
    exp: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((run_dir / EXPERIMENT).read_text())
        exp = data if isinstance(data, dict) else {}
    keep = ("status", "backend", "started_at", "ended_at", "exit_code", "total_steps", "executor")
    return {"name": run_dir.name, "state": {k: state.get(k) for k in keep if state.get(k) is not None},
            "step": step, "reward": reward, "last_time": last,
            "experiment": exp.get("experiment") if isinstance(exp.get("experiment"), str) else None}


def _load(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / INDEX).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("runs"), dict):
        return {}
    return data["runs"]


def _save(root: Path, runs: dict[str, Any]) -> None:
    tmp = root / f".{INDEX}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"version": VERSION, "runs": runs}, separators=(",", ":")))
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


def rows(summary: Callable[[Any], dict[str, Any]], root: Path | None = None, experiment: str | None = None,
         stall_after: float = 1800.0) -> list[dict[str, Any]]:
    """The status rows (as `summary`, rlctl.runs.status's, makes them from a RunStatus; plus `experiment`), oldest
    first."""
    from rlctl.core.state import runs_root

    root = root or runs_root()
    if not root.is_dir():
        return []
    cached = _load(root)
    fresh: dict[str, Any] = {} if experiment is None else dict(cached)
    changed = False
    out = []
    for name in _candidates(root, experiment):
        path = root / name
        sig = signature(str(path))
        if sig is None:
            continue
        entry = cached.get(name)
        if not (isinstance(entry, dict) and entry.get("sig") == sig and isinstance(entry.get("row"), dict)):
            try:
                entry = {"sig": sig, "row": build_row(path)}
            except Exception:  # whatever is in there, the listing goes on
                entry = {"sig": sig, "row": {"name": name, "state": {"status": "unknown"}, "step": None,
                                             "reward": None, "last_time": None, "experiment": None}}
            changed = True
        fresh[name] = entry
        out.append(_summary(path, entry["row"], stall_after, summary))
    if changed or set(fresh) != set(cached):
        _save(root, fresh)
    out.sort(key=lambda r: (r.get("started_at") or 0.0, r["name"]))
    return out


def _summary(path: Path, row: dict[str, Any], stall_after: float, summary: Callable[[Any], dict[str, Any]]
             ) -> dict[str, Any]:
    from rlctl.runs.state import RunStatus, true_status

    state = dict(row.get("state") or {})
    status = state.get("status", "unknown")
    if status in ACTIVE:  # may have ended or stalled since it was written: its executor tells (no ingest)
        try:
            status = true_status(path, read_state(path), row.get("last_time"), stall_after)
        except Exception:
            status = "unknown"
    rs = RunStatus(row.get("name", path.name), path, state, status, row.get("step"), state.get("total_steps"),
                   {"reward/mean": row.get("reward")}, row.get("last_time"))
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
