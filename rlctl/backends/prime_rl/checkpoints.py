"""prime-rl's checkpoints on disk, under its output_dir (rlctl renders output_dir = checkpoint.dir), at v0.3.0 and
v0.8.0 alike:

    checkpoints/step_N/trainer/            the trainer's DCP checkpoint (model shards, optimizer, scheduler,
                                           progress; dataloader/rank_R.pt) — trainer/ckpt.py get_ckpt_path
        .metadata                          written by torch.distributed.checkpoint when the save finished
    weights/step_N/                        HF weights (or lora_adapters/) for inference/eval — ckpt.py
        STABLE                             touched after the weights are written (v0.3.0 trainer/ckpt.py:340-341,
                                           v0.8.0 trainer/ckpt.py:355-359,482)
    run_default/checkpoints/step_N/orchestrator/progress.pt
                                           the orchestrator's progress (and buffer) — orchestrator/ckpt.py:29-30
    run_default/broadcasts/step_N/         filesystem weight broadcasts; the trainer deletes them two steps on,
                                           except at multiples of ckpt.interval (v0.3.0 trainer/utils.py:256-265,
                                           v0.8.0 trainer/utils.py:657-671), which stay

prime-rl's own `ckpt.keep_last` deletes old checkpoints/step_N and weights/step_N (trainer/ckpt.py `maybe_clean`:
v0.3.0 lines 202-233 and 344-375, v0.8.0 lines 287-321 and 485-517). Nothing deletes the orchestrator's
run_default/checkpoints/step_N nor the broadcasts kept at checkpoint steps: they belong to the step's checkpoint here
(extra paths), so rlctl's pruning removes them with it, and `--resume` copies them (prime-rl resumes the orchestrator
from its own step directory and, with the filesystem broadcast, the weights from the kept broadcast).

What prime-rl already pruned leaves the step's orchestrator checkpoint and kept broadcast behind: such a step (no
trainer checkpoint) is listed as an incomplete checkpoint made of what remains, so rlctl's pruning removes it too.

A checkpoint is complete when the trainer's `.metadata` exists and the orchestrator's `progress.pt` exists: both are
what `ckpt.resume_step` loads (trainer/ckpt.py `load`, orchestrator/ckpt.py `load`).
"""

from __future__ import annotations

import re
from pathlib import Path

from rlctl.backends.layout import Checkpoint, ordered, scan

PATTERN = re.compile(r"^step_(\d+)$")
ORCHESTRATOR = Path("run_default")


def trainer_complete(step_dir: Path) -> bool:
    return (step_dir / "trainer" / ".metadata").is_file()


def orchestrator_complete(root: Path, step: int) -> bool:
    return (root / ORCHESTRATOR / "checkpoints" / f"step_{step}" / "orchestrator" / "progress.pt").is_file()


def weights_complete(root: Path, step: int) -> bool:
    return (root / "weights" / f"step_{step}" / "STABLE").is_file()


def parts(root: Path, step: int) -> list[Path]:
    """What belongs to a step besides checkpoints/step_N, in prime-rl's layout."""
    return [root / "weights" / f"step_{step}", root / ORCHESTRATOR / "checkpoints" / f"step_{step}",
            root / ORCHESTRATOR / "broadcasts" / f"step_{step}"]


def find(root: Path) -> list[Checkpoint]:
    """The checkpoints under prime-rl's output_dir `root`, oldest first."""
    found = scan([root / "checkpoints"], PATTERN,
                 lambda p, step: trainer_complete(p) and orchestrator_complete(root, step))
    # broadcasts alone are prime-rl's live hand-over to inference (it deletes them two steps on): never listed alone
    leftovers = scan([root / "weights", root / ORCHESTRATOR / "checkpoints"], PATTERN, lambda p, step: False)
    for step, c in leftovers.items():
        if step not in found:  # the trainer checkpoint is gone (prime-rl's keep_last): what it left is incomplete
            found[step] = Checkpoint(step, c.path, False)
    for step, c in found.items():
        c.extra_paths = [p for p in parts(root, step) if p != c.path and p.is_dir() and not p.is_symlink()]
    return ordered(found)
