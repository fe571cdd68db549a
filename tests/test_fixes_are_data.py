"""Fixes are data (README): on the bundled recipes, each check whose fix is a concrete recipe value gives it as `set`
in `rlctl preflight --json`, and applying exactly that (`--set key=value` for each entry, as a user would) closes the
check without another newly failing or warning (tests/conformance/test_fixes_close.py's rule, on the bundled recipes
as a user runs them: rlctl's entry point in a working directory of its own, with a HOME of its own)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.conftest import RECIPES, run_cli

QUICK = str(RECIPES / "quickstart.toml")
VERL = str(RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml")
VERL_EXTRA = "backend.verl.extra"

CASES = [  # (recipe, --set edits that trigger the checks, {check: the set it must give, None: any that closes it})
    (QUICK, ["rollout.max_tokens=200"], {"context.budget": {"rollout.max_tokens": 101}}),  # measured prompts: 27 max
    (QUICK, ["model.max_model_len=20"], {"context.budget": {"model.max_model_len": 43}}),  # no room for a response
    # verl enforces the prompt limit, and trains on prompt + response
    (VERL, ["rollout.max_tokens=4000"], {"context.budget": {"rollout.max_tokens": 1536},
                                         "context.train_seq_len": {"train.seq_len": 5024}}),
    (VERL, ["model.max_model_len=100000"], {"context.positions": {"model.max_model_len": 4096}}),
    # warn: more than half of the 80 steps; the LR at step 5 too low as well
    (QUICK, ["optim.warmup_steps=60"], {"schedule.warmup": {"optim.warmup_steps": 8},
                                        "schedule.lr_at_step": {"optim.warmup_steps": 8}}),
    (QUICK, ["optim.warmup_steps=80"], {"schedule.warmup": {"optim.warmup_steps": 8}}),  # fail: the whole run
    # the recipe's own form (a ratio); W&B on with no key (the user's HOME has no ~/.netrc); no flash-attn here for
    # verl's default FlashAttention-2: PyTorch's attention through verl's own key (its fix was text only)
    (VERL, ["optim.warmup_ratio=0.9"], {"schedule.warmup": {"optim.warmup_ratio": 0.1},
                                        "env.wandb": {"logging.wandb.offline": True},
                                        "env.flash_attn": {f"{VERL_EXTRA}.+actor_rollout_ref.model.override_config."
                                                           "attn_implementation": "sdpa"}}),
]


def said(results: list[dict]) -> Counter:
    return Counter((r["check"], r["verdict"]) for r in results if r["verdict"] in ("fail", "warn"))


@pytest.mark.parametrize(("recipe", "sets", "checks"), CASES, ids=[f"{'+'.join(c[2])}-{'+'.join(c[1])}" for c in CASES])
def test_a_concrete_fix_is_given_as_set_and_closes_its_check(tmp_path, monkeypatch, recipe, sets, checks):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)

    def preflight(edits: list[str]) -> list[dict]:
        p = run_cli("preflight", recipe, "--json", *[a for s in edits for a in ("--set", s)], cwd=tmp_path)
        assert p.code in (0, 1), p.err
        return json.loads(p.out)["results"]

    before = preflight(sets)
    for check, want in checks.items():
        mine = [r for r in before if r["check"] == check and r["verdict"] in ("fail", "warn")]
        assert mine, f"--set {sets} does not trigger {check}: {[r['figure'] for r in before if r['check'] == check]}"
        res = mine[0]
        assert res["set"] == want, f"{check}: set {res['set']}, fix {res['fix']!r}"
        fixed = preflight(sets + [f"{k}={json.dumps(v)}" for k, v in res["set"].items()])
        b, a = said(before), said(fixed)
        assert a[(check, res["verdict"])] < b[(check, res["verdict"])], \
            [r["figure"] for r in fixed if r["check"] == check]
        new = [k for k in a if a[k] > b[k] and not (k[0] == check and k[1] == "warn")]
        assert not new, [r["figure"] for r in fixed if (r["check"], r["verdict"]) in new]
