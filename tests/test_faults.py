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
    # quickstart runs trl: an openrlhf set is for another backend, refused before anything is launched or written
    res = cli("launch", str(RECIPES / "quickstart.toml"), "--set", 'patches.set="openrlhf/0.9.3"')
    assert res.code == 2 and "is for openrlhf 0.9.3, but the recipe runs trl" in res.err, res.err
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


STEPS = ("import time\nfor i in range(1, 21):\n    print(f'step:{i} - critic/score/mean:0.5', flush=True)\n"
         "    time.sleep(0.15)\n")


def test_full_disk_keeps_the_run_supervised_and_metrics_valid(tmp_path, monkeypatch, capsys):
    """ENOSPC while writing metrics and state: reported, the run stays supervised, no half record is left, and
    once there is room again nothing is missing or doubled."""
    import errno
    import threading

    import rlctl.metrics.stream as stream
    import rlctl.runs.supervisor as supervisor
    from tests.test_launch import wait_for

    full = {"on": False}
    real_records, real_state = stream.write_records, supervisor.write_state

    def write_records(path, records, now=None):
        if full["on"] and records:
            with path.open("a") as fh:
                fh.write('{"step": 99, "ti')  # what a full disk leaves: half a record
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_records(path, records, now)

    def write_state(run_dir, **updates):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_state(run_dir, **updates)

    monkeypatch.setattr(stream, "write_records", write_records)
    monkeypatch.setattr(supervisor, "write_state", write_state)
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    run = create_run_dir(tmp_path / "runs", "full")
    sup = Supervisor(run, {"argv": [sys.executable, str(script)], "backend": "verl", "grace_seconds": 5},
                     dict(os.environ))
    sup.start()

    def disk_fills_then_frees() -> None:
        wait_for(lambda: (run / "metrics.jsonl").is_file(), timeout=30, interval=0.05)
        full["on"] = True
        wait_for(lambda: sup.disk_full is not None, timeout=30, interval=0.05)
        time.sleep(0.6)
        full["on"] = False

    t = threading.Thread(target=disk_fills_then_frees, daemon=True)
    t.start()
    assert sup.loop() == 0
    t.join(timeout=5)
    assert "disk full (metrics.jsonl" in capsys.readouterr().err
    state = read_state(run)
    assert state["status"] == "finished" and state["disk_full_at"] and state["disk_full"] is None
    lines = (run / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]  # valid JSONL: every line parses
    steps = [r["step"] for r in recs if "reward/mean" in r]
    assert steps == list(range(1, 21))


def test_outcome_is_recorded_where_the_child_ends_when_the_supervisor_is_killed(tmp_path, monkeypatch):
    """SIGKILL the supervisor; the child then exits 3 on its own: status says failed with exit code 3 (from the
    wrapper's exit record), logs -f returns, stop does not rewrite it."""
    from rlctl.runs.logs import show_logs
    from rlctl.runs.stopping import stop_run
    from rlctl.runs.supervisor import start_detached, write_spec
    from tests.test_launch import wait_for

    run = create_run_dir(tmp_path / "runs", "orphan")
    code = "import time\nprint('step:1 - critic/score/mean:0.5', flush=True)\ntime.sleep(2)\nraise SystemExit(3)\n"
    write_spec(run, {"argv": [sys.executable, "-c", code], "backend": "verl", "executor": "local"})
    (run / "state.json").write_text(json.dumps({"status": "starting", "backend": "verl", "started_at": time.time()}))
    start_detached(run, dict(os.environ))
    state = read_state(run)
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    assert wait_for(lambda: (run / "attempts" / "1" / "exit.json").is_file(), timeout=30)
    show_logs(run, follow=True)  # returns: the run ended, though nobody supervised its end
    rs = run_status(run)
    assert rs.status == "failed" and rs.state["exit_code"] == 3 and rs.step == 1
    assert "not running (failed, exit code 3)" in stop_run(run)
    assert read_state(run)["status"] == "failed"

    # everything killed at once (a reboot): nothing can tell, and status says so
    run2 = create_run_dir(tmp_path / "runs", "gone")
    write_spec(run2, {"argv": [sys.executable, "-c", "import time; time.sleep(60)"], "backend": "verl"})
    (run2 / "state.json").write_text(json.dumps({"status": "starting", "backend": "verl"}))
    start_detached(run2, dict(os.environ))
    st = read_state(run2)
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    os.killpg(st["pgid"], signal.SIGKILL)
    assert wait_for(lambda: run_status(run2).status == "lost", timeout=30)


def test_stall_rule_fits_rl():
    """max(k x median step time, floor); a longer grace for the first step and around evals/saves; a backend's
    stall sign cuts the wait to the floor; busy GPUs are work, not a stall."""
    from rlctl.runs.stall import StallConfig, StallDetector

    cfg = StallConfig(k=3, floor_s=10, first_step_s=100, slow_step_s=100)
    d = StallDetector(cfg, [r"Watchdog caught collective operation timeout"], started_at=0.0, every=(10,))
    assert d.check(99.0) is None and "the first step" in d.check(101.0)
    for i, t in enumerate([100.0, 120.0, 140.0, 160.0], start=1):  # 20 s a step
        d.observe_step(i, t)
    assert d.check(160.0 + 59) is None and "limit 60s" in d.check(160.0 + 61)  # 3 x 20 s
    assert d.check(160.0 + 61, gpus_busy=True) is None
    d.observe_step(9, 200.0)  # step 10 checkpoints: the save's grace
    assert d.check(200.0 + 99) is None and "with an eval or a checkpoint save" in d.check(200.0 + 101)
    d.observe_log("[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5) ran for 600000 ms", 210.0)
    assert "after the log said: [rank0]: Watchdog" in d.check(221.0)



def test_after_a_restart_from_the_start_the_stall_limit_keeps_the_runs_step_time(tmp_path):
    """A restart from the start (no checkpoint) replays steps 1..N, which the supervisor sees as one observation:
    with a new detector that knew no step time, the next step waited first_step_s (1800 s) instead of k x the
    median step time the run had shown. The step time of the run carries over to the next attempt's detector."""
    from rlctl.runs.supervisor import Supervisor

    (tmp_path / "state.json").write_text(json.dumps({"status": "running"}))
    spec = {"backend": "command", "executor": "local", "restart": {"mode": "on-stall"},
            "stall": {"k": 3, "floor_s": 10, "first_step_s": 1800, "slow_step_s": 1800}}
    sup = Supervisor(tmp_path, spec, {})
    sup._new_detector()
    for i, t in enumerate([100.0, 120.0, 140.0, 160.0], start=1):  # 20 s a step
        sup.detector.observe_step(i, t)
    assert sup.detector.threshold()[0] == 60
    sup._new_detector(0)  # restarted from the start
    assert sup.detector.threshold() == (1800, "the first step")  # loading again: the first step's grace
    sup.detector.observe_step(4, 500.0)  # steps 1-4 replayed between two looks: one observation
    assert sup.detector.threshold() == (60, "step 5"), sup.detector.threshold()


def test_adapters_name_their_stall_signs():
    import re

    from rlctl.backends import get_backend

    samples = {
        "verl": "(WorkerDict pid=1) [rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout",
        "openrlhf": "OSError: [Errno 24] Too many open files",
        "prime_rl": "httpx.ConnectError: [Errno 111] Connection refused; retrying in 5s",
    }
    for name, line in samples.items():
        pats = get_backend(name).stall_patterns()
        assert any(re.search(p, line) for p in pats), (name, line)
    assert get_backend("trl").stall_patterns() == []


def test_status_says_when_the_disk_is_full(tmp_path, monkeypatch):
    import shutil

    from rlctl.runs.status import render

    run = create_run_dir(tmp_path / "runs", "full")
    (run / "state.json").write_text(json.dumps({"status": "finished", "backend": "verl", "exit_code": 0}))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 0))
    assert "! disk full: 0 bytes free" in render(str(run), as_json=False, stall_after=1800)


def test_a_supervisor_that_cannot_start_says_one_line_and_fails_the_run(tmp_path):
    """A defect in rlctl's own setup (here: a spec whose restart table is not a table) left a raw traceback in the
    supervisor's log and the run `starting` until it was found lost: one line, the run failed with why, the
    traceback kept in supervisor-error.txt for a report."""
    run = create_run_dir(tmp_path / "runs", "broken")
    from rlctl.runs.supervisor import write_spec

    write_spec(run, {"argv": [sys.executable, "-c", "pass"], "backend": "verl", "executor": "local",
                     "restart": "always-please"})
    (run / "state.json").write_text(json.dumps({"status": "starting", "backend": "verl"}))
    r = subprocess.run([sys.executable, "-m", "rlctl.runs.supervisor", str(run)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("rlctl: rlctl's supervisor failed:") and "please report it" in r.stderr, r.stderr
    st = read_state(run)
    assert st["status"] == "failed" and "supervisor failed" in st["error"], st
    assert "Traceback" in (run / "supervisor-error.txt").read_text()
