"""Stopping a run from another shell, through its executor: the supervisor if it lives (it records the outcome),
else the processes or job themselves. A run that already ended keeps its history: stop never rewrites it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from rlctl.runs.state import ACTIVE, process_alive, read_state, settled_status

ATTACHED = "attached"  # the executor `rlctl attach` records: a run rlctl reads but did not start


def stop_plan(run_dir: Path, grace: float) -> str:
    """What `rlctl stop` would do to a run, from its recorded state; nothing is signalled."""
    from rlctl import executors

    st = read_state(run_dir)
    status = st.get("status", "unknown")
    if status not in ACTIVE:
        return f"{run_dir.name} is {status}: stop would do nothing."
    if st.get("executor") == ATTACHED:
        return (f"would end the following of {run_dir.name} (SIGINT to `rlctl attach --follow`, pid "
                f"{st.get('supervisor_pid')}); the run itself was not started by rlctl and is not stopped.")
    return executors.get(st.get("executor")).stop_plan(run_dir, st, grace)


def _stop_following(run_dir: Path, state: dict[str, Any], grace: float) -> str:
    """An attached run that `rlctl attach --follow` follows: the following ends (as on Ctrl-C, which records the run
    as attached again); the run itself is not rlctl's to stop."""
    pid, created = state.get("supervisor_pid"), state.get("supervisor_create_time")
    if not process_alive(pid, created):
        return f"{run_dir.name} is not running (attached): nothing follows it, and rlctl did not start it."
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0)):
        os.kill(pid, sig)
        end = time.time() + wait
        while time.time() < end and process_alive(pid, created):
            time.sleep(0.1)
        if not process_alive(pid, created):
            break
    return (f"{run_dir.name}: no longer followed (rlctl attach --follow, pid {pid}, ended); the run itself was not "
            f"started by rlctl and goes on where it runs. Status: {read_state(run_dir).get('status')}.")


def stop_run(run_dir: Path, grace: float = 30.0) -> str:
    from rlctl import executors

    state = read_state(run_dir)
    if state.get("executor") == ATTACHED and state.get("status") in ACTIVE:
        return _stop_following(run_dir, state, grace)
    status = settled_status(run_dir, state)  # a run that ended while nobody watched is recorded as it ended
    if status == "unreachable":  # its host did not answer: the run may well go on there
        from rlctl.errors import Unreachable

        st = read_state(run_dir)
        raise Unreachable(f"{run_dir.name} was not stopped: {st.get('unreachable') or 'its host did not answer'}; "
                          f"last known state: {st.get('status')}, so it may still run there.",
                          hint=f"when the host answers again: rlctl stop {run_dir.name}")
    name = state.get("executor")
    if name not in executors.registry():
        name = "local"
    if status not in ACTIVE:
        code = read_state(run_dir).get("exit_code")
        said = f"{run_dir.name} is not running ({status}" + (f", exit code {code})." if code is not None else ").")
        if state.get("executor") != ATTACHED:  # what its attempts left behind still goes (an engine of its own)
            left = executors.get(name).leftovers(run_dir, state, grace)
            if left:
                said += f" {left[0].upper()}{left[1:]}."
        return said
    return executors.get(name).stop(run_dir, read_state(run_dir), grace)
