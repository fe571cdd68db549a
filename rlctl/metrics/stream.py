"""The metrics stream of a run: ingest the raw log into metrics.jsonl incrementally, read it back fast.

Ingestion remembers its byte offset (and the log's inode) in `.ingest.json`, so the supervisor, a later
`rlctl status` or `rlctl logs --metrics` can each continue where the last one stopped. Only complete lines are
parsed; a truncated or rotated log restarts from its beginning. Nothing here ever raises on bad input.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlctl.metrics.parsers import NEEDLES, PARSERS, strip_ansi

LOG = "stdout.log"
BACKEND_METRICS = "backend_metrics.jsonl"  # structured metrics a backend writes itself (OpenRLHF + rlctl's patch)
METRICS = "metrics.jsonl"
STATE = ".ingest.json"
CHUNK = 8 * 1024 * 1024


@dataclass
class IngestState:
    offset: int = 0
    inode: int = 0
    lines: int = 0
    records: int = 0
    skipped: int = 0
    restarts: int = 0  # how often the log was found truncated or replaced


def _load_states(run_dir: Path) -> dict[str, IngestState]:
    try:
        raw = json.loads((run_dir / STATE).read_text())
        return {name: IngestState(**st) for name, st in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _save_states(run_dir: Path, states: dict[str, IngestState]) -> None:
    tmp = run_dir / (STATE + ".tmp")
    tmp.write_text(json.dumps({name: asdict(st) for name, st in states.items()}))
    os.replace(tmp, run_dir / STATE)


def split_segments(line: str) -> list[str]:
    """A raw line may hold carriage-return progress-bar frames: every segment is looked at."""
    if "\x1b" in line:
        line = strip_ansi(line)
    if "\r" not in line:
        return [line] if line.strip() else []
    return [seg for seg in line.split("\r") if seg.strip()]


def parse_line(parser: Callable[[str], dict[str, Any] | None], line: str) -> tuple[list[dict[str, Any]], int]:
    records, skipped = [], 0
    for seg in split_segments(line):
        try:
            rec = parser(seg)
        except Exception:  # Malformed, or a parser bug: count the line, never stop ingestion
            skipped += 1
            continue
        if rec is not None:
            records.append(rec)
    return records, skipped


def write_records(path: Path, records: list[dict[str, Any]], now: float | None = None) -> None:
    if not records:
        return
    t = now if now is not None else time.time()
    buf = []
    for rec in records:
        out = {"step": rec["step"], "time": round(t, 3)}
        out.update({k: v for k, v in rec.items() if k != "step"})
        buf.append(json.dumps(out, allow_nan=False, default=str))
    with path.open("a", encoding="utf-8") as fh:
        fh.write("\n".join(buf) + "\n")  # one write: a reader never sees half a record from us


def ingest(run_dir: Path, backend: str, final: bool = False) -> IngestState | None:
    """Parse whatever complete lines the log (and a backend's own metrics file) gained since last time. With
    final=True a last line without a newline is parsed too (the process has ended). Returns the totals, or None
    if another process is ingesting right now."""
    parser = PARSERS.get(backend)
    if parser is None or not (run_dir / LOG).exists():
        return None
    with open(run_dir / ".ingest.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None
        states = _load_states(run_dir)
        for name in (LOG, BACKEND_METRICS):
            if (run_dir / name).exists():
                states[name] = _ingest_file(run_dir / name, parser, states.get(name, IngestState()), final,
                                            run_dir / METRICS)
        _save_states(run_dir, states)
        return _total(states)


def _ingest_file(log: Path, parser: Callable, st: IngestState, final: bool, out: Path) -> IngestState:
    try:
        stat = log.stat()
    except OSError:
        return st
    if stat.st_ino != st.inode or stat.st_size < st.offset:
        if st.inode:  # rotated or truncated while followed
            st.restarts += 1
        st.offset, st.inode = 0, stat.st_ino
    with log.open("rb") as fh:
        fh.seek(st.offset)
        carry = b""
        while True:
            chunk = fh.read(CHUNK)
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
                continue
            complete, carry = data[: cut + 1], data[cut + 1:]
            _consume(complete, parser, st, out)
            st.offset += len(complete)
        if final and carry:
            _consume(carry, parser, st, out)
            st.offset += len(carry)
    return st


def _total(states: dict[str, IngestState]) -> IngestState:
    t = IngestState()
    for st in states.values():
        t.lines += st.lines
        t.records += st.records
        t.skipped += st.skipped
        t.restarts += st.restarts
    main = states.get(LOG)
    if main:
        t.offset, t.inode = main.offset, main.inode
    return t


def _consume(blob: bytes, parser: Callable, st: IngestState, out: Path) -> None:
    text = blob.decode("utf-8", errors="replace")
    records: list[dict[str, Any]] = []
    needles = NEEDLES.get(getattr(parser, "backend", ""), ())
    for line in text.split("\n"):
        if not line:
            continue
        st.lines += 1
        if needles and not any(n in line for n in needles):
            continue
        recs, skipped = parse_line(parser, line)
        records.extend(recs)
        st.skipped += skipped
    st.records += len(records)
    write_records(out, records)


def ingest_stats(run_dir: Path) -> IngestState:
    return _total(_load_states(run_dir))


# ---------------------------------------------------------------------------------------------------------------
# reading


def iter_metrics(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of a metrics.jsonl; a damaged line (e.g. a crash mid-write elsewhere) is skipped."""
    with contextlib.suppress(FileNotFoundError), path.open("r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                yield rec


def tail_records(path: Path, max_bytes: int = 4 * 1024 * 1024) -> list[dict[str, Any]]:
    """The records in the last `max_bytes` of a metrics file: what status needs, read from the end."""
    try:
        size = path.stat().st_size
    except OSError:
        return []
    with path.open("rb") as fh:
        start = max(0, size - max_bytes)
        fh.seek(start)
        data = fh.read()
    if start:
        data = data[data.find(b"\n") + 1:]
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
    return out


def by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Merge records per step (a step can be reported in several lines, e.g. prime-rl's two processes)."""
    merged: dict[int, dict[str, Any]] = {}
    for rec in records:
        merged.setdefault(rec["step"], {}).update(rec)
    return dict(sorted(merged.items()))
