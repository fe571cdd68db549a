"""Learning-rate schedules exactly as the backends compute them, in plain Python (no torch at preflight time).

Convention: `lrs[i]` is the learning rate used by optimizer step i+1, i.e. base_lr * lambda(i), because every
backend calls `scheduler.step()` after `optimizer.step()`. Tests compare these with the real implementations
(transformers' `get_scheduler`, torch's LinearLR/CosineAnnealingLR) to 1e-9 relative. verl's and prime-rl's live in
their adapters.
"""

from __future__ import annotations

import math


def hf_lambda(name: str, step: int, warmup: int, total: int, min_lr_rate: float = 0.0,
              num_cycles: float = 0.5) -> float:
    """transformers.optimization's lr lambdas (the schedulers OpenRLHF and TRL call through get_scheduler)."""
    s = float(step)
    if name == "constant":
        return 1.0
    if name == "constant_with_warmup":
        return s / float(max(1.0, warmup)) if s < warmup else 1.0
    if name == "linear":
        if s < warmup:
            return s / float(max(1, warmup))
        return max(0.0, float(total - step) / float(max(1, total - warmup)))
    if name in ("cosine", "cosine_with_min_lr"):
        if s < warmup:
            return s / float(max(1, warmup))
        progress = float(step - warmup) / float(max(1, total - warmup))
        factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
        if name == "cosine":
            return max(0.0, factor)
        factor = factor * (1 - min_lr_rate) + min_lr_rate
        return max(0, factor)
    raise ValueError(f"unknown transformers scheduler {name!r}")


def hf_schedule(name: str, lr: float, warmup: int, total: int, min_lr_rate: float = 0.0) -> list[float]:
    return [lr * hf_lambda(name, i, warmup, total, min_lr_rate) for i in range(total)]


def sparkline(values: list[float], width: int = 40) -> str:
    """A one-line picture of a curve: every value when there are at most `width`, else `width` points resampled
    evenly from the first to the newest (the last character is always the newest value)."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]  # a NaN/inf reward happens
    if not values:
        return ""
    blocks = "▁▂▃▄▅▆▇█"
    n = len(values)
    if n <= width:
        pts = values
    elif width <= 1:
        pts = values[-1:]
    else:
        pts = [values[round(i * (n - 1) / (width - 1))] for i in range(width)]
    lo, hi = min(pts), max(pts)
    if hi - lo <= 0:
        return blocks[-1] * len(pts) if hi > 0 else blocks[0] * len(pts)
    return "".join(blocks[int((v - lo) / (hi - lo) * (len(blocks) - 1))] for v in pts)
