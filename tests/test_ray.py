"""The Ray executor against a real Ray head on loopback: jobs, logs into metrics, stop, head lifecycle."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from rlctl.executors.ray import LocalHead, cluster_info, job_status
from rlctl.runs.state import process_alive, read_state, run_status
from tests.conftest import RECIPES
from tests.test_launch import cleanup_runs, metrics, only_run, rlctl, wait_for

pytestmark = pytest.mark.slow
pytest.importorskip("ray.job_submission")
pytest.importorskip("trl")
QUICK = str(RECIPES / "quickstart.toml")


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture
def env(tmp_path, model_cache, monkeypatch):
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RLCTL_MODEL_CACHE", str(model_cache))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield {"runs": tmp_path / "runs", "env": dict(os.environ), "cwd": tmp_path}
    cleanup_runs(tmp_path / "runs")


def head_gone(state: dict) -> bool:
    import psutil

    temp = state["ray_head_temp_dir"]
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(temp in (a or "") for a in p.info["cmdline"] or []):
                return False
        except psutil.Error:
            continue
    return not process_alive(state["ray_head_pid"], state["ray_head_create_time"]) and not os.path.exists(temp)


def test_quickstart_as_a_ray_job_on_a_head_rlctl_starts(env):
    r = rlctl(env, "launch", QUICK, "--executor", "ray", "--set", "train.steps=15", timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(env["runs"])
    state = read_state(run)
    assert state["status"] == "finished" and state["ray_job_status"] == "SUCCEEDED"
    assert state["ray_job_id"].startswith("rlctl-") and state["ray_started_head"] is True
    assert state["ray_address"].startswith("http://127.0.0.1:")
    steps = sorted({m["step"] for m in metrics(run) if "reward/mean" in m})
    assert steps == list(range(1, 16))  # the job's logs were followed into the metrics stream
    assert "Running entrypoint for job" in (run / "stdout.log").read_text()
    assert wait_for(lambda: head_gone(state), timeout=30)


def test_detached_ray_job_status_and_stop(env):
    r = rlctl(env, "launch", QUICK, "--executor", "ray", "--detach", "--set", "train.steps=100000", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    run = env["runs"] / r.stdout.strip()
    assert wait_for(lambda: (run / "metrics.jsonl").is_file() and len(metrics(run)) >= 2, timeout=180)
    row = json.loads(rlctl(env, "status", "--json").stdout)[0]
    assert row["status"] == "running" and row["step"] >= 2
    state = read_state(run)
    assert job_status(state["ray_address"], state["ray_job_id"]) == "RUNNING"
    out = rlctl(env, "stop", run.name, timeout=200)
    assert "stopped" in out.stdout, out.stdout + out.stderr
    state = read_state(run)
    assert state["status"] == "stopped" and state["ray_job_status"] == "STOPPED"
    assert wait_for(lambda: head_gone(state), timeout=30)


def test_existing_cluster_is_used_and_never_stopped(env, tmp_path):
    head = LocalHead(tmp_path, num_gpus=0)  # stands for the user's own cluster
    address = head.start()
    try:
        r = rlctl(env, "launch", QUICK, "--executor", "ray", "--address", address, "--set", "train.steps=5",
                  timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        run = only_run(env["runs"])
        state = read_state(run)
        assert state["status"] == "finished" and state["ray_started_head"] is False
        assert "ray_head_pid" not in state
        assert cluster_info(address)["nodes"], "rlctl must not stop a cluster it did not start"
    finally:
        head.stop()


def test_killed_follower_is_recovered_over_rest(env):
    r = rlctl(env, "launch", QUICK, "--executor", "ray", "--detach", "--set", "train.steps=100000", timeout=300)
    run = env["runs"] / r.stdout.strip()
    assert wait_for(lambda: (run / "metrics.jsonl").is_file() and len(metrics(run)) >= 2, timeout=180)
    state = read_state(run)
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    assert wait_for(lambda: not process_alive(state["supervisor_pid"], state["supervisor_create_time"]), 10)
    n = len(metrics(run))
    # status asks the job API, copies the job's new logs, parses them
    assert wait_for(lambda: run_status(run).status == "running" and len(metrics(run)) > n, timeout=120, interval=1)
    out = rlctl(env, "stop", run.name, timeout=200)
    assert "stopped" in out.stdout
    assert wait_for(lambda: head_gone(read_state(run)), timeout=30)


def test_preflight_checks_the_cluster(env, tmp_path, cli):
    res = cli("preflight", QUICK, "--only", "env.ray", "--set", "resources.executor=ray",
              "--set", 'resources.ray_address="http://127.0.0.1:9"', "--json")
    r = json.loads(res.out)["results"][0]
    assert res.code == 1 and r["verdict"] == "fail" and "not reachable" in r["figure"]
    head = LocalHead(tmp_path, num_gpus=0)
    address = head.start()
    try:
        res = cli("preflight", QUICK, "--only", "env.ray", "--set", "resources.executor=ray",
                  "--set", f'resources.ray_address="{address}"', "--json")
        assert json.loads(res.out)["results"][0]["verdict"] == "ok"
        res = cli("preflight", QUICK, "--only", "env.ray", "--set", "resources.executor=ray",
                  "--set", f'resources.ray_address="{address}"', "--set", "resources.gpus_per_node=8", "--json")
        r = json.loads(res.out)["results"][0]
        assert r["verdict"] == "fail" and "needs 1 node(s) with 8 GPU(s)" in r["figure"]
    finally:
        head.stop()


def job_process(temp_dir: str, needle: str = "rlctl.backends.trl.runner") -> int | None:
    """The trainer process of a job on the run's own head (its working directory lies in the head's temp dir)."""
    import psutil

    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if any(needle in (a or "") for a in p.info["cmdline"] or []) and temp_dir in (p.info["cwd"] or ""):
                return p.pid
        except psutil.Error:
            continue
    return None


FLAG_REWARD = """
import os
import time


def reward_func(completions, **kwargs):
    while os.path.exists({flag!r}):  # a verifier that hangs while the flag file exists
        time.sleep(0.2)
    time.sleep(1.0)  # and is slow: the test's kill lands while the job still trains
    return [c.count("a") / max(len(c), 1) for c in completions]
"""


def test_ray_job_killed_then_stalled_is_restarted_from_its_checkpoint_and_finishes(env, tmp_path):
    flag = tmp_path / "hang"
    reward = tmp_path / "reward.py"
    reward.write_text(FLAG_REWARD.format(flag=str(flag)))
    r = rlctl(env, "launch", QUICK, "--executor", "ray", "--detach", "--restart", "always", "--max-restarts", "2",
              "--set", "train.steps=12", "--set", "checkpoint.every=4", "--set", f'reward.function="{reward}"',
              "--set", "run.stall.floor_s=4", "--set", "run.stall.k=3", "--set", "run.stall.slow_step_s=8",
              "--set", "run.stall.first_step_s=45", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    run = env["runs"] / r.stdout.strip()
    ckpt4 = run / "checkpoints" / "checkpoint-4" / "trainer_state.json"

    def steps() -> list[int]:
        return [m["step"] for m in metrics(run) if "reward/mean" in m] if (run / "metrics.jsonl").is_file() else []

    assert wait_for(lambda: ckpt4.is_file() and max(steps(), default=0) >= 5, timeout=240)
    state = read_state(run)
    pid = job_process(state["ray_head_temp_dir"])
    assert pid, "the trainer of the Ray job was not found"
    flag.write_text("")  # the next attempt's verifier will hang
    os.kill(pid, signal.SIGKILL)  # the trainer dies: the job FAILED
    assert wait_for(lambda: len(read_state(run).get("attempts") or []) >= 3, timeout=300), read_state(run)
    flag.unlink()  # the third attempt runs through
    assert wait_for(lambda: read_state(run).get("status") == "finished", timeout=300), read_state(run)
    state = read_state(run)
    a1, a2, a3 = state["attempts"]
    assert a1["outcome"] == "failed" and a2["reason"] == "failed" and a2["from_step"] in (4, 8)
    assert a2["outcome"] == "stalled" and "no new step" in a2["stall"] and Path(a2["evidence"]).is_file()
    evidence = Path(a2["evidence"]).read_text()
    assert "py-spy is not installed" in evidence or "reward_func" in evidence, evidence[-3000:]  # where it hung
    assert a3["reason"] == "stalled" and a3["outcome"] == "finished" and state["ray_job_status"] == "SUCCEEDED"
    got = steps()
    assert sorted(got) == list(range(1, 13)) and len(got) == len(set(got)), got
    assert wait_for(lambda: head_gone(state), timeout=30)  # one head for all attempts, stopped at the end


VERL_JOB = """
import time

for step in range(1, 5):  # verl's console lines (LocalLogger, 0.4's f"{v:.3f}"), one every 1.5 s
    print(f"step:{step} - actor/pg_loss:{0.01 * step:.3f} - critic/score/mean:{0.1 * step:.3f}", flush=True)
    time.sleep(1.5)
"""


def test_attach_a_running_ray_job_by_id_and_follow_it_to_its_end(env, tmp_path):
    """`rlctl attach <job id> --backend verl --follow` on a real head: the job's logs come through the job API while
    it runs, and the run ends with it."""
    import psutil
    from ray.job_submission import JobStatus, JobSubmissionClient

    script = tmp_path / "verl_like_job.py"
    script.write_text(VERL_JOB)
    (tmp_path / "head").mkdir()
    head = LocalHead(tmp_path / "head", num_gpus=0)
    address = head.start()
    try:
        client = JobSubmissionClient(address)
        job_id = client.submit_job(entrypoint=f"{sys.executable} -u {script}")
        assert wait_for(lambda: client.get_job_status(job_id) == JobStatus.RUNNING, timeout=30)
        r = rlctl(env, "attach", job_id, "--address", address, "--backend", "verl", "--follow", "--name", "rayjob",
                  timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]
        assert client.get_job_status(job_id) == JobStatus.SUCCEEDED
        run = only_run(env["runs"])
        assert f"attached {run} (verl)" in r.stdout and run.name.startswith("rayjob"), r.stdout
        state = read_state(run)
        assert state["status"] == "finished" and state["ray_job_status"] == "SUCCEEDED"
        assert state["ray_job_id"] == job_id and state["ray_address"] == address and not state.get("supervisor_pid")
        got = {m["step"]: m for m in metrics(run)}
        assert sorted(got) == [1, 2, 3, 4]
        assert got[2]["policy_loss"] == 0.02 and got[4]["reward/mean"] == 0.4
        row = json.loads(rlctl(env, "status", "--json").stdout)[0]
        assert row["status"] == "finished" and row["step"] == 4
    finally:
        with contextlib.suppress(Exception):
            client.stop_job(job_id)
        head.stop()
        for p in psutil.process_iter(["cmdline"]):  # the job's own process, should the head have left it
            with contextlib.suppress(psutil.Error):
                if str(script) in (p.info["cmdline"] or []):
                    p.kill()


# ---- secrets: never on a command line, never in a job record ------------------------------------------------------
SECRET_TRAINER = """
import hashlib, os, time
v = os.environ.get("MY_SERVICE_API_KEY", "")
print("secret sha", hashlib.sha256(v.encode()).hexdigest()[:16], flush=True)
for s in range(1, 13):
    print(f"step {s} | loss {1.0 / s}", flush=True)
    time.sleep(1.0)
"""


def _leaks(secret: str, address: str) -> list[str]:
    """Where the secret can be read by another user: process command lines, the Ray jobs API."""
    import urllib.request

    import psutil
    from ray.job_submission import JobSubmissionClient

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if secret in " ".join(p.info["cmdline"] or []):
                found.append(f"cmdline of pid {p.info['pid']}")
    client = JobSubmissionClient(address)
    jobs = client.list_jobs()
    for job in jobs:
        info = client.get_job_info(job.submission_id)
        if secret in repr(info) or secret in json.dumps(info.runtime_env or {}, default=str):
            found.append(f"job {job.submission_id} (get_job_info, runtime_env {sorted(info.runtime_env or {})})")
    with urllib.request.urlopen(f"{address}/api/jobs/", timeout=10) as r:  # what the dashboard shows anyone
        if secret in r.read().decode("utf-8", errors="replace"):
            found.append("GET /api/jobs/")
    return found


def test_secrets_stay_off_command_lines_and_job_records(env, tmp_path):
    """A planted secret reaches the job (its entrypoint reads it from its environment: the head rlctl starts
    inherits it) and appears in no process's command line, no Ray job record and no file of the run directory."""
    import hashlib
    import uuid

    secret = f"planted-{uuid.uuid4().hex}"
    (tmp_path / "trainer.py").write_text(SECRET_TRAINER)
    (tmp_path / "prompts.jsonl").write_text('{"input": "a"}\n')
    (tmp_path / "s.toml").write_text(f"""
[backend]
name = "command"
[backend.command]
command = ["{sys.executable}", "{tmp_path / 'trainer.py'}"]
log_pattern = 'step (?P<step>\\d+) \\| loss (?P<loss>\\S+)'
metrics_map = {{loss = "policy_loss"}}
[model]
path = "random:qwen2?hidden=64&layers=2"
[data]
train = "prompts.jsonl"
[train]
steps = 12
[resources]
gpus_per_node = 0
gpu = "cpu"
executor = "ray"
[env]
MY_SERVICE_API_KEY = "${{MY_SERVICE_API_KEY}}"
""")
    env["env"]["MY_SERVICE_API_KEY"] = secret
    r = rlctl(env, "launch", str(tmp_path / "s.toml"), "--detach", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    run = env["runs"] / r.stdout.strip().splitlines()[-1]
    assert wait_for(lambda: (run / "metrics.jsonl").is_file() and len(metrics(run)) >= 2, timeout=240), \
        (run / "stdout.log").read_text()[-2000:]
    state = read_state(run)
    assert state["status"] == "running" and state["ray_started_head"] is True
    assert _leaks(secret, state["ray_address"]) == []  # while the job runs
    assert wait_for(lambda: read_state(run).get("status") == "finished", timeout=120), read_state(run)
    log = (run / "stdout.log").read_text()
    assert f"secret sha {hashlib.sha256(secret.encode()).hexdigest()[:16]}" in log  # the job had it
    for f in run.rglob("*"):
        if f.is_file():
            assert secret not in f.read_text(errors="replace"), f
