"""verl's checkpoints: `global_step_N/` under default_local_dir; complete up to the step named in
latest_checkpointed_iteration.txt, which verl writes after a save finishes."""

from __future__ import annotations

import re
from pathlib import Path

from rlctl.backends.layout import Checkpoint, ordered, read_int, scan

PATTERN = re.compile(r"^global_step_(\d+)$")
MARKER = "latest_checkpointed_iteration.txt"


def find(root: Path) -> list[Checkpoint]:
    latest = read_int(root / MARKER)
    return ordered(scan([root], PATTERN, lambda p, step: latest is not None and step <= latest))
