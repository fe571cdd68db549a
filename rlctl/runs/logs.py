"""`rlctl logs`: the raw log or the unified metrics stream, optionally following."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rlctl.errors import CheckFailed, RlctlError
from rlctl.metrics.stream import LOG, METRICS, ingest, ingest_stats, unparsed_report
from rlctl.runs.state import ACTIVE, read_state, settled_status


def _tail_start(path: Path, lines: int) -> int:
    """Byte offset where the last `lines` lines begin, found by reading backwards."""
    if lines <= 0 or not path.exists():
        return 0
    size = path.stat().st_size
    block = 64 * 1024
    pos, found = size, 0
    with path.open("rb") as fh:
        while pos > 0:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            chunk = fh.read(step)
            found += chunk.count(b"\n")
            if found > lines:
                extra = found - lines  # newlines in this chunk before the wanted start
                i = -1
                for _ in range(extra):
                    i = chunk.index(b"\n", i + 1)
                return pos + i + 1
    return 0


def show_logs(run_dir: Path, follow: bool = False, metrics: bool = False, lines: int = 0) -> None:
    settled_status(run_dir)  # a live run's executor brings its newest log here first (a remote run's mirror)
    state = read_state(run_dir)
    if metrics and state.get("backend"):
        ingest(run_dir, state["backend"], final=state.get("status") not in ACTIVE)
        _report_unparsed(run_dir, state)
    path = run_dir / (METRICS if metrics else LOG)
    if path.exists() and not path.is_file():  # a FIFO or device would block or never end
        raise RlctlError(f"{path}: not a regular file; rlctl reads logs only from files.",
                         hint="remove it; the run writes a plain file there")
    out = sys.stdout.buffer
    pos = _tail_start(path, lines)
    while True:
        if path.exists():
            with path.open("rb") as fh:
                fh.seek(pos)
                while True:
                    chunk = fh.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    pos += len(chunk)
            out.flush()
        if not follow:
            return
        state = read_state(run_dir)
        if settled_status(run_dir, state) not in ACTIVE:  # ends with the run, even when its supervisor is gone
            state = read_state(run_dir)
            if metrics and state.get("backend"):
                ingest(run_dir, state["backend"], final=True)
            if path.exists() and path.stat().st_size > pos:
                continue
            return
        if metrics and state.get("backend"):
            ingest(run_dir, state["backend"])
        time.sleep(0.5)


def _report_unparsed(run_dir: Path, state: dict) -> None:
    """Lines that looked like metrics but were not understood go to stderr; a finished run whose non-empty log gave
    no record at all is an error (exit 1), never an empty stream in silence."""
    st = ingest_stats(run_dir)
    msg = unparsed_report(st)
    if msg:
        sys.stderr.write(f"rlctl: {run_dir.name}: {msg}\n")
    has_records = (run_dir / METRICS).exists() and (run_dir / METRICS).stat().st_size > 0
    if st.lines and not has_records and state.get("status") not in ACTIVE:
        raise CheckFailed(f"{run_dir.name}: {st.lines} log lines gave no metrics record.",
                          hint=f"is it a {state.get('backend')} log? docs/metrics.md lists the formats rlctl reads")
