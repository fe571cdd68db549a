"""Learning-rate schedules exactly as the backends compute them, in plain Python (no torch at preflight time).

Convention: `lrs[i]` is the learning rate used by optimizer step i+1, i.e. base_lr * lambda(i), because every
backend calls `scheduler.step()` after `optimizer.step()`. Tests compare these with the real implementations
(transformers' `get_scheduler`, torch's LinearLR/CosineAnnealingLR) to 1e-9 relative. verl's lives in its adapter.
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


def _torch_linear_factor(t: int, start: float, end: float, total_iters: int) -> float:
    # torch.optim.lr_scheduler.LinearLR in closed form
    return start + (end - start) * min(t, total_iters) / total_iters if total_iters > 0 else end


def prime_rl_schedule(kind: str, lr: float, warmup: int, total: int, min_lr: float = 0.0,
                      decay_steps: int = 0) -> list[float]:
    """prime_rl.trainer.scheduler (v0.3): constant, linear (WSD) and cosine, built from torch's LinearLR,
    CosineAnnealingLR and SequentialLR."""
    min_lr_factor = min_lr / lr if min_lr > 0 else 1e-8
    out = []
    for step in range(total):
        if kind == "constant":
            f = 1.0
        elif kind == "cosine":
            if warmup > 0 and step < warmup:
                f = _torch_linear_factor(step, min_lr_factor, 1.0, warmup)
            else:
                t = step - warmup if warmup > 0 else step
                t_max = total - warmup
                eta = min_lr + (lr - min_lr) * (1 + math.cos(math.pi * t / t_max)) / 2 if t_max > 0 else lr
                f = eta / lr
        elif kind == "linear":
            decay_start = total - decay_steps
            if warmup > 0 and step < warmup:
                f = _torch_linear_factor(step, min_lr_factor, 1.0, warmup)
            elif decay_steps > 0 and step >= decay_start:
                f = _torch_linear_factor(step - decay_start, 1.0, min_lr_factor, decay_steps - 1)
            else:
                f = 1.0
        else:
            raise ValueError(f"prime-rl has no scheduler {kind!r}")
        out.append(lr * f)
    return out


def sparkline(values: list[float], width: int = 40) -> str:
    """A one-line picture of a curve, resampled to `width` points."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]  # a NaN/inf reward happens
    if not values:
        return ""
    blocks = "▁▂▃▄▅▆▇█"
    n = len(values)
    pts = [values[min(n - 1, int(i * n / width))] for i in range(min(width, n))]
    lo, hi = min(pts), max(pts)
    if hi - lo <= 0:
        return blocks[-1] * len(pts) if hi > 0 else blocks[0] * len(pts)
    return "".join(blocks[int((v - lo) / (hi - lo) * (len(blocks) - 1))] for v in pts)
