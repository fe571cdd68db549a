"""verl counts saves and evaluations in iterations (trainer.save_freq / test_freq), rlctl in optimizer steps: the
rounding is said with the recipe key and the value verl uses, and the checkpoint count the disk check uses is the one
verl's own trainer loop saves (verl 0.9.1's v1 trainer fit, tests/conformance/_verl_support.py)."""

from __future__ import annotations

import pytest

from rlctl.backends import get_backend
from rlctl.recipe.loader import load
from tests.conformance import _verl_support as vs
from tests.conftest import RECIPES

pytest.importorskip("hydra")

VERL = get_backend("verl")
SEED = RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"
FOUR = ["train.train_batch_size=64"]  # the seed's rollout of 64 prompts x 16 = 4 mini-batches: k = 4


@pytest.mark.parametrize("key,freq", [("checkpoint.every", "trainer.save_freq"), ("eval.every", "trainer.test_freq")])
def test_rounded_every_names_its_key_and_the_value_used(cli, key, freq):
    res = cli("render", str(SEED), *[a for s in [*FOUR, f"{key}=30"] for a in ("--set", s)])
    assert res.code == 0, res.err
    said = [ln for ln in res.err.splitlines() if "30" in ln and "28" in ln]
    assert len(said) == 1, res.err
    assert f"{key} = 30" in said[0] and f"{freq}=7" in said[0] and f"{freq}=7" in res.out


def test_saved_checkpoints_is_what_verls_loop_saves():
    try:
        vs.verl_root("0.9.1")
    except RuntimeError as e:
        pytest.skip(str(e))
    recipes = {every: load(SEED, [*FOUR, f"checkpoint.every={every}", "backend.version=0.9.1"]).recipe
               for every in (6, 50, 44, 3)}
    jobs = [{"id": every, "overrides": VERL.render(r, 128).argv[3:], "dataset_size": 128}
            for every, r in recipes.items()]
    for res in vs.run_jobs("0.9.1", jobs):
        assert "error" not in res, res["error"]
        r = recipes[res["id"]]
        total = VERL.total_steps(r, 128)
        assert VERL.saved_checkpoints(r, total) == len(res["loop"]["saves"]), (res["id"], total, res["loop"]["saves"])
