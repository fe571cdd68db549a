"""`[run] on_event`: the command a watcher runs when a pool run fails over, dies or finishes (seed 004 watched W&B by
hand every 5-10 minutes; a provisioning script that feeds the pool a fresh host fits here).

The command is the recipe's string split like a shell would (never run by one); rlctl adds nothing to its command
line. The event is in its environment — RLCTL_EVENT (failover | death | finish), RLCTL_RUN, RLCTL_HOST (where the run
is now), RLCTL_FROM_HOST, RLCTL_STEP, RLCTL_GENERATION, RLCTL_REASON, and all of it as RLCTL_EVENT_JSON — beside
the watcher's own environment. It runs in the background, its output appended to the run's `on_event.log`; each
event of a run fires once, however often watchers restart (the run record keeps which fired).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

LOG = "on_event.log"
_children: list[subprocess.Popen] = []


def fire(run_dir: Path, command: str, event: str, **fields: Any) -> None:
    argv = shlex.split(command)
    info = {"event": event, "run": run_dir.name, "time": time.time(), **fields}
    env = dict(os.environ)
    env.update(RLCTL_EVENT=event, RLCTL_RUN=run_dir.name, RLCTL_EVENT_JSON=json.dumps(info, default=str))
    env.update({f"RLCTL_{k.upper()}": str(v) for k, v in fields.items() if v is not None})
    with (run_dir / LOG).open("ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {event}: {shlex.join(argv)}\n".encode())
        log.flush()
        try:
            p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        except OSError as e:
            log.write(f"could not start it: {e.strerror or e}\n".encode())
            return
    _children.append(p)


def wait_all(timeout: float = 120.0) -> None:
    """Before a watcher returns: the event commands it started end (they are left running after `timeout`)."""
    deadline = time.time() + timeout
    for p in list(_children):
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            continue
        _children.remove(p)
