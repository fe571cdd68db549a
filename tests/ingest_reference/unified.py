"""One metrics stream whatever the backend: JSON lines with `step` and `time`, DESIGN.md's unified names, and
`<backend>/<key>` for everything else (nothing is dropped)."""

from __future__ import annotations

from typing import Any

UNIFIED = (
    "reward/mean", "reward/std", "correctness", "response_length/mean", "response_length/clip_ratio", "kl",
    "entropy", "policy_loss", "grad_norm", "clip_ratio", "lr", "advantage/mean", "advantage/std",
    "throughput/tokens_per_s", "time/step_s", "time/generation_s", "time/train_s",
)


_INF = float("inf")


def clean_value(v: Any) -> float | int | str | bool | None:
    """Numbers stay numbers (numeric strings too); NaN and infinities become None so the stream stays JSON."""
    t = type(v)
    if t is float:
        return v if (v == v and v != _INF and v != -_INF) else None
    if t is int or t is bool or v is None:
        return v
    if t is str:
        try:
            f = float(v)
        except ValueError:
            return v.strip()
        if f != f or f == _INF or f == -_INF:
            return None
        if f.is_integer() and v.strip().lstrip("+-").isdigit():
            return int(f)
        return f
    if isinstance(v, (int, float)):
        return clean_value(float(v)) if isinstance(v, float) else int(v)
    return str(v)


def unify(backend: str, raw: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """Map a backend's keys to unified names; unmapped keys pass through as `<backend>/<key>`."""
    out: dict[str, Any] = {}
    get = mapping.get
    for k, v in raw.items():
        if k == "step" or k == "time":
            continue
        out[get(k) or f"{backend}/{k}"] = clean_value(v)
    return out
