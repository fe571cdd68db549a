"""Remote GPU machines over SSH, against a real OpenSSH server on loopback (tests/remote_sshd.py): hosts
add/list/check, launch --on, status/logs/metrics/doctor/ckpt/stop of a remote run from the laptop, checkpoints
pulled, and the faults: a killed connection mid-run, sshd down, a full remote disk, a changed host key, a host whose
rlctl is missing or older. Secrets planted locally are looked for on the remote side (files and `ps`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rlctl.core.state import read_state
from tests.conftest import RECIPES, ROOT
from tests.remote_sshd import ALIAS, sshd  # noqa: F401 - the session fixture

QUICK = str(RECIPES / "quickstart.toml")
# a small quickstart: this machine is shared, a CPU step can take 15 s
SMALL = ("--set", "rollout.prompts_per_step=2", "--set", "train.train_batch_size=16", "--set",
         "train.micro_batch_size=16")


@pytest.fixture
def remote(sshd, tmp_path, monkeypatch, cli):  # noqa: F811
    ctl = Path(f"/tmp/rlctl-t-{uuid.uuid4().hex[:8]}")  # ControlPath sockets need a short path
    monkeypatch.setenv("RLCTL_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("RLCTL_SSH_CONFIG", str(sshd.client_config))
    monkeypatch.setenv("RLCTL_SSH_CONTROL_DIR", str(ctl))
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "laptop-runs"))
    work = tmp_path / "remote"
    r = cli("hosts", "add", "box", ALIAS, "--workdir", str(work), "--python", sys.executable,
            "--env", f"PYTHONPATH={ROOT}", "--env", f"RLCTL_MODEL_CACHE={tmp_path / 'models'}")
    assert r.code == 0, r.err
    yield {"work": work, "runs": tmp_path / "laptop-runs", "tmp": tmp_path, "sshd": sshd, "ctl": ctl}
    for run in (work / "runs").glob("*") if (work / "runs").is_dir() else []:  # nothing left running
        st = read_state(run)
        for key in ("pgid", "supervisor_pid"):
            if st.get(key):
                with contextlib.suppress(OSError):
                    os.killpg(st[key], 9) if key == "pgid" else os.kill(st[key], 9)
    with contextlib.suppress(Exception):
        subprocess.run(["ssh", "-F", str(sshd.client_config), "-o", f"ControlPath={ctl}/%C", "-O", "exit", ALIAS],
                       capture_output=True, timeout=10)


def sub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def wait_for(pred, timeout=120.0, interval=0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False


def test_hosts_add_list_check_remove(remote, cli):
    r = cli("hosts", "list")
    assert "box" in r.out and ALIAS in r.out
    r = cli("hosts", "check", "box")
    assert r.code == 0, r.out + r.err
    assert "rlctl 0." in r.out and "gpus: none (no NVIDIA GPU found" in r.out and "GB free at" in r.out
    assert "trl:" in r.out
    r = cli("hosts", "check", "box", "--json")
    facts = json.loads(r.out)["box"]["facts"]
    assert facts["disk_path"] == str(remote["work"]) and facts["gpus"] is None
    assert cli("hosts", "add", "box", ALIAS).code == 2  # exists
    assert cli("hosts", "remove", "box").code == 0
    assert "no hosts" in cli("hosts", "list").out


def test_damaged_hosts_config(remote, cli):
    path = Path(os.environ["RLCTL_CONFIG_DIR"]) / "hosts.toml"
    path.write_text(path.read_text() + "\n[hosts.x\nssh = 1\n")
    r = cli("hosts", "list")
    assert r.code == 2 and f"{path}:" in r.err and "not valid TOML" in r.err
    path.write_text('[hosts.y]\nssh = "a"\nsecret_thing = 1\n')
    r = cli("hosts", "check", "y")
    assert r.code == 2 and f"{path}:1" in r.err and "unknown key" in r.err
    path.write_text('[hosts.y]\nssh = "a"\nenv = { WANDB_API_KEY = "x" }\n')
    r = cli("hosts", "list")
    assert r.code == 2 and "a secret, in a file" in r.err


def test_missing_and_older_rlctl(remote, cli):
    r = cli("hosts", "add", "bare", ALIAS, "--workdir", str(remote["work"]), "--python", f"{sys.executable} -I -S")
    assert r.code == 0
    r = cli("hosts", "check", "bare")
    assert r.code == 1 and "rlctl is not installed" in r.out and "rlctl hosts install bare" in r.out
    old = remote["tmp"] / "old-python"
    old.write_text('#!/bin/sh\necho \'{"machine": "x", "rlctl_version": "0.0.1", "python": "x", "gpus": null}\'\n')
    old.chmod(0o755)
    cli("hosts", "add", "old", ALIAS, "--workdir", str(remote["work"]), "--python", str(old))
    r = cli("hosts", "check", "old")
    assert r.code == 1 and "0.0.1 there is older than" in r.out and "rlctl hosts install old" in r.out
    r = cli("launch", QUICK, "--on", "bare", "--detach")
    assert r.code == 2 and "rlctl hosts install bare" in r.err
    r = cli("launch", QUICK, "--set", "run.on=bare", "--detach")  # [run] on = "HOST" in a recipe
    assert r.code == 2 and "rlctl hosts install bare" in r.err
    assert not (remote["runs"]).exists() or not list(remote["runs"].iterdir())


def test_changed_host_key_is_refused(remote, cli):
    cli("hosts", "add", "moved", f"{ALIAS}-changed", "--workdir", str(remote["work"]), "--python", sys.executable)
    r = cli("hosts", "check", "moved")
    assert r.code == 1
    assert "refused the host key" in r.out and "ssh-keygen -R" in r.out


def test_unreachable_host_never_hangs(remote, cli):
    runs = remote["runs"]
    run = runs / "ghost-20260101-000000"
    run.mkdir(parents=True)
    from rlctl.core.state import write_state

    write_state(run, name=run.name, executor="ssh", host="box", status="running", started_at=time.time(),
                handle={"executor": "ssh", "ref": {"host": "box", "run_dir": "/nonexistent"}})
    remote["sshd"].stop()
    try:
        t0 = time.time()
        r = cli("status", "--timeout", "3")
        took = time.time() - t0
        assert r.code == 0, r.err
        assert "unreachable (last: running)" in r.out and "box" in r.out
        assert took < 8, took
        r = cli("status", run.name, "--timeout", "3")
        assert r.code == 0 and "unreachable" in r.out and "last known state" in r.out, r.out + r.err
    finally:
        remote["sshd"].start()


def test_full_remote_disk_fails_cleanly(remote, cli, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        cli("hosts", "add", "tiny", ALIAS, "--workdir", str(small / "w"), "--python", sys.executable,
            "--env", f"PYTHONPATH={ROOT}")
        data = tmp_path / "recipe"
        data.mkdir()
        big = "\n".join(json.dumps({"prompt": "a" * 200 + str(i), "label": "a"}) for i in range(12000))
        (data / "prompts.jsonl").write_text(big + "\n")  # ~2.6 MB > 1 MB
        (data / "reward.py").write_text((RECIPES / "quickstart" / "reward.py").read_text())
        (data / "r.toml").write_text(Path(QUICK).read_text().replace("quickstart/prompts.jsonl", "prompts.jsonl")
                                     .replace("quickstart/reward.py", "reward.py"))
        r = cli("launch", str(data / "r.toml"), "--on", "tiny", "--detach")
        assert r.code == 2, r.out + r.err
        assert "disk is full" in r.err and "free space on tiny" in r.err
        assert not (small / "w" / "runs").exists()  # nothing half-started there
        assert not remote["runs"].exists() or not list(remote["runs"].iterdir())  # nor a local record
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


@pytest.mark.slow
def test_quickstart_on_remote_end_to_end(remote, cli, monkeypatch):
    secret = f"planted-{uuid.uuid4().hex}"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    r = cli("launch", QUICK, "--on", "box", "--detach", *SMALL, "--set", "train.steps=4", "--set", "checkpoint.every=2")
    assert r.code == 0, r.out + r.err
    name = r.out.strip().splitlines()[-1]
    local = remote["runs"] / name
    st = read_state(local)
    assert st["executor"] == "ssh" and st["host"] == "box"
    remote_dir = Path(st["remote_run_dir"])
    assert remote_dir.is_dir() and remote_dir.parent == remote["work"] / "runs"
    # the recipe as this machine resolved it (compare reads it): this machine's paths, the secret masked
    here = (local / "recipe.laptop.toml").read_text()
    assert str(RECIPES / "quickstart" / "prompts.jsonl") in here and ".rlctl/stage" not in here and secret not in here

    # the secret reached the remote process's environment, and never a command line
    sup = read_state(remote_dir).get("supervisor_pid")
    assert sup and secret.encode() in Path(f"/proc/{sup}/environ").read_bytes()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert secret not in ps

    # kill the shared SSH connection mid-run: the run goes on, status reconnects
    subprocess.run(["ssh", "-F", os.environ["RLCTL_SSH_CONFIG"], "-o", f"ControlPath={remote['ctl']}/%C", "-O",
                    "exit", ALIAS], capture_output=True, timeout=10)
    r = cli("status")
    assert r.code == 0 and name in r.out and "box" in r.out, r.out + r.err
    assert wait_for(lambda: read_state(remote_dir).get("status") == "finished", timeout=400)
    r = cli("status", name)
    assert r.code == 0 and "finished" in r.out, r.out + r.err
    assert read_state(local)["status"] == "finished"
    r = cli("status")
    assert "finished" in r.out and "4/4" in r.out

    r = sub("logs", name)  # logs writes bytes to stdout: a real process
    assert r.returncode == 0 and "'step': 4" in r.stdout, r.stderr
    r = sub("logs", name, "--metrics")
    recs = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    assert recs and max(x.get("step", 0) for x in recs) == 4
    assert cli("metrics", name, "--csv").code == 0
    assert cli("doctor", name).code in (0, 1)
    r = cli("ckpt", "list", name)
    assert r.code == 0 and "complete" in r.out and "step       4" in r.out, r.out + r.err

    # checkpoints: pull the newest complete one, verified
    r = cli("ckpt", "pull", name, "--to", str(remote["tmp"] / "pulled"))
    assert r.code == 0, r.out + r.err
    assert "verified" in r.out
    assert any((remote["tmp"] / "pulled").rglob("*.safetensors"))

    # push the checkpoint to a second host, and resume there from it (one more step)
    work2 = remote["tmp"] / "remote2"
    cli("hosts", "add", "box2", ALIAS, "--workdir", str(work2), "--python", sys.executable, "--env",
        f"PYTHONPATH={ROOT}", "--env", f"RLCTL_MODEL_CACHE={remote['tmp'] / 'models'}")
    r = cli("ckpt", "push", name, "--to", "box2")
    assert r.code == 0 and "verified" in r.out, r.out + r.err
    pushed = work2 / "runs" / name
    assert read_state(pushed)["status"] == "finished" and any(pushed.rglob("*.safetensors"))
    r = cli("launch", QUICK, "--on", "box2", "--detach", *SMALL, "--set", "train.steps=5", "--resume", f"box:{name}")
    assert r.code == 0, r.out + r.err
    second = Path(read_state(remote["runs"] / r.out.strip().splitlines()[-1])["remote_run_dir"])
    assert second.parent == work2 / "runs"
    assert wait_for(lambda: read_state(second).get("status") in ("finished", "failed"), timeout=400)
    st2 = read_state(second)
    assert st2["status"] == "finished" and st2["resumed_from"].endswith(name), st2

    # no secret in any file on either side
    for root in (remote["work"], remote["runs"]):
        p = subprocess.run(["grep", "-rl", secret, str(root)], capture_output=True, text=True)
        assert p.stdout == "", p.stdout


@pytest.mark.slow
def test_stop_remote_run(remote, cli):
    r = cli("launch", QUICK, "--on", "box", "--detach", *SMALL, "--set", "train.steps=400")
    assert r.code == 0, r.out + r.err
    name = r.out.strip().splitlines()[-1]
    assert "would run `rlctl stop" in cli("stop", name, "--dry-run").out
    r = cli("stop", name, "--grace", "5")
    assert r.code == 0, r.err
    assert "box:" in r.out
    remote_dir = Path(read_state(remote["runs"] / name)["remote_run_dir"])
    assert read_state(remote_dir)["status"] == "stopped"
    assert cli("status", name).code == 0
    assert read_state(remote["runs"] / name)["status"] == "stopped"


def test_git_bundle_and_remote_preflight(remote, cli, tmp_path):
    """Unpushed commits travel as a bundle of HEAD's files, checked out there as HEAD's tree (its SHA recorded);
    preflight runs there, and its failure
    (a context budget the recipe breaks) comes back with its table; nothing starts."""
    repo = tmp_path / "repo"
    (repo / "quickstart").mkdir(parents=True)
    for f in ("prompts.jsonl", "reward.py"):
        (repo / "quickstart" / f).write_text((RECIPES / "quickstart" / f).read_text())
    (repo / "r.toml").write_text(Path(QUICK).read_text())
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    sha = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    r = cli("launch", str(repo / "r.toml"), "--on", "box", "--detach", "--set", "rollout.max_tokens=500")
    assert r.code == 1, r.out + r.err
    assert "box: preflight failed" in r.err and "context" in r.err
    checkout = remote["work"] / ".rlctl" / "repos" / sha
    tree = subprocess.run([*git[:3], "rev-parse", "HEAD^{tree}"], capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD^{tree}"], capture_output=True, text=True)
    assert head.stdout.strip() == tree
    assert not (remote["work"] / "runs").exists() or not list((remote["work"] / "runs").iterdir())
    # the second time nothing is sent again (content-addressed)
    r = cli("launch", str(repo / "r.toml"), "--on", "box", "--detach", "--set", "rollout.max_tokens=500")
    assert "box: preflight failed" in r.err


def test_patch_on_host_runs_the_remote_rlctl(remote, cli):
    r = cli("patch", "status", "--backend", "openrlhf", "--on", "box")
    assert r.code == 2  # relayed from the host's rlctl: openrlhf is not installed there
    assert "openrlhf" in r.err and "not installed" in r.err


def test_attach_a_log_on_a_host(remote, cli, tmp_path):
    from tests.conftest import FIXTURES

    log = tmp_path / "on-the-box" / "train.log"  # a run rlctl did not start, on the host
    log.parent.mkdir()
    log.write_text((FIXTURES / "trl" / "stdout.log").read_text())
    r = cli("attach", f"box:{log}", "--backend", "trl", "--name", "theirs")
    assert r.code == 0, r.out + r.err
    assert "box: attached" in r.out
    local = next(remote["runs"].iterdir())
    st = read_state(local)
    assert st["executor"] == "ssh" and Path(st["remote_run_dir"]).parent == remote["work"] / "runs"
    r = cli("status")
    assert "theirs" in r.out and "box" in r.out and "80/" not in r.out.split("theirs")[0]
    assert (local / "metrics.jsonl").stat().st_size > 0  # the mirror
    r = sub("logs", local.name, "--metrics")
    assert r.returncode == 0 and '"step": 80' in r.stdout.replace('"step":80', '"step": 80'), r.stderr


# ---- rlctl eval --on HOST ------------------------------------------------------------------------------------------
EVAL_SCRIPT = '''import json, os, sys
step, name, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if name == "crashy" and step == 4:
    print("boom: the evaluator died on this host", file=sys.stderr, flush=True)
    os.kill(os.getppid(), 9)  # the eval job itself dies, before writing any result
json.dump({"primary": 0.1 * step, "cvd": float(os.environ.get("CUDA_VISIBLE_DEVICES", "-1")),
           "has_key": float("WANDB_API_KEY" in os.environ)}, open(out, "w"))
'''


def fake_run(runs: Path, recipe: Path, steps=(2, 4), name="r-20261125-000000", **state) -> Path:
    """A finished local run with TRL-layout checkpoints (complete: trainer_state.json) and the recipe."""
    from rlctl.core.state import write_state
    from rlctl.recipe.loader import dump_toml, load

    run = runs / name
    for step in steps:
        d = run / "checkpoints" / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        (d / "weights.bin").write_bytes(os.urandom(4096))
    (run / "recipe.toml").write_text(dump_toml(load(recipe).recipe.model_dump(mode="json", exclude_none=True)))
    write_state(run, name=name, backend="trl", status="finished", **state)
    return run


def eval_recipe(tmp: Path, sets: str = "probe") -> Path:
    d = tmp / "evalrecipe"
    d.mkdir(exist_ok=True)
    (d / "eval_posthoc.py").write_text(EVAL_SCRIPT)
    (d / "probe.jsonl").write_text(json.dumps({"prompt": "a", "label": "a"}) + "\n")
    body = "".join(f'[eval.sets.{s}]\ndata = "probe.jsonl"\n' for s in sets.split(","))
    (d / "r.toml").write_text(f'''extends = "{QUICK}"
[eval]
evaluator = "command"
command = "{sys.executable} {d / 'eval_posthoc.py'} {{step}} {{set}} {{output}}"
{body}''')
    return d / "r.toml"


def stream(run: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)  # every line whole
        out.setdefault(rec["step"], {}).update({k: v for k, v in rec.items() if k.startswith("eval/")})
    return out


def test_eval_a_local_run_on_a_host(remote, cli, monkeypatch):
    """A local run's checkpoints pushed to the host (verified), the command evaluator's script and the set's data
    staged there, each job run by the host's rlctl (--gpu as its CUDA_VISIBLE_DEVICES), the results back in the
    local stream and ledger at their steps; the same numbers as a local `rlctl eval`; the secret only on stdin."""
    secret = f"planted-{uuid.uuid4().hex}"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    recipe = eval_recipe(remote["tmp"])
    run = fake_run(remote["runs"], recipe)
    monkeypatch.chdir(remote["tmp"])
    r = cli("eval", run.name, "--all", "--on", "box", "--gpu", "3", "--json")
    assert r.code == 0, r.out + r.err
    assert "copied to box" in r.err and "sending" in r.err
    rows = {x["step"]: x["metrics"] for x in json.loads(r.out)["results"]}
    key = "eval/probe/greedy_pass@1"
    assert {s: m[key] for s, m in rows.items()} == {0: 0.0, 2: pytest.approx(0.2), 4: pytest.approx(0.4)}
    assert all(m[f"{key}/cvd"] == 3.0 and m[f"{key}/has_key"] == 1.0 for m in rows.values())
    ev = stream(run)
    assert {s: ev[s][key] for s in ev} == {s: m[key] for s, m in rows.items()}
    ledger = json.loads((run / "evals" / "evals.json").read_text())
    assert [(e["step"], e["outcome"], e["host"]) for e in ledger["by_hand"]] == [(0, "ok", "box"), (2, "ok", "box"),
                                                                                 (4, "ok", "box")]
    assert json.loads((run / "evals" / "step-4.out.json").read_text())["host"] == "box"
    spec = json.loads((remote["work"] / "runs" / run.name / "evals" / "step-4.json").read_text())
    assert "/.rlctl/stage/" in spec["command"] and "/.rlctl/stage/" in spec["sets"][0]["data"]  # staged copies
    there = remote["work"] / "runs" / run.name / "checkpoints"
    assert (there / "checkpoint-4" / "weights.bin").read_bytes() == (run / "checkpoints" / "checkpoint-4" /
                                                                      "weights.bin").read_bytes()
    st = cli("status", run.name)
    assert key in st.out, st.out
    csv = cli("metrics", run.name, "--csv", "--keys", key).out
    assert f"4,{run.name},{key},0.4" in csv, csv
    assert cli("doctor", run.name).code in (0, 1)
    # again: nothing travels twice; identical numbers to a local eval of the same checkpoint
    r2 = cli("eval", run.name, "--step", "4", "--on", "box", "--gpu", "3", "--json")
    assert r2.code == 0 and "already on box" in r2.err, r2.err
    assert len(list((remote["work"] / ".rlctl" / "stage").glob("eval-*"))) == 1  # the same files: one stage
    local = cli("eval", run.name, "--step", "4", "--gpu", "3", "--json")
    assert local.code == 0, local.err
    assert json.loads(local.out)["results"][0]["metrics"] == json.loads(r2.out)["results"][0]["metrics"]
    for root in (remote["work"], remote["runs"]):  # the secret is in no file on either side
        p = subprocess.run(["grep", "-rl", secret, str(root)], capture_output=True, text=True)
        assert p.stdout == "", p.stdout


def test_eval_on_host_crash_unknown_host_and_old_rlctl(remote, cli, monkeypatch):
    recipe = eval_recipe(remote["tmp"], "probe,crashy")
    run = fake_run(remote["runs"], recipe)
    monkeypatch.chdir(remote["tmp"])
    r = cli("eval", run.name, "--all", "--on", "box")
    assert r.code == 1, r.out + r.err
    assert "evaluator crashed (killed by signal 9)" in r.out and "boom: the evaluator died" in r.out, r.out
    assert "Traceback" not in r.out + r.err
    ev = stream(run)
    assert sorted(ev) == [0, 2] and "eval/crashy/greedy_pass@1" in ev[2]  # step 4's job died: nothing recorded
    ledger = json.loads((run / "evals" / "evals.json").read_text())
    assert ledger["by_hand"][-1]["outcome"] == "failed" and ledger["by_hand"][-1]["step"] == 4
    r = cli("eval", run.name, "--on", "nowhere")
    assert r.code == 2 and "no host 'nowhere'" in r.err and "rlctl hosts add nowhere" in r.err
    bare = remote["tmp"] / "bare"
    cli("hosts", "add", "bare", ALIAS, "--workdir", str(bare), "--python", f"{sys.executable} -I -S")
    r = cli("eval", run.name, "--on", "bare")
    assert r.code == 2 and "rlctl hosts install bare" in r.err, r.err
    assert not (bare / "runs").exists() and not (bare / ".rlctl").exists()  # nothing sent to a host that can't
    old = remote["tmp"] / "old-python"  # an rlctl from before remote evals: its ssh_remote knows no `eval`
    old.write_text("#!/bin/sh\necho 'rlctl: usage: python -m rlctl.executors.ssh_remote {blobs,launch,poll,ckpt,"
                   "adopt}' >&2\nexit 2\n")
    old.chmod(0o755)
    cli("hosts", "add", "old", ALIAS, "--workdir", str(bare), "--python", str(old))
    r = cli("eval", run.name, "--on", "old")
    assert r.code == 2 and "older than this one" in r.err and "rlctl hosts install old" in r.err, r.err
    assert not (bare / "runs").exists()


def test_eval_a_base_model_and_a_run_in_place_on_the_host(remote, cli, monkeypatch):
    from rlctl.core.state import write_state

    recipe = eval_recipe(remote["tmp"])
    monkeypatch.chdir(remote["tmp"])
    r = cli("eval", "random:qwen2?hidden=64&layers=2", "--recipe", str(recipe), "--on", "box", "--json")
    assert r.code == 0, r.out + r.err
    assert json.loads(r.out)["results"][0]["metrics"]["eval/probe/greedy_pass@1"] == 0.0
    assert list((remote["tmp"] / "rlctl-evals").rglob("step-0.out.json"))  # brought back, as a local eval keeps it
    # a run that lives on the host (as launch --on leaves it): evaluated there, into its stream there
    there = fake_run(remote["work"] / "runs", recipe, name="onbox-20261125-000000")
    local = remote["runs"] / there.name
    local.mkdir(parents=True)
    write_state(local, name=there.name, executor="ssh", host="box", status="finished", backend="trl",
                handle={"executor": "ssh", "ref": {"host": "box", "run_dir": str(there)}, "attempt": 1},
                remote_run_dir=str(there))
    r = cli("eval", there.name, "--step", "2", "--on", "box")
    assert r.code == 0, r.out + r.err
    assert stream(there)[2]["eval/probe/greedy_pass@1"] == pytest.approx(0.2)
    assert stream(local)[2]["eval/probe/greedy_pass@1"] == pytest.approx(0.2)  # the mirror, refreshed
    assert "sending" not in r.err  # nothing travels: the checkpoints and the recipe are there
    r = cli("eval", there.name)
    assert r.code == 2 and "--on box" in r.err


def remote_eval_handlers() -> dict[int, float]:
    """The `rlctl.executors.ssh_remote eval` processes on the host (this machine): pid -> start time."""
    import psutil

    found = {}
    for p in psutil.process_iter(["cmdline", "create_time"]):
        cmd = p.info["cmdline"] or []
        if "rlctl.executors.ssh_remote" in cmd and "eval" in cmd:
            found[p.pid] = p.info["create_time"]
    return found


def test_eval_on_host_faults_unreachable_cut_and_full_disk(remote, cli, monkeypatch, tmp_path):
    """sshd down: said within the timeout; the connection cut mid-eval: the steps already back are recorded whole,
    the one in flight not at all; the host's disk full during the checkpoint push: said, with the fix."""
    recipe = eval_recipe(remote["tmp"])
    script = recipe.parent / "eval_posthoc.py"
    calls = remote["tmp"] / "calls.log"  # each evaluator start, to tell a picked-up job from a second one
    hold = remote["tmp"] / "hold"  # step 4's job runs there while it exists (it slept 20 s: the test waited them out)
    hold.write_text("")
    script.write_text(f"import os, time, sys\nopen({str(calls)!r}, 'a').write(sys.argv[1] + '\\n')\n"
                      f"while int(sys.argv[1]) == 4 and os.path.exists({str(hold)!r}):\n    time.sleep(0.1)\n"
                      + EVAL_SCRIPT)
    run = fake_run(remote["runs"], recipe)
    monkeypatch.chdir(remote["tmp"])
    remote["sshd"].stop()
    try:
        t0 = time.time()
        r = cli("eval", run.name, "--on", "box")
        assert r.code == 1 and "box: unreachable" in r.err and "Traceback" not in r.err, r.err
        assert time.time() - t0 < 25
    finally:
        remote["sshd"].start()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "rlctl.cli", "eval", run.name, "--all", "--on", "box"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        spec = remote["work"] / "runs" / run.name / "evals" / "step-4.json"
        assert wait_for(spec.is_file, timeout=60)  # step 4's job runs there (20 s): cut the connection now
        time.sleep(1)
        subprocess.run(["ssh", "-F", os.environ["RLCTL_SSH_CONFIG"], "-o", f"ControlPath={remote['ctl']}/%C", "-O",
                        "exit", ALIAS], capture_output=True, timeout=10)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, out + err
    assert "recorded: step 0, step 2; not recorded: step 4" in err and "Traceback" not in err, err
    ev = stream(run)  # every line whole (stream() parses each)
    assert sorted(ev) == [0, 2]
    # again: step 4's job, still running there, is picked up and recorded once; nothing is evaluated twice (the job
    # is let go once the pickup's handler there has waited on it a moment)
    before = remote_eval_handlers()
    release = threading.Thread(target=lambda: (wait_for(lambda: any(
        time.time() - t >= 2 for pid, t in remote_eval_handlers().items() if pid not in before), timeout=120,
        interval=0.2), hold.unlink()), daemon=True)
    release.start()
    r = cli("eval", run.name, "--step", "4", "--on", "box")
    release.join(timeout=10)
    assert r.code == 0, r.out + r.err
    assert "step 4 was in flight on box" in r.err, r.err
    assert stream(run)[4]["eval/probe/greedy_pass@1"] == pytest.approx(0.4)
    assert sorted(calls.read_text().split()) == ["0", "2", "4"]
    assert not list((run / "evals").glob("*.pending"))
    r = cli("eval", run.name, "--step", "4", "--on", "box")  # asked again on purpose: evaluated again
    assert r.code == 0 and "in flight" not in r.err and sorted(calls.read_text().split()) == ["0", "2", "4", "4"]

    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        cli("hosts", "add", "tiny", ALIAS, "--workdir", str(small / "w"), "--python", sys.executable,
            "--env", f"PYTHONPATH={ROOT}")
        big = fake_run(remote["runs"], recipe, name="big-20261125-000000")
        (big / "checkpoints" / "checkpoint-4" / "weights.bin").write_bytes(os.urandom(3 << 20))
        r = cli("eval", big.name, "--on", "tiny")
        assert r.code == 2, r.out + r.err
        assert "disk is full" in r.err and "free space on tiny" in r.err
        assert not (big / "metrics.jsonl").exists()
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


@pytest.mark.slow
def test_quickstart_checkpoints_evaluated_on_a_host(remote, cli, monkeypatch):
    """The CPU quickstart trained here; its checkpoints evaluated on the host with rlctl's own evaluator (greedy,
    deterministic): the same numbers as `rlctl eval` here, at the right steps of the local stream."""
    pytest.importorskip("trl")
    monkeypatch.setenv("RLCTL_MODEL_CACHE", str(remote["tmp"] / "local-models"))  # the host has its own cache
    monkeypatch.chdir(remote["tmp"])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "rlctl.cli", "launch", QUICK, *SMALL, "--set", "train.steps=4",
                        "--set", "checkpoint.every=2"], capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    (run,) = list(remote["runs"].iterdir())
    sets = remote["tmp"] / "sets.toml"
    sets.write_text(f'extends = "{QUICK}"\n[eval.sets.tiny]\ndata = "{RECIPES / "quickstart" / "prompts.jsonl"}"\n'
                    'grader = "reward"\nthreshold = 0.2\nlimit = 3\nmax_tokens = 8\n')
    r = cli("eval", run.name, "--all", "--on", "box", "--recipe", str(sets), "--json")
    assert r.code == 0, r.out + r.err
    there = {x["step"]: x["metrics"] for x in json.loads(r.out)["results"]}
    key = "eval/tiny/greedy_pass@1"
    assert sorted(there) == [0, 2, 4] and all(key in m for m in there.values())
    assert all(m[f"{key}/response_tokens"] > 0 for m in there.values())  # it generated, on the host
    ev = stream(run)
    assert {s: ev[s][key] for s in (0, 2, 4)} == {s: there[s][key] for s in (0, 2, 4)}
    st = cli("status", run.name)
    assert key in st.out and "baseline" in st.out, st.out
    csv = cli("metrics", run.name, "--csv", "--keys", key).out
    assert all(f"{s},{run.name},{key}," in csv for s in (0, 2, 4)), csv
    here = cli("eval", run.name, "--all", "--recipe", str(sets), "--json")
    assert here.code == 0, here.err
    assert {x["step"]: x["metrics"] for x in json.loads(here.out)["results"]} == there  # identical, every key


def test_ckpt_push_of_a_local_run(remote, cli):
    """ckpt push (its transfer is the one eval --on uses): the whole checkpoint, verified there; again: nothing
    travels, the record stays."""
    run = fake_run(remote["runs"], eval_recipe(remote["tmp"]))
    r = cli("ckpt", "push", run.name, "--to", "box")
    assert r.code == 0 and "step 4" in r.out and "verified" in r.out, r.out + r.err
    there = remote["work"] / "runs" / run.name
    assert read_state(there)["status"] == "finished" and (there / "checkpoints" / "checkpoint-4" / "weights.bin")\
        .read_bytes() == (run / "checkpoints" / "checkpoint-4" / "weights.bin").read_bytes()
    (there / "checkpoints" / "checkpoint-4" / "weights.bin").write_bytes(b"damaged")
    r = cli("ckpt", "push", run.name, "--to", "box")  # a damaged copy there is sent again
    assert r.code == 0, r.out + r.err
    assert (there / "checkpoints" / "checkpoint-4" / "weights.bin").stat().st_size == 4096


def test_launch_on_host_sends_the_eval_sets_data(remote, cli, tmp_path):
    """A run launched --on a host evaluates its checkpoints there (and `eval --on` in place): each eval set's data
    travels with the recipe, and the host's recipe points at its staged copy."""
    sets = tmp_path / "elsewhere"
    sets.mkdir()
    (sets / "held_out.jsonl").write_text(json.dumps({"prompt": "held-out-probe", "label": "a"}) + "\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'extends = "{QUICK}"\n[eval.sets.probe]\ndata = "{sets / "held_out.jsonl"}"\n')
    r = cli("launch", str(recipe), "--on", "box", "--detach", "--set", "rollout.max_tokens=500")
    assert r.code == 1 and "box: preflight failed" in r.err, r.out + r.err  # it got as far as the host's preflight
    staged = list((remote["work"] / ".rlctl" / "stage").rglob("held_out.jsonl"))
    assert staged and staged[0].read_text().startswith('{"prompt": "held-out-probe"')


@pytest.mark.slow
def test_quickstart_on_the_host_evaluated_in_place(remote, cli, monkeypatch):
    """A run launched --on the host, evaluated there by `rlctl eval RUN --on HOST` (nothing pushed): the results
    in its stream on the host, seen here through the mirror by status and metrics."""
    pytest.importorskip("trl")
    monkeypatch.chdir(remote["tmp"])
    r = cli("launch", QUICK, "--on", "box", "--detach", *SMALL, "--set", "train.steps=2", "--set",
            "checkpoint.every=2")
    assert r.code == 0, r.out + r.err
    name = r.out.strip().splitlines()[-1]
    remote_dir = Path(read_state(remote["runs"] / name)["remote_run_dir"])
    assert wait_for(lambda: read_state(remote_dir).get("status") in ("finished", "failed"), timeout=400)
    sets = remote["tmp"] / "sets.toml"
    sets.write_text(f'extends = "{QUICK}"\n[eval.sets.tiny]\ndata = "{RECIPES / "quickstart" / "prompts.jsonl"}"\n'
                    'grader = "reward"\nthreshold = 0.2\nlimit = 2\nmax_tokens = 8\n')
    r = cli("eval", name, "--all", "--on", "box", "--recipe", str(sets), "--json")
    assert r.code == 0, r.out + r.err
    assert "copied to" not in r.err  # the checkpoints are there already
    key = "eval/tiny/greedy_pass@1"
    assert sorted(x["step"] for x in json.loads(r.out)["results"]) == [0, 2]
    assert sorted(s for s, m in stream(remote_dir).items() if key in m) == [0, 2]  # the host's own stream
    assert sorted(s for s, m in stream(remote["runs"] / name).items() if key in m) == [0, 2]  # the mirror
    assert key in cli("status", name).out
    assert json.loads((remote_dir / "evals" / "evals.json").read_text())["by_hand"][-1]["step"] == 2
