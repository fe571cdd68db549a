"""backend.verl.extra keys that rlctl also renders from the recipe. The extras come after rlctl's overrides on the
command line and Hydra keeps the last value of a key, so the extra wins. rlctl says so, and puts the extra's value back
into the recipe key it was rendered from (RECIPE_KEY, in the recipe's unit): the effective recipe
(Backend.effective), on which render's checks and preflight's run. The effective recipe must render the command that
runs; where it does not (a value the recipe cannot hold), the warning says the checks read the recipe's value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from rlctl.backends.base import Finding
from rlctl.backends.verl.extra import extra_leaves

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

A = "actor_rollout_ref"
ITERATIONS = "iterations"  # verl counts these in iterations; the recipe in optimizer steps
# rendered Hydra key -> (the recipe key it is rendered from, its unit)
RECIPE_KEY: dict[str, tuple[str, str | None]] = {
    "trainer.save_freq": ("checkpoint.every", ITERATIONS),
    "trainer.test_freq": ("eval.every", ITERATIONS),
    "trainer.total_training_steps": ("train.steps", ITERATIONS),
    f"{A}.rollout.n": ("rollout.group_size", None),
    "data.max_response_length": ("rollout.max_tokens", None),
    "data.max_prompt_length": ("data.max_prompt_tokens", None),
    f"{A}.actor.optim.lr": ("optim.lr", None),
    f"{A}.actor.optim.weight_decay": ("optim.weight_decay", None),
    f"{A}.actor.optim.clip_grad": ("optim.max_grad_norm", None),
    f"{A}.actor.ppo_micro_batch_size_per_gpu": ("train.micro_batch_size", None),
    f"{A}.actor.ppo_epochs": ("train.epochs_per_rollout", None),
    f"{A}.rollout.gpu_memory_utilization": ("rollout.gpu_memory_utilization", None),
    f"{A}.rollout.log_prob_micro_batch_size_per_gpu": ("rollout.micro_batch_size", None),
    f"{A}.rollout.tensor_model_parallel_size": ("rollout.tensor_parallel", None),
    f"{A}.rollout.temperature": ("rollout.temperature", None),
    f"{A}.rollout.max_model_len": ("model.max_model_len", None),
    "data.seed": ("train.seed", None),
}
# rendered Hydra key -> the recipe key it is rendered from, where the extra's value cannot go back into it: one
# bound of the clip range (an asymmetric range, DAPO's clip-higher, has no recipe key)
ONE_SIDE = {f"{A}.actor.clip_ratio_low": "algorithm.eps_clip", f"{A}.actor.clip_ratio_high": "algorithm.eps_clip"}
WHERE = "(Hydra keeps the last value of a key: the extra, after rlctl's overrides)"


@dataclass
class Effective:
    recipe: Any
    findings: list[Finding] = field(default_factory=list)
    lines: dict[str, str] = field(default_factory=dict)


def _get(recipe: Any, dotted: str) -> Any:
    for p in dotted.split("."):
        recipe = getattr(recipe, p, None)
    return recipe


def as_verl_reads(v: Any) -> Any:
    """An override's value as verl receives it: rendered onto the argv (`key=value`), then read by Hydra's grammar;
    a string "1e-6" and the float 1e-06 are the same override. Lists and tables element by element."""
    from rlctl.backends.verl.argv import _val
    from rlctl.backends.verl.memory import hydra_value

    if isinstance(v, list):
        return [as_verl_reads(x) for x in v]
    if isinstance(v, dict):
        return {k: as_verl_reads(x) for k, x in v.items()}
    return hydra_value(_val(v))


def _with(recipe: Recipe, values: dict[str, Any]) -> Recipe:
    """The recipe with these keys set; what the recipe set itself stays set, the rest stays at its default."""
    from rlctl.recipe.schema import Recipe as RecipeModel

    data = recipe.model_dump(mode="python", exclude_unset=True)
    for dotted, v in values.items():
        *path, last = dotted.split(".")
        node = data
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return RecipeModel.model_validate(data)


def effective(backend: Any, recipe: Recipe) -> Effective:
    extra = extra_leaves(recipe)
    if not extra:
        return Effective(recipe)
    without = recipe.model_copy(deep=True)
    without.backend.table().extra.clear()
    rendered = dict(backend.overrides(without, None))
    # compared as verl reads both (a number given as text included); the checks take the value as verl reads it
    read = {k: as_verl_reads(v) for k, v in extra.items() if k in rendered}
    hits = {k: v for k, v in read.items() if v != as_verl_reads(rendered[k])}
    if not hits:
        return Effective(recipe)
    k = backend.optimizer_steps_per_logged_step(recipe)
    values: dict[str, Any] = {}
    for key, v in hits.items():
        if key in RECIPE_KEY:
            rk, unit = RECIPE_KEY[key]
            values[rk] = (v * k if isinstance(v, int) and v > 0 else None) if unit == ITERATIONS else v
    if f"{A}.rollout.n" in hits and "train.train_batch_size" not in values:
        # rlctl renders the mini-batch (prompts) from train_batch_size (samples) / group_size: the command keeps
        # rlctl's mini-batch whatever n the extra gives, so train_batch_size is pinned to it
        mini = rendered[f"{A}.actor.ppo_mini_batch_size"]
        if isinstance(hits[f"{A}.rollout.n"], int):
            values["train.train_batch_size"] = mini * hits[f"{A}.rollout.n"]
    eff, why = recipe, ""
    try:
        eff = _with(recipe, values) if values else recipe
        ran = dict(backend.overrides(eff, None))
        moved = [x for x in hits if x in RECIPE_KEY and as_verl_reads(ran.get(x)) != hits[x]]
        if moved:
            eff, why = recipe, f"a recipe with it renders {', '.join(moved)} otherwise"
    except (ValidationError, TypeError, ValueError) as e:
        eff, why = recipe, f"the recipe cannot hold it ({str(e).splitlines()[-1].strip()})"
    out, lines = [], {}
    for key, v in hits.items():
        name = f"backend.verl.extra.{key}"
        was = f"{key}={rendered[key]!r}"
        if key in ONE_SIDE:
            out.append(Finding("warn", name, f"{name} = {v!r} overrides rlctl's {was} (from {ONE_SIDE[key]}) {WHERE}: "
                               f"the extra wins for that bound of the clip range; {ONE_SIDE[key]} sets the other",
                               "remove it unless an asymmetric clip range is meant (no recipe key renders one)"))
            continue
        if key not in RECIPE_KEY:
            out.append(Finding("warn", name, f"{name} = {v!r} overrides rlctl's {was} {WHERE}: the extra wins; no "
                               "recipe key renders it, so rlctl's checks do not read it", "remove it unless meant"))
            continue
        rk = RECIPE_KEY[key][0]
        if why:
            out.append(Finding("warn", name, f"{name} = {v!r} overrides rlctl's {was} (from {rk}) {WHERE}: the extra "
                               f"wins, but {why}: rlctl's checks read the recipe's {rk} = {_get(recipe, rk)!r}",
                               f"remove it; set {rk} instead"))
            continue
        out.append(Finding("warn", name, f"{name} = {v!r} overrides rlctl's {was} (from {rk}) {WHERE}: the extra "
                           f"wins; the checks use its value, as {rk} = {values[rk]!r}",
                           f"remove it; set {rk} = {values[rk]!r} instead"))
        lines[rk] = f"{name} = {v!r} in place of {rk} = {_get(recipe, rk)!r}"
    if not why and "train.train_batch_size" in values and f"{A}.rollout.n" in hits:
        lines["train.train_batch_size"] = (f"train.train_batch_size = {values['train.train_batch_size']} (rlctl's "
                                           "mini-batch of prompts, which the command keeps, x the extra's rollout.n)")
    return Effective(eff, out, lines)
