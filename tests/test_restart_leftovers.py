"""A restart starts only once the failed attempt's processes are gone, those that left its process group included.

On the H100 (docs/gpu/verl-3.json) verl's driver was SIGKILLed; its Ray worker still held 7.5 GiB of GPU 0 when
rlctl started the next attempt (NVML listed it at that moment, its command line already empty: mid-exit). An
inference engine or Ray worker that started its own session (setsid) is not in the attempt's process group at all:
killing the group leaves it running, an orphaned engine holding the GPU the next attempt needs. Here the engine is a
process that starts its own session and ignores SIGTERM, as such workers do; the trainer crashes after its first
save; the restarted trainer records whether the engine of the attempt before it is still there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_seams_followups import COUNTER, counter_project, wait_for

TRAINER = r'''
import argparse, json, os, signal, subprocess, sys, time

ap = argparse.ArgumentParser()  # the counter trainer's command line (tests/fixtures/command/counter_trainer.py)
for flag in ("--steps", "--save-every", "--out", "--resume"):
    ap.add_argument(flag)
a = ap.parse_args()
out, resume = a.out, a.resume
os.makedirs(out, exist_ok=True)
mark = os.path.join(out, "engine.pid")
if resume is None:  # attempt 1: an engine in a session of its own, deaf to SIGTERM, as a Ray worker or vLLM may be
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
    if os.environ.get("ENGINE_DAEMON"):  # seed 002's way: `setsid nohup ... &` from a shell that exits at once
        subprocess.run(["setsid", "sh", "-c", f'nohup {sys.executable} -c "import time; time.sleep(3600)" '
                        f'>/dev/null 2>&1 & echo $! > {mark}'], check=True)
        while not open(mark).read().strip():
            time.sleep(0.01)
    else:
        engine = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        open(mark, "w").write(str(engine.pid))
    start = 1
    if os.environ.get("ENGINE_HOLD"):  # a run that trains on until it is stopped
        print("step 1 | reward 0.25", flush=True)
        time.sleep(3600)
else:
    pid = int(open(mark).read())
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    json.dump({"pid": pid, "state": state}, open(os.path.join(out, "engine_at_restart.json"), "w"))
    start = json.load(open(os.path.join(resume, "training_info.json")))["step"] + 1
for step in range(start, 5):
    print(f"step {step} | reward {step / 4:.2f}", flush=True)
    if step % 2 == 0:
        d = os.path.join(out, f"step_{step}")
        os.makedirs(d, exist_ok=True)
        json.dump({"step": step}, open(os.path.join(d, "training_info.json"), "w"))
    if resume is None and step == 3:
        time.sleep(1.5)  # long enough for the supervisor to see the whole attempt
        os._exit(1)      # the driver dies; its engine lives on
'''


def _project(work: Path, extra: str = "") -> None:
    """The counter trainer's recipe (tests/test_seams_followups.py) running TRAINER instead, restarted on failure."""
    (work / "trainer.py").write_text(TRAINER)
    counter_project(work, steps=4, extra='[run]\nrestart = "on-failure"\nmax_restarts = 1\n' + extra)
    (work / "c.toml").write_text((work / "c.toml").read_text().replace(str(COUNTER), str(work / "trainer.py")))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["popen", "daemon"])
def test_restart_waits_until_the_failed_attempts_engine_is_gone(user, how):
    """`popen`: the engine in a session of its own, deaf to SIGTERM; `daemon`: started with `setsid nohup ... &` from a
    shell that exits at once (reparented to init before rlctl could see it in the attempt's tree: found by the mark
    in its environment)."""
    work, rlctl = user
    _project(work, extra='[env]\nENGINE_DAEMON = "1"\n' if how == "daemon" else "")
    r = rlctl("launch", "c.toml", "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    run = next((work / "runs").glob("counter-*"))
    seen = run / "training_state" / "engine_at_restart.json"
    assert wait_for(lambda: json.loads(rlctl("status", run.name, "--json").stdout).get("status") == "finished",
                    timeout=120), rlctl("status", run.name).stdout + (run / "stdout.log").read_text()
    at_restart = json.loads(seen.read_text())
    assert at_restart["state"] in ("gone", "Z"), (
        f"attempt 2 started while attempt 1's engine (pid {at_restart['pid']}) was still there: {at_restart}")
    state = json.loads((run / "state.json").read_text())
    assert [a["outcome"] for a in state["attempts"]] == ["failed", "finished"], state["attempts"]
    log = (run / "stdout.log").read_text() + "".join(
        p.read_text() for p in sorted(run.glob("supervisor*.log")))
    assert "left its process group" in log or "left the attempt's process group" in log, log[-3000:]


@pytest.mark.slow
def test_stop_after_the_supervisor_died_stops_the_engine_that_left_the_group(user):
    """`rlctl stop` of a run whose supervisor was SIGKILLed does the supervisor's job: the attempt's process group and
    the engine that left it (known from attempts/1/pids.json), not the group alone."""
    import os
    import signal

    work, rlctl = user
    _project(work, extra='[env]\nENGINE_HOLD = "1"\n')
    r = rlctl("launch", "c.toml", "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    run = next((work / "runs").glob("counter-*"))
    mark = run / "training_state" / "engine.pid"
    pids = run / "attempts" / "1" / "pids.json"
    assert wait_for(lambda: mark.is_file() and pids.is_file() and mark.read_text().strip() in pids.read_text(),
                    timeout=60), (run / "stdout.log").read_text()
    engine = int(mark.read_text())
    os.kill(json.loads((run / "state.json").read_text())["supervisor_pid"], signal.SIGKILL)
    shown = rlctl("status", run.name)  # it said `running` alone, restarts promised (new-user trial)
    assert "supervisor" in shown.stdout and "is gone" in shown.stdout and f"rlctl resume {run.name}" in shown.stdout, \
        shown.stdout
    gone = json.loads(rlctl("status", run.name, "--json").stdout)["supervisor_gone"]
    assert gone["fix"] == f"rlctl resume {run.name}", gone
    dry = rlctl("stop", run.name, "--dry-run")  # it named the dead supervisor as the way (new-user trial)
    assert "is gone" in dry.stdout + dry.stderr and "through its supervisor" not in dry.stdout, dry.stdout
    r = rlctl("stop", run.name, "--grace", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert wait_for(lambda: not Path(f"/proc/{engine}").exists() or
                    Path(f"/proc/{engine}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", timeout=30), \
        f"the engine (pid {engine}) outlived `rlctl stop`"
    assert "had left its process group" in (run / "stdout.log").read_text()
    # the attempt's own line says how it ended too (it read `-> running` under a run `stopped`: new-user trial)
    assert json.loads((run / "state.json").read_text())["attempts"][-1]["outcome"] == "stopped"
    shown = rlctl("status", run.name).stdout
    assert "-> running" not in shown and "stopped" in shown, shown


def _unsupervised_crash(work: Path, rlctl) -> tuple[Path, int]:
    """A run whose supervisor was SIGKILLed, then its attempt too: its engine (a daemon of its own) lives on."""
    import os
    import signal

    _project(work, extra='[env]\nENGINE_DAEMON = "1"\nENGINE_HOLD = "1"\n')
    r = rlctl("launch", "c.toml", "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    run = next((work / "runs").glob("counter-*"))
    mark = run / "training_state" / "engine.pid"
    assert wait_for(lambda: mark.is_file() and mark.read_text().strip() and "step 1" in
                    (run / "stdout.log").read_text(), timeout=60), (run / "stdout.log").read_text()
    engine = int(mark.read_text())
    st = json.loads((run / "state.json").read_text())
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    os.killpg(st["pgid"], signal.SIGKILL)  # the attempt dies unwatched; its engine is in a session of its own
    assert wait_for(lambda: rlctl("status", run.name, "--json").returncode == 0 and json.loads(
        rlctl("status", run.name, "--json").stdout)["status"] not in ("running", "starting"), timeout=30)
    assert _alive(engine)
    return run, engine


@pytest.mark.slow
def test_stop_of_an_ended_run_stops_what_its_unsupervised_attempt_left(user):
    """`rlctl stop` of a run that already ended said "is not running" and left its engine running."""
    work, rlctl = user
    run, engine = _unsupervised_crash(work, rlctl)
    r = rlctl("stop", run.name)
    assert r.returncode == 0 and "left" in r.stdout + r.stderr, r.stdout + r.stderr
    assert wait_for(lambda: not _alive(engine), timeout=20), "rlctl stop left the ended attempt's engine running"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_resume_stops_what_the_unsupervised_attempt_left_before_the_next_starts(user):
    """`rlctl resume` started the next attempt (and its engine) beside the dead attempt's engine."""
    work, rlctl = user
    run, engine = _unsupervised_crash(work, rlctl)
    r = rlctl("resume", run.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert wait_for(lambda: not _alive(engine), timeout=30), "resume left the dead attempt's engine running"
    assert wait_for(lambda: "attempt 2 started" in (run / "stdout.log").read_text() or
                    json.loads((run / "state.json").read_text()).get("attempt") == 2, timeout=60)
    r = rlctl("stop", run.name, "--grace", "2")
    assert r.returncode == 0, r.stdout + r.stderr
