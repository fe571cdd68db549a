"""`rlctl logs`: the raw log or the unified metrics stream, optionally following."""

from __future__ import annotations

import codecs
import contextlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from rlctl.errors import CheckFailed, RlctlError
from rlctl.metrics.stream import LOG, METRICS, ingest, ingest_stats, unparsed_report
from rlctl.runs.components import component, files_of, tail
from rlctl.runs.state import ACTIVE, read_state, settled_status

EVENTS = "rlctl-events.jsonl"


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
    follow_file(run_dir, run_dir / (METRICS if metrics else LOG), lines, follow, metrics)


def follow_file(run_dir: Path, path: Path, lines: int = 0, follow: bool = True, metrics: bool = False) -> None:
    """Print `path` (from its last `lines` lines); with `follow`, keep printing until the run ends."""
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


# ---- one component's own log (rlctl.runs.components) ------------------------------------------------------------
def _events(run_dir: Path) -> list[str]:
    """The supervisor's recorded events, as lines."""
    out = []
    with contextlib.suppress(OSError), (run_dir / EVENTS).open() as fh:
        for line in fh:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                rec = json.loads(line)
                t = rec.pop("time", None)  # an event of an older rlctl may have none: shown without a time
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t))) if t is not None else "(no time)"
                out.append(f"{when} {rec.pop('event', '?')}: " + ", ".join(f"{k}={v}" for k, v in rec.items()))
    return out


_STAMP = re.compile(r"^(?:rlctl event )?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def _by_time(lines: list[str]) -> list[str]:
    """The supervisor's log and its events as one history, by their timestamps (a line without one stays with the
    line before it), so that -n N is the newest N."""
    keyed, key = [], ""
    for i, ln in enumerate(lines):
        m = _STAMP.match(ln)
        key = m.group(1) if m else key
        keyed.append((key, i, ln))
    return [ln for _, _, ln in sorted(keyed)]


def show_component(run_dir: Path, name: str, lines: int = 0, follow: bool = False) -> None:
    """`rlctl logs RUN --component NAME`: the component's own log, here (a run on an SSH host: asked there)."""
    state = read_state(run_dir)
    if state.get("executor") == "ssh":
        _show_remote(run_dir, state, name, lines, follow)
        return
    comp = component(run_dir, name, state)
    out = sys.stdout
    if comp.name == "supervisor":
        text = _by_time([ln for _, _, ln in tail(run_dir, comp, 8 << 20)]
                        + [f"rlctl event {e}" for e in _events(run_dir)])
        if not text:
            out.write(f"# {run_dir.name}: no supervisor log (the run was supervised in the launching terminal; "
                      "its events are in rlctl-events.jsonl)\n")
        out.write("".join(t + "\n" for t in (text[-lines:] if lines > 0 else text)))
        return
    files = files_of(run_dir, comp)
    if not files and not (comp.main_log or comp.ray_actors):
        out.write(f"# {run_dir.name}: {name}: nothing written yet ({comp.where})\n")
    if follow and not (comp.main_log or comp.ray_actors) and len(files) == 1:
        sys.stdout.flush()
        follow_file(run_dir, files[0], lines)
        return
    if follow:
        raise RlctlError(f"--follow with --component {name}: {comp.where} is not one file rlctl can follow.",
                         hint=f"rlctl logs {run_dir.name} -f (the run's whole output)")
    if comp.ray_actors or comp.other_actors:  # lines of the run's output: only this component's
        rows = tail(run_dir, comp, 64 << 20)
        out.write("".join(text + "\n" for _, _, text in (rows[-lines:] if lines > 0 else rows)))
        return
    paths = files_of(run_dir, comp) + ([run_dir / LOG] if comp.main_log and (run_dir / LOG).is_file() else [])
    for p in paths:  # each file as written (its own line endings), headed like tail(1) when there are several
        if len(paths) > 1:
            out.write(f"==> {p} <==\n")
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        with p.open("rb") as fh:
            fh.seek(_tail_start(p, lines))
            while chunk := fh.read(1 << 20):
                out.write(dec.decode(chunk))
            out.write(dec.decode(b"", final=True))


def _show_remote(run_dir: Path, state: dict[str, Any], name: str, lines: int, follow: bool) -> None:
    """A run on an SSH host: its components' logs are there; the host's rlctl prints them (one round trip)."""
    from rlctl import executors

    ref = (state.get("handle") or {}).get("ref") or {}
    host, remote_dir = ref.get("host"), ref.get("run_dir")
    if not host or not remote_dir:
        raise RlctlError(f"{run_dir.name}: its state.json has no SSH handle {{host, run_dir}}.")
    if follow:
        raise RlctlError(f"--follow with --component on a host: {run_dir.name} runs on {host}.",
                         hint=f"rlctl logs {run_dir.name} --component {name} -n 100 (again to see more), or on the "
                              f"host: rlctl logs {remote_dir} --component {name} -f")
    code, out, err = executors.get("ssh").run_remote_rlctl(
        host, ["logs", remote_dir, "--component", name, "--lines", str(lines)])
    if code != 0:
        from rlctl.errors import CheckFailed

        text = (err.strip() or f"exit code {code}").removeprefix("rlctl: ")
        raise (RlctlError if code == 2 else CheckFailed)(f"{host}: {text}")
    sys.stdout.write(out + ("\n" if out else ""))
