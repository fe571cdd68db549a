"""Unattended runs, with real processes: a SIGKILLed trainer comes back from its last complete checkpoint and finishes,
a hung reward function is detected, restarted and given up on with evidence, a run whose supervisor was SIGKILLed
is told as it really ended (status, logs -f, stop), and `rlctl resume` picks a run up after a "reboot".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rlctl.runs.state import process_alive, read_state, run_status
from tests import test_sync
from tests.conftest import RECIPES
from tests.test_launch import metrics, only_run, rlctl, wait_for

pytestmark = pytest.mark.slow
s3 = test_sync.s3  # the fixture: a local S3 server
pytest.importorskip("trl")
QUICK = str(RECIPES / "quickstart.toml")

HANGING_REWARD = '''
import time

calls = 0


def reward_func(completions, **kwargs):
    global calls
    calls += 1
    if calls > 3:
        time.sleep(10**6)  # a verifier that never answers
    return [c.count("a") / max(len(c), 1) for c in completions]
'''


SLOW_REWARD = '''
import time


def reward_func(completions, **kwargs):
    time.sleep(0.4)  # a verifier that takes a moment: the test's kill lands while the run still trains
    return [c.count("a") / max(len(c), 1) for c in completions]
'''


@pytest.fixture
def slow(tmp_path) -> str:
    """--set for a quickstart whose reward takes 0.4 s a step."""
    p = tmp_path / "slow_reward.py"
    p.write_text(SLOW_REWARD)
    return f'reward.function="{p}"'


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture
def env(tmp_path, model_cache, monkeypatch):
    from tests.test_launch import cleanup_runs

    runs = tmp_path / "runs"
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(runs))
    monkeypatch.setenv("RLCTL_MODEL_CACHE", str(model_cache))
    yield {"runs": runs, "env": dict(os.environ), "cwd": tmp_path}
    cleanup_runs(runs)


def reward_steps(run: Path) -> list[int]:
    if not (run / "metrics.jsonl").is_file():
        return []
    return [m["step"] for m in metrics(run) if "reward/mean" in m]


def trainer_pid(state: dict) -> int | None:
    """The backend process: the child of the wrapper that records its exit code."""
    import psutil

    try:
        kids = psutil.Process(state["pid"]).children()
    except psutil.Error:
        return None
    return kids[0].pid if kids else None


def complete_checkpoint(run: Path, step: int) -> bool:
    return (run / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").is_file()


def test_sigkilled_trainer_restarts_from_the_last_complete_checkpoint_and_finishes(env, s3, slow):
    env["env"].update(s3["env"])
    url = f"{s3['url']}/quick"
    r = rlctl(env, "launch", QUICK, "--detach", "--restart", "on-failure", "--max-restarts", "2", "--grace", "5",
              "--set", slow,
              "--set", "train.steps=16", "--set", "checkpoint.every=4", "--set", f'checkpoint.sync="{url}"')
    assert r.returncode == 0, r.stderr[-3000:]
    run = env["runs"] / r.stdout.strip()
    assert wait_for(lambda: complete_checkpoint(run, 4) and max(reward_steps(run), default=0) >= 6, timeout=180)
    first = read_state(run)
    os.kill(trainer_pid(first), signal.SIGKILL)  # the OOM killer, a crashed worker
    assert wait_for(lambda: read_state(run).get("status") == "finished", timeout=240), read_state(run)
    state = read_state(run)
    a1, a2 = state["attempts"]
    assert a1["exit_code"] == -signal.SIGKILL and a1["outcome"] == "failed" and a1["exit_recorded"]
    assert a2["reason"] == "failed" and a2["restart"] and a2["from_step"] in (4, 8, 12)
    assert a2["from_checkpoint"].endswith(f"checkpoint-{a2['from_step']}")
    assert a2["exit_code"] == 0 and a2["outcome"] == "finished"
    # one metrics stream across the attempts: every step once, none missing
    steps = reward_steps(run)
    assert sorted(steps) == list(range(1, 17)) and max(Counter(steps).values()) == 1, steps
    assert "restarting from checkpoint step" in (run / "stdout.log").read_text()
    assert Path(a1["evidence"]).is_file()
    shown = rlctl(env, "status", run.name)
    assert "attempts: 2 (restart on-failure" in shown.stdout and "#2" in shown.stdout, shown.stdout
    # checkpoints went to object storage, `latest` last, and come back on another machine
    from rlctl.runs.sync import fetch_latest, read_latest

    latest = read_latest(url)
    assert latest is not None and latest["step"] == 16
    got = fetch_latest(url, env["cwd"] / "elsewhere")
    assert (env["cwd"] / "elsewhere" / got["path"] / "trainer_state.json").is_file()
    # and a new run (on any machine with the same storage) resumes from it
    r = rlctl(env, "launch", QUICK, "--name", "from-s3", "--resume", url, "--set", "train.steps=18")
    assert r.returncode == 0, r.stderr[-3000:]
    again = next(d for d in env["runs"].iterdir() if d.name.startswith("from-s3"))
    assert reward_steps(again) == [17, 18] and read_state(again)["resumed_from"] == url


def test_hung_reward_is_detected_restarted_and_given_up_with_evidence(env, tmp_path):
    reward = tmp_path / "hang.py"
    reward.write_text(HANGING_REWARD)
    r = rlctl(env, "launch", QUICK, "--restart", "on-stall", "--max-restarts", "1", "--grace", "1",
              "--set", "train.steps=50", "--set", f'reward.function="{reward}"',
              "--set", "run.stall.floor_s=4", "--set", "run.stall.k=3", "--set", "run.stall.first_step_s=40",
              timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    run = only_run(env["runs"])
    state = read_state(run)
    assert state["status"] == "failed" and "stalled after 1 restart" in state["gave_up"]
    assert [a["outcome"] for a in state["attempts"]] == ["stalled", "stalled"]
    for a in state["attempts"]:
        assert "no new step for" in a["stall"]
        text = Path(a["evidence"]).read_text()
        assert "## last log lines" in text and "## GPUs" in text
        if "py-spy is not installed" not in text:
            assert "reward_func" in text or "sleep" in text, text[-2000:]  # where it hangs
    steps = reward_steps(run)
    assert sorted(steps) == [1, 2, 3], steps  # the second attempt's repeats were not streamed twice
    assert not process_alive(state["pid"], state["pid_create_time"])
    shown = rlctl(env, "status", run.name)
    assert "gave up: stalled after 1 restart" in shown.stdout and "stalled: no new step" in shown.stdout


def test_killed_supervisor_then_finished_run_is_shown_finished(env, slow):
    r = rlctl(env, "launch", QUICK, "--detach", "--set", "train.steps=14", "--grace", "5", "--set", slow)
    run = env["runs"] / r.stdout.strip()
    assert wait_for(lambda: len(reward_steps(run)) >= 2, timeout=180)
    state = read_state(run)
    os.kill(state["supervisor_pid"], signal.SIGKILL)  # rlctl dies; the run goes on and ends on its own
    follower = subprocess.Popen([sys.executable, "-m", "rlctl.cli", "logs", run.name, "-f"], env=env["env"],
                                cwd=env["cwd"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, _ = follower.communicate(timeout=180)  # logs -f ends when the run ends, supervisor or not
    assert follower.returncode == 0
    assert wait_for(lambda: not process_alive(state["pid"], state["pid_create_time"]), timeout=30)
    rs = run_status(run)
    assert rs.status == "finished" and rs.state["exit_code"] == 0, rs.state
    assert "exit record" in read_state(run)["settled_by"]
    assert sorted(reward_steps(run)) == list(range(1, 15))  # status ingested what nobody followed
    stop = rlctl(env, "stop", run.name)
    assert "not running (finished, exit code 0)" in stop.stdout
    assert read_state(run)["status"] == "finished"  # stop did not rewrite history
    assert "'train_runtime'" in out or "train_runtime" in out


def test_preemption_then_reboot_and_resume_picks_up_each_time(env, slow):
    """SIGTERM to the supervisor (a spot notice): the backend saves a checkpoint and exits, the run is stopped;
    `rlctl resume` continues from that checkpoint. Then everything is SIGKILLed (a reboot): lost; resume again."""
    r = rlctl(env, "launch", QUICK, "--detach", "--set", "train.steps=12", "--set", "checkpoint.every=100",
              "--grace", "30", "--set", slow)
    run = env["runs"] / r.stdout.strip()
    assert wait_for(lambda: max(reward_steps(run), default=0) >= 3, timeout=180)
    state = read_state(run)
    os.kill(state["supervisor_pid"], signal.SIGTERM)
    assert wait_for(lambda: read_state(run).get("status") == "stopped", timeout=60), read_state(run)
    saved = [int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("checkpoint-*")
             if (p / "trainer_state.json").is_file()]
    assert saved and max(saved) >= 3, saved  # checkpointed on the way out, though checkpoint.every is 100
    res = rlctl(env, "resume", run.name)
    assert res.returncode == 0 and "attempt 2" in res.stdout, res.stdout + res.stderr
    assert read_state(run)["attempts"][1]["from_step"] == max(saved)
    assert wait_for(lambda: max(reward_steps(run), default=0) >= max(saved) + 2, timeout=180)
    state = read_state(run)
    os.kill(state["supervisor_pid"], signal.SIGKILL)  # a reboot: everything dies at once, nothing records it
    os.killpg(state["pgid"], signal.SIGKILL)
    assert wait_for(lambda: run_status(run).status == "lost", timeout=30)
    res = rlctl(env, "resume", run.name)
    assert res.returncode == 0 and "attempt 3" in res.stdout, res.stdout + res.stderr
    assert wait_for(lambda: read_state(run).get("status") == "finished", timeout=240), read_state(run)
    state = read_state(run)
    assert [a["reason"] for a in state["attempts"]] == ["launch", "resume (stopped)", "resume (lost)"]
    steps = reward_steps(run)
    assert sorted(steps) == list(range(1, 13)) and max(Counter(steps).values()) == 1, steps
    again = rlctl(env, "resume", run.name)
    assert "nothing to resume" in again.stdout


def test_spec_records_what_a_later_supervisor_needs(env):
    """The W&B run id and rlctl's variables travel in the spec: a restart or `rlctl resume` keeps the same W&B run."""
    r = rlctl(env, "launch", QUICK, "--detach", "--set", "logging.wandb.project=p", "--grace", "2",
              "--set", "logging.wandb.offline=true", "--restart", "always", "--max-restarts", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    run = env["runs"] / r.stdout.strip()
    spec = json.loads((run / ".launch.json").read_text())
    assert spec["env_extra"]["WANDB_RUN_ID"] == read_state(run)["wandb_run_id"] and spec["env_extra"]["RLCTL_RUN_DIR"]
    assert spec["restart"] == {"mode": "always", "max_restarts": 0}
    assert "stopped" in rlctl(env, "stop", run.name, "--grace", "2").stdout


@pytest.fixture
def readme_env(tmp_path, model_cache, monkeypatch):
    """The README's defaults: ./runs relative to where rlctl is run, no RLCTL_RUNS_DIR (only HOME and the tiny model
    cache kept apart)."""
    from tests.test_launch import cleanup_runs

    monkeypatch.delenv("RLCTL_RUNS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLCTL_MODEL_CACHE", str(model_cache))
    yield {"runs": tmp_path / "runs", "env": dict(os.environ), "cwd": tmp_path}
    cleanup_runs(tmp_path / "runs")


def test_resume_after_every_process_was_killed_with_the_default_runs_dir(readme_env, slow):
    """Seed 004's `pkill -9 python` on a run launched from a working directory with every default: `rlctl resume`
    started a supervisor in the run directory with the run's relative path, which then found no .launch.json there
    and died ("no readable .launch.json"), leaving the run lost (found on an H100 by scripts/gpu/run.py)."""
    env = readme_env
    r = rlctl(env, "launch", QUICK, "--detach", "--set", "train.steps=6", "--set", "checkpoint.every=2",
              "--set", slow)
    assert r.returncode == 0, r.stderr
    run = env["runs"] / r.stdout.strip()
    assert wait_for(lambda: complete_checkpoint(run, 2) and max(reward_steps(run), default=0) >= 3, timeout=240)
    state = read_state(run)
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    os.killpg(state["pgid"], signal.SIGKILL)
    assert wait_for(lambda: run_status(run).status == "lost", timeout=30)
    # a lost run says the way forward (it said only `lost`)
    lost = rlctl(env, "status", run.name)
    assert f"next: rlctl resume {run.name}" in lost.stdout, lost.stdout
    assert json.loads(rlctl(env, "status", run.name, "--json").stdout)["next"].startswith(f"rlctl resume {run.name}")
    res = rlctl(env, "resume", run.name)
    assert res.returncode == 0, res.stdout + res.stderr
    assert wait_for(lambda: read_state(run).get("status") in ("finished", "failed"), timeout=240), read_state(run)
    state = read_state(run)
    assert state["status"] == "finished", (run / "supervisor.log").read_text()[-2000:]
    steps = reward_steps(run)
    assert sorted(steps) == list(range(1, 7)) and max(Counter(steps).values()) == 1, steps
    # the lost attempt ended at its last sign of life, before the resume: elapsed is the time the attempts ran, never
    # more than the run's wall time (the lost attempt was counted until the run's end, overlapping the next one)
    a1, a2 = state["attempts"]
    assert a1["outcome"] == "lost" and a1["started_at"] < a1["ended_at"] <= a2["started_at"], state["attempts"]
    shown = json.loads(rlctl(env, "status", run.name, "--json").stdout)
    wall = state["ended_at"] - state["started_at"]
    assert shown["elapsed_s"] <= wall + 0.01, (shown["elapsed_s"], wall, state["attempts"])
    assert shown["elapsed_s"] >= (a2["ended_at"] - a2["started_at"]) + (a1["ended_at"] - a1["started_at"]) - 0.01
    assert shown.get("next") is None  # finished: nothing to do
    # the wall clock since launch is given beside it (hostile trial 11: no start, end or wall time anywhere)
    assert shown["wall_s"] == wall and shown["started_at"] == state["started_at"], shown
    # restart never: the second attempt was the resume; no "max N restarts" beside a policy that never restarts
    text = rlctl(env, "status", run.name).stdout
    assert "attempts: 2 (restart never)" in text and "max" not in text.split("attempts: 2", 1)[1].split("\n")[0], text
