"""Defects found where features meet (issue 30, 2.1-2.4, 2.12, 2.14), each played as a user types it: the README's
commands from a working directory with every default — a relative `./runs`, no RLCTL_* variables, only HOME
isolated (and for SSH the host's alias in that HOME's ~/.ssh/config). One trained run is shared by the module."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.core.state import read_state
from tests.conftest import RECIPES
from tests.remote_sshd import sshd  # noqa: F401 - the session fixture

pytestmark = pytest.mark.slow
pytest.importorskip("trl")

# the command evaluator's script: a number per step, so the best checkpoint is known (step 2, not the newest)
PROBE = '''import json, sys
step, out = int(sys.argv[1]), sys.argv[2]
json.dump({"primary": {0: 0.2, 2: 0.9, 4: 0.5, 6: 0.4}.get(step, 0.1)}, open(out, "w"))
'''
VALUES = {0: 0.2, 2: 0.9, 4: 0.5, 6: 0.4}
KEY = "eval/probe/greedy_pass@1"
SMALL = ["--set", "rollout.prompts_per_step=2", "--set", "train.train_batch_size=16", "--set",
         "train.micro_batch_size=16", "--set", "rollout.max_tokens=8"]


class User:
    """A shell in a working directory: `rlctl ...` with the environment a user has (HOME of its own)."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.home = cwd.parent / f"{cwd.name}-home"
        self.home.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_")}
        self.env["HOME"] = str(self.home)
        self.env.pop("XDG_CACHE_HOME", None)
        self.env.pop("XDG_CONFIG_HOME", None)
        self.env.pop("XDG_STATE_HOME", None)

    def __call__(self, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], cwd=cwd or self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def run_dir(self, name: str) -> Path:
        found = sorted((self.cwd / "runs").glob(f"{name}-*"))
        assert len(found) == 1, found
        return found[0]

    def cleanup(self) -> None:
        for run in (self.cwd / "runs").glob("*") if (self.cwd / "runs").is_dir() else []:
            st = read_state(run)
            for key in ("pgid", "supervisor_pid"):
                if st.get(key):
                    with contextlib.suppress(OSError):
                        os.killpg(st[key], signal.SIGKILL) if key == "pgid" else os.kill(st[key], signal.SIGKILL)


def new_user(tmp_path_factory) -> User:
    """A working directory holding a copy of the bundled quickstart (recipes/quickstart.toml + its data)."""
    u = User(tmp_path_factory.mktemp("user"))
    (u.cwd / "recipes").mkdir()
    shutil.copy(RECIPES / "quickstart.toml", u.cwd / "recipes" / "quickstart.toml")
    shutil.copytree(RECIPES / "quickstart", u.cwd / "recipes" / "quickstart")
    return u


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`rlctl launch r.toml --set data.eval=recipes/quickstart/prompts.jsonl` from the user's directory: 6 steps,
    a checkpoint every 2, a command evaluator whose best step is 2. The --set path is relative to where it is typed."""
    u = new_user(tmp_path_factory)
    (u.cwd / "probe.py").write_text(PROBE)
    (u.cwd / "r.toml").write_text(f'''extends = "recipes/quickstart.toml"
name = "seams"
[train]
steps = 6
[checkpoint]
every = 2
[eval]
evaluator = "command"
command = "{sys.executable} {u.cwd / 'probe.py'} {{step}} {{output}}"
primary = "probe"
[eval.sets.probe]
data = "recipes/quickstart/prompts.jsonl"
''')
    r = u("launch", "r.toml", *SMALL, "--set", "data.eval=recipes/quickstart/prompts.jsonl", timeout=900)
    yield u, r
    u.cleanup()


def run_of(trained) -> tuple[User, Path]:
    u, r = trained
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return u, u.run_dir("seams")


# ---- 2.2: every path of a recipe, resolved once --------------------------------------------------------------------

def test_a_set_path_is_relative_to_where_it_is_typed_and_reaches_the_trainer(trained):
    u, run = run_of(trained)
    cfg = json.loads((run / "trl_config.json").read_text())
    assert cfg["eval_data"] == str(u.cwd / "recipes" / "quickstart" / "prompts.jsonl")  # absolute, and it exists
    assert cfg["train_data"] == str(u.cwd / "recipes" / "quickstart" / "prompts.jsonl")  # the extended file's dir
    assert cfg["reward_file"] == str(u.cwd / "recipes" / "quickstart" / "reward.py")


def test_paths_resolved_once_for_preflight_render_and_show(tmp_path_factory):
    u = new_user(tmp_path_factory)
    (u.cwd / "exp").mkdir()
    (u.cwd / "exp" / "held.jsonl").write_text('{"prompt": "a", "label": "a"}\n')
    (u.cwd / "exp" / "r.toml").write_text('extends = "../recipes/quickstart.toml"\n[eval.sets.held]\n'
                                          'data = "held.jsonl"\n')
    data = u.cwd / "recipes" / "quickstart" / "prompts.jsonl"
    # typed from the working directory: relative to it, not to the recipe (exp/)
    r = u("preflight", "exp/r.toml", "--set", "data.eval=recipes/quickstart/prompts.jsonl", "--json")
    res = json.loads(r.stdout)["results"]
    assert [x["verdict"] for x in res if x["check"] == "reference.data"] == ["ok", "ok", "ok"], res
    shown = u("recipe", "show", "exp/r.toml", "--set", "data.eval=recipes/quickstart/prompts.jsonl", "--json")
    doc = json.loads(shown.stdout)
    assert doc["data"]["eval"] == str(data) and doc["data"]["train"] == str(data)
    assert doc["eval"]["sets"]["held"]["data"] == str(u.cwd / "exp" / "held.jsonl")  # the recipe file's own dir
    assert doc["reward"]["function"] == str(u.cwd / "recipes" / "quickstart" / "reward.py")
    out = u.cwd / "rendered"
    r = u("render", "exp/r.toml", "--set", "data.eval=recipes/quickstart/prompts.jsonl", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "trl_config.json").read_text())["eval_data"] == str(data)
    # the same words relative to the recipe are not found where the user typed them: said with the absolute path
    r = u("preflight", "exp/r.toml", "--set", "data.eval=held.jsonl")
    assert r.returncode == 1 and f"data.eval {u.cwd / 'held.jsonl'} does not exist" in r.stdout, r.stdout
    # a file the recipe names that is missing: the absolute path next to the file that named it
    (u.cwd / "exp" / "r.toml").write_text('extends = "../recipes/quickstart.toml"\n[data]\n'
                                          'eval = "missing.jsonl"\n[reward]\nfunction = "nope.py"\n')
    r = u("preflight", "exp/r.toml")
    assert f"{u.cwd / 'exp' / 'missing.jsonl'} does not exist" in r.stdout, r.stdout
    assert f"{u.cwd / 'exp' / 'nope.py'} does not exist" in r.stdout, r.stdout
    shown = json.loads(u("recipe", "show", "exp/r.toml", "--json").stdout)
    assert shown["data"]["eval"] == str(u.cwd / "exp" / "missing.jsonl")


# ---- 2.1: rlctl eval with the default relative runs directory ------------------------------------------------------

def test_eval_by_hand_with_the_default_runs_dir(trained):
    u, run = run_of(trained)
    r = u("eval", "seams", "--all", "--json", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rows = {x["step"]: x["metrics"] for x in json.loads(r.stdout)["results"]}
    assert {s: m[KEY] for s, m in rows.items()} == {s: VALUES[s] for s in rows} and {2, 4, 6} <= set(rows)
    # the run named by a relative path from another directory
    (u.cwd / "sub").mkdir(exist_ok=True)
    r = u("eval", f"../runs/{run.name}", "--step", "2", "--set", "probe", "--json", cwd=u.cwd / "sub")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert json.loads(r.stdout)["results"][0]["metrics"][KEY] == 0.9
    assert not (u.cwd / "sub" / "runs").exists()


def user_ssh(u: User, server) -> str:
    """The loopback sshd under an alias of the user's ~/.ssh/config. OpenSSH reads ~/.ssh from the passwd entry, not
    $HOME, so HOME/bin/ssh (first on PATH, as for rsync's `-e ssh`) is the real client given that config."""
    import pwd

    ssh = u.home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "config").write_text(f"""Host spare-box
  HostName 127.0.0.1
  Port {server.port}
  User {pwd.getpwuid(os.getuid()).pw_name}
  IdentityFile {server.root / 'home' / '.ssh' / 'id_ed25519'}
  IdentitiesOnly yes
  UserKnownHostsFile {server.known_hosts}
  StrictHostKeyChecking yes
  LogLevel ERROR
""")
    bin_dir = u.home / "bin"
    bin_dir.mkdir(exist_ok=True)
    real = shutil.which("ssh", path=os.defpath + ":/usr/bin:/bin")
    (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec {real} -F "$HOME/.ssh/config" "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    u.env["PATH"] = f"{bin_dir}:{u.env.get('PATH', os.defpath)}"
    return "spare-box"


def test_eval_on_a_host_with_the_default_runs_dir(trained, sshd, tmp_path):  # noqa: F811
    u, run = run_of(trained)
    alias = user_ssh(u, sshd)
    r = u("hosts", "add", "spare", alias, "--workdir", str(tmp_path / "spare"), "--python", sys.executable)
    assert r.returncode == 0, r.stderr
    try:
        r = u("eval", "seams", "--all", "--set", "probe", "--on", "spare", "--json", timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        rows = {x["step"]: x["metrics"] for x in json.loads(r.stdout)["results"]}
        assert {s: m[KEY] for s, m in rows.items()} == {s: VALUES[s] for s in rows} and {0, 6} <= set(rows)
        assert json.loads((run / "evals" / "step-6.out.json").read_text())["host"] == "spare"
    finally:
        subprocess.run(["ssh", "-O", "exit", alias], env=u.env, capture_output=True, timeout=20)
        u("hosts", "remove", "spare")


# ---- 2.3: prune keeps the best-eval checkpoint by default --------------------------------------------------------

def test_prune_keeps_the_best_by_default_and_says_so(trained):
    u, run = run_of(trained)
    assert read_state(run)["best_checkpoint"]["step"] == 2
    r = u("ckpt", "prune", "seams", "--keep-last", "1", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "keeping step 2: the best eval" in r.stdout and KEY in r.stdout, r.stdout
    assert "would delete 1 checkpoint(s)" in r.stdout and "step 4" in r.stdout and "step 2 " not in r.stdout
    r = u("ckpt", "prune", "seams", "--keep-last", "1", "--no-keep-best", "--dry-run")
    assert "would delete 2 checkpoint(s)" in r.stdout and "step 2" in r.stdout, r.stdout
    r = u("ckpt", "prune", "seams", "--keep-last", "1")
    assert r.returncode == 0, r.stderr
    left = [c["step"] for c in json.loads(u("ckpt", "list", "seams", "--json").stdout)["checkpoints"]]
    assert [s for s in left if s is not None] == [2, 6]


# ---- 2.14: the quickstart keeps its final model; doctor --weights with nothing to compare ------------------------

def wait_for(pred, timeout: float = 600.0) -> bool:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.5)
    return False


def test_the_quickstart_keeps_its_final_model(tmp_path_factory):
    """Also the sibling of 2.1: `rlctl resume RUN` after a killed rlctl, with the default ./runs (the supervisor it
    starts runs in the run directory, and was handed `runs/<run>`)."""
    from rlctl.runs.state import process_alive

    u = new_user(tmp_path_factory)
    try:
        r = u("launch", "recipes/quickstart.toml", *SMALL, "--set", "train.steps=4", "--detach", timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        run = u.run_dir("quickstart")
        first = read_state(run)["supervisor_pid"]
        os.kill(first, signal.SIGKILL)  # rlctl killed (a reboot of the laptop's session): the trainer goes on
        r = u("resume", "quickstart")
        assert r.returncode == 0 and "supervised already" not in r.stdout, r.stdout + r.stderr
        st = read_state(run)
        assert st["supervisor_pid"] != first and process_alive(st["supervisor_pid"]), (st, r.stdout)
        assert wait_for(lambda: read_state(run).get("status") in ("finished", "failed", "lost", "stopped"))
        assert read_state(run)["status"] == "finished", (read_state(run), (run / "supervisor.log").read_text())
        assert (run / "checkpoints" / "final" / "model.safetensors").is_file()
        listed = u("ckpt", "list", "quickstart")
        assert "final" in listed.stdout and "no checkpoints" not in listed.stdout, listed.stdout
        r = u("doctor", "quickstart", "--weights")
        assert "weights_frozen" in r.stdout and "changed" in r.stdout, r.stdout  # the start weights against final/
        # a run rlctl did not train holds no weights: said as such, not as a frozen-weights finding
        r = u("attach", f"runs/{run.name}/stdout.log", "--backend", "trl", "--name", "copy")
        assert r.returncode == 0, r.stderr
        r = u("doctor", "copy", "--weights")
        assert "weights_frozen" not in r.stdout and "nothing to compare" in r.stdout, r.stdout
        assert "no checkpoint with weights" in r.stdout
    finally:
        u.cleanup()


# ---- 2.4: an eval set's `every` that checkpoints cannot serve ----------------------------------------------------

def test_eval_every_that_checkpoints_cannot_serve(tmp_path_factory):
    u = new_user(tmp_path_factory)
    (u.cwd / "r.toml").write_text('extends = "recipes/quickstart.toml"\n[train]\nsteps = 20\n[checkpoint]\n'
                                  'every = 10\n[eval.sets.probe]\ndata = "recipes/quickstart/prompts.jsonl"\n'
                                  'every = 5\n')
    r = u("preflight", "r.toml", "--json")
    found = [x for x in json.loads(r.stdout)["results"] if x["check"] == "eval.every"]
    assert len(found) == 1 and found[0]["verdict"] == "warn", found
    f = found[0]
    assert "eval.sets.probe.every = 5" in f["figure"] and "checkpoint.every = 10" in f["figure"]
    assert "0, 10, 20" in f["figure"], f["figure"]
    assert "eval.sets.probe.every = 10" in f["fix"] and "checkpoint.every = 5" in f["fix"], f["fix"]
    assert f["set"] == {"eval.sets.probe.every": 10}
    r = u("preflight", "r.toml", "--set", "eval.sets.probe.every=10", "--json")
    assert [x["verdict"] for x in json.loads(r.stdout)["results"] if x["check"] == "eval.every"] == ["ok"]
    r = u("preflight", "r.toml", "--set", "checkpoint.every=5", "--json")
    assert [x["verdict"] for x in json.loads(r.stdout)["results"] if x["check"] == "eval.every"] == ["ok"]
    # without the step-0 baseline the steps start at the first checkpoint (new-user trial: "at 0, 20, 40" was said)
    r = u("preflight", "r.toml", "--set", "checkpoint.every=5", "--set", "eval.baseline=false", "--json")
    found = [x for x in json.loads(r.stdout)["results"] if x["check"] == "eval.every"]
    assert "(at 5, 10, 15, 20)" in found[0]["figure"], found


# ---- 2.12: LR "reaches 30% of the target by step 20" ----------------------------------------------------------------

def test_lr_check_means_reached_by_the_step(tmp_path_factory):
    import torch
    from transformers import get_scheduler

    u = new_user(tmp_path_factory)
    sets = ["--set", "optim.schedule=cosine", "--set", "train.steps=20", "--set", "preflight.lr_check_step=20"]
    r = u("preflight", "recipes/quickstart.toml", *sets, "--json")
    res = {x["check"]: x for x in json.loads(r.stdout)["results"]}["schedule.lr_at_step"]
    # TRL's own scheduler: the target from step 1, decayed to ~0 at step 20, the end of the run
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=5e-3)
    sched = get_scheduler("cosine", opt, num_warmup_steps=0, num_training_steps=20)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 5e-3 and lrs[-1] < 0.3 * 5e-3
    assert res["verdict"] == "ok", res
    assert res["data"]["fraction"] == pytest.approx(max(lrs) / 5e-3)
    # a warmup that does not get there by step 20 still fails
    r = u("preflight", "recipes/quickstart.toml", "--set", "train.steps=200", "--set", "optim.warmup_steps=100",
          "--set", "preflight.lr_check_step=20", "--json")
    res = {x["check"]: x for x in json.loads(r.stdout)["results"]}["schedule.lr_at_step"]
    assert res["verdict"] == "fail" and "by step 20" in res["fix"], res
