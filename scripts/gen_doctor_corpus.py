"""Make the doctor corpus's runs for real: short CPU runs whose metrics.jsonl land in tests/fixtures/doctor_corpus/.

    PYTHONPATH=. python scripts/gen_doctor_corpus.py [case ...]     # all cases, or the ones named

Each case is `rlctl launch` of the quickstart (TRL GRPO on a tiny random Qwen2, CPU) with --set overrides that make
one behaviour happen (lr = 0 for frozen weights, a constant reward for zero-variance groups, ...), or the command
backend's torchrun trainer (tests/fixtures/command/tiny_trainer.py). The run's metrics.jsonl and its resolved
recipe.toml are copied into tests/fixtures/doctor_corpus/<case>/ (no checkpoints); labels.toml next to them is
written by hand from what the run did (read its metrics), never by this script. Runs take 30 s to 3 min each on a
laptop CPU; the runs themselves go to a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "doctor_corpus"
OUT = ROOT / "tests" / "fixtures" / "doctor_corpus"
QUICKSTART = str(ROOT / "recipes" / "quickstart.toml")
REWARDS = str(HERE / "rewards.py")
TRAINER = ROOT / "tests" / "fixtures" / "command" / "tiny_trainer.py"


def reward(name: str) -> list[str]:
    return [f'reward.function="{REWARDS}"', f'reward.function_name="{name}"']


def heldout(data: str) -> list[str]:
    """A named eval set 'heldout' (the primary) on scripts/doctor_corpus/<data>, left to rlctl's evaluator: a step-0
    baseline, then one greedy eval per 10-step checkpoint, graded by the recipe's reward (correct at >= 0.5)."""
    return [f'eval.sets.heldout.data="{HERE / data}"', 'eval.sets.heldout.grader="reward"',
            "eval.sets.heldout.threshold=0.5", "eval.sets.heldout.limit=8", 'eval.primary="heldout"',
            "checkpoint.every=10"]


# case -> (recipe, --set overrides)
CASES: dict[str, tuple[str, list[str]]] = {
    # learns, then saturates at the task's ceiling (reward 1.0 = every character an 'a'); truncation by design
    # (the tiny model never emits EOS: every completion runs to max_tokens), entropy low once converged
    "trl_quickstart_converged": (QUICKSTART, ["checkpoint.every=40"]),
    # the first 20 steps of the same: learning, not yet saturated
    "trl_quickstart_learning": (QUICKSTART, ["train.steps=20"]),
    # LoRA r8 at lr 5e-2 on the CPU: in 40 steps the policy barely moves (flat learning, not a normal LoRA run)
    "trl_lora_slow": (QUICKSTART, ["lora.rank=8", "lora.alpha=16", "optim.lr=5e-2", "train.steps=40"]),
    # LoRA that learns: reward 0.007 -> ~0.4 in 10 steps, then held there. The output head is tied to the embeddings
    # and frozen under LoRA (TRL refuses an adapter on lm_head), and the final norm bounds the hidden state, so the
    # adapters can lift the 'a' logit by about init std x hidden: on the 64-wide quickstart model that is ~1.3 (the
    # reward stays ~0.01: trl_lora_slow), on a 256-wide one ~5 (a reach of ~40% 'a')
    "trl_lora_learning": (QUICKSTART, ["model.path=random:qwen2?hidden=256&layers=2", "lora.rank=16",
                                       "lora.alpha=32", "optim.lr=2e-2", "train.steps=40", "checkpoint.every=20"]),
    # sick ones
    # lr = 0 (refused in optim.lr, so through TRL's own learning_rate): the weights never move
    "trl_frozen_lr0": (QUICKSTART, ["backend.trl.extra.learning_rate=0", "train.steps=20"]),
    # the seeds' silent freeze: pure bf16 parameters and an lr below half a bf16 step (docs/precision.md); a small
    # kl_coef so the KL to the reference is logged (it stays exactly 0)
    "trl_frozen_bf16": (QUICKSTART, ["model.dtype=bfloat16", "model.precision=pure", "optim.lr=1e-6",
                                     "algorithm.kl_coef=0.001", "train.steps=30", "checkpoint.every=15"]),
    "trl_truncation": (QUICKSTART, ["rollout.max_tokens=4", "train.steps=20"]),
    "trl_zero_variance_constant_reward": (QUICKSTART, [*reward("constant"), "train.steps=20"]),
    # a scorer that returns NaN for some completions: TRL sums rewards with nansum, so NaN becomes 0 (no NaN in the log)
    "trl_nan_reward": (QUICKSTART, [*reward("nan_after"), "train.steps=20"]),
    # ... and for every completion: TRL logs the function's mean reward as NaN
    "trl_nan_reward_all": (QUICKSTART, [*reward("nan_all"), "train.steps=10"]),
    # an lr far too small for a reward whose every group has spread: reward flat, the policy barely moves
    "trl_flat_tiny_lr": (QUICKSTART, [*reward("byte_mean"), "optim.lr=1e-6", "train.steps=20"]),
    "trl_length_collapse": (QUICKSTART, [*reward("short"), "train.steps=30"]),
    # a large lr with a KL term: KL and loss jump while entropy falls
    "trl_instability_high_lr_kl": (QUICKSTART, ["optim.lr=0.3", "algorithm.kl_coef=0.05", "train.steps=30"]),
    "trl_eval_divergence": (QUICKSTART, [*reward("by_label"), f'data.eval="{HERE / "eval_not_a.jsonl"}"',
                                         "eval.every=10", "train.steps=40"]),
    # the same reward by label with a named eval set left to rlctl's evaluator: its step-0 baseline is the base model
    # (correct when the complement of the 'a' fraction is >= 0.5); as training learns to write 'a', the held-out set
    # falls below the baseline
    "trl_eval_below_baseline": (QUICKSTART, [*reward("by_label"), *heldout("eval_not_a.jsonl"), "train.steps=40"]),
    # ... and with the eval set's label the training one (the same held-out prompts labelled "a"): the eval rises
    # above its baseline (healthy; eval_below_baseline must not fire)
    "trl_eval_above_baseline": (QUICKSTART, [*reward("by_label"), *heldout("eval_a.jsonl"), "train.steps=20"]),
}

LOG_PATTERN = (r"step (?P<step>\d+) \| loss (?P<loss>\S+) \| reward (?P<reward>\S+) \| lr (?P<lr>\S+) "
               r"\| grad_norm (?P<grad_norm>\S+)")
COMMAND_RECIPE = """
name = "tiny-torchrun"
[backend]
name = "command"
[backend.command]
command = {command}
log_pattern = '{pattern}'
metrics_map = {{loss = "policy_loss", reward = "reward/mean", lr = "lr", grad_norm = "grad_norm"}}
checkpoint_pattern = "step_{{step}}"
checkpoint_marker = "training_info.json"
resume_args = ["--resume", "{{path}}"]
[model]
path = "random:qwen2?hidden=64&layers=2"
dtype = "float32"
max_model_len = 128
[data]
train = "{prompts}"
max_prompt_tokens = 32
[rollout]
group_size = 4
prompts_per_step = 2
max_tokens = 16
[train]
steps = {steps}
train_batch_size = 8
micro_batch_size = 4
[optim]
lr = 0.05
[resources]
gpus_per_node = 0
gpu = "cpu"
[checkpoint]
dir = "training_state"
every = 10
"""


def command_recipe(tmp: Path, steps: int = 30) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TRAINER),
           "--steps", "{steps}", "--save-every", "{checkpoint_every}", "--out", "{checkpoint_dir}", "--lr", "{lr}"]
    path = tmp / "tiny-torchrun.toml"
    path.write_text(COMMAND_RECIPE.format(command=json.dumps(cmd), steps=steps, pattern=LOG_PATTERN,
                                          prompts=ROOT / "recipes" / "quickstart" / "prompts.jsonl"))
    return str(path)


def run_case(name: str, recipe: str, sets: list[str], runs: Path) -> None:
    env = {**os.environ, "RLCTL_RUNS_DIR": str(runs), "PYTHONPATH": str(ROOT)}
    argv = [shutil.which("rlctl") or "rlctl", "launch", recipe, "--name", name, "--force"]
    for s in sets:
        argv += ["--set", s]
    print("$", " ".join(argv), flush=True)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    print(proc.stdout[-600:], proc.stderr[-1500:], sep="\n", flush=True)
    made = sorted(runs.glob(f"{name}-*"), key=lambda p: p.stat().st_mtime)
    if not made:
        print(f"{name}: no run directory (rc {proc.returncode}): skipped", flush=True)
        return
    run_dir = made[-1]
    dest = OUT / name
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("metrics.jsonl", "recipe.toml"):
        if (run_dir / f).is_file():
            text = (run_dir / f).read_text().replace(str(ROOT), "<repo>")
            (dest / f).write_text(text)
    state = json.loads((run_dir / "state.json").read_text())
    (dest / "run.json").write_text(json.dumps({"backend": state.get("backend"), "exit_code": proc.returncode,
                                               "sets": [s.replace(str(ROOT), "<repo>") for s in sets]}, indent=1)
                                   + "\n")


def main(argv: list[str]) -> int:
    wanted = argv or [*CASES, "command_torchrun_learning", "command_torchrun_frozen_lr0", "command_torchrun_nan",
                      "command_torchrun_converged", "command_torchrun_spikes_high_lr"]
    with tempfile.TemporaryDirectory(prefix="rlctl-doctor-corpus-") as tmp:
        runs = Path(tmp) / "runs"
        for name in wanted:
            if name == "command_torchrun_learning":
                run_case(name, command_recipe(Path(tmp)), [], runs)
            elif name == "command_torchrun_nan":  # an absurd lr: the weights overflow to inf, the loss to NaN
                run_case(name, command_recipe(Path(tmp), steps=10), ["backend.command.extra.lr=1e37"], runs)
            elif name == "command_torchrun_converged":  # a larger lr: the loss reaches 0, the reward 1
                run_case(name, command_recipe(Path(tmp)), ["backend.command.extra.lr=0.6"], runs)
            elif name == "command_torchrun_spikes_high_lr":  # SGD past its stable step size: the loss jumps
                run_case(name, command_recipe(Path(tmp)), ["backend.command.extra.lr=1.2"], runs)
            elif name == "command_torchrun_frozen_lr0":  # --lr 0 appended after the recipe's --lr: argparse takes it
                run_case(name, command_recipe(Path(tmp), steps=20), ["backend.command.extra.lr=0"], runs)
            else:
                recipe, sets = CASES[name]
                run_case(name, recipe, sets, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
