"""prime-rl's learning-rate schedule in plain Python: `trainer/scheduler.py` (identical at v0.3.0 and v0.8.0 but for
optimizer wrappers) composes torch's LinearLR, CosineAnnealingLR and SequentialLR; tests compare this with torch run on
the scheduler table prime-rl resolves (tests/conformance/test_prime_rl.py, tests/test_schedules.py)."""

from __future__ import annotations

import math


def _torch_linear_factor(t: int, start: float, end: float, total_iters: int) -> float:
    # torch.optim.lr_scheduler.LinearLR in closed form
    return start + (end - start) * min(t, total_iters) / total_iters if total_iters > 0 else end


def prime_rl_schedule(kind: str, lr: float, warmup: int, total: int, min_lr: float = 0.0,
                      decay_steps: int = 0) -> list[float]:
    """prime_rl.trainer.scheduler (v0.3.0, v0.8.0): constant, linear (WSD) and cosine, built from torch's LinearLR,
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
