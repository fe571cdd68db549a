#!/usr/bin/env python3
"""Trainer-only memory of an FSDP2 trainer shaped like prime-rl's and verl's, in plain torch, on one GPU.

What TRL does not exercise: FSDP2 (`fully_shard`) with fp32 master parameters and bf16 compute
(MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)), the whole model loaded in fp32 (frozen base included,
as both load it), LoRA adapters through PEFT, activation checkpointing of every decoder layer (prime-rl `ac.freq = 1`,
verl `enable_gradient_checkpointing`), and a log-prob loss over the full sequence in fp32. Each case runs in a fresh
process (world size 1) for 3 steps; peaks from NVML (sampled every 20 ms) and torch.

    python bench/gpu_fsdp.py --out gpu_fsdp.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3
CASES = [
    # name, shape, lora rank (0 = full), activation checkpointing, micro batch, sequence length
    ("fsdp-7b-lora8-ac-mb1-s2048", "Qwen/Qwen2.5-7B", 8, True, 1, 2048),
    ("fsdp-7b-lora8-noac-mb1-s2048", "Qwen/Qwen2.5-7B", 8, False, 1, 2048),
    ("fsdp-1.5b-full-ac-mb2-s2560", "Qwen/Qwen2.5-1.5B", 0, True, 2, 2560),
    ("fsdp-1.5b-full-noac-mb1-s2560", "Qwen/Qwen2.5-1.5B", 0, False, 1, 2560),
    # held out: run after the plan's FSDP constants were committed
    ("fsdp-7b-lora16-ac-mb2-s1536", "Qwen/Qwen2.5-7B", 16, True, 2, 1536),
    ("fsdp-3b-full-ac-mb1-s4096", "Qwen/Qwen2.5-3B", 0, True, 1, 4096),
    ("fsdp-1.5b-lora8-noac-mb4-s1024", "Qwen/Qwen2.5-1.5B", 8, False, 4, 1024),
]


def child(name: str) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(ROOT))
    from rlctl.recipe.models import KNOWN

    _, shape, rank, ac, mb, seq = next(c for c in CASES if c[0] == name)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29512", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    a = KNOWN[shape.lower()]
    cfg = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      tie_word_embeddings=a.tie_embeddings, use_cache=False)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg)  # fp32: what prime-rl and verl load for training
    if rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
    if ac:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    layers = model.base_model.model.model.layers if rank else model.model.layers
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    torch.cuda.synchronize()
    after_load = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        ids = torch.randint(0, 256, (mb, seq), device="cuda")
        logits = model(input_ids=ids).logits.float()  # fp32 log-probs over the sequence, as both trainers do
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(logp * torch.randn_like(logp)).mean()
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    out = {"after_load_allocated_gib": after_load / GiB,
           "torch_peak_allocated_gib": torch.cuda.max_memory_allocated() / GiB,
           "torch_peak_reserved_gib": torch.cuda.max_memory_reserved() / GiB,
           "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    dist.destroy_process_group()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu_fsdp.json"))
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child)), flush=True)
        return
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    results = []
    only = set(filter(None, os.environ.get("RLCTL_FSDP_CASES", "").split(",")))
    for case in CASES:
        if only and case[0] not in only:
            continue
        before = pynvml.nvmlDeviceGetMemoryInfo(h).used / GiB
        peak = [before]
        stop = threading.Event()

        def sample(peak=peak, stop=stop):
            while not stop.is_set():
                peak[0] = max(peak[0], pynvml.nvmlDeviceGetMemoryInfo(h).used / GiB)
                time.sleep(0.02)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        t0 = time.time()
        p = subprocess.run([sys.executable, __file__, "--child", case[0]], capture_output=True, text=True,
                           timeout=300)
        stop.set()
        t.join()
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        row = {"config": case[0], "shape": case[1], "lora": case[2], "ac": case[3], "mb": case[4], "seq": case[5],
               "nvml_before_gib": before, "nvml_peak_run_gib": peak[0] - before, "wall_s": time.time() - t0,
               **(json.loads(line[7:]) if line else {"error": p.stderr[-1500:]})}
        row["oom"] = "out of memory" in p.stderr.lower()
        results.append(row)
        print(json.dumps(row), flush=True)
        a.out.write_text(json.dumps({"results": results}, indent=2))


if __name__ == "__main__":
    main()
