"""The tiny process between the supervisor and the backend: runs the command, and when it ends writes its exit code
to the run directory atomically, so the outcome is durable where the child ends — whatever happens to rlctl.

`python .../wrap.py EXIT_FILE -- ARGV...`. Standard library only, run by path (imports nothing of rlctl). It shares
the child's process group and lets the group's signals reach the child; it ignores them itself (a no-op handler,
reset to the default in the child by exec). It exits as the child did: same code, or the same signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time


def write_record(path: str, record: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    data = (json.dumps(record) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    try:
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: wrap.py EXIT_FILE -- ARGV...", file=sys.stderr)
        return 2
    exit_file, cmd = argv[0], argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    started = time.time()
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        print(f"rlctl: could not start {cmd[0]!r}: {e.strerror or e}", file=sys.stderr, flush=True)
        code = 127
        child = None
    else:
        code = child.wait()
    record = {"exit_code": code, "started_at": started, "ended_at": time.time(),
              "pid": child.pid if child else None, "wrapper_pid": os.getpid()}
    try:
        write_record(exit_file, record)
    except OSError as e:  # a full disk: the supervisor (if alive) still sees our exit status
        print(f"rlctl: could not record the exit code in {exit_file}: {e}", file=sys.stderr, flush=True)
    if code < 0:  # die of the same signal (SIGKILL/SIGSTOP cannot be caught, so have no handler to reset)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
