"""Pure half-precision weights with a learning rate too small to move them (docs/precision.md).

A bf16 number has 8 significant bits: a weight w changes only when the update exceeds half its spacing,
|w| * 2^-8 to 2^-9. AdamW's step is about lr per element (exactly lr on its first step), so a pure-bf16 parameter
moves only when |w| < ~2^8.5 * lr = 362 * lr (fp16: 11 bits, 2896 * lr). At lr 1e-6 that is |w| < 3.6e-4: about 1% of
weights drawn from N(0, 0.02), and measured on an H100, 1.6% of a Qwen2.5-0.5B-shaped model changed. The check
reads the weight magnitudes of a local model (safetensors, sampled, no torch), else assumes the usual std 0.02.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlctl.preflight import OK, WARN, Context, Result, check

MOVE_FACTOR = {"bfloat16": 2**8.5, "float16": 2**11.5}  # |w| below factor * lr moves under an update of lr
TYPICAL_STD = 0.02  # initializer_range of Qwen/Llama configs; trained linear weights are of this order
MIN_MOVING = 0.5  # warn when fewer weights than this can move at the configured lr


def moving_fraction_normal(lr: float, factor: float, std: float = TYPICAL_STD) -> float:
    """P(|w| < factor * lr) for w ~ N(0, std)."""
    return math.erf(factor * lr / (std * math.sqrt(2)))


def moving_fraction_local(path: str, lr: float, factor: float, sample: int = 16) -> float | None:
    """The same fraction measured on a local checkpoint's 2-D weights (sampled windows), or None."""
    p = Path(path)
    if not p.is_dir():
        return None
    try:
        from rlctl.runs.weights import FLOAT, _Reader, _to_float, _windows, tensors

        ts = [t for t in tensors(p).values() if len(t.shape) == 2 and t.dtype in FLOAT]
    except (OSError, ValueError, KeyError):
        return None
    if not ts:
        return None
    reader = _Reader()
    below = total = 0
    limit = factor * lr
    try:
        for t in ts[:: max(len(ts) // 64, 1)]:
            for lo, hi in _windows(t.numel, sample):
                vals = _to_float(reader.read(t, lo, min(hi, lo + 4096)), t.dtype)
                below += sum(1 for v in vals if abs(float(v)) < limit)
                total += len(vals)
    finally:
        reader.close()
    return below / total if total else None


@check("precision.bf16_updates")
def bf16_updates(ctx: Context) -> Result | None:
    r = ctx.recipe
    if r.lora is not None:
        return None  # adapters are fp32 (mixed) or start at zero; the frozen base is not updated
    param = ctx.backend.param_dtype(r)
    factor = MOVE_FACTOR.get(param)
    if factor is None:
        return Result("precision.bf16_updates", OK, f"trainer updates {param} master weights (model.precision = "
                      f"{r.model.precision!r}): an lr of {r.optim.lr:g} moves them", None, {"param_dtype": param})
    lr = r.optim.lr
    measured = moving_fraction_local(r.model.path, lr, factor)
    frac = measured if measured is not None else moving_fraction_normal(lr, factor)
    basis = "of this model's weights (sampled)" if measured is not None else f"of weights ~N(0, {TYPICAL_STD})"
    needed = 1.645 * TYPICAL_STD / factor  # moves 90% of N(0, 0.02) weights
    data = {"param_dtype": param, "lr": lr, "moving_fraction": frac, "threshold": factor * lr,
            "lr_for_90_percent": needed}
    figure = (f"pure {param} parameters, lr {lr:g}: an AdamW step (~lr) changes only weights with |w| < "
              f"{factor * lr:.2g}, {frac:.1%} {basis}")
    if frac < MIN_MOVING:
        return Result("precision.bf16_updates", WARN, figure + "; the rest never change while loss and rewards log",
                      f'set model.precision = "mixed" (fp32 master weights, bf16 compute: what FSDP and '
                      f"DeepSpeed do), or optim.lr >= {needed:.1g}", data)
    return Result("precision.bf16_updates", OK, figure, None, data)


@check("precision.supported")
def supported(ctx: Context) -> Result | None:
    r = ctx.recipe
    if r.model.precision in ctx.backend.precisions:
        return None
    return Result("precision.supported", WARN,
                  f"{r.backend.name} renders model.precision = {', '.join(map(repr, ctx.backend.precisions))} only: "
                  f"{r.model.precision!r} is not honoured (the trainer keeps fp32 master weights; the memory plan "
                  "assumes them)", 'remove model.precision or set it to "mixed"', {"supported": ctx.backend.precisions})
