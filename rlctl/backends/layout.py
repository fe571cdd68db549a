"""On-disk checkpoint layouts: the record adapters return and the directory scan they share."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Checkpoint:
    step: int
    path: Path
    complete: bool
    extra_paths: list[Path] = field(default_factory=list)  # e.g. prime-rl's weights/step_N next to it

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


def scan(
    bases: Iterable[Path], pattern: re.Pattern[str], complete: Callable[[Path, int], bool]
) -> dict[int, Checkpoint]:
    """Step-named directories under `bases`. Symlinks are never checkpoints (a link named like a newer step must not
    make pruning delete the real newest one); a step found twice (e.g. DeepSpeed state + HF export) is one
    checkpoint with extra paths, complete only if every part is."""
    found: dict[int, Checkpoint] = {}
    for base in bases:
        try:
            entries = sorted(base.iterdir())
        except OSError:
            continue
        for p in entries:
            m = pattern.match(p.name)
            if not m or p.is_symlink() or not p.is_dir():
                continue
            step = int(m.group(1))
            done = complete(p, step)
            if step in found:
                found[step].extra_paths.append(p)
                found[step].complete = found[step].complete and done
            else:
                found[step] = Checkpoint(step, p, done)
    return found


def ordered(found: dict[int, Checkpoint]) -> list[Checkpoint]:
    return [found[s] for s in sorted(found)]


def read_int(path: Path) -> int | None:
    """An integer written in a marker file (verl's latest_checkpointed_iteration.txt, DeepSpeed's `latest`)."""
    try:
        digits = re.sub(r"\D", "", path.read_text(errors="replace")[:100])
    except OSError:
        return None
    return int(digits) if digits else None
