"""LR schedule exactly as the backend computes it: total steps, warmup, and the LR at step K (the seeds'
preflight_lr.sh rule: abort if LR@20 < 30% of the target)."""

from __future__ import annotations

from typing import Any

from rlctl.estimate.schedules import sparkline
from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check
from rlctl.recipe.schema import MAX_STEPS


def _no_steps(ctx: Context) -> Result:
    return Result(
        "schedule.steps", SKIP,
        f"dataset {ctx.recipe.data.train!r} is not a local file, so the number of steps is unknown",
        "point data.train at the local JSONL/JSON/Parquet file, or set train.steps",
    )


def _named(text: str, sets: dict[str, Any] | None) -> str:
    """The fix text, led by the computed fix where there is one."""
    return f"set {', '.join(f'{k} = {v}' for k, v in sets.items())}: {text}" if sets else text


@check("schedule.steps")
def total_steps(ctx: Context) -> Result:
    r = ctx.recipe
    total = ctx.total_steps
    if total is None:
        return _no_steps(ctx)
    src = f"{ctx.dataset_size} prompts" if ctx.dataset_size is not None else "train.steps"
    if r.train.steps is None and ctx.dataset_size is not None:
        formula = ctx.backend.steps_formula(r, ctx.dataset_size)
    else:
        formula = f"train.steps = {r.train.steps}"
    if total <= 0:
        return Result("schedule.steps", FAIL, f"0 optimizer steps ({formula})",
                      "the dataset is smaller than one training batch: lower train.train_batch_size or add data",
                      {"total_steps": total})
    if total > MAX_STEPS:
        return Result("schedule.steps", FAIL, f"{total} optimizer steps ({formula}): above rlctl's limit of "
                      f"{MAX_STEPS}, far beyond any real run; the LR curve is not computed",
                      "check train.episodes / train.steps and train.train_batch_size", {"total_steps": total})
    return Result("schedule.steps", OK, f"{total} optimizer steps ({formula}; from {src})", None,
                  {"total_steps": total})


def _lr_reached(ctx: Context, lrs: list[float]) -> bool:
    p = ctx.recipe.preflight
    return not lrs or max(lrs[:p.lr_check_step]) >= p.lr_check_min_fraction * ctx.recipe.optim.lr


def warmup_fix(ctx: Context) -> dict[str, Any] | None:
    """The longest warmup, at most a tenth of the run, that both schedule checks pass as the backend rounds it (in
    the recipe's own form: optim.warmup_ratio where it sets a ratio, else optim.warmup_steps); None if none does."""
    from rlctl.preflight._fixes import apply

    r, total = ctx.recipe, ctx.total_steps
    if not total:
        return None
    key = "optim.warmup_ratio" if r.optim.warmup_ratio is not None else "optim.warmup_steps"
    w, tried = total // 10, set()
    while w not in tried:
        tried.add(w)
        sets = {key: round(w / total, 4) if key == "optim.warmup_ratio" else w}
        try:
            fixed = apply(r, sets)
            warm = ctx.backend.warmup_steps(fixed, total)
            if warm < total and 2 * warm <= total and _lr_reached(ctx, ctx.backend.schedule(fixed, ctx.dataset_size)):
                return sets
        except Exception:  # noqa: BLE001 - a value the adapter cannot model is no fix to offer
            pass
        w //= 2
    return None


@check("schedule.warmup")
def warmup(ctx: Context) -> Result:
    total = ctx.total_steps
    if not total:
        return Result("schedule.warmup", SKIP, "no step count (see schedule.steps)")
    w = ctx.backend.warmup_steps(ctx.recipe, total)
    data = {"warmup_steps": w, "total_steps": total}
    if w >= total:
        return Result("schedule.warmup", FAIL, f"warmup {w} steps >= the whole run ({total} steps): LR never "
                      "reaches its target", _named("lower optim.warmup_ratio / warmup_steps, or train longer",
                                                   fix := warmup_fix(ctx)), data, set=fix)
    if w > total / 2:
        return Result("schedule.warmup", WARN, f"warmup {w} of {total} steps (>50% of the run)",
                      _named("a warmup this long wastes most of the run below target LR", fix := warmup_fix(ctx)),
                      data, set=fix)
    return Result("schedule.warmup", OK, f"warmup {w} of {total} steps", None, data)


@check("schedule.lr_at_step")
def lr_at_step(ctx: Context) -> Result:
    """The seeds' rule "LR@20 >= 30% of target" means the LR has *reached* that much by step K: the highest LR of
    steps 1..K, so a short decaying run that starts at the target (a 20-step cosine ends near 0 at step 20) passes,
    and a warmup that gets there only after step K fails."""
    r = ctx.recipe
    lrs = ctx.lrs
    if not lrs:
        if ctx.total_steps is None or ctx.total_steps > MAX_STEPS:
            why = "no step count" if ctx.total_steps is None else f"{ctx.total_steps} steps, above the limit"
            return Result("schedule.lr_at_step", SKIP, f"{why} (see schedule.steps)")
        # the adapter models no schedule (a trainer rlctl does not know keeps its own): no figure to check
        return Result("schedule.lr_at_step", SKIP, f"the {r.backend.name} backend's trainer keeps its own LR "
                      f"schedule, which rlctl does not model: the LR at step {r.preflight.lr_check_step} is not "
                      "checked")
    k = r.preflight.lr_check_step
    frac_min = r.preflight.lr_check_min_fraction
    k_eff = min(k, len(lrs))
    reached = max(lrs[:k_eff])
    at = 1 + lrs.index(reached)
    frac = reached / r.optim.lr
    curve = sparkline(lrs)
    data = {"step": k_eff, "lr": reached, "at_step": at, "lr_at_step": lrs[k_eff - 1], "fraction": frac,
            "target": r.optim.lr, "total_steps": len(lrs)}
    figure = f"LR reaches {reached:.3g} ({frac:.0%} of {r.optim.lr:.3g}) by step {k_eff}" + (
        f" (at step {at})" if at != k_eff else "") + f"  {curve}"
    if frac < frac_min:
        return Result(
            "schedule.lr_at_step", FAIL, figure,
            _named(f"LR must reach {frac_min:.0%} of target by step {k}: shorten warmup "
                   f"(optim.warmup_ratio/warmup_steps) or check the step count; threshold in [preflight]",
                   fix := warmup_fix(ctx)), data, set=fix)
    peak = max(lrs)
    if peak < 0.999 * r.optim.lr:
        return Result("schedule.lr_at_step", WARN, figure + f"; peak {peak:.3g} never reaches the target",
                      "the run ends during warmup", data)
    return Result("schedule.lr_at_step", OK, figure, None, data)
