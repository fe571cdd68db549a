"""OpenRLHF's checkpoints under --ckpt_path (the same in every release 0.9.3-0.11.2):

- `_actor/global_stepN/` (and `_critic/` with ppo): DeepSpeed states, written by `strategy.save_ckpt`
  (utils/deepspeed/deepspeed.py) through DeepSpeed's `save_checkpoint(save_dir, tag, save_latest=True)`, which
  writes the tag directory first and the `latest` file (holding the tag) last: complete when `latest` names this step
  or a later one. `save_ckpt` deletes the oldest (by mtime) until fewer than --max_ckpt_num remain before saving;
  from 0.9.9 `best_global_stepN` tags are kept apart (only the newest best stays).
- `global_stepN_hf/`: the HF export (`ppo_actor.save_checkpoint`, `os.path.join(ckpt_path, f"{tag}_hf")`), written by
  `strategy.save_model`: weights or adapter, then `config.json`, then the tokenizer — complete once
  `tokenizer_config.json` is there. OpenRLHF never deletes these (nor `best_global_stepN_hf`), in any release.

`best_*` checkpoints are not rlctl's to prune (its pattern skips them); rlctl renders `--best_metric_key none` when
it must hold keep_last.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlctl.backends.layout import Checkpoint, ordered, read_int, scan

PATTERN = re.compile(r"^global_step(\d+)(?:_hf)?$")
HF_DONE = "tokenizer_config.json"  # strategy.save_model writes the tokenizer last


def _complete(path: Path, step: int) -> bool:
    if path.name.endswith("_hf"):
        has_model = any((path / f).is_file() for f in ("adapter_config.json", "config.json"))
        return has_model and (path / HF_DONE).is_file()
    latest = read_int(path.parent / "latest")
    return latest is not None and latest >= step


def find(root: Path) -> list[Checkpoint]:
    try:
        bases = [root, *(d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and d.name.startswith("_"))]
    except OSError:
        return []
    found = scan(bases, PATTERN, _complete)
    # `_actor/latest` belongs to the checkpoint it names: resuming (DeepSpeed's load_checkpoint with no tag) reads it,
    # so a copy of that checkpoint (rlctl launch --resume) must take it along
    for base in bases[1:]:
        latest = base / "latest"
        step = read_int(latest)
        if step in found and latest.is_file() and not latest.is_symlink():
            found[step].extra_paths.append(latest)
    return ordered(found)
