#!/usr/bin/env python3
"""The memory plan against every measured trainer configuration (docs/gpu/gpu_*_h100*.json), as markdown tables.

Each bench grid maps to the recipe whose plan it checks: the FSDP2 grids (bench/gpu_fsdp.py) to the prime-rl recipe
with the features the bench ran, the FSDP1 grid to verl's recipe, the DeepSpeed grid (bench/gpu_deepspeed.py) to
OpenRLHF's. tests/test_memory.py uses the same mappings; docs/memory.md prints these tables.

    python bench/memory_report.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOCS = ROOT / "docs" / "gpu"  # the raw data of every GPU run
RECIPES = ROOT / "recipes"
PRIME_SHARED = RECIPES / "prime-rl-qwen2.5-7b-1xh100-shared.toml"
VERL = RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"
OPENRLHF = RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml"

FSDP_RAW = ["gpu_fsdp_h100.json", "gpu_fsdp_h100_heldout.json", "gpu_fsdp_h100_b.json"]
DP2_RAW = ["gpu_fsdp_h200x2_dp2.json"]  # 2 GPUs: FSDP2 (d2-*, the prime-rl recipe) and FSDP1 (dv2-*, verl's)
VERL_RAW = ["gpu_fsdp1_verl_h100.json", "gpu_fsdp1_verl_h100_heldout.json"]
DS_RAW = ["gpu_deepspeed_h100.json", "gpu_deepspeed_h100_heldout.json"]


def rows(files: list[str]) -> list[dict[str, Any]]:
    return [r for f in files for r in json.loads((DOCS / f).read_text())["results"] if "error" not in r]


def _plan(recipe: Path, sets: list[str], row: dict[str, Any], features: Any = None):
    from rlctl.estimate.memory import trainer_memory
    from rlctl.recipe.models import KNOWN
    from rlctl.recipe.planning import prepare

    prep = prepare(recipe, sets)
    if not row["lora"]:
        prep.recipe.lora = None
    return trainer_memory(prep.recipe, KNOWN[row["shape"].lower()], features=features)


def fsdp_plan(row: dict[str, Any]):
    """The prime-rl recipe with the same shape and the features the bench ran (not prime-rl's defaults)."""
    from rlctl.backends.base import MemoryFeatures

    every = row.get("every", 1 if row["ac"] else 0)
    chunk = {"full": None, "v03": row["mb"] * row["seq"] * 2048, "v08": 1024 * 8192}[row.get("head", "full")]
    f = MemoryFeatures(checkpoint_every=every or None, activation_offload=row.get("offload") or None,
                       optimizer=row.get("optim", "gpu"), logits_chunk=chunk)
    dp = row.get("gpus", 1)
    return _plan(PRIME_SHARED, [f"train.seq_len={row['seq']}", f"train.micro_batch_size={row['mb']}",
                                f"train.train_batch_size={row['mb'] * dp}", f"lora.rank={row['lora'] or 8}",
                                f"train.gradient_checkpointing={'true' if every else 'false'}",
                                f"resources.gpus_per_node={dp}", f"resources.trainer_gpus={list(range(dp))}",
                                "resources.inference_gpus=[0]"], row, f)


def verl_plan(row: dict[str, Any]):
    """verl's recipe: packed tokens (prompt + response = the bench's sequence), temperature 0.6, no dynamic
    batching, no reference model; FSDP1, the engine the grid ran (LoRA included: rlctl now renders FSDP2 for a LoRA
    recipe, rlctl/backends/verl/__init__.py LORA_SYNC)."""
    seq, mb, dp = row["seq"], row["mb"], row.get("gpus", 1)
    return _plan(VERL, [f"model.path={row['shape']}", f"data.max_prompt_tokens={seq // 2}",
                        f"rollout.max_tokens={seq // 2}", f"model.max_model_len={max(seq, 4096)}",
                        f"train.micro_batch_size={mb}", f"train.train_batch_size={mb * dp}",
                        'backend.verl.extra={"actor_rollout_ref.actor.strategy"="fsdp"}',
                        f"resources.gpus_per_node={dp}",
                        f"train.gradient_checkpointing={'true' if row['ac'] else 'false'}", "algorithm.kl_coef=0",
                        "algorithm.use_kl_loss=false", f"lora.rank={row['lora'] or 8}", "rollout.temperature=0.6"],
                 row)


def deepspeed_plan(row: dict[str, Any]):
    """OpenRLHF's recipe on one trainer GPU with the same model, ZeRO stage, checkpointing and micro batch, planned as
    the bench ran it: one process doing forward/backward and steps only (the engine's allocator slack), not
    OpenRLHF's actor, which also runs the experience forward and the broadcast to vLLM (its own measured slack)."""
    import dataclasses

    from rlctl.backends import get_backend
    from rlctl.recipe.planning import prepare

    sets = [f"model.path={row['shape']}", "model.dtype=bfloat16",
            # OpenRLHF trains on prompt + response (it has no train.seq_len): the bench's sequence split in two
            f"data.max_prompt_tokens={row['seq'] // 2}", f"rollout.max_tokens={row['seq'] - row['seq'] // 2}",
            f"model.max_model_len={row['seq']}",
            f"train.micro_batch_size={row['mb']}", f"train.train_batch_size={row['mb']}",
            f"train.zero_stage={row['zero_stage']}", f"lora.rank={row['lora'] or 8}",
            f"train.gradient_checkpointing={'true' if row['ac'] else 'false'}",
            "resources.gpus_per_node=2", "resources.trainer_gpus=[1]",
            "resources.inference_gpus=[0]", "algorithm.kl_coef=0"]
    recipe = prepare(OPENRLHF, sets).recipe
    if not row["lora"]:
        recipe.lora = None
    f = dataclasses.replace(get_backend("openrlhf").memory_features(recipe), transient_slack=None)
    return _plan(OPENRLHF, sets, row, f)


def table(files: list[str], plan, held_out: set[str], predicted: str | None = None) -> str:
    from rlctl.estimate.memory import GiB

    pred = json.loads((DOCS / predicted).read_text()) if predicted else {}
    out = ["| configuration | plan (GiB) | measured NVML peak (GiB) | plan / measured | torch allocated peak | "
           "torch reserved peak | planned allocated | set |", "|---|---|---|---|---|---|---|---|"]
    for r in rows(files):
        b = plan(r)
        gib = b.total / GiB
        set_ = "held out" if r["config"] in held_out else "fit"
        if r["config"] in pred and r["config"] in held_out:
            set_ += f" (predicted {pred[r['config']]['plan_gib']:.2f})"
        out.append(f"| {r['config']} | {gib:.2f} | {r['nvml_peak_run_gib']:.2f} | {gib / r['nvml_peak_run_gib']:.2f} "
                   f"| {r['torch_peak_allocated_gib']:.2f} | {r['torch_peak_reserved_gib']:.2f} | "
                   f"{b.facts['allocated_peak'] / GiB:.2f} | {set_} |")
    return "\n".join(out)


FSDP_HELD = {"fsdp-7b-lora16-ac-mb2-s1536", "fsdp-3b-full-ac-mb1-s4096", "fsdp-1.5b-lora8-noac-mb4-s1024",
             "b-3b-full-ac1-s4096-off5-step-v08", "b-7b-lora16-ac1-s8192-off5-step-v08",
             "b-3b-full-noac-s2048-step-v08", "b-7b-lora8-ac2-s4096-off5-v08"}
VERL_HELD = {"v-1.5b-full-gc-mb1-s16384", "v-7b-lora8-nogc-mb1-s4096", "v-0.5b-full-nogc-mb2-s4096"}
DS_HELD = {"ds-0.5b-full-z3-nogc-mb4-s1024", "ds-3b-lora32-z2-nogc-mb4-s1024", "ds-7b-lora8-z2-gc-mb1-s4096",
           "ds-1.5b-full-z3-nogc-mb2-s2048", "ds-3b-full-z2-gc-mb1-s2048"}


def main() -> None:
    print("### FSDP2 (prime-rl-shaped)\n")
    print(table(FSDP_RAW, fsdp_plan, FSDP_HELD, "gpu_fsdp_h100_b_predicted.json"))
    print("\n### FSDP1 (verl-shaped)\n")
    print(table(VERL_RAW, verl_plan, VERL_HELD, "gpu_fsdp1_verl_h100_predicted.json"))
    print("\n### Two GPUs (H200): FSDP2 prime-rl-shaped (d2-*) and FSDP1 verl-shaped (dv2-*), all held out\n")
    print(table(DP2_RAW, lambda r: (verl_plan if r["engine"] == "fsdp1" else fsdp_plan)(r),
                {r["config"] for r in rows(DP2_RAW)}, "gpu_fsdp_h200x2_dp2_predicted.json"))
    print("\n### DeepSpeed ZeRO (OpenRLHF-shaped)\n")
    print(table(DS_RAW, deepspeed_plan, DS_HELD, "gpu_deepspeed_h100_heldout_predicted.json"))


if __name__ == "__main__":
    main()
