"""OpenRLHF's checkpoints: DeepSpeed states `_actor/global_stepN/` (complete up to the `latest` tag DeepSpeed writes
last) and HF exports `global_stepN_hf/` (complete once the model/adapter config is written)."""

from __future__ import annotations

import re
from pathlib import Path

from rlctl.backends.layout import Checkpoint, ordered, read_int, scan

PATTERN = re.compile(r"^global_step(\d+)(?:_hf)?$")


def _complete(path: Path, step: int) -> bool:
    if path.name.endswith("_hf"):
        return any((path / f).is_file() for f in ("adapter_config.json", "config.json"))
    latest = read_int(path.parent / "latest")
    return latest is not None and latest >= step


def find(root: Path) -> list[Checkpoint]:
    try:
        bases = [root, *(d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and d.name.startswith("_"))]
    except OSError:
        return []
    return ordered(scan(bases, PATTERN, _complete))
