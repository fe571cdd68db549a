"""`rlctl status` of a run that was stopped and resumed, or lost, as a user types it (the `user` fixture: every
default). Each test failed before its fix (new-user trial 4: D6, D7)."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.test_experiments import wait_for
from tests.test_seams_followups import counter_project


def _status(rlctl, name: str) -> dict:
    r = rlctl("status", name, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_elapsed_and_eta_leave_out_the_time_a_run_was_stopped(user):
    """D6: stopped at its first save, left 4 s, resumed: elapsed counted the 4 s and the ETA took the stopped gap as
    training time (the trial saw `elapsed 4:24 eta 4:57` and the run finished 20 s later). Now elapsed is the time
    its attempts ran and the ETA the current attempt's own step rate."""
    work, rlctl = user
    gate = work / "gate"
    gate.mkdir()
    # held at step 2 (the first attempt) and at step 6 (the resumed one): running both times, no sleep to guess
    counter_project(work, steps=8, extra=f'[env]\nTRAINER_GATE = "{gate}"\nTRAINER_GATE_STEP = "2,6"\n')
    r = rlctl("launch", "c.toml", "--detach")
    assert r.returncode == 0, r.stderr
    name = r.stdout.strip().splitlines()[-1]
    run = work / "runs" / name
    assert wait_for(lambda: (run / "training_state" / "step_2" / "training_info.json").is_file())
    assert rlctl("stop", name).returncode == 0
    gap = 4.0
    time.sleep(gap)  # the stopped time itself is what is measured
    assert rlctl("resume", name).returncode == 0
    assert wait_for(lambda: _status(rlctl, name)["step"] == 6)
    d = _status(rlctl, name)
    now = time.time()
    assert d["status"] == "running", d["status"]
    a1, a2 = d["attempts"][-2:]
    started = json.loads((run / "state.json").read_text())["started_at"]
    ran = (a1["ended_at"] - started) + (now - a2["started_at"])  # from the launch to #1's end, then #2
    wall = now - started
    assert abs(d["elapsed_s"] - ran) < 1.5 and d["elapsed_s"] < wall - gap + 1, (d["elapsed_s"], ran, wall)
    rate = (now - a2["started_at"]) / (6 - a2["from_step"])  # this attempt's seconds per step
    assert abs(d["eta_s"] - rate * 2) < 0.5 + 0.2 * rate * 2, (d["eta_s"], rate)
    text = rlctl("status", name).stdout
    assert "(this attempt " in text, text
    row = next(x for x in json.loads(rlctl("status", "--json").stdout) if x["name"] == name)  # the listing too
    assert row["elapsed_s"] < wall - gap + 1, (row["elapsed_s"], wall)
    (gate / "go").write_text("")
    assert wait_for(lambda: _status(rlctl, name)["status"] == "finished")
    d = _status(rlctl, name)
    ran = d["attempts"][0]["started_at"] - started + sum(a["ended_at"] - a["started_at"] for a in d["attempts"])
    assert abs(d["elapsed_s"] - ran) < 0.5, (d["elapsed_s"], ran)


def test_a_lost_run_says_lost_on_its_attempt_line_too(user):
    """D7: supervisor and trainer SIGKILLed: the header said `lost` and the attempt line `-> running` until
    `rlctl resume`. Now the attempt line says what the header says."""
    work, rlctl = user
    gate = work / "gate"
    gate.mkdir()
    counter_project(work, extra=f'[env]\nTRAINER_GATE = "{gate}"\n')
    r = rlctl("launch", "c.toml", "--detach", "--restart", "on-failure")
    assert r.returncode == 0, r.stderr
    name = r.stdout.strip().splitlines()[-1]
    run = work / "runs" / name
    assert wait_for(lambda: (run / "training_state" / "step_2" / "training_info.json").is_file())
    st = json.loads((run / "state.json").read_text())
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    os.killpg(st["pgid"], signal.SIGKILL)  # the trainer and its wrapper: no exit record is left
    assert wait_for(lambda: _status(rlctl, name)["status"] == "lost", timeout=30)
    text = rlctl("status", name).stdout
    assert text.splitlines()[0].split()[2] == "lost", text
    attempt = next(line for line in text.splitlines() if line.strip().startswith("#1 "))
    assert attempt.endswith("-> lost"), text
    assert _status(rlctl, name)["attempts"][-1]["outcome"] == "lost"
