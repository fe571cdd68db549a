"""GPU memory plan for a recipe: the trainer per GPU and the vLLM engine per GPU, from first principles.

Figures are estimates of *peak allocated* memory. The assumptions are spelled out next to each term so that a
measured peak (docs/memory.md) can be compared term by term.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlctl.recipe.models import Arch

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

GiB = 1024**3

# Usable memory as torch/vLLM report it (GiB), by the names people write in resources.gpu.
GPU_MEMORY_GIB = {
    "h100-80gb": 79.18, "h100": 79.18, "h100-pcie": 79.18, "h100-sxm": 79.18, "h100-94gb": 93.1,
    "h200": 139.8, "h200-141gb": 139.8, "a100-80gb": 79.15, "a100": 79.15, "a100-40gb": 39.4,
    "a6000": 47.5, "rtx-a6000": 47.5, "l40s": 44.4, "rtx4090": 23.5, "4090": 23.5, "l4": 22.0, "b200": 178.4,
}

CUDA_OVERHEAD = 1.0 * GiB  # CUDA context, cuBLAS workspace, allocator slack: per process
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}


def gpu_memory_gib(name: str) -> float | None:
    key = name.strip().lower().replace(" ", "-").replace("_", "-")
    if key in GPU_MEMORY_GIB:
        return GPU_MEMORY_GIB[key]
    import re

    m = re.search(r"(\d+)\s*gb", key)
    if m:
        return float(m.group(1)) * 0.99  # "80GB" cards expose ~79 GiB
    return None


@dataclass
class Breakdown:
    """Bytes per term, in the order they are printed."""

    terms: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    def table(self) -> str:
        return ", ".join(f"{k} {v / GiB:.1f}" for k, v in self.terms.items() if v >= 0.05 * GiB)


def _engine(recipe: Recipe) -> str:
    """How the trainer holds parameters: deepspeed (OpenRLHF), fsdp (verl, prime-rl) or plain (TRL, 1 process)."""
    return {"openrlhf": "deepspeed", "verl": "fsdp", "prime_rl": "fsdp"}.get(recipe.backend.name, "plain")


def trainer_memory(recipe: Recipe, arch: Arch) -> Breakdown:
    r = recipe
    b = Breakdown()
    engine = _engine(r)
    dp = max(r.trainer_gpu_count, 1)
    stage = 3 if engine == "fsdp" else (r.train.zero_stage if engine == "deepspeed" else 0)
    P = arch.params
    compute_bytes = DTYPE_BYTES[r.model.dtype]
    full = r.lora is None
    T = P if full else arch.lora_params(r.lora.rank, r.lora.target_modules)  # trainable parameters

    if engine == "fsdp":  # fp32 sharded master parameters, bf16 compute (verl, prime-rl defaults)
        w_bytes, g_bytes, o_bytes = (4, 4, 8) if full else (compute_bytes, 4, 8)
        b.notes.append("FSDP: fp32 sharded parameters and gradients, Adam m+v in fp32")
    elif engine == "deepspeed":  # bf16 weights+grads, fp32 master + m + v in the optimizer
        w_bytes, g_bytes, o_bytes = compute_bytes, compute_bytes, 12
        b.notes.append(f"DeepSpeed ZeRO-{stage}: bf16 weights/grads, fp32 master+m+v")
    else:  # one process, torch AdamW: states in the parameter dtype
        w_bytes, g_bytes, o_bytes = compute_bytes, compute_bytes, 2 * compute_bytes
        b.notes.append("single process: AdamW states in the parameter dtype")
    if not full:
        w_bytes = compute_bytes  # frozen base in the compute dtype; adapters small

    b.terms["weights"] = P * w_bytes / (dp if stage >= 3 else 1)
    if not full:
        b.terms["lora weights"] = T * 4
    b.terms["gradients"] = T * g_bytes / (dp if stage >= 2 else 1)
    if r.train.offload:
        b.terms["optimizer"] = 0.0
        b.notes.append("optimizer states offloaded to CPU")
    else:
        b.terms["optimizer"] = T * o_bytes / (dp if stage >= 1 else 1)
    if r.algorithm.kl_coef > 0 and full:
        b.terms["reference model"] = P * compute_bytes / (dp if stage >= 3 else 1)

    S = r.train_seq_len
    mb = r.train.micro_batch_size
    per_token_layer = 2 * (5 * arch.hidden + 3 * (arch.intermediate if not arch.experts else
                                                  arch.expert_intermediate * arch.experts_per_token))
    if r.train.gradient_checkpointing:
        acts = mb * S * (arch.layers * arch.hidden * compute_bytes + per_token_layer)
        b.notes.append("gradient checkpointing: layer inputs kept, one layer recomputed")
    else:
        acts = mb * S * arch.layers * per_token_layer
    b.terms["activations"] = acts
    if r.backend.name == "trl":
        # TRL keeps only the completion's logits (logits_to_keep) in the compute dtype, log-softmax in fp32
        b.terms["logits"] = mb * r.rollout.max_tokens * arch.vocab * (compute_bytes + 4)
    else:
        # full-sequence logits in fp32 for log-probs, and their gradient
        b.terms["logits"] = mb * S * arch.vocab * 8
    if not r.uses_vllm:
        # TRL generates with the training model: KV cache for its generation batch
        per_device = r.samples_per_rollout / dp
        b.terms["generation kv cache"] = per_device * (r.data.max_prompt_tokens + r.rollout.max_tokens) \
            * arch.kv_bytes_per_token(compute_bytes)
    b.terms["cuda overhead"] = CUDA_OVERHEAD
    return b


def trainer_resident(trainer: Breakdown, with_optimizer: bool = False) -> float:
    """What the trainer holds between steps: its weights (and, once it has stepped, its optimizer states)."""
    keep = {"weights", "lora weights", "reference model", "cuda overhead"}
    if with_optimizer:
        keep.add("optimizer")
    return sum(v for k, v in trainer.terms.items() if k in keep)


@dataclass
class EnginePlan:
    budget: float
    weights: float
    activations: float
    kv_cache: float
    kv_per_token: float
    seqs_at_max_len: int  # sequences of max_model_len the KV cache holds (vLLM refuses to start below 1)
    seqs_at_rollout_len: int  # sequences of prompt + max_tokens, i.e. the concurrency a rollout gets
    concurrent_needed: int

    @property
    def fits_needed(self) -> bool:
        return self.seqs_at_rollout_len >= self.concurrent_needed


def vllm_memory(recipe: Recipe, arch: Arch, gpu_total: float) -> EnginePlan:
    r = recipe
    tp = r.rollout.tensor_parallel
    budget = r.rollout.gpu_memory_utilization * gpu_total
    weights = (arch.weight_bytes_on_disk or arch.params * DTYPE_BYTES[r.model.dtype]) / tp
    tokens = r.rollout.max_num_batched_tokens or 8192
    # vLLM's profiling run: a forward of max_num_batched_tokens, plus CUDA graphs unless eager
    acts = tokens * (4 * arch.hidden + 2 * (arch.intermediate or arch.hidden * 4)) * 2 / tp + 0.5 * GiB
    if not r.rollout.enforce_eager:
        acts += 0.5 * GiB
    kv = budget - weights - acts
    kv_heads_per_gpu = max(arch.kv_heads // tp, 1)
    per_token = 2 * arch.layers * kv_heads_per_gpu * arch.hd * 2
    seqs = int(max(kv, 0) // (per_token * r.model.max_model_len))
    rollout_len = min(r.data.max_prompt_tokens + r.rollout.max_tokens, r.model.max_model_len)
    seqs_rollout = int(max(kv, 0) // (per_token * rollout_len))
    needed = -(-r.samples_per_rollout // r.rollout.engines)
    return EnginePlan(budget, weights, acts, kv, per_token, seqs, seqs_rollout, needed)


def colocation_mode(recipe: Recipe) -> str:
    """`sleep`: the engine frees its memory while the trainer steps (verl's hybrid engine, OpenRLHF with
    --vllm_enable_sleep); `resident`: both hold their memory all the time (prime-rl on one GPU)."""
    if recipe.backend.name == "verl":
        return "sleep"
    if recipe.backend.name == "openrlhf" and recipe.backend.extra().get("vllm_enable_sleep"):
        return "sleep"
    return "resident"
