"""Eval sets against the checkpoints that serve them: a set rlctl evaluates (not the backend in-loop) is evaluated on
saved checkpoints only, so its `every` means what it says only when checkpoints are saved at those steps."""

from __future__ import annotations

import math

from rlctl.preflight import OK, WARN, Context, Result, check

NAME = "eval.every"


def _steps(every: int, total: int | None, shown: int = 4, baseline: bool = True) -> str:
    """`0, 10, 20` (to the end of the run) or `0, 10, 20, 30, ...`; without the step-0 baseline (`eval.baseline =
    false`) from the first checkpoint."""
    steps = [0] * baseline + list(range(every, (total or every * shown) + 1, every))
    if len(steps) <= 1:
        return f"{steps[0]} only" if steps else "none (no checkpoint within the run)"
    more = total is None or len(steps) > shown + 1
    return ", ".join(str(s) for s in steps[:shown + 1]) + (", ..." if more else "")


@check(NAME, silent="no eval sets rlctl evaluates on saved checkpoints")
def every(ctx: Context) -> list[Result] | None:
    from rlctl.evals.sets import checkpoint_sets

    sets = checkpoint_sets(ctx.recipe, ctx.backend)
    if not sets:
        return None
    ck = ctx.recipe.checkpoint.every
    total = ctx.total_steps
    base = ctx.recipe.eval.baseline
    out = []
    for s in sets:
        key = "eval.every" if s.legacy else f"eval.sets.{s.name}.every"
        if not ck:
            want = s.every or 10
            out.append(Result(NAME, WARN, f"eval set {s.name!r} is evaluated by rlctl on saved checkpoints and "
                              "checkpoint.every is unset: "
                              + ("only the step-0 baseline is evaluated" if base else "nothing is evaluated"),
                              f"set checkpoint.every = {want} (or a divisor of it)", {"set": s.name},
                              {"checkpoint.every": want}))
            continue
        if not s.every or s.every % ck == 0:
            step = s.every or ck
            out.append(Result(NAME, OK, f"eval set {s.name!r}: every {step} steps, on checkpoints saved every {ck} "
                              f"(at {_steps(step, total, baseline=base)})", None, {"set": s.name, "every": step}))
            continue
        real = math.lcm(ck, s.every)
        up = ck * math.ceil(s.every / ck)
        divisors = [d for d in range(s.every, 0, -1) if s.every % d == 0][:3]
        out.append(Result(
            NAME, WARN, f"{key} = {s.every} but checkpoint.every = {ck}: rlctl evaluates saved checkpoints only, so "
            f"{s.name!r} is evaluated at {_steps(real, total, baseline=base)} (every {real} steps), not every "
            f"{s.every}",
            f"set {key} = {up} (a multiple of checkpoint.every: {up}, {up + ck}, ...) or checkpoint.every = "
            f"{s.every} (a divisor of {s.every}: {', '.join(map(str, divisors))})",
            {"set": s.name, "every": s.every, "checkpoint_every": ck, "evaluated_every": real}, {key: up}))
    return out
