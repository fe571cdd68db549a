"""Every process one local attempt started, those that left its process group included, and their end.

An attempt runs in a process group of its own, and stopping it signals that group. But an inference engine or a Ray
worker may start a session of its own (setsid): it leaves the group, outlives a SIGKILLed driver and keeps its GPU
memory, so the next attempt starts beside an orphaned engine (docs/gpu/verl-3.json: a Ray worker of the killed
attempt still held 7.5 GiB when the restart began). So the executor looks at the attempt's process tree while it
runs (`track`, at most once a second), remembers each descendant with its start time (attempts/<n>/pids.json, for
a supervisor that adopts the run later) and, when the attempt ends, stops those still alive and waits until every
one of them is gone: a process in exit still holds its GPU memory until the driver has torn its context down.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

PIDS = "pids.json"
SCAN_EVERY_S = 1.0
# in every attempt's environment, inherited by whatever it starts, however it detaches (setsid, `nohup ... &`, a
# double fork): the processes of an attempt are found by it even after they left its tree
MARK = "RLCTL_ATTEMPT"


def mark_value(run_dir: Path, attempt: int) -> str:
    return f"{Path(run_dir).resolve()}#{attempt}"


def marked(value: str) -> list[tuple[Any, str]]:
    """The live processes whose environment carries MARK=value (this process excluded)."""
    import psutil

    out = []
    for p in psutil.process_iter(["status", "cmdline"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(MARK) == value:
                out.append((p, " ".join(p.info["cmdline"] or [])[:160]))
        except (psutil.Error, OSError):
            continue
    return out


def _proc(pid: int, create_time: float | None) -> Any:
    """The live, non-zombie process `pid` started at `create_time`, else None (the pid may be reused)."""
    import psutil

    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.05:
            return None
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.Error, OSError):
        return None


class AttemptProcesses:
    def __init__(self, adir: Path, root_pid: int | None, mark: str | None = None):
        self.path = adir / PIDS
        self.root = root_pid
        self.mark = mark
        self.known: dict[int, dict[str, Any]] = {}
        self.last = 0.0
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            self.known = {int(k): v for k, v in json.loads(self.path.read_text()).items()}

    def track(self, force: bool = False) -> None:
        """Remember the attempt's descendants now (throttled)."""
        now = time.monotonic()
        if not self.root or (not force and now - self.last < SCAN_EVERY_S):
            return
        self.last = now
        import psutil

        try:
            kids = psutil.Process(self.root).children(recursive=True)
        except (psutil.Error, OSError):
            return
        grew = False
        for k in kids:
            if k.pid in self.known:
                continue
            with contextlib.suppress(psutil.Error, OSError):
                self.known[k.pid] = {"create_time": k.create_time(), "cmd": " ".join(k.cmdline())[:160]}
                grew = True
        if grew:
            with contextlib.suppress(OSError):
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps({str(k): v for k, v in self.known.items()}))
                os.replace(tmp, self.path)

    def alive(self) -> list[tuple[Any, str]]:
        """Every process of the attempt still there: those seen in its tree, and those its environment marks."""
        out = []
        for pid, rec in self.known.items():
            p = _proc(pid, rec.get("create_time"))
            if p is not None:
                out.append((p, str(rec.get("cmd") or "")))
        if self.mark:
            seen = {p.pid for p, _ in out}
            out += [(p, cmd) for p, cmd in marked(self.mark) if p.pid not in seen]
        return out


def stop_strays(procs: list[tuple[Any, str]], grace: float) -> list[str]:
    """SIGTERM, then SIGKILL after `grace`, the processes given; wait until they are gone. What was done, per
    process, for the run's log."""
    import psutil

    said = []
    for p, _cmd in procs:
        with contextlib.suppress(psutil.Error, OSError):
            p.send_signal(signal.SIGTERM)
    _gone, alive = psutil.wait_procs([p for p, _ in procs], timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error, OSError):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(alive, timeout=30)
    killed = {p.pid for p in alive}
    for p, cmd in procs:
        how = "SIGKILL after SIGTERM was ignored" if p.pid in killed else "SIGTERM"
        said.append(f"pid {p.pid} ({cmd or '?'}): {how}")
    return said


def wait_gone(pred: Any, timeout: float) -> bool:
    """Wait until `pred()` is false (every process of the attempt gone, exits included); False at the timeout."""
    deadline = time.time() + timeout
    while pred():
        if time.time() >= deadline:
            return False
        time.sleep(0.05)
    return True
