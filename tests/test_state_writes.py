"""state.json has more than one writer: the run's supervisor, and `rlctl status` wherever the run's executor learns
something only it can tell (a SLURM job's queue state, from the login node, while the job's own rlctl writes the
same file on the shared filesystem; a local run whose supervisor died). Each write is a read-merge-write of the whole
file; no writer may lose what another wrote meanwhile (a lost `status` left a requeued SLURM run `restarting` while
its attempt ran)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlctl.core.state import read_state, update_state, write_state

ROOT = Path(__file__).resolve().parents[1]

WRITER = """
import sys
from pathlib import Path
from rlctl.core.state import write_state
run_dir, tag, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(n):
    write_state(run_dir, **{f"{tag}{i}": i, "last": tag})
"""


def test_two_processes_lose_no_write(tmp_path):
    """Two processes (the job's supervisor and the login node's status) write keys of their own at once."""
    write_state(tmp_path, status="running")
    n = 100
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), tag, str(n)], cwd=ROOT) for tag in "ab"]
    for p in procs:
        assert p.wait(timeout=120) == 0
    state = read_state(tmp_path)
    lost = [f"{t}{i}" for t in "ab" for i in range(n) if f"{t}{i}" not in state]
    assert not lost, f"{len(lost)} of {2 * n} writes lost, e.g. {lost[:5]}"
    assert state["status"] == "running"


def test_a_signal_handler_writing_in_the_middle_of_a_write_loses_nothing(tmp_path):
    """The supervisor writes state.json from its signal handlers (SIGTERM: stopping) too, which may run between the
    read and the rename of a write the same process was doing: neither write is lost, nor does the process wait
    on the lock it holds itself."""
    write_state(tmp_path, status="running")
    fired: list[int] = []

    def handler(signum, frame):
        n = len(fired)  # a handler may run inside another: each its own key
        fired.append(n)
        if n + 1 >= 50:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
        write_state(tmp_path, **{f"h{n}": True})

    old = signal.signal(signal.SIGPROF, handler)  # SIGALRM is pytest-timeout's
    signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
    try:
        deadline = time.monotonic() + 20
        i = 0
        while (len(fired) < 50 or i < 50) and time.monotonic() < deadline:
            write_state(tmp_path, **{f"m{i}": i})
            i += 1
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, old)
    assert len(fired) == 50, len(fired)
    state = json.loads((tmp_path / "state.json").read_text())
    lost = [f"m{k}" for k in range(i) if f"m{k}" not in state] + \
        [f"h{k}" for k in range(len(fired)) if f"h{k}" not in state]
    assert not lost, f"{len(lost)} of {i + len(fired)} writes lost, e.g. {lost[:5]}"


def test_update_state_decides_on_the_state_as_it_is_now(tmp_path):
    """A writer that decides from what it read (the login node: "the job waits again, so the run is queued") decides
    on the state under the lock, not on a copy read before the job's rlctl wrote `running`."""
    write_state(tmp_path, status="requeued")
    stale = read_state(tmp_path)
    write_state(tmp_path, status="running")  # the job's rlctl, meanwhile

    def queued_if_unchanged(now):
        return {"status": "queued"} if now.get("status") == stale.get("status") else None

    update_state(tmp_path, queued_if_unchanged)
    assert read_state(tmp_path)["status"] == "running"
    update_state(tmp_path, lambda now: {"slurm_state": "RUNNING"})
    assert read_state(tmp_path) == {"status": "running", "slurm_state": "RUNNING"}
