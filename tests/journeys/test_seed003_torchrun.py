"""Seed 003's workflow as its team types it: its own Dr-GRPO trainer under torchrun, run through the `command`
backend from the bundled recipe (recipes/command-torchrun-dr-grpo.toml); training stopped by hand, every
checkpoint evaluated in its own process with the team's own evaluator, and training resumed from the newest
checkpoint for more steps.

The trainer is tests/fixtures/command/tiny_trainer.py (torch.distributed with gloo on the CPU, 2 ranks: a real
torchrun job), copied into the team's repository where its runner lives. The evaluator is the team's eval script:
it loads a checkpoint's model.pt and scores a held-out batch as the trainer scores its own ("reward" = 1 / (1 +
loss)); each value the stream shows is recomputed here from the same checkpoint.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.journeys.conftest import FIXTURES, RECIPES, User, evals_by_step, stream, wait_for

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

EVAL_BATCH = '''\
"""Evaluate one checkpoint of a training run on a held-out batch (seed 003's eval_batch.py, reduced)."""
import json, os, sys

import torch

checkpoint, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)  # the runner's policy, as initialised (the base model: step 0)
if os.path.isfile(os.path.join(checkpoint, "model.pt")):
    model.load_state_dict(torch.load(os.path.join(checkpoint, "model.pt")))
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(123))
target = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
with torch.no_grad():
    loss = float(((model(x) - x @ target) ** 2).mean())
json.dump({"primary": 1.0 / (1.0 + loss), "loss": loss}, open(out, "w"))
'''


def held_out_reward(checkpoint) -> float:
    """What the team's evaluator computes, computed here from the checkpoint's own file."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    if checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint / "model.pt"))
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(123))
    target = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    with torch.no_grad():
        return 1.0 / (1.0 + float(((model(x) - x @ target) ** 2).mean()))


def recipe(repo, evaluator: str) -> str:
    return f"""\
# the bundled seed 003 recipe, pointed at this checkout and its CPU test config
extends = "command-torchrun-dr-grpo.toml"
name = "overnight"

[backend.command]
command = ["torchrun", "--standalone", "--nproc_per_node=2", "rl_training/runners/rl_runner.py",
           "--steps", "{{steps}}", "--save-every", "{{checkpoint_every}}", "--out", "{{checkpoint_dir}}",
           "--lr", "{{lr}}", "--metrics", "train_log.jsonl", "--step-seconds", "0.4"]
cwd = "{repo}"
metrics_file = "train_log.jsonl"
metrics_map = {{ loss = "policy_loss", reward = "reward/mean", "optim/lr" = "lr" }}

[model]
path = "random:qwen2?hidden=64&layers=2"
dtype = "float32"
max_model_len = 256
[data]
train = "data/gsm8k_train.jsonl"
input_key = "question"
label_key = "answer"
max_prompt_tokens = 32
[train]
steps = 30
[optim]
lr = 0.05
[resources]
gpus_per_node = 0
gpu = "cpu"
[checkpoint]
every = 2
keep_last = 10

[eval]
evaluator = "command"
command = "python {evaluator} {{checkpoint}} {{output}}"
[eval.sets.gsm8k]
data = "data/gsm8k_test.jsonl"
"""


@pytest.fixture(scope="module")
def team(new_user) -> User:
    u = new_user("seed003")
    runner = u.cwd / "rl_training" / "runners"
    runner.mkdir(parents=True)
    shutil.copy(FIXTURES / "command" / "tiny_trainer.py", runner / "rl_runner.py")
    (runner / "eval_batch.py").write_text(EVAL_BATCH)
    shutil.copy(RECIPES / "command-torchrun-dr-grpo.toml", u.cwd / "command-torchrun-dr-grpo.toml")
    u.write("data/gsm8k_train.jsonl", "".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n"
                                               for i in range(8)))
    u.write("data/gsm8k_test.jsonl", json.dumps({"question": "q", "answer": "1"}) + "\n")
    u.write("rl.toml", recipe(u.cwd, "rl_training/runners/eval_batch.py"))  # relative to the recipe
    return u


def test_preflight_and_render(team):
    p = team("rlctl preflight rl.toml")
    assert p.returncode == 0, p.stdout + p.stderr
    lr = next(line for line in p.stdout.splitlines() if "schedule.lr_at_step" in line)
    # 30 steps are far below rlctl's limit: what is unknown is the schedule of a trainer rlctl does not know
    assert "above the limit" not in lr and "30 optimizer steps" in p.stdout, lr
    r = team.ok("rlctl render rl.toml")
    assert "torchrun" in r.stdout and "rl_runner.py" in r.stdout and "--steps" in r.stdout


def test_preflight_names_the_trainer(team):
    assert "command None" not in team("rlctl preflight rl.toml").stdout


@pytest.fixture(scope="module")
def stopped(team):
    """Launched detached; stopped by hand once step 4's checkpoint is complete."""
    p = team.ok("rlctl launch rl.toml --detach")
    name = p.stdout.strip().splitlines()[-1]
    run = team.cwd / "runs" / name
    assert run.is_dir(), (p.stdout, p.stderr)

    def step_4_complete():
        rows = json.loads(team.ok(f"rlctl ckpt list {name} --json").stdout)["checkpoints"]
        return any(r["step"] >= 4 and r["complete"] for r in rows)

    assert wait_for(step_4_complete, timeout=300, interval=1), (run / "stdout.log").read_text()[-2000:]
    stop = team("rlctl stop overnight")
    return stop, run


def test_stop_by_hand(team, stopped):
    stop, run = stopped
    assert stop.returncode == 0, stop.stderr
    st = team.json(f"rlctl status {run.name} --json")
    assert st["status"] == "stopped", st["status"]
    steps = [m["step"] for m in stream(run) if "reward/mean" in m]
    assert steps == list(range(1, steps[-1] + 1)) and 4 <= steps[-1] < 30
    assert st["step"] == steps[-1] and st["total_steps"] == 30
    row = next(line for line in team.ok("rlctl status").stdout.splitlines() if line.startswith(run.name))
    assert row.split()[1:5] == ["local", "command", "stopped", f"{steps[-1]}/30"], row
    listed = json.loads(team.ok(f"rlctl ckpt list {run.name} --json").stdout)["checkpoints"]
    complete = [r["step"] for r in listed if r["complete"]]
    assert complete == list(range(2, complete[-1] + 1, 2)) and complete[-1] >= 4
    for r in listed:  # where they are, from here
        assert (team.cwd / r["path"]).resolve().parent == run / "training_state", r


def test_checkpoints_evaluated_while_training(team, stopped):
    """The supervisor evaluated the base model first, then each complete checkpoint, with the team's script."""
    _, run = stopped
    ev = evals_by_step(run)
    key = "eval/gsm8k/greedy_pass@1"
    assert 0 in ev and ev[0][key] == pytest.approx(held_out_reward(None), rel=1e-6)
    for step in [s for s in ev if s]:
        assert ev[step][key] == pytest.approx(held_out_reward(run / "training_state" / f"step_{step}"), rel=1e-6)


def test_eval_every_checkpoint_by_hand(team, stopped):
    """`rlctl eval RUN --all` (seed 003's eval_batch.py --training-run RUN): the baseline and every checkpoint."""
    _, run = stopped
    p = team(f"rlctl eval {run.name} --all", timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    ev = evals_by_step(run)
    complete = sorted(int(d.name.split("_")[1]) for d in (run / "training_state").glob("step_*")
                      if (d / "training_info.json").is_file())
    for step in complete:
        want = held_out_reward(run / "training_state" / f"step_{step}")
        assert ev[step]["eval/gsm8k/greedy_pass@1"] == pytest.approx(want, rel=1e-6)
        assert f"{want:.4g}" in p.stdout or str(round(want, 4)) in p.stdout


def test_resume_for_more_steps(team, stopped):
    """resume_training.py --from-step latest --additional-steps: `launch --resume RUN` from the newest complete
    checkpoint, a new run of its own; the parent is left as it was."""
    _, parent = stopped
    newest = max(int(d.name.split("_")[1]) for d in (parent / "training_state").glob("step_*")
                 if (d / "training_info.json").is_file())
    before = sorted(p.name for p in (parent / "training_state").iterdir())
    p = team(f"rlctl launch rl.toml --resume {parent.name} --name overnight-2 --set train.steps={newest + 4}",
             timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    run = team.run_dir("overnight-2")
    assert [m["step"] for m in stream(run) if "reward/mean" in m] == list(range(newest + 1, newest + 5))
    log = (run / "stdout.log").read_text()
    assert f"resuming from checkpoint step {newest}" in log and f"at step {newest + 1}" in log
    st = team.json(f"rlctl status {run.name} --json")
    assert st["status"] == "finished" and st["step"] == newest + 4
    assert sorted(p.name for p in (parent / "training_state").iterdir()) == before  # only read
