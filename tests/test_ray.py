"""The Ray executor against a real Ray head on loopback: jobs, logs into metrics, stop, head lifecycle."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
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
    """The trainer process of a job on the run's own head (its working directory lies in the head's temp dir): the
    interpreter whose argv names the module, not the `/bin/sh -c "... -m MODULE ..."` Ray starts it with (killing
    that one left the trainer training on beside the next attempts)."""
    import psutil

    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if needle in (p.info["cmdline"] or []) and temp_dir in (p.info["cwd"] or ""):
                return p.pid
        except psutil.Error:
            continue
    return None


def job_processes(temp_dir: str, needle: str = "rlctl.backends.trl.runner") -> list[int]:
    """Every process of the run's jobs whose command line names the trainer (and the `sh -c` Ray starts it with)."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        with contextlib.suppress(psutil.Error):
            if any(needle in (a or "") for a in p.info["cmdline"] or []) and temp_dir in (p.info["cwd"] or ""):
                out.append(p.pid)
    return out


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


FLAG_REWARD = """
import os
import time

calls = 0


def reward_func(completions, **kwargs):
    global calls
    calls += 1
    # a verifier that hangs while the flag file exists, after its attempt's first three steps: the stall is then
    # called after k x the attempt's step time (run.stall.k), not after the first step's grace
    while calls > 3 and os.path.exists({flag!r}):
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
    first = job_processes(state["ray_head_temp_dir"])  # the trainer and the shell Ray started it with
    flag.write_text("")  # the next attempt's verifier will hang
    os.kill(pid, signal.SIGKILL)  # the trainer dies: the job FAILED
    assert wait_for(lambda: not any(_alive(p) for p in first), timeout=30), "attempt 1's trainer is still running"
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
import hashlib, os, sys, time
v = os.environ.get("MY_SERVICE_API_KEY", "")
print("secret sha", hashlib.sha256(v.encode()).hexdigest()[:16], flush=True)
for s in range(1, 13):
    print(f"step {s} | loss {1.0 / s}", flush=True)
    while s == 2 and not os.path.exists(sys.argv[1]):  # held running until the test has looked for the secret
        time.sleep(0.1)
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
command = ["{sys.executable}", "{tmp_path / 'trainer.py'}", "{tmp_path / 'looked'}"]
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
    (tmp_path / "looked").write_text("")  # the job goes on to its end
    assert wait_for(lambda: read_state(run).get("status") == "finished", timeout=120), read_state(run)
    log = (run / "stdout.log").read_text()
    assert f"secret sha {hashlib.sha256(secret.encode()).hexdigest()[:16]}" in log  # the job had it
    for f in run.rglob("*"):
        if f.is_file():
            assert secret not in f.read_text(errors="replace"), f


# -- a fresh head's job agent: Ray's "No available agent to submit job" answer (issue 30 §3) ----------------------


def ray_no_agent_answer() -> tuple[int, str]:
    """The status and text Ray's job API answers a submission with while its head has no job agent, read from the
    installed Ray's own source (ray/dashboard/modules/job/job_head.py, submit_job)."""
    import importlib.util
    import re

    import aiohttp.web

    src = (Path(importlib.util.find_spec("ray").origin).parent / "dashboard" / "modules" / "job" / "job_head.py")
    m = re.search(r'text="(No available agent[^"]*)",\s*status=aiohttp\.web\.(\w+)\.status_code', src.read_text())
    assert m, "Ray's job_head.py no longer answers 'No available agent' as this test expects"
    return getattr(aiohttp.web, m.group(2)).status_code, m.group(1)


class FreshHeadFront:
    """A real HTTP server on loopback in front of a real Ray head: it answers the first `refuse` job submissions
    exactly as Ray's job API does while a fresh head's agent starts (the race cannot be provoked at will: Ray's
    head itself waits 10 s for its agent), and forwards every other request to the head."""

    def __init__(self, head: str, refuse: int):
        import threading
        import urllib.error
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        status, text = ray_no_agent_answer()
        front = self
        self.refuse, self.submissions = refuse, 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def answer(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                if self.command == "POST" and self.path.rstrip("/") == "/api/jobs":
                    front.submissions += 1
                    if front.refuse > 0:
                        front.refuse -= 1
                        return self.answer(status, text.encode(), "text/plain; charset=utf-8")
                req = urllib.request.Request(head + self.path, data=body, method=self.command,
                                             headers={k: v for k, v in self.headers.items()
                                                      if k.lower() in ("content-type", "accept")})
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        self.answer(r.status, r.read(), r.headers.get("Content-Type", "application/json"))
                except urllib.error.HTTPError as e:
                    self.answer(e.code, e.read(), e.headers.get("Content-Type", "text/plain"))

            do_GET = do_POST = do_PUT = do_DELETE = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def user_cluster(tmp_path_factory):
    """A head that stands for the user's cluster (one for the tests below: a head's start is their cost)."""
    head = LocalHead(tmp_path_factory.mktemp("cluster"), num_gpus=0)
    yield head.start()
    head.stop()


@pytest.fixture
def fresh_head(user_cluster):
    """That cluster as it answers just after `ray start`: `fresh_head(refuse=N)` gives an address whose first N job
    submissions get Ray's no-agent answer."""
    fronts: list[FreshHeadFront] = []

    def front(refuse: int) -> FreshHeadFront:
        fronts.append(FreshHeadFront(user_cluster, refuse))
        return fronts[-1]

    yield front
    for f in fronts:
        f.close()


def test_launch_right_after_ray_start_waits_for_the_job_agent_and_says_so(user, fresh_head):
    """Ray answers HTTP 500 "No available agent to submit job, please try again later." until a fresh head's agent
    is up: rlctl submits again with backoff, says so, and the run goes through (this failed the launch before)."""
    from tests.test_experiments import bandit_recipe

    work, cli = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=4))
    front = fresh_head(refuse=2)
    r = cli("launch", "b.toml", "--executor", "ray", "--address", front.address, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    said = [x for x in r.stderr.splitlines() if "has no job agent yet" in x]
    assert len(said) == 2, r.stderr
    assert "submitting again in 1 s" in said[0] and "submitting again in 2 s" in said[1], said
    assert 'HTTP 500 "No available agent to submit job"' in said[0]
    assert front.submissions == 3
    run = only_run(work / "runs")
    state = read_state(run)
    assert state["status"] == "finished" and state["ray_job_status"] == "SUCCEEDED"
    assert sorted(m["step"] for m in metrics(run) if "reward/mean" in m) == [1, 2, 3, 4]


def test_a_job_agent_that_never_comes_fails_at_the_limit_with_what_ray_answered(fresh_head, capsys):
    """Within a limit: the submission gives up with Ray's answer and where to look, after backing off; any other
    failure is not retried."""
    from ray.job_submission import JobSubmissionClient

    from rlctl.errors import RlctlError
    from rlctl.executors.ray import submit_when_agent_ready

    front = fresh_head(refuse=1000)
    client = JobSubmissionClient(front.address)
    t0 = time.monotonic()
    with pytest.raises(RlctlError) as e:
        submit_when_agent_ready(lambda: client.submit_job(entrypoint="true"), front.address, limit=4.0)
    took = time.monotonic() - t0
    assert "still has no job agent after" in e.value.message and "No available agent" in e.value.message
    assert "dashboard_agent.log" in (e.value.hint or "")
    assert front.submissions == 3 and 3.0 <= took < 10.0, (front.submissions, took)  # waits of 1 s and 2 s
    assert capsys.readouterr().err.count("has no job agent yet") == 2
    n = front.submissions
    with pytest.raises(RlctlError) as e:  # another failure: said at once, not retried
        submit_when_agent_ready(lambda: client.submit_job(entrypoint="true", runtime_env={"pip": 5}), front.address)
    assert front.submissions == n and "Ray job submission to" in e.value.message


def test_slurm_allocation_waits_for_its_nodes_and_names_the_one_that_never_joined(user_cluster, tmp_path):
    """The SLURM job's wait for its Ray cluster (issue 33.2), against a real head: with every node of the allocation
    in it, it goes on; a node of the allocation that never joins fails the run naming it, within the limit (never a
    silent hang); a head that does not answer is said as such."""
    from rlctl.core.state import read_state, write_state
    from rlctl.executors.ray import cluster_info
    from rlctl.executors.slurm.job import wait_ray

    run = tmp_path / "run"
    run.mkdir()
    write_state(run, status="starting")
    ip = cluster_info(user_cluster)["nodes"][0]["ip"]
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(f"n1 {ip}\n")
    assert wait_ray(run, user_cluster, nodes, timeout=30) == 0
    nodes.write_text(f"n1 {ip}\nn2 10.255.255.254\n")  # n2's ray start never came
    t0 = time.time()
    assert wait_ray(run, user_cluster, nodes, timeout=4) == 1 and time.time() - t0 < 30
    st = read_state(run)
    assert st["status"] == "failed" and "node(s) n2 did not join the Ray cluster within 4 s (1 of 2 joined)" in \
        st["error"], st
    assert wait_ray(run, "http://127.0.0.1:9", nodes, timeout=2) == 1
    assert "did not answer within 2 s" in read_state(run)["error"]
