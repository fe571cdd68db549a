"""Disk: checkpoint size x how many are kept, against free space where checkpoints go."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check, existing_parent


def human(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 1e3:.1f} kB"


@check("disk.checkpoints")
def checkpoints(ctx: Context) -> list[Result]:
    r = ctx.recipe
    out: list[Result] = []
    if isinstance(ctx.arch, Exception):
        return [Result("disk.checkpoints", SKIP, ctx.arch.message, ctx.arch.hint)]
    per, what = ctx.backend.checkpoint_bytes(ctx.arch, r)
    total_steps = ctx.total_steps
    every = r.checkpoint.every
    kept = ctx.backend.kept_checkpoints(r)
    if every is None:
        count = 1
    elif kept:
        count = kept + 1  # the next one is written before the oldest goes
    elif total_steps:
        count = ctx.backend.saved_checkpoints(r, total_steps)
    else:
        count = None
    where = Path(r.checkpoint.dir)
    base = existing_parent(where)
    free = shutil.disk_usage(base).free
    data = {"per_checkpoint": per, "count": count, "free": free, "checked_at": str(base), "machine": ctx.machine}
    if count is None:
        out.append(Result("disk.checkpoints", WARN, f"{human(per)} per checkpoint ({what}); unknown count",
                          "set checkpoint.keep_last", data))
    else:
        need = per * count
        note = "" if base == where.absolute() else f" (checked on {base}, the nearest existing parent)"
        figure = f"{count} x {human(per)} ({what}) = {human(need)}; {human(free)} free on {ctx.machine}{note}"
        usable = free * (1 - r.preflight.disk_headroom)
        if need > usable:
            fix, sets = _fix(ctx, per, count, usable)
            out.append(Result("disk.checkpoints", FAIL, figure, fix, data, set=sets))
        else:
            out.append(Result("disk.checkpoints", OK, figure, None, data))
    return out + ctx.backend.preflight(ctx, "disk")


def _fix(ctx: Context, per: float, count: int, usable: float) -> tuple[str, dict | None]:
    """The computed fix: the keep_last that fits, else checkpoints without the optimizer where the backend honours
    that, else more disk (never a key the backend cannot honour, never the keep_last already set)."""
    from rlctl.preflight._fixes import apply, honoured

    r = ctx.recipe
    fits = int(usable // per) if per else count  # checkpoints that fit; one more is written before the oldest goes
    if fits >= 2 and (r.checkpoint.keep_last is None or r.checkpoint.keep_last > fits - 1):
        sets = {"checkpoint.keep_last": fits - 1}
        if honoured(ctx.backend, r, sets):
            return f"set checkpoint.keep_last = {fits - 1} ({fits} x {human(per)} fit)", sets
    if r.checkpoint.save_optimizer:
        sets = {"checkpoint.save_optimizer": False}
        if honoured(ctx.backend, r, sets) and not isinstance(ctx.arch, Exception):
            lighter, _ = ctx.backend.checkpoint_bytes(ctx.arch, apply(r, sets))
            if lighter * count <= usable:
                return f"set checkpoint.save_optimizer = false ({count} x {human(lighter)})", sets
    short = per * count - usable
    return f"free {human(short)} or more on this disk, or point checkpoint.dir at a bigger one", None
