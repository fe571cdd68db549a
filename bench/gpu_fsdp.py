#!/usr/bin/env python3
"""Trainer-only memory of an FSDP2 trainer shaped like prime-rl's and verl's, in plain torch, on one GPU.

What TRL does not exercise: FSDP2 (`fully_shard`) with fp32 master parameters and bf16 compute
(MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)), the whole model loaded in fp32 (frozen base included,
as both load it), LoRA adapters through PEFT, activation checkpointing of every decoder layer (prime-rl `ac.freq = 1`,
verl `enable_gradient_checkpointing`), and a log-prob loss over the full sequence in fp32. Each case runs in a fresh
process (world size 1) for 3 steps; peaks from NVML (sampled every 20 ms) and torch.

Grid `fsdp-b` adds what prime-rl's trainer does besides (its own implementation is not installable on the GPU
machine; these are rlctl's own implementations of the same behaviour): checkpointing every N-th layer
(`checkpoint_wrapper` on layers with `layer_id % N == 0`), activation offloading through saved-tensor hooks that
keep the last K saved tensors on the GPU (`ac_offloading.max_inflight_activations`), optimizer states on the CPU
between steps (`optim_cpu_offload`), and a fused log-prob head that never materialises the logits: chunked over the
vocabulary (v0.3.0, 2048 columns, all tokens) or over tokens and vocabulary (v0.8.0, 1024 tokens x 8192 columns),
recomputing each chunk in backward.

    python bench/gpu_fsdp.py --out gpu_fsdp.json                 # the first grid
    RLCTL_FSDP_GRID=fsdp-b python bench/gpu_fsdp.py --out b.json
    RLCTL_FSDP_GRID=fsdp1-verl python bench/gpu_fsdp.py --out v.json
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
def _case(name: str, shape: str, lora: int, every: int, mb: int, seq: int, offload: int = 0, optim: str = "gpu",
          head: str = "full", engine: str = "fsdp2", hf_ac: bool | None = None) -> dict:
    """One configuration: lora rank (0 = full fine-tune), checkpoint every N-th layer (0 = off), micro batch,
    sequence length, activation offloading keeping K (0 = off), optimizer (gpu | step), log-prob head (full | v03 |
    v08 | verl), engine (fsdp2 | fsdp1), and whether checkpointing goes through HF's gradient_checkpointing_enable
    (default: FSDP1 does, as verl; FSDP2 wraps every N-th layer in checkpoint_wrapper, as prime-rl)."""
    return {"name": name, "shape": shape, "lora": lora, "every": every, "ac": bool(every), "mb": mb, "seq": seq,
            "offload": offload, "optim": optim, "head": head, "engine": engine,
            "hf_ac": engine == "fsdp1" if hf_ac is None else hf_ac}


# grid one: FSDP2 with HF checkpointing of every layer or none and a materialised fp32 log-softmax
CASES = [_case(n, shape, lora, int(ac), mb, seq, hf_ac=True) for n, shape, lora, ac, mb, seq in [
    ("fsdp-7b-lora8-ac-mb1-s2048", "Qwen/Qwen2.5-7B", 8, True, 1, 2048),
    ("fsdp-7b-lora8-noac-mb1-s2048", "Qwen/Qwen2.5-7B", 8, False, 1, 2048),
    ("fsdp-1.5b-full-ac-mb2-s2560", "Qwen/Qwen2.5-1.5B", 0, True, 2, 2560),
    ("fsdp-1.5b-full-noac-mb1-s2560", "Qwen/Qwen2.5-1.5B", 0, False, 1, 2560),
    # held out: run after the plan's FSDP constants were committed
    ("fsdp-7b-lora16-ac-mb2-s1536", "Qwen/Qwen2.5-7B", 16, True, 2, 1536),
    ("fsdp-3b-full-ac-mb1-s4096", "Qwen/Qwen2.5-3B", 0, True, 1, 4096),
    ("fsdp-1.5b-lora8-noac-mb4-s1024", "Qwen/Qwen2.5-1.5B", 8, False, 4, 1024),
]]
# grid fsdp-b: what prime-rl's trainer does besides (see the module docstring)
CASES_B = [
    _case("b-7b-lora8-ac1-s2048-v03", "Qwen/Qwen2.5-7B", 8, 1, 1, 2048, head="v03"),  # seed 004 as it ran
    _case("b-7b-lora8-noac-s2048-v03", "Qwen/Qwen2.5-7B", 8, 0, 1, 2048, head="v03"),
    _case("b-1.5b-full-ac2-s4096-v08", "Qwen/Qwen2.5-1.5B", 0, 2, 1, 4096, head="v08"),
    _case("b-1.5b-full-ac1-s8192-off5-step-v08", "Qwen/Qwen2.5-1.5B", 0, 1, 1, 8192, 5, "step", "v08"),
    _case("b-1.5b-full-ac3-s4096-step-v08", "Qwen/Qwen2.5-1.5B", 0, 3, 1, 4096, 0, "step", "v08"),
    # held out: predicted by the plan as committed before this grid ran
    _case("b-3b-full-ac1-s4096-off5-step-v08", "Qwen/Qwen2.5-3B", 0, 1, 1, 4096, 5, "step", "v08"),
    _case("b-7b-lora16-ac1-s8192-off5-step-v08", "Qwen/Qwen2.5-7B", 16, 1, 1, 8192, 5, "step", "v08"),
    _case("b-3b-full-noac-s2048-step-v08", "Qwen/Qwen2.5-3B", 0, 0, 1, 2048, 0, "step", "v08"),
    _case("b-7b-lora8-ac2-s4096-off5-v08", "Qwen/Qwen2.5-7B", 8, 2, 1, 4096, 5, "gpu", "v08"),
]


# grid fsdp1-verl: verl's default actor engine, FSDP1 (FullyShardedDataParallel wrapping each decoder layer,
# MixedPrecision(bf16 params, fp32 reduce and buffers), the model loaded in fp32), HF gradient checkpointing, packed
# micro batches (remove padding: one row of micro batch x sequence tokens) and verl's log-prob head: bf16 logits
# divided by the temperature into a bf16 copy, a cross entropy that keeps no fp32 copy and writes its gradient into
# the saved logits (flash-attn's Triton kernel, inplace_backward)
CASES_V = [_case(n, shape, lora, every, mb, seq, head="verl", engine="fsdp1") for n, shape, lora, every, mb, seq in [
    ("v-1.5b-full-gc-mb4-s2048", "Qwen/Qwen2.5-1.5B", 0, 1, 4, 2048),
    ("v-1.5b-full-nogc-mb1-s4096", "Qwen/Qwen2.5-1.5B", 0, 0, 1, 4096),
    ("v-7b-lora16-gc-mb2-s4096", "Qwen/Qwen2.5-7B", 16, 1, 2, 4096),
    ("v-3b-full-gc-mb2-s4096", "Qwen/Qwen2.5-3B", 0, 1, 2, 4096),
    ("v-0.5b-full-gc-mb8-s4096", "Qwen/Qwen2.5-0.5B", 0, 1, 8, 4096),
    # held out: run after the FSDP1 slack (1.45) was fitted on the full fine-tunes above
    ("v-3b-full-nogc-mb1-s2048", "Qwen/Qwen2.5-3B", 0, 0, 1, 2048),
    ("v-1.5b-lora32-nogc-mb2-s2048", "Qwen/Qwen2.5-1.5B", 32, 0, 2, 2048),
    # held out: run after the FSDP1 slacks (1.40 forward/backward, 1.22 at the step) were fitted on the rows above
    ("v-1.5b-full-gc-mb1-s16384", "Qwen/Qwen2.5-1.5B", 0, 1, 1, 16384),
    ("v-7b-lora8-nogc-mb1-s4096", "Qwen/Qwen2.5-7B", 8, 0, 1, 4096),
    ("v-0.5b-full-nogc-mb2-s4096", "Qwen/Qwen2.5-0.5B", 0, 0, 2, 4096),
]]


# grid fsdp-dp2: the same trainers on 2 GPUs (RLCTL_BENCH_GPUS=2, torchrun), so that sharding across ranks is
# measured, not only modelled. FSDP2 cases are built on the meta device, sharded, then materialised (each rank holds
# only its shards, as prime-rl loads them); FSDP1 cases as above
CASES_D = [
    _case("d2-3b-full-ac1-s4096-v08", "Qwen/Qwen2.5-3B", 0, 1, 1, 4096, head="v08"),
    _case("d2-7b-full-ac1-s4096-v08", "Qwen/Qwen2.5-7B", 0, 1, 1, 4096, head="v08"),
    _case("d2-7b-lora16-noac-s4096-v03", "Qwen/Qwen2.5-7B", 16, 0, 1, 4096, head="v03"),
    _case("dv2-1.5b-full-gc-mb4-s2048", "Qwen/Qwen2.5-1.5B", 0, 1, 4, 2048, head="verl", engine="fsdp1"),
    _case("dv2-3b-full-nogc-mb1-s4096", "Qwen/Qwen2.5-3B", 0, 0, 1, 4096, head="verl", engine="fsdp1"),
]
GRIDS = {"": CASES, "fsdp-b": CASES_B, "fsdp1-verl": CASES_V, "fsdp-dp2": CASES_D}


def case(name: str) -> dict:
    return next(c for grid in GRIDS.values() for c in grid if c["name"] == name)


def chunked_logprobs(hidden, weight, labels, token_chunk: int | None, vocab_chunk: int):
    """log p(label) of every token without the [tokens, vocab] logits: an online log-sum-exp over vocabulary chunks
    (and token chunks), recomputed chunk by chunk in backward."""
    import torch

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, w, y):
            n, v = h.shape[0], w.shape[0]
            tc = token_chunk or n
            logz = torch.empty(n, device=h.device, dtype=torch.float32)
            target = torch.empty(n, device=h.device, dtype=torch.float32)
            for t0 in range(0, n, tc):
                hc, yc = h[t0:t0 + tc], y[t0:t0 + tc]
                m = torch.full((hc.shape[0],), float("-inf"), device=h.device)
                s = torch.zeros(hc.shape[0], device=h.device)
                tgt = torch.zeros(hc.shape[0], device=h.device)
                for v0 in range(0, v, vocab_chunk):
                    lc = (hc @ w[v0:v0 + vocab_chunk].t()).float()
                    m_new = torch.maximum(m, lc.amax(-1))
                    s = s * torch.exp(m - m_new) + torch.exp(lc - m_new[:, None]).sum(-1)
                    m = m_new
                    hit = (yc >= v0) & (yc < v0 + lc.shape[1])
                    idx = (yc - v0).clamp(0, lc.shape[1] - 1)
                    tgt = torch.where(hit, lc.gather(1, idx[:, None]).squeeze(1), tgt)
                logz[t0:t0 + tc] = m + torch.log(s)
                target[t0:t0 + tc] = tgt
            ctx.save_for_backward(h, w, y, logz)
            return target - logz

        @staticmethod
        def backward(ctx, g):
            h, w, y, logz = ctx.saved_tensors
            n, v = h.shape[0], w.shape[0]
            tc = token_chunk or n
            gh = torch.zeros_like(h, dtype=torch.float32)
            gw = torch.zeros_like(w, dtype=torch.float32) if ctx.needs_input_grad[1] else None
            for t0 in range(0, n, tc):
                hc, yc, gc, lz = h[t0:t0 + tc], y[t0:t0 + tc], g[t0:t0 + tc].float(), logz[t0:t0 + tc]
                for v0 in range(0, v, vocab_chunk):
                    wc = w[v0:v0 + vocab_chunk]
                    probs = torch.exp((hc @ wc.t()).float() - lz[:, None])
                    gl = -gc[:, None] * probs
                    hit = (yc >= v0) & (yc < v0 + wc.shape[0])
                    idx = (yc - v0).clamp(0, wc.shape[0] - 1)
                    gl.scatter_add_(1, idx[:, None], (gc * hit)[:, None])
                    gh[t0:t0 + tc] += gl @ wc.float()
                    if gw is not None:
                        gw[v0:v0 + vocab_chunk] += gl.t() @ hc.float()
            return gh.to(h.dtype), (gw.to(w.dtype) if gw is not None else None), None

    return Fn.apply(hidden, weight, labels)


def inplace_logprobs(logits, labels, rows: int = 256):
    """log p(label) from bf16 logits without an fp32 copy (fp32 only for `rows` rows at a time), the gradient written
    into the saved logits in backward: what flash-attn's Triton cross entropy holds with inplace_backward."""
    import torch

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            n = x.shape[0]
            out = torch.empty(n, device=x.device, dtype=torch.float32)
            lse = torch.empty(n, device=x.device, dtype=torch.float32)
            for i in range(0, n, rows):
                c = x[i:i + rows].float()
                lse[i:i + rows] = torch.logsumexp(c, -1)
                out[i:i + rows] = c.gather(1, y[i:i + rows, None]).squeeze(1) - lse[i:i + rows]
            ctx.save_for_backward(x, y, lse)
            return out

        @staticmethod
        def backward(ctx, g):
            x, y, lse = ctx.saved_tensors
            for i in range(0, x.shape[0], rows):
                gi = g[i:i + rows].float()
                grad = -gi[:, None] * torch.exp(x[i:i + rows].float() - lse[i:i + rows, None])
                grad.scatter_add_(1, y[i:i + rows, None], gi[:, None])
                x[i:i + rows].copy_(grad)
            return x, None

    return Fn.apply(logits, labels)


class OffloadActivations:
    """Saved tensors of 1 KiB or more go to pinned CPU memory as they are saved; the last `keep` stay alive on the
    GPU meanwhile (the in-flight stash); backward brings each back when it is needed."""

    def __init__(self, keep: int):
        import collections

        import torch

        self.stash: collections.deque = collections.deque()
        self.keep = keep

        def pack(t):
            if not t.is_cuda or t.numel() * t.element_size() < 1024 or isinstance(t, torch.nn.Parameter):
                return t
            cpu = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            cpu.copy_(t, non_blocking=True)
            self.stash.append(t)
            while len(self.stash) > self.keep:
                self.stash.popleft()
            return (cpu, t.device)

        def unpack(x):
            return x[0].to(x[1], non_blocking=True) if isinstance(x, tuple) else x

        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.stash.clear()
        return self.hooks.__exit__(*exc)


def move_states(opt, device: str) -> None:
    """Adam states to pinned CPU memory or back (the local shard of a DTensor state)."""
    import copy

    import torch
    from torch.distributed.tensor import DTensor

    def move(t):
        return t.to("cpu").pin_memory() if device == "cpu" else t.to(device, non_blocking=True)

    for st in opt.state.values():
        for k, v in st.items():
            if isinstance(v, DTensor):
                nv = copy.copy(v)
                nv._local_tensor = move(v._local_tensor)
                st[k] = nv
            elif torch.is_tensor(v) and v.dim():
                st[k] = move(v)


def child(name: str) -> dict:
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(ROOT))
    from rlctl.recipe.models import KNOWN

    c = case(name)
    rank, mb, seq = c["lora"], c["mb"], c["seq"]
    if "LOCAL_RANK" not in os.environ:  # one process; torchrun sets these for several
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29512", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    world, rid, local = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rid, world_size=world)
    meta = world > 1 and c["engine"] == "fsdp2"
    a = KNOWN[c["shape"].lower()]
    cfg = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      tie_word_embeddings=a.tie_embeddings, use_cache=False)
    # fp32: what prime-rl and verl load for training. verl's FSDP1 worker builds the model on the CPU and FSDP moves
    # it to the GPU unit by unit (fsdp_workers.py: init on CPU/meta, FSDP(device_id=..., sync_module_states=True));
    # building it on the GPU first would leave the pool fragmented by the freed unflattened parameters
    with torch.device("cpu" if c["engine"] == "fsdp1" else "meta" if meta else "cuda"):
        model = Qwen2ForCausalLM(cfg)
    if rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
    inner = model.base_model.model if rank else model
    if c["hf_ac"] and c["ac"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif c["every"]:
        for i, (n, block) in enumerate(list(inner.model.layers.named_children())):
            if i % c["every"] == 0:
                inner.model.layers.register_module(n, checkpoint_wrapper(block, preserve_rng_state=False))
    if c["head"] in ("v03", "v08"):
        tok, voc = (None, 2048) if c["head"] == "v03" else (1024, 8192)

        class FusedHead(torch.nn.Module):
            """Replaces lm_head (same weight, tied or not): returns the labels' log-probs, never the logits."""

            def __init__(self, weight):
                super().__init__()
                self.weight = weight
                self.labels = None

            def forward(self, hidden):
                h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
                return chunked_logprobs(h, self.weight, self.labels, tok, voc)

        head = FusedHead(inner.lm_head.weight)
        inner.lm_head = head
    if c["engine"] == "fsdp1":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

        policies = [functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Qwen2DecoderLayer})]
        if rank:  # verl's LoRA policy (utils/fsdp_utils.py get_fsdp_wrap_policy): each trainable leaf its own unit
            policies.insert(0, functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: bool(
                not list(m.named_children()) and getattr(m, "weight", None) is not None
                and m.weight.requires_grad)))
        model = FullyShardedDataParallel(
            model, auto_wrap_policy=functools.partial(_or_policy, policies=policies),
            mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                           buffer_dtype=torch.float32, cast_forward_inputs=bool(rank)),
            sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=local, use_orig_params=bool(rank))
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in inner.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        if meta:  # each rank materialises its own shards only (random values: memory is what is measured)
            model.to_empty(device="cuda")
            with torch.no_grad():
                for prm in model.parameters():
                    prm.normal_(0, 0.02)
                for buf in model.buffers():
                    buf.fill_(1e-3)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    torch.cuda.synchronize()
    after_load = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for step in range(3):
        ids = torch.randint(0, 256, (mb, seq), device="cuda")
        ctx = OffloadActivations(c["offload"]) if c["offload"] else contextlib.nullcontext()
        with ctx:
            if c["head"] == "verl":
                # packed: one row of every token; labels rolled by one (as verl rolls input_ids), no slicing
                logits = model(input_ids=ids.reshape(1, -1)).logits.squeeze(0)
                scaled = logits / 0.6  # the temperature copy (bf16)
                logp = inplace_logprobs(scaled, torch.roll(ids.reshape(-1), -1))
                del logits, scaled
            elif c["head"] == "full":
                logits = model(input_ids=ids).logits.float()  # fp32 log-probs over the sequence
                logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
                del logits
            else:
                head.labels = ids[:, 1:].reshape(-1)
                logp = model(input_ids=ids).logits
            loss = -(logp * torch.randn_like(logp)).mean()
        loss.backward()
        if c["optim"] == "step" and step:  # states on the GPU for the step only (after the first step)
            move_states(opt, "cuda")
        opt.step()
        if c["optim"] == "step":
            move_states(opt, "cpu")
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
        out = child(a.child)
        if os.environ.get("RANK", "0") == "0":
            print("RESULT " + json.dumps(out), flush=True)
        return
    import pynvml

    pynvml.nvmlInit()
    gpus = int(os.environ.get("RLCTL_BENCH_GPUS", "1"))
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    results = []
    only = set(filter(None, os.environ.get("RLCTL_FSDP_CASES", "").split(",")))
    for c in GRIDS.get(os.environ.get("RLCTL_FSDP_GRID", ""), CASES):
        if only and c["name"] not in only:
            continue
        befores = [pynvml.nvmlDeviceGetMemoryInfo(h).used / GiB for h in handles]
        peak = list(befores)
        stop = threading.Event()

        def sample(peak=peak, stop=stop):
            while not stop.is_set():
                for i, h in enumerate(handles):
                    peak[i] = max(peak[i], pynvml.nvmlDeviceGetMemoryInfo(h).used / GiB)
                time.sleep(0.02)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        t0 = time.time()
        launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
                    if gpus > 1 else [sys.executable])
        p = subprocess.run([*launcher, __file__, "--child", c["name"]], capture_output=True, text=True, timeout=300)
        stop.set()
        t.join()
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        per_gpu = [x - b for x, b in zip(peak, befores, strict=True)]
        row = {"config": c["name"], **{k: c[k] for k in ("shape", "lora", "ac", "mb", "seq", "every", "offload",
                                                            "optim", "head", "engine")},
               "gpus": gpus, "nvml_before_gib": befores[0], "nvml_peak_per_gpu_gib": per_gpu,
               "nvml_peak_run_gib": max(per_gpu), "wall_s": time.time() - t0,
               **(json.loads(line[7:]) if line else {"error": p.stderr[-1500:]})}
        row["oom"] = "out of memory" in p.stderr.lower()
        results.append(row)
        print(json.dumps(row), flush=True)
        a.out.write_text(json.dumps({"results": results}, indent=2))


if __name__ == "__main__":
    main()
