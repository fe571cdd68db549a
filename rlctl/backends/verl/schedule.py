"""verl's LR schedule in plain Python (no torch at preflight time): verl/utils/torch_functional.py's
get_constant_schedule_with_warmup and get_cosine_schedule_with_warmup (zero_indexed_step=True, init_lr_ratio 0), as the
FSDP engine builds them (workers/engine/fsdp/transformer_impl.py _build_lr_scheduler). One value per scheduler step,
i.e. per verl iteration; tests/conformance/test_verl.py compares it with the release's own code to 1e-9.
"""

from __future__ import annotations

import math


def verl_schedule(kind: str, lr: float, warmup: int, total: int, min_lr_ratio: float = 0.0,
                  num_cycles: float = 0.5) -> list[float]:
    """verl.utils.torch_functional's get_constant/cosine_schedule_with_warmup (zero-indexed steps, init ratio 0)."""
    out = []
    for step in range(total):
        if kind == "constant":
            f = float(step) / float(max(1.0, warmup)) if step < warmup else 1.0
        elif kind == "cosine":
            if step < warmup:
                f = float(step) / float(max(1, warmup))
            else:
                progress = float(step - warmup) / float(max(1, total - warmup))
                x = math.cos(math.pi * float(num_cycles) * 2.0 * progress)
                f = max(min_lr_ratio, x * (1 - min_lr_ratio) * 0.5 + (1 + min_lr_ratio) * 0.5)
        else:
            raise ValueError(f"verl has no lr_scheduler_type {kind!r} (constant or cosine)")
        out.append(lr * f)
    return out
