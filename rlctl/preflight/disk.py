"""Disk: checkpoint size x how many are kept, against free space where checkpoints go."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check, existing_parent


def checkpoint_bytes(ctx: Context) -> tuple[float, str]:
    """Bytes one checkpoint takes, and what it holds, as each backend writes it."""
    r = ctx.recipe
    arch = ctx.arch
    P = arch.params
    T = arch.lora_params(r.lora.rank, r.lora.target_modules) if r.lora else P
    keep_opt = r.checkpoint.save_optimizer
    name = r.backend.name
    if name == "prime_rl":  # trainer: fp32 FSDP shards + optimizer; plus bf16 weights for inference
        return P * 4 + (T * 8 if keep_opt else 0) + P * 2, "fp32 model shards + optimizer + bf16 weights/"
    if name == "verl":
        return P * 4 + (T * 8 if keep_opt else 0), "FSDP model + optimizer shards"
    if name == "openrlhf":
        hf = T * 2 if r.lora else P * 2
        ds = (P * 2 + T * 12) if keep_opt else 0
        return hf + ds, ("HF " + ("adapter" if r.lora else "weights")) + (" + DeepSpeed states" if keep_opt else "")
    w = 2 if r.model.dtype in ("bfloat16", "float16") else 4
    return (T * w if r.lora else P * w) + (T * 2 * 4 if keep_opt else 0), "HF model + optimizer"


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
    per, what = checkpoint_bytes(ctx)
    total_steps = ctx.total_steps
    every = r.checkpoint.every
    if every is None:
        count = 1
    elif r.checkpoint.keep_last:
        count = r.checkpoint.keep_last + 1  # the next one is written before the oldest goes
    elif total_steps:
        count = max(total_steps // every, 1)
    else:
        count = None
    where = Path(r.checkpoint.dir)
    base = existing_parent(where)
    free = shutil.disk_usage(base).free
    data = {"per_checkpoint": per, "count": count, "free": free, "checked_at": str(base)}
    if count is None:
        out.append(Result("disk.checkpoints", WARN, f"{human(per)} per checkpoint ({what}); unknown count",
                          "set checkpoint.keep_last", data))
    else:
        need = per * count
        note = "" if base == where.absolute() else f" (checked on {base}, the nearest existing parent)"
        figure = f"{count} x {human(per)} ({what}) = {human(need)}; {human(free)} free{note}"
        usable = free * (1 - r.preflight.disk_headroom)
        if need > usable:
            out.append(Result("disk.checkpoints", FAIL, figure,
                              "set checkpoint.keep_last, checkpoint.save_optimizer = false, or a bigger disk", data))
        else:
            out.append(Result("disk.checkpoints", OK, figure, None, data))
    if r.backend.name == "prime_rl" and r.checkpoint.keep_last:
        out.append(Result("disk.keep_last", WARN,
                          "prime-rl's ckpt.keep_last does not delete old checkpoints (seen in the seeds)",
                          "rlctl launch prunes to checkpoint.keep_last itself while the run goes"))
    if r.backend.name == "openrlhf" and r.checkpoint.save_optimizer:
        out.append(Result("disk.deepspeed", WARN,
                          "DeepSpeed checkpoints are on (OpenRLHF's default): optimizer + model states every save",
                          "set checkpoint.save_optimizer = false (--disable_ds_ckpt) if HF checkpoints suffice"))
    if (r.backend.name == "openrlhf" and r.lora and r.train.zero_stage == 3
            and (r.patches.set or "") != f"openrlhf/{r.backend.version}"):
        out.append(Result("disk.lora_zero3", WARN,
                          "OpenRLHF LoRA + ZeRO-3 saves full-model shards next to the adapter (~200 GB for 20B)",
                          "apply the openrlhf save_model patch set (patches.set) or use ZeRO-2"))
    return out
