"""TRL's checkpoints: the Trainer's `checkpoint-N/` folders; complete once trainer_state.json is written (last)."""

from __future__ import annotations

import re
from pathlib import Path

from rlctl.backends.layout import Checkpoint, ordered, scan

PATTERN = re.compile(r"^checkpoint-(\d+)$")


def find(root: Path) -> list[Checkpoint]:
    return ordered(scan([root], PATTERN, lambda p, step: (p / "trainer_state.json").is_file()))
