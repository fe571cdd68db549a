"""The metrics stream of a run: ingest the raw log into metrics.jsonl incrementally, read it back fast.

Ingestion remembers its byte offset (and the log's inode) in `.ingest.json`, so the supervisor, a later
`rlctl status` or `rlctl logs --metrics` can each continue where the last one stopped. Only complete lines are
parsed; a truncated or rotated log restarts from its beginning. Nothing here ever raises on bad input.

The backend's adapter reads the lines (`rlctl.backends.get_backend(name).parse`, pre-filtered by its
`metric_needles`); this module knows no backend. A record the adapter says goes on in the next lines (`Incomplete`)
is retried with them joined; lines that look like metrics but are not understood are counted, and the first few kept
(`IngestState.examples`), so nothing is dropped silently.

Steps (parsers' module docstring): a record's own, counted, or the one in progress; a stand-in (a progress bar's
summary of a step whose own record another process prints) is counted only while the log has given no step of its
own, then paired with the own records (`_stand_in`), and left out where its step's own record came first: the two
processes' lines reach the log in either order. The pairing is kept per log in IngestState, between reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import compress, islice, repeat
from operator import contains, itemgetter, not_, or_
from pathlib import Path
from stat import S_ISREG
from typing import Any

from rlctl.metrics.parsers import (
    STAND_IN,
    STAND_IN_CURRENT,
    Header,
    Incomplete,
    forget_lines,
    split_lines,
    strip_ansi,
)

LOG = "stdout.log"
BACKEND_METRICS = "backend_metrics.jsonl"  # structured metrics a backend writes itself (e.g. through rlctl's patch)
SOURCES = "logs"  # more logs of an attached run (symlinks to the backend's own files), each followed like LOG
METRICS = "metrics.jsonl"
STEP_FLOOR = ".step_floor"  # see step_floor()
STATE = ".ingest.json"
CHUNK = 1024 * 1024  # 8 MiB chunks made a new process fault in fresh pages for their objects: ~20% more CPU
MAX_EXAMPLES = 5
PENDING_LINES = 64  # a record wrapped over more lines than this is given up (counted as not understood)
PENDING_BYTES = 256 * 1024


@dataclass
class IngestState:
    offset: int = 0
    inode: int = 0
    lines: int = 0
    records: int = 0
    skipped: int = 0  # lines that looked like metrics but were not understood
    restarts: int = 0  # how often the log was found truncated or replaced
    last_step: int = 0  # the step of the last record (counted steps continue from it)
    # a stand-in record's pairing with the backend's own records (parsers.STAND_IN; assign_steps): the step of the
    # last record that carried its own (-1: none yet, stand-ins are counted), the step the last stand-in stood for
    own_step: int = -1
    stand_in_step: int = 0
    # the last stand-in's values: a bar's final frame drawn again by close() is the same step (Ray writes each frame
    # on a line of its own: docs/gpu/openrlhf-3.json), left out; any record of the backend's own in between clears it
    last_stand_in: str = ""
    pending: str = ""  # the start of a record that continues on the next lines
    pending_lines: int = 0
    context: str = ""  # a table's header (`Header`): the lines after it are read with it
    examples: list[str] = field(default_factory=list)  # the first lines not understood, with their line number


_ADAPTERS: dict[str, Any] = {}


def adapter(backend: str) -> Any | None:
    """The backend's adapter (adapters are stateless: one per process), or None when no such backend is installed."""
    from rlctl.backends import get_backend
    from rlctl.errors import RlctlError

    if backend not in _ADAPTERS:
        try:
            _ADAPTERS[backend] = get_backend(backend)
        except (RlctlError, ImportError, AttributeError):
            return None
    return _ADAPTERS[backend]


def _load_states(run_dir: Path) -> dict[str, IngestState]:
    known = set(IngestState.__dataclass_fields__)
    try:
        raw = json.loads((run_dir / STATE).read_text())
        return {name: IngestState(**{k: v for k, v in st.items() if k in known}) for name, st in raw.items()}
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
    """Records of one line, and how many of its segments looked like metrics but were not understood."""
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


_INT = {int}


def assign_steps(records: list[dict[str, Any]], st: IngestState) -> list[dict[str, Any]]:
    """Give every record an int step: its own, the next counted one (no `step`), or the current one (None). A
    stand-in (parsers.STAND_IN, STAND_IN_CURRENT) is counted or current while the log has given no record with its
    own step; after one it is paired with them (`_stand_in`), and left out where its step's own record came first."""
    steps = list(map(dict.get, records, repeat("step")))
    if steps and set(map(type, steps)) == _INT:  # every record with its own int step (the common case): as they are
        st.last_step = st.own_step = steps[-1]
        st.last_stand_in = ""
        return records
    out = []
    for rec in records:
        step = rec.get("step", ...)
        if type(step) is int:  # the record's own step (the common case): as it is
            st.last_step = st.own_step = step
            st.last_stand_in = ""
            out.append(rec)
            continue
        if step in (STAND_IN, STAND_IN_CURRENT):
            same = json.dumps({k: v for k, v in rec.items() if k not in ("step", "time")}, sort_keys=True, default=str)
            if same == st.last_stand_in:
                continue  # the frame again (tqdm's close()), not a step
            st.last_stand_in = same
            step = _stand_in(step, st)
            if step is None:
                continue
        elif step is ...:
            step = st.last_step + 1
        elif step is None:
            step = st.last_step
        if not isinstance(step, int):
            continue
        st.last_step = step
        out.append({**rec, "step": step})
    return out


def _stand_in(kind: str, st: IngestState) -> int | None:
    """A stand-in's step, or None where its step's own record has come already (it carries the step's values).

    The backend prints one stand-in and one own record per step, from two processes whose lines reach the log in
    either order (Ray forwards each actor's output on its own). A stand-in for the next step comes while the last
    own record is the step the last stand-in stood for; any other time, the step of the last own record has had no
    stand-in yet: this one is it. Where a line was lost (or a step has no stand-in), the pairing errs towards
    leaving out stand-ins whose own record is still to come (it carries their step), never towards a step the run
    did not make; a restart starts it again (restart_steps)."""
    if st.own_step < 0:  # no step of the backend's own in this log (yet): stand-ins count the steps
        if kind == STAND_IN:
            st.stand_in_step = st.last_step + 1
            return st.stand_in_step
        return st.last_step
    if kind == STAND_IN_CURRENT:  # the step in progress: only one a stand-in counted, its own record still to come
        return st.last_step if st.own_step < st.last_step else None
    if st.stand_in_step != st.own_step:
        st.stand_in_step = st.own_step
        return None
    st.stand_in_step = st.last_step + 1
    return st.stand_in_step


def restart_steps(state: dict[str, Any], base: int) -> None:
    """A restart from the checkpoint of step `base`, on one log's state as saved in .ingest.json: counting goes on
    from it, and so does a stand-in's pairing (that step had both its records; the repeated steps have theirs anew)."""
    state["last_step"] = state["stand_in_step"] = base
    if state.get("own_step", -1) >= 0:
        state["own_step"] = base


try:
    import orjson as _orjson  # in [dev], never a core dependency: the standard library writes the same values
except ImportError:
    _orjson = None
_STD = json.JSONEncoder(allow_nan=False, default=str).encode


def _encode(out: dict[str, Any]) -> bytes:
    """One record as JSON: orjson where installed (10x faster), else the standard library. Both write floats in
    their shortest round-trip form."""
    if _orjson is not None:
        try:
            return _orjson.dumps(out, default=str)
        except TypeError:  # an int beyond 64 bits, a key that is no string: the standard library decides
            pass
    return _STD(out).encode()


def _lines(records: list[dict[str, Any]], t: float) -> bytes | None:
    """All records as JSON lines in one orjson call, `time` added last in each by one replace; None unless every
    record splits cleanly (no `},{` inside a value) and none has a `time` of its own."""
    if _orjson is None or any(map(dict.__contains__, records, repeat("time"))):
        return None
    try:
        blob = _orjson.dumps(records, default=str)
    except TypeError:
        return None
    if not blob.endswith(b"}]"):
        return None
    end = b',"time":' + json.dumps(t).encode() + b"}"
    sep = end + b"\n{"
    out = blob.replace(b"},{", sep)
    if len(out) - len(blob) != (len(records) - 1) * (len(sep) - 3):  # one `},{` between each two records, no other
        return None
    return b"".join((memoryview(out)[1:-2], end, b"\n"))


def write_records(path: Path, records: list[dict[str, Any]], now: float | None = None) -> None:
    """Append records (each with its int step) as JSON lines with the time they were read."""
    if not records:
        return
    t = round(now if now is not None else time.time(), 3)
    data = _lines(records, t) if len(records) > 1 else None
    if data is None:
        encode = _encode
        buf = []
        for rec in records:
            out = {"step": rec["step"], "time": t}
            out.update(rec)  # `step` keeps its place (and value); everything else follows in the record's order
            buf.append(encode(out))
        data = b"\n".join(buf) + b"\n"
    with path.open("ab") as fh:
        fh.write(data)  # one write: a reader never sees half a record from us


def log_files(run_dir: Path) -> list[str]:
    """The files ingested for a run, relative to it: the log, a backend's metrics file, an attached run's logs."""
    names = [LOG, BACKEND_METRICS]
    extra = run_dir / SOURCES
    if extra.is_dir():
        names += sorted(f"{SOURCES}/{p.name}" for p in extra.iterdir() if p.is_file())
    return [n for n in names if (run_dir / n).exists()]


def step_floor(run_dir: Path) -> int:
    """The last step a restarted run had streamed before its restart (written by its supervisor at the restart):
    the new attempt repeats the steps after its checkpoint, and those repeats are dropped. -1: none."""
    try:
        return int((run_dir / STEP_FLOOR).read_text().strip())
    except (OSError, ValueError):
        return -1


INGEST_LOCK = ".ingest.lock"


@contextlib.contextmanager
def ingest_lock(run_dir: Path, wait: float = 0.0) -> Iterator[bool]:
    """The run's ingest lock (one writer of metrics.jsonl and .ingest.json at a time), tried for up to `wait`
    seconds; yields whether it is held, so each caller decides what a busy lock means (ingest: skip this round; an
    eval result: append anyway, in one write; a restart's step reset: leave it)."""
    with open(run_dir / INGEST_LOCK, "w") as lock:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.05)
        yield True


def ingest(run_dir: Path, backend: str, final: bool = False) -> IngestState | None:
    """Parse whatever complete lines the logs gained since last time. With final=True a last line without a
    newline is parsed too (the process has ended), and a record left unfinished is counted as not understood.
    Returns the totals, or None if another process is ingesting right now (or the backend is unknown)."""
    ad = adapter(backend)
    files = log_files(run_dir)
    if ad is None or not files or _mirrored(run_dir):
        return None
    with ingest_lock(run_dir) as held:
        if not held:
            return None
        states = _load_states(run_dir)
        parse = ad.log_parser(run_dir) if hasattr(ad, "log_parser") else ad.parse
        needles = getattr(parse, "metric_needles", getattr(ad, "metric_needles", ()))
        # the bulk reader knows the adapter's own lines; a per-run parser (attach's metrics map) names its own
        bulk = getattr(ad if parse == ad.parse else parse, "metric_bulk", None)
        reader = _Reader(parse, tuple(needles or ()), run_dir / METRICS, bulk)
        from rlctl.evals import in_loop

        reader.rename = in_loop.renamer(ad, run_dir)  # in-loop evals as eval/<set>/<mode> (docs/eval.md)
        reader.floor = step_floor(run_dir)
        with _no_gc():
            for name in files:
                states[name] = reader.file(run_dir / name, states.get(name, IngestState()), final)
        _save_states(run_dir, states)
        return _total(states)


def _mirrored(run_dir: Path) -> bool:
    """The run's stream is written where the run lives and copied here (its executor says so): parsing the copy of
    its log here again would append every record a second time."""
    from rlctl.core.state import read_state

    name = read_state(run_dir).get("executor")
    if name in (None, "local"):
        return False
    from rlctl import executors

    try:
        return bool(getattr(executors.get(name), "mirrored", False))
    except Exception:  # an executor this install lacks (a plugin gone): parse as before
        return False


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cycle collector paused: a chunk's records are tens of thousands of new dicts (no cycles among them), and
    each pass of the collector over them costs a fifth of the time ingestion takes."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Reader:
    """Reads logs into records. `needles`: substrings every metrics line holds (lines without any are skipped
    unread); `bulk`: the adapter's optional reader of a whole chunk, records by the offset of their line, for the
    lines it reads exactly as `parser` would (the others go to `parser`)."""

    def __init__(self, parser: Callable[[Any], dict[str, Any] | None], needles: tuple[str, ...], out: Path,
                 bulk: Callable[[str], dict[int, dict[str, Any]]] | None = None):
        self.parser, self.needles, self.out, self.bulk = parser, needles, out, bulk
        self.floor = -1
        self.rename: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def file(self, log: Path, st: IngestState, final: bool) -> IngestState:
        try:
            stat = log.stat()
        except OSError:
            return st
        if not S_ISREG(stat.st_mode):  # a FIFO or device named like the log would block or never end
            return st
        if stat.st_ino != st.inode or stat.st_size < st.offset:
            if st.inode:  # rotated or truncated while followed
                st.restarts += 1
            st.offset, st.inode, st.pending, st.pending_lines, st.context = 0, stat.st_ino, "", 0, ""
        with log.open("rb") as fh:
            fh.seek(st.offset)
            carry = b""
            while True:
                chunk = fh.read(CHUNK)
                if not chunk:
                    break
                data = carry + chunk if carry else chunk
                cut = data.rfind(b"\n")
                if cut < 0:
                    carry = data
                    continue
                if cut == len(data) - 1:  # the chunk ends with its line (no copy of 8 MiB)
                    complete, carry = data, b""
                else:
                    complete, carry = data[: cut + 1], data[cut + 1:]
                self.consume(complete, st)
                st.offset += len(complete)
            if final and carry:
                self.consume(carry, st)
                st.offset += len(carry)
        if final and st.pending:
            self.not_understood(st, st.pending)
            st.pending, st.pending_lines = "", 0
        return st

    def not_understood(self, st: IngestState, text: str, line_no: int | None = None) -> None:
        st.skipped += 1
        if len(st.examples) < MAX_EXAMPLES:
            first = text.strip().split("\n")[0]
            n = line_no if line_no is not None else st.lines - st.pending_lines
            st.examples.append(f"line {n}: {first[:200]}")

    def _starts_record(self, line: str) -> bool:
        if self.needles and not any(n in line for n in self.needles):
            return False
        try:
            return self.parser(strip_ansi(line).split("\r")[-1]) is not None
        except Exception:
            return True

    def consume(self, blob: bytes, st: IngestState) -> None:
        """Parse a run of complete lines. Only the lines holding one of the adapter's needles are looked at (each
        needle found with str.find over the whole chunk, at memchr speed), and every line after the start of a record
        that goes on (`Incomplete`) until it is settled: exactly what `consume_lines` does line by line."""
        text = blob.decode("utf-8", errors="replace")
        if not self.needles and self.bulk is None:
            self.consume_lines(text, st)
            return
        records: list[dict[str, Any]] = []
        dense = self.bulk is not None and (not self.needles or _dense(text, self.needles))
        count = _LineCount(text, st.lines, split_lines(text) if dense else None)
        done: dict[int, dict[str, Any]] = {}
        if dense:  # mostly metrics lines: read in bulk first
            done = self.bulk(text)  # its lines hold a needle: the others are looked for in the lines left
            hits = sorted([*done, *_needle_lines(text, self.needles, skip=done)])
        else:
            hits = _needle_lines(text, self.needles)
            done = self.bulk(text) if self.bulk is not None and hits else {}
        n, pos, i = len(text), 0, 0
        if not st.pending and not st.context and len(done) == len(hits):  # all read in bulk (done's are hits)
            records, i = list(done.values()), len(hits)
        while True:
            if st.pending or st.context:  # the record goes on, or a table: every next line is looked at
                if pos >= n:
                    break
            else:
                while i < len(hits) and hits[i] < pos:
                    i += 1
                if i == len(hits):
                    break
                pos = hits[i]
            end = text.find("\n", pos)
            if end < 0:
                end = n
            rec = None if st.pending or st.context else done.get(pos)
            if rec is not None:  # read already, in bulk
                records.append(rec)
            elif end > pos:
                st.lines = count.upto(end + 1)
                self.line(text[pos:end], st, records)
            pos = end + 1
        st.lines = count.upto(n + 1)
        forget_lines()  # the chunk's lines, kept for the bulk reader and the needles
        self.emit(records, st)

    def consume_lines(self, text: str, st: IngestState) -> None:
        """The reference path: every line looked at in turn."""
        records: list[dict[str, Any]] = []
        for line in text.split("\n"):
            if not line:
                continue
            st.lines += 1
            self.line(line, st, records)
        self.emit(records, st)

    def emit(self, records: list[dict[str, Any]], st: IngestState) -> None:
        records = assign_steps(records, st)
        if records and min(map(itemgetter("step"), records)) <= self.floor:
            records = [r for r in records if r["step"] > self.floor]
        if self.rename is not None:
            records = [self.rename(r) for r in records]
        st.records += len(records)
        write_records(self.out, records)

    def line(self, line: str, st: IngestState, records: list[dict[str, Any]]) -> None:
        """One non-empty line (st.lines counts it already): its records go to `records`."""
        if st.pending and self._continue(line, st, records):
            return
        if st.context and self._in_table(line, st, records):
            return
        needles = self.needles
        if needles and not any(n in line for n in needles):
            return
        segments = split_segments(line)
        counted: dict[str, Any] | None = None  # CR frames redraw one display: its last step-less record stands
        for i, seg in enumerate(segments):
            try:
                rec = self.parser(seg)
            except Incomplete:
                if i == len(segments) - 1:
                    st.pending, st.pending_lines = seg, 1
                else:
                    self.not_understood(st, seg, st.lines)
                continue
            except Header as h:
                st.context = h.text
                continue
            except Exception:  # Malformed, or a parser bug: count the line, never stop ingestion
                self.not_understood(st, seg, st.lines)
                continue
            if rec is None:
                continue
            if len(segments) == 1 or rec.get("step", STAND_IN) != STAND_IN:
                records.append(rec)
            else:  # a counted record (no `step`, or a stand-in): one per display
                counted = rec
        if counted is not None:
            records.append(counted)

    def _in_table(self, line: str, st: IngestState, records: list[dict[str, Any]]) -> bool:
        """A line under a table's header: a row (True), the rule or a garbled row (True), or the table's end."""
        try:
            rec = self.parser(st.context + "\n" + (strip_ansi(line) if "\x1b" in line else line))
        except Header as h:
            st.context = h.text
            return True
        except Exception:
            self.not_understood(st, line, st.lines)
            return True
        if rec is None:
            st.context = ""
            return False
        records.append(rec)
        return True

    def _continue(self, line: str, st: IngestState, records: list[dict[str, Any]]) -> bool:
        """Join a line to the pending record. True when the line was used up by it."""
        if self._starts_record(line):  # a new record begins: the pending one was cut
            self.not_understood(st, st.pending)
            st.pending, st.pending_lines = "", 0
            return False
        joined = st.pending + "\n" + (strip_ansi(line) if "\x1b" in line else line)
        try:
            rec = self.parser(joined)
        except Incomplete:
            if st.pending_lines + 1 >= PENDING_LINES or len(joined) > PENDING_BYTES:
                self.not_understood(st, st.pending)
                st.pending, st.pending_lines = "", 0
                return False
            st.pending, st.pending_lines = joined, st.pending_lines + 1
            return True
        except Exception:
            st.pending_lines += 1
            self.not_understood(st, st.pending)
            st.pending, st.pending_lines = "", 0
            return True
        st.pending, st.pending_lines = "", 0
        if rec is None:
            return False
        records.append(rec)
        return True



def _dense(text: str, needles: tuple[str, ...]) -> bool:
    """Whether most of a chunk's lines hold a needle, judged by its first lines (counting all of it costs what
    finding them does)."""
    sample = text[:65536]
    return sum(map(sample.count, needles)) * 4 > sample.count("\n")


def _needle_lines(text: str, needles: tuple[str, ...], skip: dict[int, Any] | None = None) -> list[int]:
    """Where the lines holding any needle start, in order (but those starting at a key of `skip`): one str.find
    run per needle, one step per hit; where most lines hold one (a log of metrics lines), every line tested in C."""
    if skip is not None or _dense(text, needles):
        lines, starts = split_lines(text)
        starts_of: Iterator[int] = iter(starts)
        if skip:  # the lines read in bulk already are not looked at
            keep = list(map(not_, map(skip.__contains__, starts)))
            lines, starts_of = list(compress(lines, keep)), compress(starts, keep)
        if not needles:  # a parser that may find metrics in any line: every line (starts has one past the end)
            return list(islice(starts_of, len(lines)))
        mask: Iterator[bool] = map(contains, lines, repeat(needles[0]))
        for needle in needles[1:]:
            mask = map(or_, mask, map(contains, lines, repeat(needle)))
        return list(compress(starts_of, mask))
    starts: set[int] = set()
    find, rfind = text.find, text.rfind
    for needle in needles:
        pos = find(needle)
        while pos >= 0:
            start = rfind("\n", 0, pos) + 1
            starts.add(start)
            end = find("\n", pos)
            if end < 0:
                break
            pos = find(needle, end + 1)
    return sorted(starts)


class _LineCount:
    """How many non-empty lines of `text` (pieces between newlines) end before a position, plus a base: counted
    incrementally (positions only grow), blank lines located once per chunk."""

    def __init__(self, text: str, base: int, split: tuple[list[str], list[int]] | None = None):
        self.text, self.pos, self.value = text, 0, base
        self.newlines = -1  # how many the whole text has, where known
        if split is not None:  # the chunk's lines (split_lines): an empty one but the last piece ends at its start
            lines, starts = split
            self.blanks: list[int] = list(compress(starts[:-1], map(not_, lines[:-1])))
            self.newlines = len(lines) - 1
        else:
            self.blanks = [0] if text.startswith("\n") else []  # newline positions that end an empty line
            p = text.find("\n\n")
            while p >= 0:
                self.blanks.append(p + 1)
                p = text.find("\n\n", p + 1)
        self.bi = 0

    def upto(self, p: int) -> int:
        """Non-empty lines whose end (newline, or the text's end) is before p."""
        text = self.text
        n = len(text)
        if p > self.pos:
            stop = min(p, n)
            whole = self.pos == 0 and stop == n and self.newlines >= 0  # the usual call: all of a chunk read in bulk
            self.value += self.newlines if whole else text.count("\n", self.pos, stop)
            blanks = self.blanks
            while self.bi < len(blanks) and blanks[self.bi] < stop:
                self.value -= 1
                self.bi += 1
            if p > n >= self.pos and n and text[-1] != "\n":  # a last line without its newline (final)
                self.value += 1
            self.pos = p
        return self.value


def _total(states: dict[str, IngestState]) -> IngestState:
    t = IngestState()
    for st in states.values():
        t.lines += st.lines
        t.records += st.records
        t.skipped += st.skipped
        t.restarts += st.restarts
        t.examples += st.examples[: max(0, MAX_EXAMPLES - len(t.examples))]
    main = states.get(LOG)
    if main:
        t.offset, t.inode = main.offset, main.inode
    return t


def unparsed_report(st: IngestState | None) -> str | None:
    """What a person should hear about lines that looked like metrics but were not understood."""
    if st is None or not st.skipped:
        return None
    shown = "\n".join(f"  {e}" for e in st.examples)
    return (f"{st.skipped} line(s) looked like metrics but were not understood" + (f"; the first:\n{shown}"
            if shown else ""))


def ingest_stats(run_dir: Path) -> IngestState:
    return _total(_load_states(run_dir))


# ---------------------------------------------------------------------------------------------------------------
# reading


def _regular(path: Path) -> bool:
    try:
        return S_ISREG(path.stat().st_mode)
    except (OSError, ValueError):
        return False


def _sane_record(rec: Any) -> dict[str, Any] | None:
    """A record as readers may trust it: an integer step (not a bool), and `time` a finite number or absent — a
    damaged or hand-edited metrics.jsonl must not break status, doctor or metrics."""
    if not isinstance(rec, dict):
        return None
    step = rec.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    t = rec.get("time")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t != t or t in (INF, -INF)):
        rec = {k: v for k, v in rec.items() if k != "time"}
    return rec


INF = float("inf")


def iter_metrics(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of a metrics.jsonl; a damaged line (e.g. a crash mid-write elsewhere) is skipped."""
    if not _regular(path):  # absent, or a FIFO/device that would block
        return
    with contextlib.suppress(FileNotFoundError), path.open("r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                rec = _sane_record(json.loads(line))
            except (ValueError, RecursionError):
                continue
            if rec is not None:
                yield rec


def tail_records(path: Path, max_bytes: int = 4 * 1024 * 1024) -> list[dict[str, Any]]:
    """The records in the last `max_bytes` of a metrics file: what status needs, read from the end."""
    try:
        st = path.stat()
    except OSError:
        return []
    if not S_ISREG(st.st_mode):
        return []
    size = st.st_size
    with path.open("rb") as fh:
        start = max(0, size - max_bytes)
        fh.seek(start)
        data = fh.read()
    if start:
        data = data[data.find(b"\n") + 1:]
    out = []
    for line in data.decode("utf-8", errors="replace").split("\n"):  # JSON may hold U+0085/U+2028 unescaped
        if not line.strip():
            continue
        try:
            rec = _sane_record(json.loads(line))
        except (ValueError, RecursionError):
            continue
        if rec is not None:
            out.append(rec)
    return out


# records rlctl writes itself into the stream, not the trainer: the GPU memory sampler's (rlctl.metrics.gpu) and
# the checkpoint evaluator's results (rlctl.evals.loop), each at the step the run had reached
OWN_PREFIXES = ("gpu/", "eval/")


def is_progress(rec: dict[str, Any]) -> bool:
    """The record says the trainer logged a step (a metric of its own), not one rlctl wrote beside it: the time of
    the last such record is the run's "last step", which an hour of GPU samples after a hung start never is."""
    return any(k not in ("step", "time") and not k.startswith(OWN_PREFIXES) for k in rec)


def by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Merge records per step (a step can be reported in several lines, e.g. by two processes of one run)."""
    merged: dict[int, dict[str, Any]] = {}
    for rec in records:
        merged.setdefault(rec["step"], {}).update(rec)
    return dict(sorted(merged.items()))
