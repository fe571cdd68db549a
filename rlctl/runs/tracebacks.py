"""Python tracebacks in a run's log, read as a person reads them: each one's exception lines, innermost last (Ray's
RayTaskError chain goes on inside one traceback: `ray.exceptions.RayTaskError: ray::A.f() (pid=...)`, more frames,
then the error the remote task raised), and the frame that raised it.

Log lines carry prefixes that are not the program's output: colour codes, Ray's `(Actor pid=N, ip=A)`, vLLM's
process name `(EngineCore pid=N)` and its logger's `ERROR 11-27 17:04:54 [core.py:1449] `. They are read through, and
lines are grouped by them, so that two processes whose tracebacks interleave in one log are read apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Ray's driver prints a worker's line as `(Actor pid=N[, ip=A]) line`; vLLM names its processes the same way
# (`(EngineCore pid=N) `, `(Worker pid=N) `, `(APIServer pid=N) `), and Ray may print both before one line
PROCESS = re.compile(r"^\((?:[A-Za-z_][\w.:-]* )?pid=[^)]*\) ?")
# vLLM's logger (vllm/logger.py _FORMAT "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s",
# _DATE_FORMAT "%m-%d %H:%M:%S")
VLLM_LOG = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ")
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
START = "Traceback (most recent call last):"
# an exception line: a (dotted) class name, then its message; a bare name only where a traceback says it is one
EXCEPTION = re.compile(r"^(?P<name>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)(?::\s?(?P<msg>.*))?$")
NAMED = re.compile(r"(Error|Exception|Exit|Interrupt|Fault|Warning|Iteration|Timeout|Failure)$")


def split(line: str) -> tuple[str, str]:
    """(the process a line came from: its prefixes, the program's text) of one log line, colours removed."""
    text = ANSI.sub("", line.rstrip("\r\n"))
    key = []
    while True:
        m = PROCESS.match(text)
        if m is None:
            break
        key.append(m.group(0).strip())
        text = text[m.end():]
    m = VLLM_LOG.match(text)
    if m is not None:
        text = text[m.end():]
    return " ".join(key), text


@dataclass
class Raised:
    """One exception line of a traceback: where it is in the lines read, its text, and the frame that raised it."""

    index: int  # in the lines given to `tracebacks`
    name: str
    message: str
    text: str  # the exception line as the program printed it (prefixes and colours gone)
    frame: tuple[str, int, str] | None = None  # (file, line, function) of the last frame above it

    @property
    def short(self) -> str:
        """`Name: message` with the class's module left out."""
        name = self.name.rsplit(".", 1)[-1]
        return f"{name}: {self.message}" if self.message else name

    def where(self) -> str | None:
        """"in FUNC, FILE:LINE" of the frame that raised it, the file from its package on (site-packages dropped)."""
        if self.frame is None:
            return None
        file, line, func = self.frame
        parts = file.split("/")
        for i, p in enumerate(parts):  # from the top-level package on: vllm/lora/model_manager.py
            if p in ("site-packages", "dist-packages") and i + 1 < len(parts):
                parts = parts[i + 1:]
                break
        else:  # a checkout or a kit (/tmp/site/trl-vllm/vllm/...): back while the names can be packages
            keep = 1
            while keep < min(len(parts), 5) and parts[-keep - 1].isidentifier():
                keep += 1
            parts = parts[-keep:]
        return f"{func}, {'/'.join(parts)}:{line}"


@dataclass
class Traceback:
    process: str
    start: int
    raised: list[Raised] = field(default_factory=list)  # outermost first (Ray's chain: the remote error last)

    @property
    def innermost(self) -> Raised | None:
        return self.raised[-1] if self.raised else None


def tracebacks(lines: list[str]) -> list[Traceback]:
    """Every traceback in `lines` (raw log lines), in the order they began. A traceback starts at "Traceback (most
    recent call last):" (or, where another process's line swallowed that, at its first frame), takes the indented
    frame and code lines of its process, and each unindented `Name: message` after frames is one of its exception
    lines; any other unindented line of that process ends it."""
    open_: dict[str, Traceback] = {}
    frames: dict[str, tuple[str, int, str] | None] = {}
    in_frames: dict[str, bool] = {}
    out: list[Traceback] = []
    for i, raw in enumerate(lines):
        key, text = split(raw)
        if START in text:
            if not text.startswith(START):  # glued to another process's line: the traceback is the driver's
                key = ""
            tb = Traceback(key, i)
            open_[key], frames[key], in_frames[key] = tb, None, False
            out.append(tb)
            continue
        if not text.strip():
            continue
        tb = open_.get(key)
        frame = FRAME.match(text)
        if frame is not None:
            if tb is None:  # frames whose "Traceback" line went elsewhere
                tb = open_[key] = Traceback(key, i)
                out.append(tb)
            frames[key] = (frame["file"], int(frame["line"]), frame["func"])
            in_frames[key] = True
            continue
        if tb is None:
            continue
        if text[0] in " \t":  # code and carets under a frame
            continue
        m = EXCEPTION.match(text.strip())
        if m is not None and in_frames.get(key) and (m["msg"] is not None or NAMED.search(m["name"])):
            tb.raised.append(Raised(i, m["name"], (m["msg"] or "").strip(), text.strip(), frames.get(key)))
            in_frames[key] = False
            continue
        del open_[key]  # the program's next output: this traceback is over
    return [tb for tb in out if tb.raised]


def relayed_from(inner: Raised, others: list[Traceback], least: int = 40) -> Raised | None:
    """The exception another process raised whose message this one carries (Ray relays a remote task's error;
    vLLM's client says "Call to collective_rpc method failed: <the engine's error>"), or None."""
    if not inner.message:
        return None
    best = None
    for tb in others:
        r = tb.innermost
        if r is None or r is inner or not r.message or r.message == inner.message:
            continue
        probe = r.message[:120]
        if len(probe) >= min(least, len(r.message)) and probe in inner.message:
            best = r
    return best
