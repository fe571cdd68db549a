#!/usr/bin/env python3
"""Regenerate rlctl/backends/verl/snapshots/<version>.json from verl's released wheels (PyPI).

    python scripts/snapshot_verl.py 0.9.0 0.9.1

Each snapshot holds facts about one release's interface, read statically from the wheel (never verl's code):
- `keys`: every key path of verl/trainer/config/_generated_ppo_trainer.yaml (what Hydra accepts without `+`);
- `defaults`: the packaged default of the keys rlctl's render depends on;
- `reward_function_key`: where main_ppo reads the custom reward function from (verl/trainer/ppo/reward.py reads
  `config.reward.custom_reward_function`; releases whose main_ppo calls `migrate_legacy_reward_impl` also copy the
  top-level `custom_reward_function` there);
- `lr_scheduler_types`: the lr_scheduler_type values the FSDP engine accepts
  (verl/workers/engine/fsdp/transformer_impl.py);
- `trainer`: which trainer main_ppo runs by default (`v1` when trainer.use_v1 defaults to true).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlctl.backends._static import yaml_key_paths  # noqa: E402

OUT = ROOT / "rlctl" / "backends" / "verl" / "snapshots"
CACHE = Path(os.environ.get("RLCTL_TEST_CACHE", Path.home() / ".cache" / "rlctl-tests")) / "wheels"
CONFIG = "verl/trainer/config/_generated_ppo_trainer.yaml"
DEFAULTS = [
    "trainer.use_v1", "trainer.total_epochs", "trainer.total_training_steps", "trainer.resume_mode",
    "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep", "trainer.logger",
    "actor_rollout_ref.actor.optim.lr_scheduler_type", "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "actor_rollout_ref.actor.optim.min_lr_ratio",
    "actor_rollout_ref.actor.checkpoint.save_contents", "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.model.lora_rank", "critic.optim.lr", "critic.ppo_mini_batch_size",
    "reward.custom_reward_function.name",
]


def wheel(version: str) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob(f"verl-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(CACHE),
                        f"verl=={version}"], check=True)
        found = sorted(CACHE.glob(f"verl-{version}-*.whl"))
    return found[0]


def _select(tree: dict, dotted: str):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def snapshot(version: str) -> dict:
    with zipfile.ZipFile(wheel(version)) as zf:
        config = zf.read(CONFIG).decode()
        main_ppo = zf.read("verl/trainer/main_ppo.py").decode()
        engine = zf.read("verl/workers/engine/fsdp/transformer_impl.py").decode()
    tree = yaml.safe_load(config)
    keys = yaml_key_paths(config)
    migrates = "migrate_legacy_reward_impl(config)" in main_ppo
    reward_key = "reward.custom_reward_function" if "reward.custom_reward_function.path" in keys else (
        "custom_reward_function")
    return {
        "backend": "verl", "version": version,
        "source": f"verl=={version} {CONFIG}, verl/trainer/main_ppo.py, verl/workers/engine/fsdp/transformer_impl.py",
        "reward_function_key": reward_key,
        "migrates_legacy_reward": migrates,
        "lr_scheduler_types": sorted(set(re.findall(r'lr_scheduler_type == "(\w+)"', engine))),
        "trainer": "v1" if _select(tree, "trainer.use_v1") else "ray_trainer",
        "defaults": {k: _select(tree, k) for k in DEFAULTS},
        "keys": keys,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("versions", nargs="+")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for v in a.versions:
        path = OUT / f"{v}.json"
        path.write_text(json.dumps(snapshot(v), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
