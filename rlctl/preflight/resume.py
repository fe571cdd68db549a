"""checkpoint.resume = N names a step: its checkpoint must be where the backend looks for it (the recipe's checkpoint
directory, listed by the backend's own layout: Backend.checkpoints), or TRL, verl, prime-rl and the command backend
fail at start. Checked where the directory is here and readable; skipped, with why, where it is not."""

from __future__ import annotations

import os
from pathlib import Path

from rlctl.preflight import FAIL, OK, SKIP, Context, Result, check
from rlctl.preflight.references import where

NAME = "checkpoint.resume"


@check(NAME, silent="checkpoint.resume is not a step (off or latest)")
def resume_step(ctx: Context) -> Result | None:
    r = ctx.recipe
    step = r.checkpoint.resume
    if not isinstance(step, int):  # off, or latest: the newest there is, or the start
        return None
    if any(f.key == NAME for f in ctx.backend.unhonoured(r)):  # the backend does not ask for step N (OpenRLHF loads
        return None  # what _actor/latest names): its unhonoured finding says so, and nothing fails at start
    key = f"checkpoint.resume = {step} ({where(ctx, NAME)})"
    data = {"step": step, "dir": r.checkpoint.dir}
    staged = getattr(ctx.prepared, "resume_source", None)
    if staged:  # launch --resume RUN|URL puts that checkpoint into the new run's directory before the run starts
        return Result(NAME, OK, f"step {step}: {staged}", None, data)
    root = Path(r.checkpoint.dir)
    if not root.is_absolute():
        return Result(NAME, FAIL, f"{key}: no checkpoint of step {step} there: checkpoint.dir {r.checkpoint.dir!r} is "
                      "inside the new run's directory, which holds none when the run starts (steps there: none)",
                      "resume a run's checkpoint with rlctl launch RECIPE --resume RUN, or set checkpoint.dir to the "
                      "absolute path of the checkpoints, or checkpoint.resume = \"latest\" (the newest there is, else "
                      "the start)", data, {"checkpoint.resume": "latest"})
    try:
        here = root.is_dir()
        readable = here and os.access(root, os.R_OK | os.X_OK)
        ckpts = ctx.backend.checkpoints(root) if readable else []
    except OSError as e:
        return Result(NAME, SKIP, f"{key}: {root} could not be read ({e.strerror or e}): not checked", None, data)
    if not here:
        res = r.resources
        if res.executor != "local" and res.ray_address:  # read on the cluster, not here
            return Result(NAME, SKIP, f"{key}: {root} is not on this machine (the run reads it on the cluster): not "
                          "checked", None, data)
        return Result(NAME, FAIL, f"{key}: {root} does not exist, so there is no checkpoint of step {step} (steps "
                      "there: none)", "point checkpoint.dir at the run's checkpoints, or set checkpoint.resume = "
                      "\"latest\" (the newest there is, else the start)", data, {"checkpoint.resume": "latest"})
    if not readable:
        return Result(NAME, SKIP, f"{key}: {root} cannot be read here (permissions): not checked", None, data)
    complete = [c.step for c in ckpts if c.complete]
    if step in complete:
        return Result(NAME, OK, f"step {step}: a complete checkpoint in {root}", None, data)
    partial = [c.step for c in ckpts if not c.complete]
    there = ", ".join(map(str, complete)) or "none"
    data.update(complete=complete, incomplete=partial)
    why = "is incomplete" if step in partial else "does not exist"
    return Result(NAME, FAIL, f"{key}: the checkpoint of step {step} {why} in {root} (complete steps there: {there}"
                  + (f"; incomplete: {', '.join(map(str, partial))}" if partial else "") + ")",
                  (f"set checkpoint.resume to one of {there} (or \"latest\": step {complete[-1]})" if complete else
                   "set checkpoint.resume = \"latest\" (the start, while none is complete)"), data,
                  {"checkpoint.resume": complete[-1] if complete else "latest"})
