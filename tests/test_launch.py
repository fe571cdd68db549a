"""`rlctl launch` for real: the TRL quickstart end to end, stop mid-run, detached runs, crashes, resume, secrets.

These start real processes (the TRL runner trains a tiny model on the CPU) and real process trees.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.executors.local import Supervisor
from rlctl.runs.rundir import create_run_dir
from rlctl.runs.state import process_alive, read_state, run_status
from tests.conftest import RECIPES

pytestmark = pytest.mark.slow
QUICK = str(RECIPES / "quickstart.toml")
pytest.importorskip("trl")


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def cleanup_runs(runs: Path) -> None:
    """Whatever a failed test left running goes: each run's process groups and any Ray head it started."""
    if not runs.is_dir():
        return
    for run in runs.iterdir():
        state = read_state(run)
        for key in ("pgid", "supervisor_pid"):
            pid = state.get(key)
            if pid:
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                        kill(pid, signal.SIGKILL)
        if state.get("ray_started_head") and state.get("ray_head_pid"):
            from rlctl.executors.ray import stop_head

            stop_head(state["ray_head_pid"], state.get("ray_head_temp_dir"), grace=1)


@pytest.fixture
def env(tmp_path, model_cache, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(runs))
    monkeypatch.setenv("RLCTL_MODEL_CACHE", str(model_cache))
    e = dict(os.environ)
    yield {"runs": runs, "env": e, "cwd": tmp_path}
    cleanup_runs(runs)


def rlctl(env, *args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], env=env["env"], cwd=env["cwd"],
                          capture_output=True, text=True, timeout=timeout, **kw)


def only_run(runs: Path) -> Path:
    dirs = [d for d in runs.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def metrics(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]  # every line must be valid JSON


def wait_for(pred, timeout=120, interval=0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False


def descendants_gone(state: dict) -> bool:
    """No live process of the run's group is left (no orphans). Zombies awaiting a reaper don't count: in a
    container whose init does not reap, a child orphaned by a killed supervisor stays a zombie."""
    import psutil

    pgid = state.get("pgid")
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.Error):
            continue
    return True


def test_quickstart_end_to_end(env):
    r = rlctl(env, "launch", QUICK, "--set", "train.steps=30")
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(env["runs"])
    for f in ("recipe.toml", "launch.sh", "env.json", "stdout.log", "metrics.jsonl", "state.json", "trl_config.json"):
        assert (run / f).is_file(), f
    state = read_state(run)
    assert state["status"] == "finished" and state["exit_code"] == 0 and state["total_steps"] == 30
    recs = [m for m in metrics(run) if "reward/mean" in m]
    steps = [m["step"] for m in recs]
    assert steps == list(range(1, 31))
    first = sum(m["reward/mean"] for m in recs[:5]) / 5
    last = sum(m["reward/mean"] for m in recs[-5:]) / 5
    assert last > first + 0.1, (first, last)  # the reward visibly rises
    assert all("time" in m for m in metrics(run))
    envrec = json.loads((run / "env.json").read_text())
    assert envrec["packages"]["trl"] and envrec["python"]
    assert "step 30/30" in r.stderr and "finished" in r.stderr
    assert descendants_gone(state)


def test_sigterm_mid_run_stops_everything(env):
    p = subprocess.Popen([sys.executable, "-m", "rlctl.cli", "launch", QUICK, "--set", "train.steps=100000",
                          "--grace", "10"], env=env["env"], cwd=env["cwd"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: env["runs"].is_dir() and any(env["runs"].iterdir()))
    run = only_run(env["runs"])
    assert wait_for(lambda: (run / "metrics.jsonl").is_file() and len(metrics(run)) >= 3), p.poll()
    state = read_state(run)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    state = read_state(run)
    assert state["status"] == "stopped"
    assert not process_alive(state["pid"], state["pid_create_time"])
    assert descendants_gone(state)
    assert len(metrics(run)) >= 3  # still valid JSON lines


def test_process_tree_is_stopped_without_orphans(tmp_path):
    """A child that starts grandchildren (as Ray/vLLM do): stop takes the whole group."""
    script = tmp_path / "tree.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) for _ in range(3)]\n"
        "print('step:1 - critic/score/mean:0.5', flush=True)\n"
        "time.sleep(600)\n")
    run = create_run_dir(tmp_path / "runs", "tree")
    sup = Supervisor(run, {"argv": [sys.executable, str(script)], "backend": "verl", "grace_seconds": 5},
                     dict(os.environ))
    sup.start()
    import psutil

    # the wrapper that records the exit code -> the script -> its 3 children
    assert wait_for(lambda: len(psutil.Process(sup.proc.pid).children(recursive=True)) == 4, timeout=30)
    kids = [c.pid for c in psutil.Process(sup.proc.pid).children(recursive=True)]
    sup.request_stop()
    code = sup.loop()
    assert code != 0
    assert read_state(run)["status"] == "stopped"
    assert not any(psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE for k in kids)
    assert [m["reward/mean"] for m in metrics(run)] == [0.5]


def test_child_that_ignores_sigterm_is_killed_after_grace(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n")
    run = create_run_dir(tmp_path / "runs", "stubborn")
    sup = Supervisor(run, {"argv": [sys.executable, str(script)], "backend": "trl", "grace_seconds": 1},
                     dict(os.environ))
    sup.start()
    time.sleep(0.5)
    t0 = time.time()
    sup.request_stop()
    code = sup.loop()
    assert code == -signal.SIGKILL and time.time() - t0 < 15
    assert read_state(run)["status"] == "stopped"


def test_crash_and_bad_executable(tmp_path):
    run = create_run_dir(tmp_path / "runs", "crash")
    sup = Supervisor(run, {"argv": [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                           "backend": "trl"}, dict(os.environ))
    sup.start()
    assert sup.loop() == 3
    st = read_state(run)
    assert st["status"] == "failed" and st["exit_code"] == 3
    assert "boom" in (run / "stdout.log").read_text()

    run = create_run_dir(tmp_path / "runs", "nope")
    sup = Supervisor(run, {"argv": ["/nonexistent/trainer"], "backend": "trl"}, dict(os.environ))
    with pytest.raises(OSError):
        sup.start()
    st = read_state(run)
    assert st["status"] == "failed" and st["exit_code"] == 127 and "could not start" in st["error"]


def test_detached_run_status_stop_from_other_shells(env):
    r = rlctl(env, "launch", QUICK, "--detach", "--set", "train.steps=100000", "--name", "bg", "--grace", "10")
    assert r.returncode == 0, r.stderr[-2000:]
    name = r.stdout.strip()
    assert name.startswith("bg-")
    run = env["runs"] / name
    assert wait_for(lambda: (run / "metrics.jsonl").is_file() and len(metrics(run)) >= 2)
    st = rlctl(env, "status", "--json")
    rows = json.loads(st.stdout)
    assert rows[0]["name"] == name and rows[0]["status"] == "running" and rows[0]["step"] >= 2
    detail = json.loads(rlctl(env, "status", name, "--json").stdout)
    assert detail["metrics"]["reward/mean"]["latest"] is not None
    logs = rlctl(env, "logs", name, "--metrics")
    assert all(json.loads(line)["step"] >= 1 for line in logs.stdout.splitlines())
    stop = rlctl(env, "stop", name)
    assert stop.returncode == 0 and "stopped" in stop.stdout
    state = read_state(run)
    assert state["status"] == "stopped" and descendants_gone(state)


def test_killed_supervisor_is_recovered_by_status(env):
    r = rlctl(env, "launch", QUICK, "--detach", "--set", "train.steps=100000", "--grace", "5")
    run = env["runs"] / r.stdout.strip()
    assert wait_for(lambda: (run / "metrics.jsonl").is_file() and len(metrics(run)) >= 2)
    state = read_state(run)
    os.kill(state["supervisor_pid"], signal.SIGKILL)  # rlctl itself dies; the run goes on
    assert wait_for(lambda: not process_alive(state["supervisor_pid"], state["supervisor_create_time"]), 10)
    n = len(metrics(run))
    # status ingests the log itself now that nobody else does (the child keeps writing into its file)
    assert wait_for(lambda: run_status(run).status == "running" and len(metrics(run)) > n, timeout=120, interval=1)
    stop = rlctl(env, "stop", run.name, "--grace", "5")
    assert "stopped" in stop.stdout
    assert descendants_gone(state)
    assert run_status(run).status == "stopped"


def test_lost_run_when_everything_died(env, tmp_path):
    run = create_run_dir(env["runs"], "ghost")
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    (run / "state.json").write_text(json.dumps({"status": "running", "pid": p.pid, "backend": "trl",
                                                "started_at": time.time(), "supervisor_pid": p.pid}))
    assert run_status(run).status == "lost"


def test_preflight_failure_refuses_and_force_overrides(env):
    r = rlctl(env, "launch", QUICK, "--set", "rollout.max_tokens=500")
    assert r.returncode == 1 and "context.budget" in r.stdout + r.stderr and "--force" in r.stderr
    assert not env["runs"].exists() or not any(env["runs"].iterdir())


def test_smoke_mode_and_names_never_reused(env):
    r1 = rlctl(env, "launch", QUICK, "--smoke", "--name", "same")
    r2 = rlctl(env, "launch", QUICK, "--smoke", "--name", "same")
    assert r1.returncode == 0 and r2.returncode == 0, r2.stderr[-2000:]
    runs = sorted(env["runs"].iterdir())
    assert len(runs) == 2 and runs[0].name != runs[1].name
    for run in runs:
        assert read_state(run)["total_steps"] == 3
        assert max(m["step"] for m in metrics(run)) == 3


def test_run_dir_names_are_unique_within_a_second(tmp_path):
    now = time.time()
    a = create_run_dir(tmp_path, "x", now)
    b = create_run_dir(tmp_path, "x", now)
    assert a != b and a.name.startswith("x-") and b.name.endswith("-2")


def test_secrets_never_reach_the_run_directory(env):
    env["env"]["WANDB_API_KEY"] = "sk-wandb-secret-1234567890"
    env["env"]["MY_SERVICE_TOKEN"] = "tok-abcdef-0987654321"
    r = rlctl(env, "launch", QUICK, "--smoke", "--set", 'env.MY_SERVICE_TOKEN="tok-abcdef-0987654321"',
              "--set", 'env.HF_TOKEN="hf_secret_value_42"')
    assert r.returncode == 0, r.stderr[-2000:]
    run = only_run(env["runs"])
    for f in run.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            for secret in (b"sk-wandb-secret-1234567890", b"tok-abcdef-0987654321", b"hf_secret_value_42"):
                assert secret not in data, f
    assert "${HF_TOKEN}" in (run / "recipe.toml").read_text()


def test_missing_secret_fails_before_writing_anything(env):
    env["env"].pop("WANDB_API_KEY", None)
    r = rlctl(env, "launch", QUICK, "--force", "--set", "logging.wandb.project=p")
    assert r.returncode == 2 and "WANDB_API_KEY" in r.stderr
    assert not env["runs"].exists() or not any(env["runs"].iterdir())


def test_resume_continues_from_the_latest_checkpoint(env):
    r = rlctl(env, "launch", QUICK, "--name", "first", "--set", "train.steps=20", "--set", "checkpoint.every=10")
    assert r.returncode == 0, r.stderr[-2000:]
    first = only_run(env["runs"])
    assert (first / "checkpoints" / "checkpoint-20" / "trainer_state.json").is_file()
    before = tree_snapshot(first)
    r = rlctl(env, "launch", QUICK, "--name", "second", "--resume", first.name, "--set", "train.steps=30",
              "--set", "checkpoint.every=10")
    assert r.returncode == 0, r.stderr[-3000:]
    second = next(d for d in env["runs"].iterdir() if d.name.startswith("second"))
    assert (second / "parent").resolve() == first.resolve()
    assert read_state(second)["resumed_from"] == str(first)
    steps = sorted({m["step"] for m in metrics(second) if "reward/mean" in m})
    assert steps[0] == 21 and steps[-1] == 30  # picked up after step 20, not from scratch
    cfg = json.loads((second / "trl_config.json").read_text())
    assert cfg["grpo"]["resume_from_checkpoint"].endswith("checkpoint-20")
    # the resumed run wrote only into its own directory: the parent is exactly as it was (issue 14.3)
    assert tree_snapshot(first) == before
    assert (second / "checkpoints" / "checkpoint-20" / "trainer_state.json").is_file()  # its own copy
    assert (second / "checkpoints" / "checkpoint-30" / "trainer_state.json").is_file()
    assert (second / "checkpoints" / "final").is_dir()


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root (symlinks not followed) with its size and mtime."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out
