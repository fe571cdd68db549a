"""prime-rl's checkpoints: `step_N/` (under `checkpoints/` when present) with the optimizer state written last, and
the matching `weights/step_N/` for inference."""

from __future__ import annotations

import re
from pathlib import Path

from rlctl.backends.layout import Checkpoint, ordered, scan

PATTERN = re.compile(r"^step_(\d+)$")


def _complete(path: Path, step: int) -> bool:
    try:
        return any(p.name.startswith("optimizer") for p in path.iterdir())
    except OSError:
        return False


def find(root: Path) -> list[Checkpoint]:
    base = root / "checkpoints" if (root / "checkpoints").is_dir() else root
    found = ordered(scan([base], PATTERN, _complete))
    for c in found:
        w = root / "weights" / f"step_{c.step}"
        if w.is_dir() and not w.is_symlink():
            c.extra_paths.append(w)
    return found
