"""One metrics stream whatever the backend: JSON lines with `step` and `time`, DESIGN.md's unified names, and
`<backend>/<key>` for everything else (nothing is dropped)."""

from __future__ import annotations

import math
from typing import Any

UNIFIED = (
    "reward/mean", "reward/std", "correctness", "response_length/mean", "response_length/clip_ratio", "kl",
    "entropy", "policy_loss", "grad_norm", "clip_ratio", "lr", "advantage/mean", "advantage/std",
    "throughput/tokens_per_s", "time/step_s", "time/generation_s", "time/train_s",
)


def clean_value(v: Any) -> float | int | str | bool | None:
    """Numbers stay numbers (numeric strings too); NaN and infinities become None so the stream stays JSON."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v if isinstance(v, int) or math.isfinite(v) else None
    if isinstance(v, str):
        s = v.strip()
        try:
            f = float(s)
        except ValueError:
            return s
        if not math.isfinite(f):
            return None
        if f.is_integer() and s.lstrip("+-").isdigit():
            return int(f)
        return f
    if v is None:
        return None
    return str(v)


def unify(backend: str, raw: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """Map a backend's keys to unified names; unmapped keys pass through as `<backend>/<key>`."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if k in ("step", "time"):
            continue
        name = mapping.get(k)
        if name is None:
            for prefix, target in mapping.items():
                if prefix.endswith("/*") and k.startswith(prefix[:-1]):
                    name = target + k[len(prefix) - 1:]
                    break
        out[name or f"{backend}/{k}"] = clean_value(v)
    return out
