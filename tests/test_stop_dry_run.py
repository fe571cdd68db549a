"""`rlctl stop RUN --dry-run` says what each executor would do, and signals nothing."""

from __future__ import annotations

import json


def _run(tmp_path, monkeypatch, state):
    root = tmp_path / "runs"
    run = root / "r-20260101-000000"
    run.mkdir(parents=True)
    (run / "state.json").write_text(json.dumps({"name": run.name, "status": "running", **state}))
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(root))
    return run


def test_local_run(tmp_path, monkeypatch, cli):
    run = _run(tmp_path, monkeypatch, {"executor": "local", "pgid": 999999, "supervisor_pid": 999998})
    r = cli("stop", run.name, "--dry-run", "--grace", "5")
    assert r.code == 0, r.err
    assert "would send SIGTERM to process group 999999" in r.out and "supervisor, pid 999998" in r.out
    assert json.loads((run / "state.json").read_text())["status"] == "running"  # nothing recorded


def test_ray_run(tmp_path, monkeypatch, cli):
    run = _run(tmp_path, monkeypatch, {"executor": "ray", "ray_job_id": "raysubmit_x", "ray_address": "http://h:8265"})
    r = cli("stop", run.name, "--dry-run")
    assert r.code == 0, r.err
    assert "would stop Ray job raysubmit_x at http://h:8265" in r.out


def test_ended_run(tmp_path, monkeypatch, cli):
    run = _run(tmp_path, monkeypatch, {"executor": "local"})
    (run / "state.json").write_text(json.dumps({"name": run.name, "status": "finished", "exit_code": 0}))
    r = cli("stop", run.name, "--dry-run")
    assert r.code == 0 and "finished: stop would do nothing" in r.out
