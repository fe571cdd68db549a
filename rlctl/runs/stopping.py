"""Stopping a run from another shell: the supervisor if it lives (it records the outcome), else the group."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from rlctl.runs.state import ACTIVE, process_alive, read_state, write_state


def stop_run(run_dir: Path, grace: float = 30.0) -> str:
    state = read_state(run_dir)
    if state.get("status") not in ACTIVE:
        return f"{run_dir.name} is not running ({state.get('status', 'unknown')})."
    if state.get("executor") == "ray":
        from rlctl.executors.ray import stop_ray_job

        return stop_ray_job(run_dir, state)
    sup_alive = process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time"))
    child_alive = process_alive(state.get("pid"), state.get("pid_create_time"))
    if sup_alive:
        os.kill(state["supervisor_pid"], signal.SIGTERM)
        deadline = time.time() + grace + 15
        while time.time() < deadline and read_state(run_dir).get("status") in ACTIVE:
            time.sleep(0.1)
        return f"{run_dir.name}: {read_state(run_dir).get('status')}"
    if child_alive:  # the supervisor is gone (killed): do its job
        pgid = state.get("pgid") or state["pid"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline and process_alive(state.get("pid"), state.get("pid_create_time")):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    write_state(run_dir, status="stopped", ended_at=time.time(), exit_code=None)
    return f"{run_dir.name}: stopped"
