"""The supervisor: starts the backend as its own process group, follows its log into the metrics stream,
forwards stop signals to the whole group, and records how the run ended in state.json.

The child writes straight into stdout.log (a file, not a pipe), so however fast it prints it never waits on
rlctl; the supervisor reads the file behind it. Attached launches run this loop in the CLI process; detached
ones run `python -m rlctl.executors.local RUN_DIR` in a new session.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.metrics.sinks import SinkPump
from rlctl.metrics.stream import LOG, ingest
from rlctl.runs.state import process_create_time, write_state

SPEC = ".launch.json"
POLL = 0.5


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class Supervisor:
    def __init__(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str],
                 on_tick: Callable[[Path], None] | None = None):
        self.run_dir = run_dir
        self.spec = spec
        self.env = env
        self.on_tick = on_tick
        self.stop_requested_at: float | None = None
        self.grace = float(spec.get("grace_seconds", 30))
        self.proc: subprocess.Popen | None = None
        self.sinks = SinkPump(run_dir, spec.get("sinks"))

    def request_stop(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:  # noqa: ARG002
        if self.stop_requested_at is None:
            self.stop_requested_at = time.time()
            write_state(self.run_dir, status="stopping", stop_requested_at=self.stop_requested_at)
            if self.proc is not None:
                _signal_group(self.proc.pid, signal.SIGTERM)

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, self.request_stop)

    def start(self) -> None:
        log = open(self.run_dir / LOG, "ab", buffering=0)  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                self.spec["argv"], cwd=self.run_dir, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as e:
            log.write(f"rlctl: could not start {self.spec['argv'][0]!r}: {e}\n".encode())
            log.close()
            write_state(self.run_dir, status="failed", exit_code=127, ended_at=time.time(),
                        error=f"could not start {self.spec['argv'][0]!r}: {e.strerror or e}")
            raise
        log.close()
        write_state(self.run_dir, status="running", pid=self.proc.pid, pgid=self.proc.pid,
                    pid_create_time=process_create_time(self.proc.pid),
                    supervisor_pid=os.getpid(), supervisor_create_time=process_create_time(os.getpid()))

    def loop(self) -> int:
        assert self.proc is not None
        backend = self.spec["backend"]
        while True:
            code = self.proc.poll()
            ingest(self.run_dir, backend)
            self.sinks.pump()
            self._housekeeping()
            if self.on_tick:
                self.on_tick(self.run_dir)
            if code is not None:
                break
            if self.stop_requested_at and time.time() - self.stop_requested_at > self.grace:
                _signal_group(self.proc.pid, signal.SIGKILL)
            time.sleep(POLL)
        return self.finish(code)

    def _housekeeping(self) -> None:
        from rlctl.runs.checkpoints import disk_watch, prune_during_run

        now = time.time()
        if now - getattr(self, "_last_housekeeping", 0.0) < float(self.spec.get("housekeeping_seconds", 10)):
            return
        self._last_housekeeping = now
        keep = self.spec.get("keep_last")
        if keep:
            prune_during_run(self.run_dir, self.spec, keep)
        with contextlib.suppress(OSError):
            disk_watch(self.run_dir, self.spec)

    def finish(self, code: int) -> int:
        assert self.proc is not None
        # nothing of the run may outlive it: whatever the child left in its group goes too
        if _group_alive(self.proc.pid):
            _signal_group(self.proc.pid, signal.SIGTERM)
            deadline = time.time() + min(self.grace, 10)
            while _group_alive(self.proc.pid) and time.time() < deadline:
                time.sleep(0.1)
            _signal_group(self.proc.pid, signal.SIGKILL)
        ingest(self.run_dir, self.spec["backend"], final=True)
        self.sinks.pump(close=True)
        if self.on_tick:
            self.on_tick(self.run_dir)
        if self.stop_requested_at is not None:
            status = "stopped"
        else:
            status = "finished" if code == 0 else "failed"
        write_state(self.run_dir, status=status, exit_code=code, ended_at=time.time())
        return code

    def run(self) -> int:
        self.install_signal_handlers()
        self.start()
        return self.loop()


def write_spec(run_dir: Path, spec: dict[str, Any]) -> None:
    (run_dir / SPEC).write_text(json.dumps(spec, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Detached mode: `python -m rlctl.executors.local RUN_DIR`; the child's environment is ours."""
    args = argv if argv is not None else sys.argv[1:]
    run_dir = Path(args[0])
    spec = json.loads((run_dir / SPEC).read_text())
    sup = Supervisor(run_dir, spec, dict(os.environ))
    try:
        return sup.run()
    except OSError:
        return 127


if __name__ == "__main__":
    sys.exit(main())
