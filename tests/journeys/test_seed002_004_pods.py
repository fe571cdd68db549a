"""Seeds 002 and 004 as their team types them: prime-rl pod recipes checked and rendered on the laptop (the
single-GPU shared pod of seed 002, the 2x H100 pod of seed 004), a run followed through the pod's logs, and the
incident the seeds keep meeting: a pod dies mid-run (spot instance, vLLM crash, disk), and training goes on on
another pod from the newest checkpoint synced to object storage (seed 004's B2 daemon, `checkpoint.sync`).

prime-rl cannot train on a CPU: its recipes go through preflight and render, and its run is its recorded logs,
printed by prime-rl's own logger (tests/fixtures/prime_rl/generate.py). The run that dies is the CPU quickstart
(TRL) on pod A, a machine of its own (its own sshd); pod B is another; the bucket is a real S3-compatible server
(moto, the session's: tests/s3_server.py) whose credentials are in the user's shell, as B2's would be.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time

import pytest

from tests.journeys.conftest import FIXTURES, RECIPES, stream, wait_for
from tests.remote_sshd import make_sshd
from tests.s3_server import s3_server  # noqa: F401 - the session's S3 server

pytestmark = pytest.mark.slow
pytest.importorskip("trl")

POD_RUN = """\
# the bs4 run's checkpoint discipline on a CPU stand-in: every 2 steps, each one synced to the bucket
extends = "quickstart.toml"
name = "bs4"
[train]
steps = 200
[checkpoint]
every = 2
sync = "s3://bs4-ckpts/bs4-v4"
[env]  # the bucket's credentials reach the pod from this shell, never a file
AWS_ACCESS_KEY_ID = "${AWS_ACCESS_KEY_ID}"
AWS_SECRET_ACCESS_KEY = "${AWS_SECRET_ACCESS_KEY}"
AWS_ENDPOINT_URL = "${AWS_ENDPOINT_URL}"
AWS_DEFAULT_REGION = "${AWS_DEFAULT_REGION}"
"""


@pytest.fixture(scope="module")
def bucket(s3_server):  # noqa: F811 - the session's S3 server
    """The team's bucket on the session's S3-compatible server (tests/s3_server.py), and the credentials the user
    exports (moto takes any; these are the team's own, so that a leak of them is found)."""
    s3_server.bucket("bs4-ckpts")
    return {**s3_server.env, "AWS_ACCESS_KEY_ID": "bs4-key-id", "AWS_SECRET_ACCESS_KEY": "bs4-secret-7f3a9c"}


def synced(creds) -> dict | None:
    """What the bucket's `latest` says (the user's `aws s3 cp s3://bs4-ckpts/bs4-v4/latest -`)."""
    from rlctl.core.environ import environ
    from rlctl.runs.sync import read_latest

    with environ(**creds):
        return read_latest("s3://bs4-ckpts/bs4-v4")


@pytest.fixture(scope="module")
def team(new_user, sshd, tmp_path_factory, bucket):
    """The team's laptop: the bundled pod recipes, the CPU run's recipe, pod A (a machine of its own) and pod B."""
    u = new_user("seed004")
    u.copy_quickstart()
    for r in ("prime-rl-qwen3-8b-2xh100.toml", "prime-rl-qwen2.5-7b-1xh100-shared.toml"):
        shutil.copy(RECIPES / r, u.cwd / r)
    u.write("bs4.toml", POD_RUN)
    u.env.update(bucket)
    pod_a = make_sshd(tmp_path_factory.mktemp("pod-a-sshd"))
    pod_a.start()
    u.add_host("pod-a", "prime-pod-a", pod_a)
    u.add_host("pod-b", "prime-pod-b", sshd)
    yield u, pod_a
    pod_a.stop()


def test_seed004_pod_recipe_preflight_and_render(team):
    u, _ = team
    recipe = "prime-rl-qwen3-8b-2xh100.toml"
    p = u(f"rlctl preflight {recipe} --only memory --only placement --only schedule --only context")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert re.search(r"OK\s+placement\.gpus\s+trainer 1 \+ 1 engine\(s\) x TP 1 = 2 on 1 x 2 GPUs", out), out
    assert re.search(r"OK\s+memory\.trainer\s+\S+ GiB per trainer GPU", out), out
    assert re.search(r"WARN\s+context\.train_seq_len\s+trainer seq_len 4096 < prompt \+ response 6144", out), out
    u.ok(f"rlctl render {recipe} --out rendered-004")
    import tomllib

    cfg = tomllib.loads((u.cwd / "rendered-004" / "rl.toml").read_text())
    assert cfg["inference_gpu_ids"] == [0] and cfg["trainer_gpu_ids"] == [1] and cfg["max_steps"] == 1000
    assert cfg["orchestrator"]["batch_size"] == 128 and cfg["orchestrator"]["rollouts_per_example"] == 8
    assert cfg["orchestrator"]["sampling"]["max_tokens"] == 4096
    assert cfg["inference"]["gpu_memory_utilization"] == 0.9
    launch = (u.cwd / "rendered-004" / "launch.sh").read_text()
    assert "rl.toml" in launch


def test_seed002_shared_pod_fits_its_context(team):
    """Seed 002's v5 lesson: on one shared H100, max_tokens must leave room for the prompt in max_model_len."""
    u, _ = team
    recipe = "prime-rl-qwen2.5-7b-1xh100-shared.toml"
    p = u.ok(f"rlctl preflight {recipe} --only context --only placement")
    assert re.search(r"(OK|WARN)\s+context\.budget\s+", p.stdout), p.stdout
    bad = u(f"rlctl preflight {recipe} --only context --set rollout.max_tokens=4000")
    assert bad.returncode == 1 and re.search(r"FAIL\s+context\.budget", bad.stdout), bad.stdout
    u.ok(f"rlctl render {recipe} --out rendered-002")
    import tomllib

    cfg = tomllib.loads((u.cwd / "rendered-002" / "rl.toml").read_text())
    assert cfg["inference_gpu_ids"] == [0] and cfg["trainer_gpu_ids"] == [0]
    assert cfg["inference"]["gpu_memory_utilization"] == 0.5


def test_the_pods_logs_followed(team):
    """The run's orchestrator and trainer logs, copied off the pod, attached with the recipe."""
    u, _ = team
    logs = u.cwd / "pod-logs"
    logs.mkdir()
    shutil.copy(FIXTURES / "prime_rl" / "orchestrator-v0.3.0.log", logs / "orchestrator.log")
    shutil.copy(FIXTURES / "prime_rl" / "trainer-v0.3.0.log", logs / "trainer.log")
    u.ok("rlctl attach pod-logs --backend prime_rl --recipe prime-rl-qwen3-8b-2xh100.toml --name bs4-v4")
    st = u.json("rlctl status bs4-v4 --json")
    assert st["step"] == 3
    assert st["metrics"]["reward/mean"]["latest"] == pytest.approx(0.4)  # orchestrator: Reward 0.4000
    assert st["metrics"]["grad_norm"]["latest"] == pytest.approx(0.28)  # trainer: Grad. Norm 0.2800
    assert st["metrics"]["lr"]["latest"] == pytest.approx(1e-5)


# ---- the pod dies; training goes on on another one ---------------------------------------------------------------
@pytest.fixture(scope="module")
def lost(team, bucket):
    """bs4 runs on pod A until a checkpoint of step >= 2 is in the bucket; then pod A is gone (its sshd down, the
    run's processes killed: a spot instance reclaimed)."""
    u, pod_a = team
    p = u.ok("rlctl launch bs4.toml --on pod-a --detach", timeout=600)
    name = p.stdout.strip().splitlines()[-1]
    there = u.hosts["pod-a"] / "runs" / name
    got = wait_for(lambda: (s := synced(bucket)) and s["step"] >= 2 and s, timeout=400, interval=1)
    assert got, (there / "stdout.log").read_text()[-2000:] if (there / "stdout.log").exists() else "no log"
    u.ok(f"rlctl status {name}")  # the last time the laptop hears from pod A
    state = json.loads((there / "state.json").read_text())
    pod_a.stop()
    for pid, kill in ((state.get("supervisor_pid"), os.kill), (state.get("pgid"), os.killpg)):
        if pid:
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)
    return name, there, got


def test_secrets_reached_the_pod_but_no_file(team, lost, bucket):
    u, _ = team
    _, there, _ = lost
    for f in there.rglob("*"):
        if f.is_file():
            assert bucket["AWS_SECRET_ACCESS_KEY"].encode() not in f.read_bytes(), f


def test_status_shows_the_lost_pod(team, lost):
    u, _ = team
    name, _, _ = lost
    t0 = time.time()
    table = u.ok("rlctl status").stdout
    assert time.time() - t0 < 30
    row = next(line for line in table.splitlines() if line.startswith(name))
    assert "pod-a" in row and "unreachable (last: running)" in row, row


def test_resume_on_another_pod_from_the_synced_checkpoint(team, lost, bucket):
    """`launch --on pod-b --resume pod-a:RUN --detach`: pod A does not answer, so the newest checkpoint synced to the
    bucket is the one to resume from; training continues after its step on pod B, followed from the laptop with
    `rlctl status` until it ends."""
    u, _ = team
    name, _, got = lost
    step = got["step"]
    p = u(f"rlctl launch bs4.toml --on pod-b --resume pod-a:{name} --name bs4-b --set train.steps={step + 2} "
          "--detach", timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "s3://bs4-ckpts/bs4-v4" in p.stderr and f"step {step}" in p.stderr, p.stderr
    run = p.stdout.strip().splitlines()[-1]

    def row():
        return next(line for line in u.ok("rlctl status").stdout.splitlines() if line.startswith(run)).split()

    assert wait_for(lambda: row()[3] not in ("running", "starting"), timeout=600, interval=2), row()
    assert row()[1:5] == ["pod-b", "trl", "finished", f"{step + 2}/{step + 2}"], row()
    there = u.host_run_dir("pod-b", "bs4-b")
    assert [m["step"] for m in stream(there) if "reward/mean" in m] == [step + 1, step + 2]
    st = u.json(f"rlctl status {run} --json")  # what the laptop shows of the run, once it has ended
    assert st["status"] == "finished" and st["step"] == step + 2, (st["status"], st["step"])
    last = [m for m in stream(there) if "reward/mean" in m][-1]["reward/mean"]
    assert st["metrics"]["reward/mean"]["latest"] == pytest.approx(last)
    assert "train_runtime" in u.ok(f"rlctl logs {run}").stdout  # the log, to its end
