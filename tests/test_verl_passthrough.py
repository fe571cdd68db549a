"""backend.verl.extra keys that collide with what rlctl renders (Hydra keeps the last: the extra wins), `extra` for a
backend the recipe does not run, and the checkpoint label of a recipe that saves no optimizer."""

from __future__ import annotations

from rlctl.recipe.planning import prepare
from tests.conftest import RECIPES

VERL = RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"
A = "actor_rollout_ref"


def _said(prep, key: str) -> list[str]:
    return [f"{f.level}: {f.message} [{f.fix}]" for f in prep.render_findings() if key in f.key]


def test_colliding_extra_is_said_and_checked_as_what_runs():
    from rlctl.preflight import Context

    prep = prepare(VERL, ["backend.verl.extra.trainer.save_freq=10", f"backend.verl.extra.{A}.rollout.n=8"])
    k = prep.backend.optimizer_steps_per_logged_step(prep.recipe)
    said = _said(prep, "backend.verl.extra")
    assert any("trainer.save_freq" in s and "wins" in s and f"checkpoint.every = {10 * k}" in s for s in said), said
    assert any("rollout.n" in s and "rollout.group_size = 8" in s for s in said), said
    ctx = Context(prep)
    assert ctx.recipe.checkpoint.every == 10 * k and ctx.recipe.rollout.group_size == 8
    assert {"checkpoint.every", "rollout.group_size"} <= set(ctx.overridden)
    # the effective recipe renders the command that runs: the same mini-batch, the extra's save_freq and n
    ran = dict(prep.backend.overrides(ctx.recipe, None))
    rendered = dict(prep.backend.overrides(prep.recipe, None))
    assert ran[f"{A}.actor.ppo_mini_batch_size"] == rendered[f"{A}.actor.ppo_mini_batch_size"]
    assert ran["trainer.save_freq"] == 10 and ran[f"{A}.rollout.n"] == 8


def test_extra_of_another_backend_is_said():
    prep = prepare(VERL, ["backend.openrlhf.extra.foo=1"])
    said = _said(prep, "backend.openrlhf")
    assert said and "warn" in said[0] and "foo" in said[0] and "verl" in said[0], said


def test_hydra_deletion_is_refused(cli):
    res = cli("render", str(VERL), "--set", "backend.verl.extra.~trainer.logger=null")
    assert res.code == 2 and "~trainer.logger" in res.err, res.err
    prep = prepare(VERL, ["backend.verl.extra.~trainer.logger=1"])
    assert any(s.startswith("error") for s in _said(prep, "~trainer.logger"))


def test_checkpoint_label_says_what_is_saved():
    from rlctl.recipe.models import resolve_arch

    prep = prepare(VERL, ["checkpoint.save_optimizer=false"])
    _, what = prep.backend.checkpoint_bytes(resolve_arch(prep.recipe.model.path), prep.recipe)
    assert "optimizer" not in what and "model" in what, what


def test_a_deletion_written_as_a_table_is_one_error_and_never_rendered(tmp_path):
    """Trial 9: `--set 'backend.verl.extra={"~trainer.logger"=""}'` gave the `~` refusal beside a wrong "key
    `~trainer.logger` does not exist" error, and `~trainer.logger=` still reached the argv."""
    from rlctl.recipe.planning import prepare

    prep = prepare(VERL, ['backend.verl.extra={"~trainer.logger"=""}'])
    assert not any(str(a).startswith("~") for a in prep.plan.argv), prep.plan.argv
    errors = [f for f in prep.validate() if f.level == "error"]
    assert len(errors) == 1 and "`~`" in errors[0].message and "does not exist" not in errors[0].message, errors


def test_an_extra_given_as_text_is_compared_as_hydra_reads_it():
    """`"…optim.lr" = "1e-6"` reaches verl's argv as `…optim.lr=1e-6`, which Hydra reads as the float 1e-06: the
    recipe's own lr = 1e-6, so no override. The text was compared with the rendered number and always reported
    ("a recipe with it renders … otherwise"). A different value given as text is an override the checks read."""
    lr = f'backend.verl.extra.{A}.actor.optim.lr="1e-6"'
    assert prepare(VERL, ["optim.lr=1e-6", lr]).recipe.backend.extra()[f"{A}.actor.optim.lr"] == "1e-6"
    assert _said(prepare(VERL, ["optim.lr=1e-6", lr]), "optim.lr") == []
    assert _said(prepare(VERL, [f'backend.verl.extra.{A}.rollout.n="{8}"', "rollout.group_size=8"]), "rollout.n") == []
    said = _said(prepare(VERL, ["optim.lr=1e-6", f'backend.verl.extra.{A}.actor.optim.lr="2e-6"']), "optim.lr")
    assert len(said) == 1 and "optim.lr = 2e-06" in said[0] and "otherwise" not in said[0], said
