"""The local executor: each attempt is its own process group on this machine.

The backend writes straight into stdout.log (a file, not a pipe), so however fast it prints it never waits on
rlctl. Between the supervisor and the backend sits `wrap.py`, which records the backend's exit code in
`attempts/<n>/exit.json` when it ends: after a SIGKILLed supervisor, status/logs/stop read the real outcome there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from rlctl.core.state import ACTIVE, process_alive, process_create_time, read_state, write_state
from rlctl.executors.attempt_procs import MARK, AttemptProcesses, mark_value, stop_strays, wait_gone
from rlctl.executors.base import EXIT_RECORD, Executor, RunHandle, attempt_dir, read_exit_record
from rlctl.metrics.stream import LOG

WRAP = str(Path(__file__).resolve().with_name("wrap.py"))
EXIT_UNKNOWN = None


def _signal_group(pgid: int | None, sig: int) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int | None) -> bool:
    """True while a non-zombie process of the group exists."""
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        import psutil
    except ImportError:
        return True
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _last_attempt_ended(state: dict[str, Any], outcome: str, code: int | None, ended_at: float | None
                        ) -> dict[str, Any]:
    """The attempts list with its last attempt ended as the run did, when no supervisor lived to record it (status
    showed it `-> running` under a run `stopped`); {} when there is nothing to update."""
    attempts = [dict(a) for a in state.get("attempts") or []]
    if not attempts or attempts[-1].get("ended_at") is not None:
        return {}
    attempts[-1].update(outcome=outcome, exit_code=code, ended_at=ended_at, exit_recorded=code is not None)
    return {"attempts": attempts}


def _note(run_dir: Path, text: str) -> None:
    """One line of rlctl's own in the run's log, where the user reads the attempt's end."""
    with contextlib.suppress(OSError), open(run_dir / LOG, "a") as fh:
        fh.write(text + "\n")


def _resolvable(cmd: str, cwd: Path) -> bool:
    if os.sep in cmd:
        p = Path(cmd) if os.path.isabs(cmd) else cwd / cmd
        return p.is_file() and os.access(p, os.X_OK)
    return shutil.which(cmd) is not None


def _outcome(code: int | None, stop_requested: bool) -> str:
    if stop_requested:
        return "stopped"
    return "finished" if code == 0 else "failed"


class LocalExecutor(Executor):
    name: ClassVar[str] = "local"

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}
        self.trees: dict[int, AttemptProcesses] = {}  # per attempt: its descendants, those that leave its group too

    # ---- one attempt ---------------------------------------------------------------------------------------------
    def start(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], attempt: int) -> RunHandle:
        argv = list(spec["argv"])
        if not argv or not _resolvable(argv[0], run_dir):
            msg = f"rlctl: could not start {argv[0] if argv else ''!r}: no such executable\n"
            with contextlib.suppress(OSError), open(run_dir / LOG, "ab") as fh:
                fh.write(msg.encode())
            raise FileNotFoundError(2, "No such file or directory", argv[0] if argv else "")
        adir = attempt_dir(run_dir, attempt)
        adir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (adir / EXIT_RECORD).unlink()
        env = {**env, MARK: mark_value(run_dir, attempt)}  # what the attempt starts is found by it, wherever it goes
        log = open(run_dir / LOG, "ab", buffering=0)  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                [sys.executable, WRAP, str(adir / EXIT_RECORD), "--", *argv], cwd=run_dir, env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        finally:
            log.close()
        self.procs[attempt] = proc
        self.trees[attempt] = AttemptProcesses(adir, proc.pid, mark_value(run_dir, attempt))
        return RunHandle(self.name, {"pid": proc.pid, "pgid": proc.pid, "create_time": process_create_time(proc.pid)},
                         attempt)

    def poll(self, run_dir: Path, handle: RunHandle) -> int | None:
        proc = self.procs.get(handle.attempt)
        if proc is not None:
            code = proc.poll()
            if code is None:
                self._tree(run_dir, handle).track()
            return code
        # adopted from a dead supervisor: not our child, so its exit record tells
        if process_alive(handle.ref.get("pid"), handle.ref.get("create_time")):
            self._tree(run_dir, handle).track()
            return None
        rec = read_exit_record(run_dir, handle.attempt)
        return int(rec["exit_code"]) if rec and rec.get("exit_code") is not None else -signal.SIGKILL

    def wait(self, run_dir: Path, handle: RunHandle, timeout: float) -> None:
        proc = self.procs.get(handle.attempt)
        if proc is None:  # adopted: not our child, nothing to wait on
            super().wait(run_dir, handle, timeout)
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)

    def signal_stop(self, run_dir: Path, handle: RunHandle) -> None:
        _signal_group(handle.ref.get("pgid"), signal.SIGTERM)

    def kill(self, run_dir: Path, handle: RunHandle) -> None:
        _signal_group(handle.ref.get("pgid"), signal.SIGKILL)

    def _tree(self, run_dir: Path, handle: RunHandle) -> AttemptProcesses:
        if handle.attempt not in self.trees:  # adopted: what the supervisor before this one saw, and on from here
            root = handle.ref.get("pid") if process_alive(handle.ref.get("pid"), handle.ref.get("create_time")) \
                else None
            self.trees[handle.attempt] = AttemptProcesses(attempt_dir(run_dir, handle.attempt), root,
                                                          mark_value(run_dir, handle.attempt))
        return self.trees[handle.attempt]

    def cleanup(self, run_dir: Path, handle: RunHandle, grace: float) -> None:
        """The attempt's processes are all gone when this returns (bounded): its group, then those that left it;
        a process still in exit holds its GPU memory, so the next attempt waits for it too."""
        pgid = handle.ref.get("pgid")
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.time() + min(grace, 10)
            while _group_alive(pgid) and time.time() < deadline:
                time.sleep(0.1)
            _signal_group(pgid, signal.SIGKILL)
        tree = self._tree(run_dir, handle)
        strays = [(p, cmd) for p, cmd in tree.alive() if _pgid(p.pid) != pgid]
        if strays:
            said = stop_strays(strays, min(grace, 10))
            _note(run_dir, f"rlctl: {len(said)} process(es) of attempt {handle.attempt} left the attempt's process "
                           f"group and outlived it (an engine or worker in a session of its own): stopped: "
                           f"{'; '.join(said)}")
        if not wait_gone(lambda: _group_alive(pgid) or bool(tree.alive()), 30):
            left = ", ".join(f"pid {p.pid}" for p, _ in tree.alive()) or f"process group {pgid}"
            _note(run_dir, f"rlctl: attempt {handle.attempt}'s {left} still there 30 s after SIGKILL "
                           f"(a process stuck in the kernel: its GPU memory may still be held)")

    def pids(self, run_dir: Path, handle: RunHandle) -> list[int]:
        import psutil

        pgid = handle.ref.get("pgid")
        out = []
        for p in psutil.process_iter(["status"]):
            try:
                if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE and p.pid != pgid:
                    out.append(p.pid)
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        return out

    def leftovers(self, run_dir: Path, state: dict[str, Any], grace: float) -> str | None:
        """Processes of the run's ended attempts still alive (an engine that left its group while nobody supervised
        the run): stopped; what was done, or None."""
        said = []
        for adir in sorted(run_dir.glob("attempts/*")):
            if not adir.name.isdigit():
                continue
            alive = AttemptProcesses(adir, None, mark_value(run_dir, int(adir.name))).alive()
            if alive:
                said += [f"attempt {adir.name}: {x}" for x in stop_strays(alive, min(grace, 10))]
        if not said:
            return None
        text = f"stopped {len(said)} process(es) the run's ended attempts had left: {'; '.join(said)}"
        _note(run_dir, f"rlctl: {text}")
        return text

    # ---- any process -----------------------------------------------------------------------------------------------
    def status(self, run_dir: Path, state: dict[str, Any]) -> str:
        """Recorded status, corrected by the processes and the exit record: a run whose supervisor died is shown
        as it really ended (and that is written down), or `lost` only when nothing can tell."""
        status = state.get("status", "unknown")
        if status not in ACTIVE:
            return status
        handle = RunHandle.from_state(state)
        pid = handle.ref.get("pid") if handle else state.get("pid")
        ctime = handle.ref.get("create_time") if handle else state.get("pid_create_time")
        if process_alive(pid, ctime):
            return status
        if process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time")):
            return status  # the supervisor is about to record the end, or restarting
        rec = read_exit_record(run_dir, handle.attempt if handle else int(state.get("attempt") or 1))
        if rec is None:
            return "lost"
        outcome = _outcome(rec.get("exit_code"), bool(state.get("stop_requested_at")) or status == "stopping")
        with contextlib.suppress(OSError):
            write_state(run_dir, status=outcome, exit_code=rec.get("exit_code"), ended_at=rec.get("ended_at"),
                        settled_by="exit record (the supervisor was gone)",
                        **_last_attempt_ended(state, outcome, rec.get("exit_code"), rec.get("ended_at")))
        return outcome

    def stop_plan(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        target = f"process group {state['pgid']}" if state.get("pgid") else f"pid {state.get('pid', '?')}"
        if process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time")):
            sup = f" (through its supervisor, pid {state['supervisor_pid']})"
        else:  # the supervisor is gone: stop does its job itself
            sup = (f" itself (its supervisor, pid {state['supervisor_pid']}, is gone), and any process its attempts "
                   f"left" if state.get("supervisor_pid") else "")
        return f"would send SIGTERM to {target} of {run_dir.name}{sup}, then SIGKILL after {grace:g} s."

    def stop(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        sup_alive = process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time"))
        if sup_alive:
            os.kill(state["supervisor_pid"], signal.SIGTERM)
            deadline = time.time() + grace + 15
            while time.time() < deadline and read_state(run_dir).get("status") in ACTIVE:
                time.sleep(0.1)
            return f"{run_dir.name}: {read_state(run_dir).get('status')}"
        # the supervisor is gone (killed): do its job
        write_state(run_dir, status="stopping", stop_requested_at=time.time())
        handle = RunHandle.from_state(state)
        pgid = (handle.ref.get("pgid") if handle else None) or state.get("pgid") or state.get("pid")
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline and _group_alive(pgid):
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)
        attempt = handle.attempt if handle else int(state.get("attempt") or 1)
        strays = [(p, cmd) for p, cmd in AttemptProcesses(attempt_dir(run_dir, attempt), None,
                                                          mark_value(run_dir, attempt)).alive()
                  if _pgid(p.pid) != pgid]
        if strays:
            said = stop_strays(strays, min(grace, 10))
            _note(run_dir, f"rlctl: stopped {len(said)} process(es) of attempt {attempt} that had left its process "
                           f"group: {'; '.join(said)}")
        deadline = time.time() + 5
        rec = read_exit_record(run_dir, attempt)
        while rec is None and time.time() < deadline and _group_alive(pgid):
            time.sleep(0.1)
            rec = read_exit_record(run_dir, attempt)
        code = rec.get("exit_code") if rec else None
        now = time.time()
        write_state(run_dir, status="stopped", ended_at=now, exit_code=code,
                    **_last_attempt_ended(read_state(run_dir), "stopped", code, now))
        return f"{run_dir.name}: stopped" + (f" (exit code {code})" if code is not None else "")


class Supervisor:
    """The supervisor with the local executor: `Supervisor(run_dir, spec, env).run()` (kept for callers and tests
    that drive one attempt directly: start(), loop(), proc, request_stop())."""

    def __new__(cls, run_dir: Path, spec: dict[str, Any], env: dict[str, str], on_tick: Any = None) -> Any:
        from rlctl.runs.supervisor import Supervisor as Generic

        return Generic(run_dir, spec, env, executor=LocalExecutor(), on_tick=on_tick)


def main(argv: list[str] | None = None) -> int:
    """`python -m rlctl.executors.local RUN_DIR`: the generic supervisor entry point."""
    from rlctl.runs.supervisor import main as supervise

    return supervise(argv)


if __name__ == "__main__":
    sys.exit(main())
