"""Bytes as a person reads them, in one place: every size rlctl prints (checkpoints in `ckpt list` and `status`,
free disk, what a save needs) goes through human_bytes, so a 1.1 MB LoRA adapter never reads "0.00 GB"."""

from __future__ import annotations

_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6))


def human_bytes(n: float) -> str:
    """47.0 GB, 1.1 MB, 300 kB, 12 B: the largest unit the size reaches."""
    for unit, scale in _UNITS:
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.0f} kB" if n >= 1e3 else f"{n:.0f} B"
