"""Fixes are data (README): on the bundled recipes, each check whose fix is a concrete recipe value gives it as `set`
in `rlctl preflight --json`, and applying exactly that (`--set key=value` for each entry, as a user would) closes the
check without another newly failing or warning (tests/conformance/test_fixes_close.py's rule, on the bundled recipes
as a user runs them: the console script from a working directory with every default)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.conftest import RECIPES

QUICK = str(RECIPES / "quickstart.toml")
VERL = str(RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml")
PRIME = str(RECIPES / "prime-rl-qwen3-8b-2xh100.toml")

CASES = [  # (recipe, --set edits that trigger the check, the check, the set it must give)
    (QUICK, ["rollout.max_tokens=200"], "context.budget", {"rollout.max_tokens": 101}),  # measured prompts: 27 max
    (QUICK, ["model.max_model_len=20"], "context.budget", {"model.max_model_len": 43}),  # no room for any response
    (VERL, ["rollout.max_tokens=4000"], "context.budget", {"rollout.max_tokens": 1536}),  # verl enforces the prompt
    (VERL, ["model.max_model_len=100000"], "context.positions", {"model.max_model_len": 4096}),
    (VERL, ["train.seq_len=512"], "context.train_seq_len", {"train.seq_len": 2560}),
    (QUICK, ["optim.warmup_steps=60"], "schedule.warmup", {"optim.warmup_steps": 8}),  # warn: > half of 80 steps
    (QUICK, ["optim.warmup_steps=80"], "schedule.warmup", {"optim.warmup_steps": 8}),  # fail: the whole run
    (VERL, ["optim.warmup_ratio=0.9"], "schedule.warmup", None),  # the recipe's own form: a ratio
    (QUICK, ["optim.warmup_steps=60"], "schedule.lr_at_step", None),
    (VERL, [], "env.wandb", {"logging.wandb.offline": True}),
    (PRIME, [], "env.wandb", {"logging.wandb.offline": True}),
]


def said(results: list[dict]) -> Counter:
    return Counter((r["check"], r["verdict"]) for r in results if r["verdict"] in ("fail", "warn"))


def preflight(rlctl, recipe: str, sets: list[str]) -> list[dict]:
    p = rlctl("preflight", recipe, "--json", *[a for s in sets for a in ("--set", s)], timeout=60)
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)["results"]


@pytest.mark.parametrize(("recipe", "sets", "check", "want"), CASES,
                         ids=[f"{c[2]}-{'+'.join(c[1]) or 'as-bundled'}" for c in CASES])
def test_a_concrete_fix_is_given_as_set_and_closes_its_check(user, recipe, sets, check, want):
    _, rlctl = user
    rlctl.env.pop("WANDB_API_KEY", None)  # a user with no W&B key (HOME is the fixture's: no ~/.netrc)
    before = preflight(rlctl, recipe, sets)
    mine = [r for r in before if r["check"] == check and r["verdict"] in ("fail", "warn")]
    assert mine, f"--set {sets} does not trigger {check}: {[r['figure'] for r in before if r['check'] == check]}"
    res = mine[0]
    assert res["set"], f"{check} gives no set: fix {res['fix']!r}"
    if want is not None:
        assert res["set"] == want, res
    fixed = preflight(rlctl, recipe, sets + [f"{k}={json.dumps(v)}" for k, v in res["set"].items()])
    b, a = said(before), said(fixed)
    assert a[(check, res["verdict"])] < b[(check, res["verdict"])], \
        [r["figure"] for r in fixed if r["check"] == check]
    new = [k for k in a if a[k] > b[k] and not (k[0] == check and k[1] == "warn")]
    assert not new, [r["figure"] for r in fixed if (r["check"], r["verdict"]) in new]
