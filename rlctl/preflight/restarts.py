"""A restart policy needs checkpoints to restart from: without them (or without the state the backend resumes from:
Backend.restart_loses) a restart trains from step 0 again or without its optimizer state; and a
keep_last the backend's own rotation empties during each save leaves none while a checkpoint is written."""

from __future__ import annotations

from rlctl.preflight import OK, WARN, Context, Result, check

NAME = "run.restart"


@check(NAME, silent="run.restart = \"never\": no restart to prepare for")
def restart_from(ctx: Context) -> list[Result] | None:
    r = ctx.recipe
    mode = r.run.restart
    if mode == "never":
        return None
    loses = ctx.backend.restart_loses(r) if r.checkpoint.every else None
    if loses:
        return [Result(NAME, WARN, f"restart = {mode!r} with {loses}",
                       "set checkpoint.save_optimizer = true (larger checkpoints), or accept what a restart resumes",
                       {"mode": mode, "every": r.checkpoint.every}, {"checkpoint.save_optimizer": True})]
    if r.checkpoint.every:
        return [Result(NAME, OK, f"restart {mode}: from the newest complete checkpoint (saved every "
                       f"{r.checkpoint.every} steps)", None, {"mode": mode, "every": r.checkpoint.every})]
    want = max(1, (ctx.total_steps or 100) // 10)
    return [Result(NAME, WARN, f"restart = {mode!r} and checkpoint.every is unset: unless the trainer saves "
                   "checkpoints on its own, a restart trains again from step 0",
                   f"set checkpoint.every = {want}", {"mode": mode}, {"checkpoint.every": want})]


KEEP = "run.keep_last"


@check(KEEP, silent="checkpoint.keep_last unset or at least the backend's floor")
def keep_last(ctx: Context) -> Result | None:
    keep = ctx.recipe.checkpoint.keep_last
    floor = ctx.backend.min_keep_last(ctx.recipe) if keep else None
    if keep is None or floor is None or keep >= floor[0]:
        return None
    n, why = floor
    return Result(KEEP, WARN, f"checkpoint.keep_last = {keep}: {why}, so while each checkpoint is written no complete "
                  "checkpoint is on disk: a kill then (a crash, out of memory, preemption) leaves nothing to restart "
                  "or resume from, and every step is lost",
                  f"set checkpoint.keep_last = {n}: one complete checkpoint stays while the next is written",
                  {"keep_last": keep, "min_keep_last": n}, {"checkpoint.keep_last": n})
