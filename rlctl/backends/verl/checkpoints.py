"""verl's checkpoints, as its v1 trainer writes them (verl/trainer/ppo/v1/trainer_base.py `_save_checkpoint`):

    <default_local_dir>/global_step_N/actor/model_world_size_W_rank_R.pt   (+ optim_*, extra_state_*: one per rank)
    <default_local_dir>/global_step_N/actor/huggingface/                   (config + tokenizer; weights with hf_model)
    <default_local_dir>/global_step_N/critic/...                           (PPO only, same files)
    <default_local_dir>/global_step_N/data.pt                              (dataloader state)
    <default_local_dir>/latest_checkpointed_iteration.txt                  (written after the step's save finished)

A step is complete when the tracker names it or a later step, and its actor (and critic, if any) holds a model shard
for every rank. verl's rotation (max_actor_ckpt_to_keep) deletes only `actor/` and `critic/` and leaves
`global_step_N/data.pt` behind: such a directory is listed as incomplete, so pruning removes it.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlctl.backends.layout import Checkpoint, ordered, read_int, scan

PATTERN = re.compile(r"^global_step_(\d+)$")
MARKER = "latest_checkpointed_iteration.txt"
SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


def _shards_complete(role_dir: Path) -> bool:
    try:
        names = [p.name for p in role_dir.iterdir()]
    except OSError:
        return False
    ranks: dict[int, set[int]] = {}
    for name in names:
        m = SHARD.match(name)
        if m:
            ranks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    return any(found == set(range(world)) for world, found in ranks.items())


def is_complete(step_dir: Path, step: int, latest: int | None) -> bool:
    if latest is None or step > latest:
        return False
    roles = [step_dir / "actor"] + ([step_dir / "critic"] if (step_dir / "critic").exists() else [])
    return all(_shards_complete(r) for r in roles)


def find(root: Path) -> list[Checkpoint]:
    latest = read_int(root / MARKER)
    found = ordered(scan([root], PATTERN, lambda p, step: is_complete(p, step, latest)))
    for c in found:  # the HF export an evaluator loads: weights there only with "hf_model" in save_contents;
        # for a LoRA actor verl's merger writes the frozen base there and the trained adapter in lora_adapter/
        # (model_merger/base_model_merger.py save_lora_adapter): the adapter first, on the recipe's base model
        hf = c.path / "actor" / "huggingface"
        c.model_paths = [hf / "lora_adapter", hf]
    return found


def merge_argv(ckpt: Path) -> list[str]:
    """verl's own tool that turns a checkpoint's FSDP shards into an HF model where an evaluator looks for it (the
    actor's huggingface/, beside the config and tokenizer verl saved there)."""
    return ["-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", f"{ckpt}/actor",
            "--target_dir", f"{ckpt}/actor/huggingface"]


def merge_command(ckpt: Path) -> str:
    return "python " + " ".join(merge_argv(ckpt))
