"""`rlctl watch [RUN...]`: pool runs kept alive unattended (docs/resilience.md). On the laptop, or any machine whose
./runs holds the runs' records and that reaches the pool (and the runs' store).

Each look at each run is rlctl.runs.failover's: moved to another host of its pool when its host is gone, an old
attempt stopped where its host answers again, on_event fired. It returns when every run it watches has ended (exit 0
when all finished, 1 otherwise); `--once` looks once (for cron). Idempotent and restartable: all it knows is in the
run records and the store. One watcher acts on a run at a time (a lock in the run's record, held for the watcher's
life and let go by the kernel when it dies, even by kill -9); another one waits and takes over when it stops. Across
machines the store's generations keep two watchers from launching the same run twice (rlctl.runs.fencing).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

from rlctl.core.state import list_runs, read_state
from rlctl.runs.failover import ENDED, Failover

LOCK = ".watch.lock"
HOLDER = ".watch.json"


def hold(run_dir: Path) -> IO[str] | None:
    """This process holds the run's watch lock from now on, or None when another watcher does."""
    fh = open(run_dir / LOCK, "a")  # noqa: SIM115 - held for the watcher's life
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    with contextlib.suppress(OSError):
        (run_dir / HOLDER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                  "since": time.time()}))
    return fh


def _holder(run_dir: Path) -> str:
    try:
        h = json.loads((run_dir / HOLDER).read_text())
        return f"pid {h['pid']} on {h['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another rlctl watch"


def unsettled(run_dir: Path) -> list[str]:
    """Earlier attempts no watcher has seen end (their host never answered again): what becomes of them."""
    from rlctl.runs.failover import lineage_of

    st = read_state(run_dir)
    lin = lineage_of(st)
    synced = bool((st.get("pool") or {}).get("sync"))
    how = ("it stops itself at its next look at the store" if synced else
           f"`rlctl watch {run_dir.name}` stops it once that host answers")
    return [f"attempt #{e.get('generation')} on {e.get('host')} was not seen to end ({e.get('host')} did not answer "
            f"again): {how}" for e in lin[:-1] if not e.get("settled")]


def pool_runs() -> list[Path]:
    """The runs here that have a pool and have not ended."""
    return [d for d in list_runs() if isinstance(read_state(d).get("pool"), dict)
            and read_state(d).get("status") not in ENDED]


def watch(runs: list[Path], interval: float, once: bool = False, out: Any = None) -> int:
    from rlctl.runs.on_event import wait_all

    out = out or sys.stdout
    if not runs:
        out.write("no pool run to watch here (rlctl launch RECIPE --on HOST1,HOST2 starts one)\n")
        return 0
    looks = {d: Failover(d, out) for d in runs}
    held: dict[Path, IO[str]] = {}
    waiting_said: set[Path] = set()
    status: dict[Path, str] = {}
    try:
        while True:
            for d in runs:
                if d not in held and (fh := hold(d)) is not None:
                    held[d] = fh
                    looks[d].say("watching" + (" (taking over from a watcher that stopped)" if d in waiting_said
                                               else ""))
                if d in held:
                    try:
                        status[d] = looks[d].step()
                    except Exception as e:  # one run's trouble (a host's odd answer) never stops the others
                        from rlctl.errors import RlctlError

                        msg = e.message if isinstance(e, RlctlError) else f"{type(e).__name__}: {e}"
                        looks[d].say(f"could not look at it: {msg}")
                        status[d] = str(read_state(d).get("status") or "unknown")
                else:
                    if d not in waiting_said:
                        looks[d].say(f"watched by {_holder(d)}: this one takes over if it stops")
                        waiting_said.add(d)
                    status[d] = str(read_state(d).get("status") or "unknown")
            if once or all(status[d] in ENDED for d in runs):
                break
            time.sleep(interval)
    finally:
        for fh in held.values():
            fh.close()
        wait_all()
    for d in runs:
        out.write(f"{d.name}: {status.get(d, 'unknown')}\n")
        for note in unsettled(d):
            out.write(f"  {note}\n")
    out.flush()
    if once:
        return 0
    return 0 if all(status[d] == "finished" for d in runs) else 1
