"""Runs on an SSH host across features, beside issue 30's (its helpers' follow-ups), typed as a user types them: from
a working directory with every default (relative ./runs, no RLCTL_* variables; only HOME isolated, its
~/.ssh/config naming the hosts), against the loopback OpenSSH server (tests/remote_sshd.py; the hosts of
tests/test_remote_seams.py's `world`). The trainer is a custom one (the command backend, seed 003's checkpoint layout,
standard library only: tests/fixtures/command/counter_trainer.py). Each test failed before its fix.

- `launch --on` sends the scripts eval.command names: in-loop evals on the host run the copy sent, not the laptop's
  path (the laptop's script is gone by the time they run).
- by-hand eval failures recorded on the host (in place, and from another host) show in `status RUN` here.
- `ckpt prune` of a host's run prunes there; `ckpt pull` brings what resuming needs (the layout descriptor), so
  `launch --resume` here continues from the pulled step.
- a recipe in a git checkout whose HEAD is on no remote branch: only HEAD's files travel (not the history), and a
  host whose disk cannot hold them says "disk full on HOST"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.core.state import read_state
from tests.remote_sshd import sshd  # noqa: F401 - the session fixture
from tests.test_remote_seams import cli, stream, tiny, wait_for, world  # noqa: F401 - fixtures
from tests.test_seams_followups import PROBE, counter_project

KEY = "eval/probe/greedy_pass@1"
FAIL = 'import sys\nsys.exit("probe crashed: no GPU for the judge model")\n'


@pytest.fixture(scope="module")
def on_box1(world):  # noqa: F811
    """`rlctl launch exp/c.toml --on box1 --detach`: 6 steps, a checkpoint every 2, evaluated by exp/probe.py (named
    relative to the recipe in eval.command). Held after step 1 until the laptop's probe.py is gone (the user edits
    on), then let go; waits until it finished there."""
    exp = world.laptop / "exp"
    exp.mkdir()
    gate = world.tmp / "gate"
    gate.mkdir()
    counter_project(exp, extra=f'''[env]
TRAINER_GATE = "{gate}"
TRAINER_GATE_STEP = "1"
[eval]
evaluator = "command"
command = "{sys.executable} probe.py {{step}} {{output}}"
primary = "probe"
baseline = false
[eval.sets.probe]
data = "prompts.jsonl"
''')
    (exp / "probe.py").write_text(PROBE)
    r = cli("launch", "exp/c.toml", "--on", "box1", "--detach")
    assert r.code == 0, r.out + r.err
    name = r.out.strip().splitlines()[-1]
    there = Path(read_state(world.laptop / "runs" / name)["remote_run_dir"])
    (exp / "probe.py").unlink()
    (gate / "go").write_text("")
    assert wait_for(lambda: read_state(there).get("status") in ("finished", "failed"), timeout=300)
    assert read_state(there)["status"] == "finished", (there / "stdout.log").read_text()[-2000:]
    return name, there


def test_launch_on_a_host_sends_the_eval_command_scripts(world, on_box1):  # noqa: F811
    name, there = on_box1
    d = json.loads(cli("status", name, "--json").out)
    assert d["status"] == "finished" and not d["eval_failures"], d["eval_failures"]
    assert {rec["step"]: rec[KEY] for rec in stream(there) if KEY in rec} == {2: 0.2, 4: 0.4, 6: 0.6}
    assert str(world.laptop) not in json.dumps(read_state(there).get("eval_failures") or [])


def test_by_hand_eval_failures_on_a_host_show_in_status(world, on_box1):  # noqa: F811
    """`rlctl eval RUN --on box1` (in place) and `--on spare` (the checkpoint goes there) with an evaluator that
    crashes: both failures are recorded in the run's ledger on box1, and `status RUN` here says them."""
    name, _ = on_box1
    (world.laptop / "exp" / "fail.py").write_text(FAIL)
    (world.laptop / "exp" / "bad.toml").write_text(f'''extends = "c.toml"
[eval]
command = "{sys.executable} fail.py {{step}} {{output}}"
''')
    r = cli("eval", name, "--on", "box1", "--step", "4", "--recipe", "exp/bad.toml")
    assert r.code == 1 and "probe crashed" in r.out, r.out + r.err
    r = cli("eval", name, "--on", "spare", "--step", "2", "--recipe", "exp/bad.toml")
    assert r.code == 1 and "probe crashed" in r.out, r.out + r.err
    d = json.loads(cli("status", name, "--json").out)
    failed = {(f["step"], f.get("host")) for f in d["eval_failures"] if f.get("by_hand")}
    assert failed == {(4, "box1"), (2, "spare")}, d["eval_failures"]
    text = cli("status", name).out
    assert "eval by hand on box1 failed at step 4" in text and "eval by hand on spare failed at step 2" in text, text
    assert "(log box1:" in text  # where that job's log is: on box1, where it ran


def test_ckpt_prune_of_a_host_run_prunes_there(world, on_box1):  # noqa: F811
    name, there = on_box1
    r = cli("ckpt", "prune", name, "--keep-last", "1", "--dry-run")
    assert r.code == 0 and "would delete 2 checkpoint(s)" in r.out, r.out + r.err
    assert "step 2" in r.out and "step 4" in r.out and "box1" in r.out, r.out
    assert sorted(p.name for p in (there / "training_state").iterdir() if p.name.startswith("step_")) == \
        ["step_2", "step_4", "step_6"]


def test_ckpt_pull_then_resume_here(world, on_box1):  # noqa: F811
    """`rlctl ckpt pull RUN` of a custom trainer's run brings the checkpoint and the layout descriptor it is read by;
    `rlctl launch exp/c.toml --resume RUN` here then starts from step 6 (it said "no complete checkpoint")."""
    name, _ = on_box1
    r = cli("ckpt", "pull", name)
    assert r.code == 0 and "pulled step 6" in r.out, r.out + r.err
    local = world.laptop / "runs" / name / "training_state"
    assert (local / "step_6" / "training_info.json").is_file() and (local / ".rlctl-checkpoints.json").is_file()
    r = cli("launch", "exp/c.toml", "--resume", name, "--set", "train.steps=8", "--name", "more")
    assert r.code == 0, r.out + r.err
    more = next((world.laptop / "runs").glob("more-*"))
    log = (more / "stdout.log").read_text()
    assert "step 7 |" in log and "step 1 |" not in log, log[-1000:]


def test_ckpt_push_of_a_host_run_and_resume_on_the_other_host(world, on_box1):  # noqa: F811
    """`rlctl ckpt push RUN --to spare` of a run on box1 (host to host, the layout descriptor with it), then `rlctl
    launch exp/c.toml --on spare --resume RUN` continues there from step 6; a push to the run's own host says it is
    there already."""
    name, there = on_box1
    r = cli("ckpt", "push", name, "--to", "box1")
    assert r.code == 0 and f"step 6 of {name} is on box1 already" in r.out, r.out + r.err
    r = cli("ckpt", "push", name, "--to", "spare")
    assert r.code == 0 and "step 6" in r.out and "verified" in r.out, r.out + r.err
    assert (world.work["spare"] / "runs" / name / "checkpoints" / ".rlctl-checkpoints.json").is_file()
    r = cli("launch", "exp/c.toml", "--on", "spare", "--resume", name, "--set", "train.steps=8", "--name", "onspare",
            "--detach")
    assert r.code == 0, r.out + r.err
    on_spare = Path(read_state(world.laptop / "runs" / r.out.strip().splitlines()[-1])["remote_run_dir"])
    assert wait_for(lambda: read_state(on_spare).get("status") in ("finished", "failed"), timeout=300)
    log = (on_spare / "stdout.log").read_text()
    assert read_state(on_spare)["status"] == "finished" and "step 7 |" in log and "step 1 |" not in log, log[-1500:]


# ---- a recipe in a git checkout whose HEAD is on no remote: HEAD's files travel, not the history ------------------

def _git(repo: Path, *args: str) -> str:
    p = subprocess.run(["git", "-C", str(repo), "-c", "user.name=u", "-c", "user.email=u@example.com", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_launch_on_a_small_host_from_an_unpushed_checkout(world, tiny):  # noqa: F811
    """The team's checkout holds 3 MB of data in its history (added, then removed) and its HEAD is on no remote
    branch: `launch --on tiny` (a 4 MB disk) sends HEAD's files alone and the run starts (it sent the whole
    repository and git's clone there failed: "unable to write file"). A HEAD whose files do not fit there either:
    "disk full on tiny while ...", exit 1."""
    proj = world.laptop / "proj"
    proj.mkdir()
    _git(proj, "init", "-q")
    counter_project(proj)
    (proj / "old-data.bin").write_bytes(os.urandom(3_000_000))
    _git(proj, "add", ".")
    _git(proj, "commit", "-qm", "a recipe and data")
    _git(proj, "rm", "-q", "old-data.bin")
    _git(proj, "commit", "-qm", "the data moved to the bucket")
    head = _git(proj, "rev-parse", "HEAD")
    r = cli("launch", "proj/c.toml", "--on", "tiny", "--detach")
    assert r.code == 0, r.out + r.err
    there = Path(read_state(world.laptop / "runs" / r.out.strip().splitlines()[-1])["remote_run_dir"])
    assert read_state(world.laptop / "runs" / there.name)["git_sha"] == head
    repos = tiny / "rlctl" / ".rlctl" / "repos" / head
    assert (repos / "c.toml").is_file() and not (repos / "old-data.bin").exists()
    assert wait_for(lambda: read_state(there).get("status") in ("finished", "failed"), timeout=300)
    assert _git(proj, "status", "--porcelain") == "" and _git(proj, "rev-parse", "HEAD") == head  # untouched
    # HEAD itself too large for what is left there: the bundle fits once, its clone does not
    free = os.statvfs(tiny).f_bavail * os.statvfs(tiny).f_frsize
    (proj / "weights.bin").write_bytes(os.urandom(int(free * 0.6)))
    _git(proj, "add", ".")
    _git(proj, "commit", "-qm", "weights")
    r = cli("launch", "proj/c.toml", "--on", "tiny", "--detach")
    assert r.code == 1 and "Traceback" not in r.err, r.out + r.err
    assert "disk full on tiny while" in r.err and "unable to write" not in r.err.split("disk full")[0], r.err
    assert "free space" in r.err and "rlctl hosts check tiny" in r.err, r.err
    assert not (tiny / "rlctl" / ".rlctl" / "repos" / _git(proj, "rev-parse", "HEAD")).exists()  # space given back
