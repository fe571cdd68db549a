"""The in-process runner of the tests (tests/conftest.py `run_cli`) is the console script as a user has it: a command
that writes bytes to stdout (`rlctl logs`) works through it too."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_logs_through_the_in_process_runner(tmp_path):
    run = tmp_path / "runs" / "r-20260101-000000"
    run.mkdir(parents=True)
    (run / "state.json").write_text(json.dumps({"name": run.name, "status": "finished", "backend": "command"}))
    (run / "stdout.log").write_bytes("step 1 \u2713\nstep 2\n".encode())
    r = run_cli("logs", str(run))
    assert r.code == 0, r.err
    assert r.out == "step 1 \u2713\nstep 2\n"
    r = run_cli("logs", str(run), "-n", "1")
    assert r.code == 0 and r.out == "step 2\n", r.err
