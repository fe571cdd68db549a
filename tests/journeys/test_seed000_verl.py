"""Seed 000's workflow as its team types it: the bundled verl recipe (Qwen2.5-Math-1.5B, multi-signal reward, one
H100) checked and rendered on the laptop; the run on the Lambda box followed through its console log; its math500
validation (verl's in-loop eval) next to the pre-training baseline; the naive-reward baseline run compared with it.

verl cannot train on a CPU: the two runs are their recorded consoles, printed by verl 0.9.1's own logger
(tests/fixtures/verl/generate.py; seed 000's figures: math500 0.488 before training, ~0.604 at step 220).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics

import pytest

from tests.journeys.conftest import FIXTURES, RECIPES, User, evals_by_step, stream

pytestmark = pytest.mark.slow

NAIVE = """\
# the naive-reward baseline: the same settings, verl's naive reward manager, 180 steps
extends = "verl-qwen2.5-math-1.5b-1xh100.toml"
name = "naive-baseline"
[train]
steps = 180
[backend.verl.extra]
"reward_model.reward_manager" = "naive"
"""

REWARD = '''\
"""Multi-signal reward (verify, format, reflect; alpha 1.0, beta 0.5, gamma 0.5)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    verify = float(ground_truth in solution_str)
    fmt = float("\\\\boxed{" in solution_str)
    reflect = float("wait" in solution_str.lower())
    return 1.0 * verify + 0.5 * fmt + 0.5 * reflect
'''


def parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture(scope="module")
def team(new_user) -> User:
    """One-Shot-RLVR's checkout: the bundled recipe, its data in verl's format, its reward, the Lambda box's log."""
    pytest.importorskip("pyarrow")
    u = new_user("seed000")
    shutil.copy(RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml", u.cwd)
    u.write("naive.toml", NAIVE)
    u.write("verl/utils/reward_score/multisignal.py", REWARD)

    def row(i, split):
        return {"data_source": "math500", "prompt": [{"role": "user", "content": f"Problem {i}: what is {i} + {i}?"}],
                "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
                "extra_info": {"split": split, "index": i}, "ground_truth": str(2 * i)}

    parquet(u.cwd / "data/train/one_shot_rlvr/pi1_r128.parquet", [row(1, "train")] * 128)
    parquet(u.cwd / "data/test/math500.parquet", [row(i, "test") for i in range(500)])
    for name in ("multisignal", "naive"):
        shutil.copy(FIXTURES / "verl" / f"journey-{name}-0.9.1.log", u.cwd / f"training_h100_{name}.log")
    return u


RECIPE = "verl-qwen2.5-math-1.5b-1xh100.toml"
# what this laptop cannot judge for a run meant for the Lambda box: its disk, its W&B key, its ulimit
FAMILIES = "--only context --only memory --only placement --only schedule --only reference --only precision"


def test_preflight_on_the_laptop(team):
    p = team(f"rlctl preflight {RECIPE} {FAMILIES}")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert re.search(r"OK\s+memory\.vllm\s+0\.65 x", out), out
    assert re.search(r"OK\s+context\.budget\s+1024 \+ 1536 = 2560 <= 2560", out), out
    assert re.search(r"OK\s+schedule\.steps\s+220 optimizer steps", out), out
    assert "reference.reward" in out and "multisignal.py defines compute_score" in out, out


def test_render_is_what_seed_000_ran(team):
    team.ok(f"rlctl render {RECIPE} --out rendered")
    argv = (team.cwd / "rendered" / "launch.sh").read_text()
    for flag in ("data.train_batch_size=64", "actor_rollout_ref.rollout.n=4", "data.max_response_length=1536",
                 "actor_rollout_ref.rollout.gpu_memory_utilization=0.65", "trainer.total_training_steps=220",
                 "trainer.save_freq=50", "trainer.test_freq=50", "actor_rollout_ref.actor.optim.lr=1e-06",
                 "trainer.val_before_train=True"):
        assert flag in argv, flag


def test_preflight_refuses_data_verl_cannot_read(team):
    """A plain-string prompt and no data_source column: verl 0.9 fails on it at the first batch; preflight says so."""
    parquet(team.cwd / "data/plain.parquet", [{"prompt": "what is 1 + 1?", "ground_truth": "2"}] * 8)
    p = team(f"rlctl preflight {RECIPE} --only reference --set data.train=data/plain.parquet")
    assert p.returncode == 1 and "data_source" in p.stdout, p.stdout


@pytest.fixture(scope="module")
def followed(team):
    a = team.ok(f"rlctl attach training_h100_multisignal.log --backend verl --recipe {RECIPE} --name multisignal")
    b = team.ok("rlctl attach training_h100_naive.log --backend verl --recipe naive.toml --name naive-baseline")
    return a, b, team.run_dir("multisignal"), team.run_dir("naive-baseline")


def test_the_log_followed_with_the_recipe(team, followed):
    a, _, run, _ = followed
    assert "221 records" in a.stdout, a.stdout
    recs = [m for m in stream(run) if "reward/mean" in m]
    assert [m["step"] for m in recs] == list(range(1, 221))
    st = team.json(f"rlctl status {run.name} --json")
    assert st["step"] == 220 and st["metrics"]["reward/mean"]["latest"] == pytest.approx(recs[-1]["reward/mean"])
    row = next(line for line in team.ok("rlctl status").stdout.splitlines() if line.startswith(run.name))
    assert row.split()[1:4] == ["local", "verl", "attached"], row


def test_math500_next_to_its_baseline(team, followed):
    """verl's val-core/math500/acc/mean@1 at temperature 0 is eval/default/greedy_pass@1; step 0 is the baseline."""
    _, _, run, _ = followed
    key = "eval/default/greedy_pass@1"
    ev = {s: m[key] for s, m in evals_by_step(run).items() if key in m}
    assert ev == {0: 0.488, 50: 0.546, 100: 0.572, 150: 0.588, 200: 0.598, 220: 0.604}
    out = team.ok(f"rlctl status {run.name}").stdout
    line = next(x for x in out.splitlines() if x.strip().startswith(key))
    assert "0.604 at step 220" in line and "+0.116 vs baseline 0.488" in line, line


def test_progress_counts_the_recipes_steps(team, followed):
    _, _, run, _ = followed
    row = next(line for line in team.ok("rlctl status").stdout.splitlines() if line.startswith(run.name))
    assert row.split()[4] == "220/220", row


def test_compare_with_the_naive_baseline(team, followed):
    """Two runs of two recipes are two arms, one run each: the means are shown, no test is claimed."""
    _, _, run, naive = followed
    got = team.json(f"rlctl compare {run.name} {naive.name} --metric eval/default/greedy_pass@1 --json")
    arms = got["arms"]
    assert len(arms) == 2, arms
    means = {name: a["mean"] for a in arms for name in a["values"]}
    assert means[run.name] == pytest.approx(statistics.fmean([0.546, 0.572, 0.588, 0.598, 0.604]))
    assert means[naive.name] == pytest.approx(statistics.fmean([0.488, 0.512, 0.53, 0.534, 0.536]))
    test = got["comparisons"][0]
    assert test.get("test") is None and test.get("welch") is None, test
    out = team.ok(f"rlctl compare {run.name} {naive.name} --metric eval/default/greedy_pass@1").stdout
    assert "fewer than 2 seeds with values in an arm: no interval, no test" in out, out


def test_the_log_followed_where_it_is_written(team, followed, sshd):
    """The same log on the Lambda box, attached there with the recipe: the same figures."""
    if "lambda" not in team.hosts:
        team.add_host("lambda", "lambda-h100", sshd)
    box = team.hosts["lambda"].parent / "home" / "One-Shot-RLVR"
    box.mkdir(parents=True, exist_ok=True)
    shutil.copy(team.cwd / "training_h100_multisignal.log", box / "training_h100.log")
    team.ok(f"rlctl attach lambda:{box / 'training_h100.log'} --backend verl --recipe {RECIPE} --name lambda-run")
    st = team.json("rlctl status lambda-run --json")
    assert st["step"] == 220
    ev = json.dumps(st)
    assert "eval/default/greedy_pass@1" in ev
