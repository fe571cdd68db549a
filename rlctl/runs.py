"""Finding runs and their state."""

from __future__ import annotations

import os
from pathlib import Path


def runs_root() -> Path:
    """Where run directories live: $RLCTL_RUNS_DIR, else ./runs."""
    return Path(os.environ.get("RLCTL_RUNS_DIR", "runs"))
