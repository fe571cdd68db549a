"""What the commands that take a RUN do with a running run, a run on an SSH host and an attached run, as a user
types them (default ./runs, only HOME isolated; the SSH host is the loopback sshd of tests/remote_sshd.py):
docs/commands.md is the table these tests hold to. The learner is the bandit (tests/fixtures/experiments), held
running at step 2 by its gate file until the test lets it go.

Issue 30 §5: `rlctl resume` of a stopped run in the default relative ./runs started a supervisor that could not
find its run and said "stopped (attempt 1)" (nothing else); `resume` of a run on a host said "no readable
.launch.json; it was not started by this rlctl"; `resume`, `supervise` and `eval` of an attached run gave
errors that named no reason; `stop` of a run whose host is down said "is not running", exit 0."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.remote_sshd import ALIAS, sshd  # noqa: F401 - the session fixture
from tests.test_compare import records, wait_for
from tests.test_experiments import bandit_recipe


def held_recipe(work: Path, steps: int = 6) -> Path:
    """The bandit (no checkpoints), held at step 2 until `gate/<seed>` exists."""
    (work / "gate").mkdir(exist_ok=True)
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    r = work / "b.toml"
    r.write_text(bandit_recipe(steps=steps) + f'\n[env]\nBANDIT_GATE = "{work / "gate"}"\n')
    return r


@pytest.fixture
def held(user):
    """The user's directory with the held bandit recipe; whatever a failed test leaves held is let go and killed."""
    work, rlctl = user
    held_recipe(work)
    yield work, rlctl
    for seed in (42, 43, 44):
        (work / "gate" / str(seed)).write_text("")
    from tests.test_experiments import _kill_all

    _kill_all(work / "remote" / "runs")


def status_of(run: Path) -> str | None:
    try:
        return json.loads((run / "state.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def test_resume_of_a_stopped_run_in_the_default_runs_directory(held):
    work, rlctl = held
    r = rlctl("launch", "b.toml", "--detach", "--name", "held")
    assert r.returncode == 0, r.stderr
    run = work / "runs" / r.stdout.strip().splitlines()[-1]
    assert wait_for(lambda: len(records(run)) >= 2)
    assert rlctl("stop", run.name, "--grace", "5").returncode == 0 and status_of(run) == "stopped"
    r = rlctl("resume", run.name)  # the relative runs/<name>: its supervisor found no run there before
    assert r.returncode == 0 and f"{run.name}: running (attempt 2)" in r.stdout, r.stdout + r.stderr
    (work / "gate" / "42").write_text("")
    assert wait_for(lambda: status_of(run) == "finished"), (run / "supervisor.log").read_text()[-2000:]


def test_resume_supervise_and_eval_of_an_attached_run_say_why_not(user):
    work, rlctl = user
    (work / "train.log").write_text("".join(f"step {i} | reward 0.{i}\n" for i in range(1, 6)))
    (work / "b.toml").write_text(bandit_recipe())
    r = rlctl("attach", "train.log", "--backend", "command", "--recipe", "b.toml", "--name", "att")
    assert r.returncode == 0, r.stderr
    name = next((work / "runs").iterdir()).name
    for verb in ("resume", "supervise"):
        r = rlctl(verb, name)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"{name} is attached" in r.stderr and f"nothing to {verb}" in r.stderr, r.stderr
        assert "rlctl attach PATH --follow" in r.stderr
    r = rlctl("eval", name)
    assert r.returncode == 2 and f"{name} is attached" in r.stderr and "--recipe RECIPE.toml" in r.stderr, r.stderr
    r = rlctl("stop", name)
    assert r.returncode == 0 and "is not running (attached)" in r.stdout, r.stdout + r.stderr


def test_stop_of_an_attached_run_being_followed_ends_the_following(user):
    """`rlctl attach --follow` shows the run as running; stop (and stop --dry-run, which said "unknown executor
    'attached'") ends the following, not the run rlctl did not start, and the run is attached again."""
    import shutil
    import subprocess
    import sys

    work, rlctl = user
    (work / "train.log").write_text("".join(f"step {i} | reward 0.{i}\n" for i in range(1, 6)))
    (work / "b.toml").write_text(bandit_recipe())
    exe = shutil.which("rlctl", path=str(Path(sys.executable).parent))
    follower = subprocess.Popen([exe, "attach", "train.log", "--backend", "command", "--recipe", "b.toml",
                                 "--name", "fol", "--follow"], cwd=work, env=rlctl.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        runs = work / "runs"
        assert wait_for(lambda: runs.is_dir() and any(status_of(d) == "running" for d in runs.iterdir()), 60)
        run = next(runs.iterdir())
        r = rlctl("stop", run.name, "--dry-run")
        assert r.returncode == 0 and "would end the following of" in r.stdout and "not stopped" in r.stdout, \
            r.stdout + r.stderr
        r = rlctl("stop", run.name, "--grace", "10")
        assert r.returncode == 0 and "no longer followed" in r.stdout and "Status: attached" in r.stdout, \
            r.stdout + r.stderr
        assert follower.wait(timeout=30) is not None and status_of(run) == "attached"
    finally:
        if follower.poll() is None:
            follower.kill()


@pytest.mark.timeout(600)
def test_resume_and_supervise_of_a_run_on_a_host(held, sshd):  # noqa: F811
    work, rlctl = held
    rlctl.env.update(RLCTL_SSH_CONFIG=str(sshd.client_config),  # the ssh config holding the host's alias
                     RLCTL_SSH_CONTROL_DIR=f"/tmp/rlctl-k-{uuid.uuid4().hex[:8]}")
    import sys

    r = rlctl("hosts", "add", "box", ALIAS, "--workdir", str(work / "remote"), "--python", sys.executable)
    assert r.returncode == 0, r.stderr
    r = rlctl("launch", "b.toml", "--on", "box", "--detach", "--name", "far")
    assert r.returncode == 0, r.stdout + r.stderr
    name = r.stdout.strip().splitlines()[-1]
    there = work / "remote" / "runs" / name
    assert wait_for(lambda: len(records(there)) >= 2)
    sshd.stop()  # the host goes down: stop cannot reach the run, and says so (it said "is not running", exit 0)
    try:
        r = rlctl("stop", name, "--grace", "5")
        assert r.returncode == 1 and f"{name} was not stopped" in r.stderr and "may still run there" in r.stderr, \
            r.stdout + r.stderr
    finally:
        sshd.start()
    assert status_of(there) == "running"
    assert rlctl("stop", name, "--grace", "5").returncode == 0 and status_of(there) == "stopped"
    r = rlctl("supervise", name)
    assert r.returncode == 2 and f"{name} runs on box" in r.stderr and f"rlctl supervise {there}" in r.stderr, \
        r.stderr
    r = rlctl("resume", name)  # the host's rlctl picks it up there
    assert r.returncode == 0 and f"box: {name}: running (attempt 2)" in r.stdout, r.stdout + r.stderr
    assert status_of(there) == "running"
    (work / "gate" / "42").write_text("")
    assert wait_for(lambda: status_of(there) == "finished")
    # logs and metrics bring the host's newest lines first, as status and doctor do (they showed the last mirror)
    r = rlctl("logs", name, "-n", "1")
    assert r.returncode == 0 and r.stdout.startswith("step 6 |"), r.stdout + r.stderr
    assert rlctl("metrics", name, "--csv").stdout.strip().splitlines()[-1].startswith("6,"), "metrics: stale"
    assert "finished" in rlctl("status", name).stdout
