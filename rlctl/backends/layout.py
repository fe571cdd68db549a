"""On-disk checkpoint layouts: the record adapters return and the directory scan they share."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from rlctl.core.checkpoint import Checkpoint


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
