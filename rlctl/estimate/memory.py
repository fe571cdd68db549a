"""GPU memory plan for a recipe: the trainer per GPU and the vLLM engine per GPU.

The trainer figure is what NVML shows the trainer process using at its peak (what an OOM sees): torch's allocated
peak (terms below: the larger of forward/backward and the optimizer step) times the caching allocator's slack, plus
the non-torch memory. Each term follows what the backend really holds, asked of its adapter (`memory_engine`,
`param_dtype`, `logits_scope`, `logit_bytes`, `lora_base_master`, `foreach_adam`, `micro_tokens` and
`memory_features`: checkpointing every N-th layer, activation offloading, optimizer states on the CPU, fused log-prob
heads, dynamic token budgets); the core names no backend. The constants were measured on an H100 with rlctl launching
TRL GRPO (bench/gpu_memory.py) and with trainers shaped like prime-rl's (FSDP2), verl's (FSDP1) and OpenRLHF's
(DeepSpeed ZeRO) (bench/gpu_fsdp.py, bench/gpu_deepspeed.py); docs/memory.md has every point, some held out.

vLLM follows vLLM's own rule (vllm/v1/worker/gpu_worker.py, determine_available_memory): the engine may use
`gpu_memory_utilization x total memory`; at startup it refuses when less than that is free; the KV cache gets that
budget minus the weights, the profiled activation peak of a max_num_batched_tokens forward and non-torch memory;
CUDA graphs are captured after the KV cache is allocated, out of the remaining headroom.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlctl.backends.base import MemoryFeatures
from rlctl.recipe.models import Arch

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

GiB = 1024**3

# Usable memory as torch/vLLM report it (GiB), by the names people write in resources.gpu.
GPU_MEMORY_GIB = {
    "h100-80gb": 79.18, "h100": 79.18, "h100-pcie": 79.18, "h100-sxm": 79.18, "h100-94gb": 93.1,
    "h200": 139.8, "h200-141gb": 139.8, "a100-80gb": 79.15, "a100": 79.15, "a100-40gb": 39.4,
    "a6000": 47.5, "rtx-a6000": 47.5, "a6000-48gb": 47.5, "l40s": 44.4, "rtx4090": 23.5, "4090": 23.5, "l4": 22.0,
    "b200": 178.4,
}

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}
# NVML-visible memory of a torch process besides its allocator: CUDA context, kernels, cuBLAS/NCCL handles
# (measured on an H100, torch 2.11 / CUDA 13: NVML used - torch reserved = 0.77-0.81 GiB over 14 runs).
CUDA_CONTEXT = 0.78 * GiB
# NVML-visible / allocated peak of the caching allocator (besides the context), by memory engine: one process
# (TRL) 1.01-1.10; FSDP2 with per-layer all-gathers: LoRA 1.09-1.11, full fine-tune 1.33-1.36 (optimizer states and
# gradients allocated between freed activation blocks); DeepSpeed ZeRO-2/3 (OpenRLHF-shaped): full fine-tune
# 1.08-1.31 (median 1.14), LoRA 1.04-1.08.
ALLOCATOR_SLACK = {"plain": 1.04, "fsdp": 1.35, "fsdp-lora": 1.11, "fsdp1": 1.40, "fsdp1-lora": 1.11,
                   "deepspeed": 1.15, "deepspeed-lora": 1.06}
# ... and where the optimizer step is the peak: FSDP2's per-parameter shards fit the blocks forward/backward freed
# (reserved = allocated); FSDP1's flat parameters 1.18-1.32 (verl-shaped, 3 full fine-tunes); others as above.
STEP_SLACK = {"fsdp": 1.0, "fsdp1": 1.22}

# Activations of one decoder layer per token in bytes, bf16 compute: ACT_H * hidden + ACT_I * intermediate
# (fitted on the 0.5B bf16 TRL run and checked on 7B LoRA TRL and FSDP runs: docs/memory.md). With checkpointing
# each layer keeps its input (fp32 under autocast with fp32 parameters) and one layer is recomputed at a time.
ACT_H = 12.0
ACT_I = 10.0
# Autocast with fp32 parameters keeps bf16 copies of the weights: saved for backward without checkpointing; with
# checkpointing they live in the autocast cache to the end of each forward (peak: copies + AUTOCAST_EXTRA).
AUTOCAST_EXTRA = 0.35 * GiB
# A fused chunked log-prob head (logits never materialised) holds, per token x vocab element of one chunk: the bf16
# logits, their fp32 scaled copy, exp and, in backward, the fp32 probabilities and their gradient.
FUSED_LOGIT_BYTES = 18.0
# DeepSpeed ZeRO with bf16 (bench/gpu_deepspeed.py, shaped like OpenRLHF's actor): gradients are bf16 (grad_accum_dtype
# unset); ZeRO's reduce bucket (reduce_bucket_size, 5e8 elements by default) is allocated beside them; the optimizer
# step flattens the bf16 gradient partition and casts it to fp32 next to the kept one (stage 1/2: 2 + 2 + 4 bytes per
# trainable parameter), stage 3 casts per sub-group (sub_group_size, 1e9 elements). NCCL and DeepSpeed hold more
# outside torch than one plain process: NVML - reserved measured 1.68 GiB (stage 1/2) and 1.30 GiB (stage 3).
DEEPSPEED_GRAD_BYTES = 2
DEEPSPEED_BUCKET = 5e8
DEEPSPEED_SUB_GROUP = 1e9
DEEPSPEED_CONTEXT = {2: 1.68 * GiB, 3: 1.30 * GiB}


def gpu_memory_gib(name: str) -> float | None:
    key = name.strip().lower().replace(" ", "-").replace("_", "-")
    if key in GPU_MEMORY_GIB:
        return GPU_MEMORY_GIB[key]
    m = re.search(r"(\d+)\s*gb", key)
    if m:
        return float(m.group(1)) * 0.99  # "80GB" cards expose ~79 GiB
    return None


def card_like(total_gib: float, named_gib: float) -> bool:
    """A card NVML sees as the one `resources.gpu` names: the named figures round (80 GB -> 79.2 GiB; boards of
    one model differ by a few hundred MiB), so within 3%."""
    return abs(total_gib / named_gib - 1) <= 0.03


def card_name(name: str, total_gib: float) -> str:
    """How a recipe's `resources.gpu` names this card: the catalog's key found in NVML's name ("NVIDIA H200" ->
    "H200"), else its memory in GB (44.4 GiB -> "45GB"), which gpu_memory_gib reads back."""
    words = name.lower().replace("nvidia", " ").split()
    known = [w for w in words if w in GPU_MEMORY_GIB and card_like(total_gib, GPU_MEMORY_GIB[w])]
    return known[0].upper() if known else f"{round(total_gib / 0.99)}GB"


@dataclass
class Breakdown:
    """Bytes per term, in the order they are printed; `total` is the NVML-visible peak of one trainer process."""

    terms: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    def table(self) -> str:
        return ", ".join(f"{k} {v / GiB:.1f}" for k, v in self.terms.items() if v >= 0.05 * GiB)


def _adapter(recipe: Recipe):
    from rlctl.backends import get_backend

    return get_backend(recipe.backend.name)


def _per_token_layer(arch: Arch) -> float:
    inter = arch.expert_intermediate * arch.experts_per_token if arch.experts else arch.intermediate
    return ACT_H * arch.hidden + ACT_I * inter


def _features(recipe: Recipe, checkpointing: bool | None) -> MemoryFeatures:
    """The adapter's MemoryFeatures for the recipe with its gradient checkpointing overridden (for a fix)."""
    r = recipe
    if checkpointing is not None and checkpointing != r.train.gradient_checkpointing:
        r = r.model_copy(deep=True)
        r.train.gradient_checkpointing = checkpointing
    return _adapter(r).memory_features(r)


def checkpointed_layers(layers: int, every: int | None) -> int:
    """Layers with layer_id % every == 0 (how the trainers apply checkpointing every N-th layer)."""
    return 0 if not every else -(-layers // every)


def trainer_memory(recipe: Recipe, arch: Arch, micro_batch: int | None = None,
                   checkpointing: bool | None = None, features: MemoryFeatures | None = None,
                   token_budget: int | None = None) -> Breakdown:
    """The trainer's peak per GPU. micro_batch / checkpointing / token_budget override the recipe's (for computing
    a fix); `features` overrides what the adapter says (for a measured configuration)."""
    r = recipe
    f = features if features is not None else _features(r, checkpointing)
    a = _adapter(r)
    b = Breakdown()
    engine = a.memory_engine(r)
    fsdp = engine in ("fsdp", "fsdp1")
    dp = max(r.trainer_gpu_count, 1)
    stage = 3 if fsdp else (r.train.zero_stage if engine == "deepspeed" else 0)
    P = arch.params
    cb = DTYPE_BYTES[r.model.dtype]  # compute dtype
    pdt = a.param_dtype(r)
    pb = DTYPE_BYTES[pdt]  # master parameters / gradients / Adam states
    full = r.lora is None
    T = P if full else arch.lora_params(r.lora.rank, r.lora.target_modules)  # trainable parameters
    mb = micro_batch or r.train.micro_batch_size
    every = f.checkpoint_every
    gc = every is not None
    b.notes.extend(f.notes)

    def shard(x: float, from_stage: int) -> float:
        return x / dp if stage >= from_stage else x

    if engine == "deepspeed":  # bf16 weights + grads; fp32 master + m + v inside the optimizer
        w_b, g_b, o_b = cb, DEEPSPEED_GRAD_BYTES, 4 + 2 * pb
        b.notes.append(f"DeepSpeed ZeRO-{stage}: {r.model.dtype} weights and gradients, {pdt} master + Adam m, v")
    else:
        w_b, g_b, o_b = pb, pb, 2 * pb
        b.notes.append(f"{engine}: {pdt} parameters, gradients and Adam m, v; compute in {r.model.dtype}")
    base_b = w_b if full else (pb if a.lora_base_master else cb)
    b.terms["weights"] = shard(P * base_b, 3)
    if not full:
        b.terms["lora weights"] = T * pb
    b.terms["gradients"] = shard(T * g_b, 2)
    opt_states = shard(T * o_b, 1)
    b.terms["optimizer"] = 0.0 if f.optimizer == "cpu" else opt_states
    if f.optimizer == "cpu":
        b.notes.append("optimizer states on the CPU")
    # a reference model: the full fine-tune's frozen copy; with LoRA only where it is a process of its own (OpenRLHF
    # loads the base model there; TRL and verl take the base by switching the adapters off)
    reference = r.algorithm.kl_coef > 0 and f.reference_on_gpu and (full or f.reference_process)
    if reference and not f.reference_process:
        # TRL loads the reference with the policy's model_init_kwargs (fp32 under mixed); FSDP/DeepSpeed: bf16 shards
        b.terms["reference model"] = shard(P * (pb if engine == "plain" else cb), 3)
    autocast_fp32 = engine == "plain" and pb > cb and base_b > cb
    if fsdp:
        per_layer_params = (P - arch.vocab * arch.hidden) / max(arch.layers, 1)
        b.terms["gathered layers"] = 2 * per_layer_params * cb  # FSDP unshards one layer ahead (prefetch)

    if token_budget is not None:
        tokens = token_budget
    elif f.token_budget is not None and micro_batch is None:
        tokens = f.token_budget[1]
        b.notes.append(f"dynamic batching: {tokens} tokens per micro batch ({f.token_budget[0]})")
    else:
        tokens = a.micro_tokens(r, mb)
    resid = 4 if autocast_fp32 else cb
    per_layer = _per_token_layer(arch) * cb / 2
    L = arch.layers
    n_ck = checkpointed_layers(L, every)
    if gc:
        # checkpointed layers keep their input; the others keep everything; one layer is recomputed at a time
        if f.activation_offload is not None:
            # every saved tensor goes to the CPU as it is saved (the kept inputs and the non-checkpointed layers'
            # activations alike) but the last few in flight
            kept = min(n_ck, f.activation_offload) * arch.hidden * resid
            b.notes.append(f"activation offloading: {f.activation_offload} saved tensors stay on the GPU")
            acts = tokens * (kept + per_layer)
        else:
            acts = tokens * (n_ck * arch.hidden * resid + (L - n_ck) * per_layer + per_layer)
        b.notes.append("activation checkpointing: " + ("every layer" if n_ck == L else f"{n_ck} of {L} layers")
                       + " (input kept, one layer recomputed at a time)")
    else:
        acts = tokens * L * per_layer
    if f.logits_chunk is not None:
        logits = f.logits_chunk * FUSED_LOGIT_BYTES
        b.notes.append(f"fused log-prob head: {f.logits_chunk} token x vocab elements at a time")
    else:
        logit_tokens = mb * r.rollout.max_tokens if a.logits_scope == "completion" else tokens
        logit_bytes = f.logit_bytes if f.logit_bytes is not None else a.logit_bytes
        logits = logit_tokens * arch.vocab * logit_bytes * cb / 2
    transient = acts + logits
    if autocast_fp32:
        copies = P * cb
        b.terms["autocast weight copies"] = copies if not gc else max(copies + AUTOCAST_EXTRA - transient, 0.0)
        transient += b.terms["autocast weight copies"]
        b.notes.append("autocast: bf16 copies of the fp32 weights (saved for backward, or cached per forward)")
    # with gradient accumulation the gradients of earlier micro batches are there during every forward/backward;
    # without it they appear as backward frees the activations (peak at the end of backward when they outweigh them)
    grads = b.terms.pop("gradients")
    accumulation = max(r.train.train_batch_size // max(mb * dp, 1), 1)
    b.terms["gradients"] = grads if accumulation > 1 else max(grads - transient, 0.0)
    if f.unsharded_grad_bytes and accumulation > 1:
        b.terms["unsharded gradients (accumulation)"] = T * f.unsharded_grad_bytes
    b.terms["activations"] = acts
    b.terms["logits"] = logits
    if engine == "deepspeed":
        # ZeRO's reduce bucket is there through backward and the step, reduce_bucket_size elements whatever the
        # trainable count (contiguous_gradients, DeepSpeed's default: setup_buckets allocates torch.empty(
        # reduce_bucket_size) at the first gradient): a LoRA actor's is 0.93 GiB too (OpenRLHF 0.10.4, 0.5B, rank 16:
        # torch's allocated peak 4.30 GiB, 3.73 planned with a bucket of the 8.8M adapter elements). The step casts
        # the flattened gradients to fp32 beside the bf16 ones: it counts where it outweighs forward/backward
        b.terms["gradient bucket"] = DEEPSPEED_BUCKET * cb
        part = shard(T, 1)
        cast = part * 4 if stage < 3 else min(part, DEEPSPEED_SUB_GROUP) * 4
        step_extra = shard(T * g_b, 2) + part * cb + cast
        b.terms["optimizer step (beyond forward/backward)"] = max(step_extra - (b.terms["gradients"] + transient),
                                                                   0.0)
    elif f.optimizer != "cpu":
        # the step holds all gradients, the states (brought in for the step only where they live on the CPU between
        # steps) and foreach AdamW's temporary; activations and logits are gone by then: it counts where it outweighs
        # forward/backward
        opt = b.terms.pop("optimizer") if f.optimizer == "step" else 0.0
        temp = shard(T * pb, 1) if a.foreach_adam else 0.0
        step_extra = grads + opt + temp - (b.terms["gradients"] + transient)
        b.terms["optimizer step (beyond forward/backward)"] = max(step_extra, 0.0)
        if f.optimizer == "step":
            b.notes.append("optimizer states on the CPU between steps, on the GPU for the step")
    if not r.uses_vllm:
        # TRL generates with the training model; generation is its own phase: weights (+ bf16 copies), optimizer
        # states, the KV cache of the generation batch. Counted only where it exceeds the training step.
        per_device = r.samples_per_rollout / dp
        kv = per_device * (r.data.max_prompt_tokens + r.rollout.max_tokens) * arch.kv_bytes_per_token(cb)
        gen = kv + (P * cb if autocast_fp32 else 0.0)
        train_extra = b.terms["gradients"] + acts + logits + b.terms.get("autocast weight copies", 0.0)
        b.terms["generation (beyond training)"] = max(gen - train_extra, 0.0)
    allocated = sum(b.terms.values())
    slack = ALLOCATOR_SLACK.get(f"{engine}-lora" if not full else engine) or ALLOCATOR_SLACK.get(engine, 1.1)
    step_beyond = b.terms.get("optimizer step (beyond forward/backward)", 0.0)
    if f.transient_slack:
        # a trainer whose training phase leaves blocks of differing sizes cached (micro batches of differing lengths,
        # per-parameter gradients, the step's casts), measured for full fine-tunes and LoRA apart (the adapter says):
        # the slack grows with the step's transient memory, not with the states allocated once
        moving = acts + logits + b.terms.get("gradient bucket", 0.0) + step_beyond
        reserved = allocated + f.transient_slack * moving
        b.notes.append(f"allocator slack: {f.transient_slack:g}x the step's transient memory, as measured for this "
                       "trainer")
    elif step_beyond and full:
        reserved = max((allocated - step_beyond) * slack, allocated * STEP_SLACK.get(engine, slack))
    else:
        reserved = allocated * slack
    b.terms["allocator slack"] = reserved - allocated
    b.terms["cuda context"] = DEEPSPEED_CONTEXT[3 if stage >= 3 else 2] if engine == "deepspeed" else CUDA_CONTEXT
    if reference and f.reference_process:
        # its own process beside the trainer's (OpenRLHF's ReferenceModelActor): bf16 weights, sharded as the actor's
        # under ZeRO-3 (get_ds_eval_config takes the actor's stage), and a CUDA context of its own; its forward's
        # blocks are freed (empty_cache) before the actor trains
        b.terms["reference model (own process)"] = shard(P * cb, 3) + b.terms["cuda context"]
        b.notes.append("the reference model is a process of its own on this GPU (its weights and CUDA context)")
    b.facts = {"engine": engine, "param_dtype": pdt, "tokens_per_micro_batch": tokens, "micro_batch": mb,
               "checkpointing": gc, "checkpointed_layers": n_ck, "gradient_accumulation": accumulation,
               "allocated_peak": allocated, "optimizer": f.optimizer, "token_budget": f.token_budget,
               "backend_notes": list(f.notes), "sleeps": f.trainer_sleeps}
    return b


def trainer_resident(trainer: Breakdown, with_optimizer: bool = False) -> float:
    """What the trainer holds between steps: its weights (and, once it has stepped, its optimizer states); a trainer
    that sleeps while the engine generates (its states offloaded) holds only its contexts and the reference."""
    keep = {"reference model", "reference model (own process)", "cuda context"}
    if not trainer.facts.get("sleeps"):
        keep |= {"weights", "lora weights"}
        if with_optimizer:
            keep.add("optimizer")
    return sum(v for k, v in trainer.terms.items() if k in keep)


def fitting_fix(recipe: Recipe, arch: Arch, limit: float) -> dict[str, Any]:
    """What makes the trainer fit in `limit` bytes, computed: the largest micro batch (or, with dynamic batching,
    the largest token budget) with the recipe's checkpointing, else checkpointing on and the largest with it. {}
    when even the smallest with checkpointing does not fit."""
    gc = recipe.train.gradient_checkpointing
    budget = _adapter(recipe).memory_features(recipe).token_budget
    for use_gc in ([True] if gc else [False, True]):
        if budget is not None:
            key, most = budget
            least = _adapter(recipe).trainer_seq_len(recipe)  # one whole sequence must fit a micro batch
            step = 256
            best = 0
            for tokens in range(least, most + 1, step):
                if trainer_memory(recipe, arch, checkpointing=use_gc, token_budget=tokens).total > limit:
                    break
                best = tokens
            if best:
                peak = trainer_memory(recipe, arch, checkpointing=use_gc, token_budget=best).total
                return {"token_budget": (key, best), "gradient_checkpointing": use_gc, "peak": peak,
                        "micro_batch_size": recipe.train.micro_batch_size}
            continue
        best = 0
        for mb in range(1, recipe.train.micro_batch_size + 1):
            if trainer_memory(recipe, arch, micro_batch=mb, checkpointing=use_gc).total > limit:
                break
            best = mb
        if best:
            peak = trainer_memory(recipe, arch, micro_batch=best, checkpointing=use_gc).total
            return {"micro_batch_size": best, "gradient_checkpointing": use_gc, "peak": peak}
        # every smaller micro batch accumulates (fp32 gradients held across micro batches): the one that needs no
        # accumulation can be the least of all although it is larger
        whole = no_accumulation_micro_batch(recipe)
        if whole is not None:
            peak = trainer_memory(recipe, arch, micro_batch=whole, checkpointing=use_gc).total
            if peak <= limit:
                return {"micro_batch_size": whole, "gradient_checkpointing": use_gc, "peak": peak}
    return {}


def no_accumulation_micro_batch(recipe: Recipe) -> int | None:
    """The micro batch above the recipe's that takes a GPU's whole share of the train batch in one (no gradient
    accumulation), where the trainer forms micro batches as told; None where there is none."""
    if not _adapter(recipe).honours_micro_batch:
        return None
    dp = max(recipe.trainer_gpu_count, 1)
    whole, rest = divmod(recipe.train.train_batch_size, dp)
    return whole if not rest and whole > recipe.train.micro_batch_size else None


def fix_text(fix: dict[str, Any], recipe: Recipe) -> str | None:
    if not fix:
        return None
    parts = []
    if fix["gradient_checkpointing"] and not recipe.train.gradient_checkpointing:
        parts.append("train.gradient_checkpointing = true")
    if "token_budget" in fix:
        key, tokens = fix["token_budget"]
        if tokens != _adapter(recipe).memory_features(recipe).token_budget[1]:
            parts.append(f"{key} = {tokens}")
    elif fix["micro_batch_size"] != recipe.train.micro_batch_size:
        # a larger micro batch that needs less: the one without gradient accumulation (say why, it reads backwards)
        why = " (one micro batch per step: no gradient accumulation)" if \
            fix["micro_batch_size"] > recipe.train.micro_batch_size else ""
        parts.append(f"train.micro_batch_size = {fix['micro_batch_size']}{why}")
    if not parts:
        return None
    return " and ".join(parts) + f" (trainer peak {fix['peak'] / GiB:.1f} GiB)"


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
    cuda_graphs: float = 0.0  # captured after the KV cache: outside the budget, inside the GPU

    @property
    def fits_needed(self) -> bool:
        return self.seqs_at_rollout_len >= self.concurrent_needed


# vLLM's profile run (v1/worker/gpu_model_runner.py profile_run; V0: worker/model_runner.py) is one forward of
# max_num_batched_tokens tokens, then the sampler, top-k and top-p on, over one row per sequence (min(tokens,
# max_num_seqs) rows). The forward's tensors are gone before the sampler's exist: the profiled torch peak is the larger
# of the two. Checked against figures vLLM logged: docs/vllm_published_logs.json, tests/test_vllm_published_logs.py.
VLLM_NON_TORCH = 0.25 * GiB  # NCCL/cuBLAS buffers vLLM finds outside torch during profiling, TP 1 (logged 0.13-0.46)
# TP > 1 over NVLink adds the custom / symmetric-memory all-reduce buffers: logged 2.06-2.21 GiB per GPU on H100
# (vLLM 0.19, TP 2 and 4; 3.58 in 0.6.5); PCIe cards all-reduce through NCCL alone (L40S, TP 2: 0.30)
VLLM_NON_TORCH_NVLINK_TP = 2.1 * GiB
VLLM_NVLINK_GPUS = ("h100", "h200", "h800", "a100", "a800", "b100", "b200", "gb200")
VLLM_CUDA_GRAPHS = 0.6 * GiB  # graph pool of the default capture sizes, logged "Graph capturing finished ... GiB"
# The forward, per token, in elements of the model dtype: the residual stream and the normed / MLP input and output
# copies of the hidden state (4 x hidden, whole on every TP rank) and the gate/up projection plus the activation's
# output (3 x intermediate, split by TP). Logged 0.77 GiB (CodeLlama-7B) and 0.85 (Granite-3.1-8B) at 8192 tokens.
VLLM_FWD_HIDDEN = 4
VLLM_FWD_INTER = 3
# The sampler, per sequence x vocabulary entry: the logits in the model dtype and in fp32, the top-k/top-p sort of the
# whole vocabulary (fp32 values, int64 indices, the sort's scratch), softmax and mask copies: 39 bytes as logged
# through vLLM 0.16 (Qwen3-14B, 1024 sequences: 5.64 GiB; V0 with 256: 1.26 GiB for a 128k vocabulary, 1.42 for 152k),
# 15 from 0.17 on (Qwen3-14B: 2.23 GiB; 0.19: 1.89 for 128k, 3.65 for 256k).
VLLM_SAMPLER_BYTES = 39
VLLM_SAMPLER_BYTES_SINCE_0_17 = 15


def _version(vllm_version: str | None) -> tuple[int, ...] | None:
    return tuple(int(x) for x in re.findall(r"\d+", vllm_version or "")[:3]) or None


def vllm_max_num_seqs(gpu: str, gpu_total: float, version: tuple[int, ...] | None) -> int:
    """vLLM's default max_num_seqs (engine/arg_utils.py, 0.8.5 on): 1024 on GPUs of >= 70 GiB but the A100, 256
    elsewhere and before (verl's rollout config sets 1024 on every GPU)."""
    big = gpu_total >= 70 * GiB and "a100" not in gpu.lower() and (version is None or version >= (0, 8, 5))
    return 1024 if big else 256


def vllm_activations(recipe: Recipe, arch: Arch, gpu_total: float, tokens: int, tp: int,
                     version: tuple[int, ...] | None) -> float:
    """The profiled peak of one engine (see above): the larger of the forward of `tokens` batched tokens and the
    sampler over max_num_seqs rows, plus the non-torch memory profiling finds."""
    dtype_bytes = DTYPE_BYTES[recipe.model.dtype]
    gpu = recipe.resources.gpu.lower()
    seqs_sampled = min(tokens, vllm_max_num_seqs(gpu, gpu_total, version))
    inter = arch.expert_intermediate * arch.experts_per_token if arch.experts else arch.intermediate
    forward = tokens * (VLLM_FWD_HIDDEN * arch.hidden + VLLM_FWD_INTER * inter / tp) * dtype_bytes
    per_logit = VLLM_SAMPLER_BYTES_SINCE_0_17 if version is not None and version >= (0, 17) else VLLM_SAMPLER_BYTES
    sampler = seqs_sampled * arch.vocab * per_logit
    nvlink = tp > 1 and "pcie" not in gpu and any(name in gpu for name in VLLM_NVLINK_GPUS)
    return max(forward, sampler) + (VLLM_NON_TORCH_NVLINK_TP if nvlink else VLLM_NON_TORCH)


def vllm_kv_per_token(recipe: Recipe, arch: Arch, tp: int) -> float:
    """KV cache bytes per token on one GPU (kv_cache_dtype "auto": the model's dtype)."""
    return 2 * arch.layers * max(arch.kv_heads // tp, 1) * arch.hd * DTYPE_BYTES[recipe.model.dtype]


def vllm_memory(recipe: Recipe, arch: Arch, gpu_total: float, vllm_version: str | None = None) -> EnginePlan:
    """vLLM's KV cache rule for `recipe`'s engine. `vllm_version` ("0.19.0"; None: 0.8.5-0.16, the V1 engines the
    seeds run) picks the default max_num_seqs and the sampler's bytes, the only version-dependent terms."""
    r = recipe
    tp = r.rollout.tensor_parallel
    version = _version(vllm_version)
    budget = r.rollout.gpu_memory_utilization * gpu_total
    weights = (arch.weight_bytes_on_disk or arch.params * DTYPE_BYTES[r.model.dtype]) / tp
    acts = vllm_activations(r, arch, gpu_total, r.rollout.max_num_batched_tokens or 8192, tp, version)
    kv = budget - weights - acts
    per_token = vllm_kv_per_token(r, arch, tp)
    seqs = int(max(kv, 0) // (per_token * r.model.max_model_len))
    rollout_len = min(r.data.max_prompt_tokens + r.rollout.max_tokens, r.model.max_model_len)
    seqs_rollout = int(max(kv, 0) // (per_token * rollout_len))
    needed = -(-r.samples_per_rollout // r.rollout.engines)
    graphs = 0.0 if r.rollout.enforce_eager else VLLM_CUDA_GRAPHS
    return EnginePlan(budget, weights, acts, kv, per_token, seqs, seqs_rollout, needed, graphs)


def colocated_parts(trainer: Breakdown, engine: EnginePlan, mode: str) -> dict[str, float]:
    """What one GPU shared by the trainer and a rollout engine holds at its peak, by part. `resident`: both all the
    time (trainer step peak + the engine's whole budget); `sleep`: the larger of the rollout (the trainer's weights
    and optimizer states + the awake engine) and the training step (the trainer's peak + the sleeping engine's
    weights)."""
    if mode != "sleep":
        return {"trainer": trainer.total, "rollout vLLM": engine.budget}
    rollout = {"trainer (between steps)": trainer_resident(trainer, with_optimizer=True),
               "rollout vLLM": engine.budget}
    training = {"trainer": trainer.total, "rollout vLLM (asleep: weights)": engine.weights}
    return rollout if sum(rollout.values()) > sum(training.values()) else training


def colocation_mode(recipe: Recipe) -> str:
    """`sleep`: the engine frees its memory while the trainer steps (verl's hybrid engine, OpenRLHF with
    --vllm_enable_sleep); `resident`: both hold their memory all the time (prime-rl on one GPU). The adapter says."""
    return _adapter(recipe).colocation_mode(recipe)
