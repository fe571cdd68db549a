"""Disk: checkpoint size x how many are kept, against free space where checkpoints go."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlctl.core.sizes import human_bytes
from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check, existing_parent
from rlctl.runs.disk_pressure import GB, room_needed

human = human_bytes  # the one formatter (rlctl.core.sizes)


@check("disk.checkpoints", hosts="disk")
def checkpoints(ctx: Context) -> list[Result]:
    r = ctx.recipe
    out: list[Result] = []
    if isinstance(ctx.arch, Exception):
        return [Result("disk.checkpoints", SKIP, ctx.arch.message, ctx.arch.hint)]
    per, what = ctx.backend.checkpoint_bytes(ctx.arch, r)
    copies = ctx.backend.checkpoint_copies(r, ctx.total_steps)
    count = copies.total
    where = Path(r.checkpoint.dir)
    base = existing_parent(where)
    free = shutil.disk_usage(base).free
    data = {"per_checkpoint": per, "count": count, "copies": copies.words(), "free": free, "checked_at": str(base),
            "machine": ctx.machine}
    if count is None:
        out.append(Result("disk.checkpoints", WARN, f"{human(per)} per checkpoint ({what}); unknown count",
                          "set checkpoint.keep_last", data))
    else:
        need = room_needed(per * count, r.checkpoint.min_free_gb)  # the rule the supervisor stops a run by
        floor = room_needed(0, r.checkpoint.min_free_gb)
        note = "" if base == where.absolute() else f" (checked on {base}, the nearest existing parent)"
        kept_free = f" + checkpoint.min_free_gb {human(floor)}" if floor else ""
        figure = (f"{count} x {human(per)} ({what}){kept_free} = {human(need)}; {human(free)} free on "
                  f"{ctx.machine}{note}; {count} on disk at once: {copies.words()}")
        usable = free * (1 - r.preflight.disk_headroom)
        if need > usable and per * count <= usable:  # the checkpoints fit: what must stay free beside them does not
            out.append(Result("disk.checkpoints", FAIL, figure,
                              f"free {human(need - usable)} or more on this disk, or set checkpoint.min_free_gb <= "
                              f"{int((usable - per * count) // GB)} (the supervisor stops the run when less than "
                              "checkpoints + checkpoint.min_free_gb is free)", data))
        elif need > usable:
            [(fix, sets), *others] = _fixes(ctx, per, count, usable - floor)
            out.append(Result("disk.checkpoints", FAIL, figure, fix, data, set=sets,
                              other_fixes=[(t, s) for t, s in others if s]))
        else:
            out.append(Result("disk.checkpoints", OK, figure, None, data))
    return out + ctx.backend.preflight(ctx, "disk")


def _fixes(ctx: Context, per: float, count: int, usable: float) -> list[tuple[str, dict | None]]:
    """The computed fixes, best first (preflight offers the first that newly fails no other check: _fixes.vet): the
    keep_last that fits (counted as the check counts, Backend.checkpoint_copies), lighter checkpoints where the backend
    honours the key (without the optimizer; the adapter's own, e.g. what stops a save from writing more than it
    should), and last more disk (never a key the backend cannot honour, never the keep_last already set, never one
    below the backend's min_keep_last)."""
    from rlctl.preflight._fixes import apply, honoured

    r, b = ctx.recipe, ctx.backend
    out: list[tuple[str, dict | None]] = []
    keep = r.checkpoint.keep_last
    if per and r.checkpoint.every:
        one = b.checkpoint_copies(apply(r, {"checkpoint.keep_last": 1}), ctx.total_steps)
        k = int(usable // per) - (one.total - 1)  # the copies besides keep_last: the best-eval one, the one written
        k = min(k, keep - 1) if keep else k
        sets = {"checkpoint.keep_last": k}
        floor = b.min_keep_last(apply(r, {"checkpoint.keep_last": 1}))  # never one that empties itself in a save
        if k >= (floor[0] if floor else 1) and honoured(b, r, sets):
            copies = b.checkpoint_copies(apply(r, sets), ctx.total_steps)
            out.append((f"set checkpoint.keep_last = {k} ({copies.words()} x {human(per)} fit)", sets))
    lighter_sets = ([{"checkpoint.save_optimizer": False}] if r.checkpoint.save_optimizer else []) + \
        b.lighter_checkpoints(r)
    for sets in lighter_sets:
        if honoured(b, r, sets) and not isinstance(ctx.arch, Exception):
            lighter, what = b.checkpoint_bytes(ctx.arch, apply(r, sets))
            if lighter * count <= usable:
                keys = ", ".join(f"{k} = {json.dumps(v)}" for k, v in sets.items())
                out.append((f"set {keys} ({count} x {human(lighter)}: {what})", sets))
    short = per * count - usable
    return out + [(f"free {human(short)} or more on this disk, or point checkpoint.dir at a bigger one", None)]
