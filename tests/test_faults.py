"""More faults: a child killed with SIGKILL, a stalled run, a patch set that cannot be applied, Parquet data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlctl.executors.local import Supervisor
from rlctl.recipe.data import count_records
from rlctl.runs.rundir import create_run_dir
from rlctl.runs.state import process_create_time, read_state, run_status
from tests.conftest import RECIPES


def test_child_killed_with_sigkill_is_failed(tmp_path):
    run = create_run_dir(tmp_path / "runs", "k")
    sup = Supervisor(run, {"argv": [sys.executable, "-c", "import time; time.sleep(600)"], "backend": "trl"},
                     dict(os.environ))
    sup.start()
    time.sleep(0.3)
    os.kill(sup.proc.pid, signal.SIGKILL)  # the OOM killer, a spot reclaim
    assert sup.loop() == -signal.SIGKILL
    st = read_state(run)
    assert st["status"] == "failed" and st["exit_code"] == -9


def test_live_process_without_new_steps_is_stalled(tmp_path):
    run = create_run_dir(tmp_path / "runs", "s")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        old = time.time() - 3600
        (run / "stdout.log").write_text("step:1 - critic/score/mean:0.5\n")
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": old, "reward/mean": 0.5}) + "\n")
        (run / ".ingest.json").write_text(json.dumps({"stdout.log": {"offset": 31, "inode": (run / "stdout.log")
                                                                     .stat().st_ino}}))
        (run / "state.json").write_text(json.dumps({
            "status": "running", "backend": "verl", "pid": p.pid, "pid_create_time": process_create_time(p.pid),
            "started_at": old - 60}))
        assert run_status(run, stall_after=1800).status == "stalled"  # a silently dead vLLM looks like this
        assert run_status(run, stall_after=7200).status == "running"
    finally:
        p.kill()
        p.wait()


def test_launch_refuses_when_the_patch_set_cannot_be_applied(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "runs"))
    res = cli("launch", str(RECIPES / "quickstart.toml"), "--set", 'patches.set="openrlhf/0.9.3"')
    assert res.code == 2 and "openrlhf is not installed" in res.err
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_parquet_and_json_records_are_counted(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": [f"q{i}" for i in range(123)]}), tmp_path / "d.parquet")
    assert count_records(tmp_path / "d.parquet") == 123
    (tmp_path / "d.json").write_text(json.dumps([{"prompt": "a"}] * 7))
    assert count_records(tmp_path / "d.json") == 7
    (tmp_path / "d.jsonl").write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert count_records(tmp_path / "d.jsonl") == 2
