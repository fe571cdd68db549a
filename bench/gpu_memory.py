#!/usr/bin/env python3
"""Preflight's trainer-memory estimate against the measured peak of real TRL GRPO steps on a GPU.

Models are randomly initialised from the public configs of real architectures (no download), so the memory is
that of the real model. Each configuration runs a few GRPO steps in a fresh process and reports
torch.cuda.max_memory_allocated next to rlctl's estimate. Run on a machine with a CUDA GPU:

    python bench/gpu_memory.py --out gpu_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = [
    # name, model, lora rank (0 = full), micro batch, group, prompts/step, max_tokens, gradient checkpointing
    ("qwen2.5-0.5b full gc", "Qwen/Qwen2.5-0.5B", 0, 8, 8, 2, 256, True),
    ("qwen2.5-0.5b full no-gc", "Qwen/Qwen2.5-0.5B", 0, 8, 8, 2, 256, False),
    ("qwen2.5-1.5b lora16 gc", "Qwen/Qwen2.5-1.5B", 16, 8, 8, 2, 256, True),
    ("qwen2.5-1.5b full gc mb4", "Qwen/Qwen2.5-1.5B", 0, 4, 8, 2, 512, True),
]


def recipe_text(model_dir: Path, data: Path, lora: int, micro: int, group: int, pps: int, max_tokens: int,
                gc: bool) -> str:
    lora_block = f"\n[lora]\nrank = {lora}\nalpha = {2 * lora}\ntarget_modules = \"all-linear\"\n" if lora else ""
    return f"""
name = "gpu-memory"
[backend]
name = "trl"
[model]
path = "{model_dir}"
dtype = "bfloat16"
max_model_len = {64 + max_tokens}
{lora_block}
[data]
train = "{data}"
input_key = "prompt"
max_prompt_tokens = 64
[rollout]
group_size = {group}
prompts_per_step = {pps}
max_tokens = {max_tokens}
[algorithm]
kl_coef = 0.0
[optim]
lr = 1e-6
schedule = "constant"
[train]
steps = 3
train_batch_size = {group * pps}
micro_batch_size = {micro}
gradient_checkpointing = {"true" if gc else "false"}
[resources]
gpus_per_node = 1
gpu = "H100-80GB"
[reward]
function = "{ROOT / 'recipes/quickstart/reward.py'}"
"""


def make_model(arch_name: str, out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlctl.recipe.models import KNOWN
    from rlctl.recipe.tiny_model import byte_tokenizer

    a = KNOWN[arch_name.lower()]
    cfg = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=a.max_positions, tie_word_embeddings=a.tie_embeddings)
    tok = byte_tokenizer()
    cfg.eos_token_id = cfg.pad_token_id = tok.eos_token_id
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def measure_one(recipe_path: Path) -> dict:
    """Child process: run the rendered TRL config for 3 steps and report the CUDA peak."""
    import torch

    from rlctl.backends.trl import TRLBackend
    from rlctl.backends.trl.runner import main as run
    from rlctl.recipe.loader import load

    r = load(recipe_path).recipe
    plan = TRLBackend().render(r, 16)
    work = recipe_path.parent / "work"
    plan.write(work)
    os.chdir(work)
    torch.cuda.reset_peak_memory_stats()
    code = run(["trl_config.json"])
    return {"exit": code, "peak_allocated": torch.cuda.max_memory_allocated(),
            "peak_reserved": torch.cuda.max_memory_reserved()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu_memory.json"))
    ap.add_argument("--child", type=Path)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(measure_one(a.child)), flush=True)
        return
    import torch

    from rlctl.estimate.memory import GiB, trainer_memory
    from rlctl.recipe.loader import load
    from rlctl.recipe.models import resolve_arch

    results = []
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        data = base / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": "x" * 60}) + "\n" for _ in range(16)))
        models: dict[str, Path] = {}
        for name, model, lora, micro, group, pps, mt, gc in CONFIGS:
            if model not in models:
                models[model] = base / model.replace("/", "_")
                make_model(model, models[model])
            rdir = base / name.replace(" ", "_")
            rdir.mkdir()
            rp = rdir / "recipe.toml"
            rp.write_text(recipe_text(models[model], data, lora, micro, group, pps, mt, gc))
            recipe = load(rp).recipe
            est = trainer_memory(recipe, resolve_arch(str(models[model])))
            p = subprocess.run([sys.executable, __file__, "--child", str(rp)], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            meas = json.loads(line[7:]) if line else {"error": p.stderr[-2000:]}
            row = {"config": name, "estimate_gib": est.total / GiB,
                   "estimate_terms_gib": {k: v / GiB for k, v in est.terms.items()}, **meas}
            if "peak_allocated" in meas:
                row["measured_gib"] = meas["peak_allocated"] / GiB
                row["ratio"] = row["estimate_gib"] / row["measured_gib"]
            results.append(row)
            print(json.dumps(row), flush=True)
    a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                 "results": results}, indent=2))


if __name__ == "__main__":
    main()
