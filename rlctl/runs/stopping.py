"""Stopping a run from another shell, through its executor: the supervisor if it lives (it records the outcome),
else the processes or job themselves. A run that already ended keeps its history: stop never rewrites it."""

from __future__ import annotations

from pathlib import Path

from rlctl.runs.state import ACTIVE, read_state, settled_status


def stop_run(run_dir: Path, grace: float = 30.0) -> str:
    from rlctl import executors

    state = read_state(run_dir)
    status = settled_status(run_dir, state)  # a run that ended while nobody watched is recorded as it ended
    if status not in ACTIVE:
        code = read_state(run_dir).get("exit_code")
        return f"{run_dir.name} is not running ({status}" + (f", exit code {code})." if code is not None else ").")
    name = state.get("executor")
    if name not in executors.registry():
        name = "local"
    return executors.get(name).stop(run_dir, read_state(run_dir), grace)
