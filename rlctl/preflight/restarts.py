"""A restart policy needs checkpoints to restart from: without them every restart trains from step 0 again."""

from __future__ import annotations

from rlctl.preflight import OK, WARN, Context, Result, check

NAME = "run.restart"


@check(NAME)
def restart_from(ctx: Context) -> list[Result] | None:
    r = ctx.recipe
    mode = r.run.restart
    if mode == "never":
        return None
    if r.checkpoint.every:
        return [Result(NAME, OK, f"restart {mode}: from the newest complete checkpoint (saved every "
                       f"{r.checkpoint.every} steps)", None, {"mode": mode, "every": r.checkpoint.every})]
    want = max(1, (ctx.total_steps or 100) // 10)
    return [Result(NAME, WARN, f"restart = {mode!r} and checkpoint.every is unset: unless the trainer saves "
                   "checkpoints on its own, a restart trains again from step 0",
                   f"set checkpoint.every = {want}", {"mode": mode}, {"checkpoint.every": want})]
