"""A checkpoint as every part of rlctl sees it: its step, where it lies, whether it is complete."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Checkpoint:
    step: int
    path: Path
    complete: bool
    extra_paths: list[Path] = field(default_factory=list)  # e.g. prime-rl's weights/step_N next to it
    # where an evaluator looks first for a loadable model, inside the checkpoint (verl's actor/huggingface)
    model_paths: list[Path] = field(default_factory=list)

    def paths(self) -> list[Path]:
        return [self.path, *self.extra_paths]

    def size(self) -> int:
        total = 0
        for root in self.paths():
            if root.is_symlink():
                continue
            if root.is_file():
                total += root.stat().st_size
                continue
            for p in root.rglob("*"):
                if p.is_file() and not p.is_symlink():
                    total += p.stat().st_size
        return total
