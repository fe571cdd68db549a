"""Remote runs across features, typed as a user types them (issue 30, defects 2.5-2.7): from a working directory
with every default (relative ./runs, no RLCTL_* variables; only HOME isolated, its ~/.ssh/config naming the hosts),
against the one loopback OpenSSH server (tests/remote_sshd.py), each host a workdir and an alias.

- box1 trains; spare evaluates (seed 001 §13): the checkpoint goes straight from box1 to spare (box1's own ssh
  reaches spare by its alias), else (spare2: box1 knows no such host) through the laptop; verified either way; the
  results in the run's stream on box1.
- a custom trainer's run on box1 (seed 003) attached with its recipe: its metrics map, its stream followed by
  `status RUN`, its checkpoints listed.
- a run whose host disk filled while saving a checkpoint (a 2 MB tmpfs as that host's workdir)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlctl.core.state import read_state
from rlctl.runs.status import state_cell
from tests.conftest import RECIPES, run_cli
from tests.remote_sshd import Sshd, ssh_home, sshd  # noqa: F401 - the session fixture

QUICK = RECIPES / "quickstart.toml"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class World:
    tmp: Path
    laptop: Path  # the working directory every command is typed in
    homes: dict[str, Path]
    work: dict[str, Path]  # each host's workdir
    sshd: Sshd


def host_args(world_tmp: Path, name: str, bin_dir: Path, workdir: Path | None = None) -> list[str]:
    """`rlctl hosts add` arguments for one host: its workdir, its python (this one: it has rlctl), and the
    environment of that machine (its own HOME, whose ~/.ssh/config is that machine's; its ssh on PATH)."""
    home = world_tmp / f"{name}-home"
    return [name, name, "--workdir", str(workdir or world_tmp / f"{name}-work"), "--python", sys.executable,
            "--env", f"HOME={home}", "--env", f"PATH={bin_dir}:{Path(sys.executable).parent}:{SYSTEM_PATH}"]


@pytest.fixture(scope="module")
def world(sshd, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("seams")
    mp = pytest.MonkeyPatch()
    homes = {n: tmp / f"{n}-home" for n in ("laptop", "box1", "spare", "spare2", "tiny")}
    laptop_bin = ssh_home(sshd, homes["laptop"], ["box1", "spare", "spare2", "tiny"])
    bins = {"box1": ssh_home(sshd, homes["box1"], ["spare"])}  # box1 reaches spare by its alias, not spare2
    for n in ("spare", "spare2", "tiny"):
        bins[n] = ssh_home(sshd, homes[n], [])
    for k in list(os.environ):
        if k.startswith("RLCTL_") or k == "XDG_CONFIG_HOME":
            mp.delenv(k)
    mp.setenv("HOME", str(homes["laptop"]))
    mp.setenv("PATH", f"{laptop_bin}:{os.environ['PATH']}")
    laptop = tmp / "laptop"
    laptop.mkdir()
    mp.chdir(laptop)
    for n in ("box1", "spare", "spare2"):
        r = run_cli("hosts", "add", *host_args(tmp, n, bins[n]))
        assert r.code == 0, r.err
    w = World(tmp, laptop, homes, {n: tmp / f"{n}-work" for n in ("box1", "spare", "spare2", "tiny")}, sshd)
    w.bins = bins  # type: ignore[attr-defined]
    try:
        yield w
    finally:
        for wd in w.work.values():  # nothing left running on any host
            for run in (wd / "runs").glob("*") if (wd / "runs").is_dir() else []:
                st = read_state(run)
                for key in ("pgid", "supervisor_pid"):
                    if st.get(key):
                        with contextlib.suppress(OSError):
                            os.killpg(st[key], signal.SIGKILL) if key == "pgid" else os.kill(st[key], signal.SIGKILL)
        with contextlib.suppress(Exception):  # the shared connection (every alias is one server: one master)
            subprocess.run([str(laptop_bin / "ssh"), "-o", f"ControlPath=/tmp/rlctl-ssh-{os.getuid()}/%C",
                            "-O", "exit", "box1"], capture_output=True, timeout=10)
        mp.undo()


cli = run_cli


def wait_for(pred, timeout: float = 300.0, interval: float = 0.3) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False


def stream(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


# ---- 2.5: seed 001 §13, trained on box1, evaluated on the spare ---------------------------------------------------
SMALL = ("--set", "rollout.prompts_per_step=2", "--set", "train.train_batch_size=16", "--set",
         "train.micro_batch_size=16")


# seed 001's eval script in miniature: the primary metric is read from the weights the job loads (a digest of
# model.safetensors) and the prompts it was given, so equal numbers on two hosts mean the same checkpoint and data
EVAL_PROG = ("import hashlib, json, sys, pathlib; m = pathlib.Path(sys.argv[1]) / 'model.safetensors'; "
             "h = hashlib.sha256(m.read_bytes()).hexdigest() if m.is_file() else '0'; "
             "json.dump(dict(primary=int(h[:6], 16) / 16 ** 6, prompts=len(open(sys.argv[2]).read().splitlines())), "
             "open(sys.argv[3], 'w'))")


@pytest.fixture(scope="module")
def trained_on_box1(world):
    """`rlctl launch r.toml --on box1` of a 2-step quickstart with a held-out set and the team's eval command, as
    seed 001's primary trains; waits until it finished there (its own eval of checkpoint 2 included)."""
    (world.laptop / "probe.jsonl").write_text("".join(json.dumps({"prompt": p, "label": "a"}) + "\n"
                                                      for p in ("aaa", "bab")))
    (world.laptop / "r.toml").write_text(f"""extends = "{QUICK}"
[train]
steps = 2
[checkpoint]
every = 2
[eval]
baseline = false
evaluator = "command"
command = '''python3 -c "{EVAL_PROG}" {{checkpoint}} {{data}} {{output}}'''
[eval.sets.probe]
data = "probe.jsonl"
""")
    r = cli("launch", "r.toml", "--on", "box1", "--detach", *SMALL)
    assert r.code == 0, r.out + r.err
    name = r.out.strip().splitlines()[-1]
    there = Path(read_state(world.laptop / "runs" / name)["remote_run_dir"])
    assert there.parent == world.work["box1"] / "runs"
    assert wait_for(lambda: read_state(there).get("status") in ("finished", "failed"), timeout=600)
    assert read_state(there)["status"] == "finished", (there / "stdout.log").read_text()[-2000:]
    return name, there


def test_eval_on_the_spare_of_a_run_trained_on_box1(world, trained_on_box1):
    """`rlctl eval RUN --on spare`: the checkpoint goes from box1 straight to spare (box1's ssh reaches spare by its
    alias), verified there; the job runs on spare; its result lands in the run's stream (on box1, and here through
    the mirror) and ledger, said to come from spare."""
    name, there = trained_on_box1
    key = "eval/probe/greedy_pass@1"
    in_loop = [rec for rec in stream(there) if key in rec]
    assert [rec["step"] for rec in in_loop] == [2]  # the supervisor's own eval of checkpoint 2, on box1
    r = cli("eval", name, "--on", "spare", "--json")
    assert r.code == 0, r.out + r.err
    assert "copied from box1 to spare directly" in r.err and "verified" in r.err, r.err
    assert "fix: eval --on box1" not in r.err
    (row,) = json.loads(r.out)["results"]
    assert row["step"] == 2 and row["host"] == "spare" and row["error"] is None
    assert row["metrics"][key] == in_loop[0][key] > 0  # the same weights as box1's own eval of step 2
    assert row["metrics"][f"{key}/prompts"] == 2  # the set's data, from box1
    on_spare = world.work["spare"] / "runs" / name
    assert (on_spare / "evals" / "step-2.out.json").is_file()  # it ran there
    for f in (there / "checkpoints" / "checkpoint-2").iterdir():
        if f.name.endswith((".safetensors", ".json")):
            assert (on_spare / "checkpoints" / "checkpoint-2" / f.name).read_bytes() == f.read_bytes()
    assert [rec["step"] for rec in stream(there) if key in rec] == [2, 2]  # the run's stream, where it lives
    ledger = json.loads((there / "evals" / "evals.json").read_text())
    assert [(e["step"], e["outcome"], e.get("host")) for e in ledger["by_hand"]] == [(2, "ok", "spare")]
    assert [rec["step"] for rec in stream(world.laptop / "runs" / name) if key in rec] == [2, 2]  # the mirror
    st = cli("status", name)
    assert st.code == 0 and key in st.out, st.out + st.err
    # again: nothing travels twice
    r = cli("eval", name, "--on", "spare")
    assert r.code == 0 and "already on spare" in r.err, r.out + r.err


def test_eval_on_a_host_the_training_box_cannot_reach_goes_through_the_laptop(world, trained_on_box1):
    """box1 has no way to spare2 (no such name in its ssh config): the copy goes through this machine, said so,
    verified the same way; the result in the run's stream all the same."""
    name, there = trained_on_box1
    r = cli("eval", name, "--on", "spare2")
    assert r.code == 0, r.out + r.err
    assert "box1 cannot reach spare2 directly" in r.err and "through this machine" in r.err, r.err
    assert "verified" in r.err
    on_spare2 = world.work["spare2"] / "runs" / name
    assert (on_spare2 / "evals" / "step-2.out.json").is_file()
    ledger = json.loads((there / "evals" / "evals.json").read_text())
    assert ("spare2", "ok") in [(e.get("host"), e["outcome"]) for e in ledger["by_hand"]]


def test_ckpt_push_of_a_run_on_box1_goes_host_to_host(world, trained_on_box1):
    """`rlctl ckpt push RUN --to spare` (what `launch --on spare --resume box1:RUN` does first): the checkpoint from
    box1 straight to spare, only what spare lacks or holds damaged (the evaluation copied it there before), verified."""
    name, there = trained_on_box1
    on_spare = world.work["spare"] / "runs" / name
    (on_spare / "checkpoints" / "checkpoint-2" / "optimizer.pt").unlink()
    (on_spare / "checkpoints" / "checkpoint-2" / "model.safetensors").write_bytes(b"damaged")
    r = cli("ckpt", "push", name, "--to", "spare")
    assert r.code == 0, r.out + r.err
    assert "step 2" in r.out and "copied from box1 directly, verified" in r.out, r.out
    for f in (there / "checkpoints" / "checkpoint-2").iterdir():
        assert (on_spare / "checkpoints" / "checkpoint-2" / f.name).read_bytes() == f.read_bytes()
    assert read_state(on_spare)["pushed_from"] == f"box1:{name}"


# ---- 2.6: a run rlctl did not start, on box1, attached with its recipe (seed 003's own trainer) -------------------
DR_GRPO = """name = "rl-practice-dr-grpo"
[backend]
name = "command"
[backend.command]
command = ["torchrun", "--nproc_per_node=2", "rl_training/runners/rl_runner.py", "--save-dir", "{checkpoint_dir}"]
metrics_file = "training_runs/run_*/logs/train_log.jsonl"
step_key = "iteration"
metrics_map = { avg_reward = "reward/mean", loss = "policy_loss", kl = "kl" }
checkpoint_pattern = "step_{step}"
checkpoint_marker = "training_info.json"
[model]
path = "Qwen/Qwen2.5-1.5B"
[data]
train = "gsm8k"
[checkpoint]
dir = "training_state"
every = 2
"""


def _train_log(steps: range) -> str:
    return "".join(json.dumps({"iteration": s, "avg_reward": 0.1 * s, "loss": 1.0 / s, "kl": 0.01}) + "\n"
                   for s in steps)


def test_attach_on_box1_with_the_recipe_follows_the_stream_and_finds_checkpoints(world):
    """`rlctl attach box1:~/RL_Practice --recipe dr-grpo.toml`: the recipe's metrics map and step key read the
    trainer's JSONL as a local attach does; `status RUN` shows the lines the trainer writes later on box1; `ckpt
    list RUN` lists its step_N checkpoints, complete or not."""
    practice = world.tmp / "box1-RL_Practice"  # the team's checkout on box1, where its trainer writes
    log = practice / "training_runs" / "run_1" / "logs" / "train_log.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_train_log(range(1, 5)))
    for s in (2, 4):
        (practice / "training_state" / f"step_{s}").mkdir(parents=True)
        (practice / "training_state" / f"step_{s}" / "adapter_model.safetensors").write_bytes(b"w" * 64)
    (practice / "training_state" / "step_2" / "training_info.json").write_text("{}")  # step 4: still being saved
    (world.laptop / "dr-grpo.toml").write_text(DR_GRPO)
    r = cli("attach", f"box1:{practice}", "--recipe", "dr-grpo.toml", "--name", "drgrpo")
    assert r.code == 0, r.out + r.err
    name = next(p.name for p in (world.laptop / "runs").iterdir() if p.name.startswith("drgrpo"))
    d = json.loads(cli("status", name, "--json").out)
    assert d["step"] == 4 and d["metrics"]["reward/mean"]["latest"] == pytest.approx(0.4), d
    assert d["metrics"]["policy_loss"]["latest"] == pytest.approx(0.25)
    recs = stream(world.laptop / "runs" / name)
    assert recs and not any(k.startswith("command/") for rec in recs for k in rec), recs[-1]  # every key mapped
    with log.open("a") as fh:  # the trainer goes on, on box1
        fh.write(_train_log(range(5, 7)))
    d = json.loads(cli("status", name, "--json").out)
    assert d["step"] == 6 and d["metrics"]["reward/mean"]["latest"] == pytest.approx(0.6), d
    r = cli("ckpt", "list", name, "--json")
    assert r.code == 0, r.out + r.err
    rows = {c["step"]: c["complete"] for c in json.loads(r.out)["checkpoints"]}
    assert rows == {2: True, 4: False}, r.out


# ---- 2.7: the host's disk fills while the trainer saves a checkpoint ----------------------------------------------
@pytest.fixture
def tiny(world):
    """Host `tiny`: its workdir on a 4 MB tmpfs of its own (root only)."""
    mnt = world.tmp / "tiny-disk"
    mnt.mkdir(exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        r = cli("hosts", "add", *host_args(world.tmp, "tiny", world.bins["tiny"], workdir=mnt / "rlctl"))
        assert r.code == 0, r.err
        yield mnt
    finally:
        for run in (mnt / "rlctl" / "runs").glob("*") if (mnt / "rlctl" / "runs").is_dir() else []:
            st = read_state(run)
            for key in ("pgid", "supervisor_pid"):
                if st.get(key):
                    with contextlib.suppress(OSError):
                        os.killpg(st[key], signal.SIGKILL) if key == "pgid" else os.kill(st[key], signal.SIGKILL)
        cli("hosts", "remove", "tiny")
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_run_whose_host_disk_filled_says_so(world, tiny):
    """Trained on `tiny`; once checkpoint-2 is saved, other data fills its disk (200 kB left). The supervisor there
    sees that checkpoint-4 would not fit and stops the run after checkpoint-2 (issue 32.4) — or, when the trainer
    reaches that save before its next look (every 2 s), the trainer dies saving checkpoint-4 (safetensors: "No space
    left on device") and the half-written checkpoint is removed. status, status RUN and --json say which, naming
    tiny ("stopped: out of disk on tiny: ..." / "failed: disk full on tiny while saving checkpoint-4": found on tiny,
    from what the disk left there), and still do after `rlctl hosts remove tiny`."""
    (world.laptop / "q.toml").write_text(f'extends = "{QUICK}"\n[train]\nsteps = 6\n[checkpoint]\nevery = 2\n')
    r = cli("launch", "q.toml", "--on", "tiny", "--detach", *SMALL)
    assert r.code == 0, r.out + r.err
    name = r.out.strip().splitlines()[-1]
    there = Path(read_state(world.laptop / "runs" / name)["remote_run_dir"])
    assert wait_for(lambda: (there / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file(), timeout=300)
    free = os.statvfs(tiny).f_bavail * os.statvfs(tiny).f_frsize
    with open(tiny / "other-data.bin", "wb") as fh:  # someone else's files fill the disk (to 200 kB free at most)
        if free > 200_000:  # a save already under way may have left less (CI: EINVAL for a negative length)
            os.posix_fallocate(fh.fileno(), 0, free - 200_000)

    def settled() -> bool:
        return json.loads(cli("status", name, "--json").out)["status"] not in ("running", "stopping")

    assert wait_for(settled, timeout=300, interval=2)
    # a save under way when the disk filled may still have completed (and the rotation freed an older one's room):
    # the truth is the newest complete checkpoint on tiny now; the one after it is what could not fit
    saved = (there / "checkpoints").glob("checkpoint-*/trainer_state.json")
    done = max(int(c.parent.name.split("-")[1]) for c in saved)
    d = json.loads(cli("status", name, "--json").out)
    if d["status"] == "stopped":
        want = "stopped: out of disk on tiny: the next checkpoint"
        assert f"stopped after checkpoint step {done}" in d["reason"], d
    else:
        want = f"failed: disk full on tiny while saving checkpoint-{done + 2}"
    assert d["reason"].startswith(want.split(": ", 1)[1]), d
    assert not (there / "checkpoints" / f"checkpoint-{done + 2}").exists()  # no half-written checkpoint is the newest
    assert want in cli("status", name).out
    assert want in cli("status").out
    assert cli("hosts", "remove", "tiny").code == 0
    assert want in cli("status", name).out and want in cli("status").out
    d = json.loads(cli("status", name, "--json").out)
    assert d["status"] == want.split(":")[0] and d["reason"].startswith(want.split(": ", 1)[1]), d


def test_a_run_lost_on_a_full_disk_here_is_failed_with_the_cause(tmp_path, monkeypatch):
    """The same evidence on this machine, for the worst case: the disk stayed full, so neither the trainer's exit
    record nor the supervisor's outcome could be written, and the supervisor is gone (killed): the run is not `lost`
    but "failed: disk full on <this machine> while saving checkpoint-4" (status, status RUN, --json)."""
    import socket

    from rlctl.core.state import write_state

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        for k in list(os.environ):
            if k.startswith("RLCTL_"):
                monkeypatch.delenv(k)
        monkeypatch.chdir(disk)
        run = disk / "runs" / "q-20261127-000000"  # what the supervisor left: running, its processes gone
        (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
        (run / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
        (run / "checkpoints" / "checkpoint-4").mkdir()
        (run / "checkpoints" / "checkpoint-4" / "config.json").write_text("{}")
        (run / "recipe.toml").write_text('[backend]\nname = "trl"\n[checkpoint]\ndir = "checkpoints"\n')
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        write_state(run, name=run.name, status="running", backend="trl", executor="local", started_at=time.time(),
                    handle={"executor": "local", "ref": {"pid": dead.pid, "pgid": dead.pid}, "attempt": 1},
                    supervisor_pid=dead.pid)
        with open(disk / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):  # the disk stays full
            while True:
                fh.write(b"\0" * 4096)
        want = f"failed: disk full on {socket.gethostname()} while saving checkpoint-4"
        d = json.loads(cli("status", run.name, "--json").out)
        assert d["status"] == "failed" and f"failed: {d['reason']}" == want and d["disk_full"], d
        assert want in cli("status", run.name).out
        assert state_cell(d) in cli("status").out  # as long as the host's name (status RUN: whole)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
