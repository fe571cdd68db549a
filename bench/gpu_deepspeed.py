#!/usr/bin/env python3
"""Trainer-only memory of a DeepSpeed ZeRO trainer shaped like OpenRLHF 0.11.2's actor training step, on one GPU.

Mirrors what OpenRLHF 0.11.2 does for the PPO/GRPO actor with its CLI defaults (the wheel's code is the oracle; this
file reimplements it, it copies none of it):

- DeepSpeed config: `openrlhf/utils/deepspeed/deepspeed_utils.py:get_train_ds_config`, completed by
  `openrlhf/utils/deepspeed/deepspeed.py:DeepspeedStrategy.get_ds_train_config` (batch sizes) and
  `DeepspeedStrategy._ds_init_train_model` (the "AdamW" optimizer section). See `ds_config` below.
- The actor: `openrlhf/models/actor.py:Actor.__init__`: weights in bf16 (`--ds.param_dtype bf16`), for ZeRO-3 a
  `HfDeepSpeedConfig` alive while the model is built (so transformers builds it under `deepspeed.zero.Init`), LoRA
  through PEFT (`enable_input_require_grads`, `TaskType.CAUSAL_LM`, `lora_alpha` 16, `target_modules` "all-linear",
  dropout 0, bias "none"), `config.use_cache = False`; gradient checkpointing with `use_reentrant=False`
  (`openrlhf/trainer/ray/ppo_actor.py:PolicyModelActor.init_model_from_pretrained`,
  `--actor.gradient_checkpointing_reentrant` default False). Random init from a `Qwen2Config`, no download.
- The step: `ppo_actor.py:ActorPPOTrainer.training_step`: `Actor.forward` (full-sequence logits cast to fp32, kept
  alive through backward and the optimizer step by the returned `output`; log-probs of the rolled sequence over every
  position by `openrlhf/models/utils.py:log_probs_from_logits`, then the last `num_actions`), `PolicyLoss` (PPO clip
  0.2, token-mean over the step's action tokens), `DeepspeedStrategy.backward` / `optimizer_step` (engine.backward /
  engine.step), `get_grad_norm`, and the metric all-reduce. `PolicyModelActor.fit` empties the CUDA cache before and
  after the steps; micro batch = train batch (gradient accumulation 1), world size 1.

OpenRLHF depends on flash-attn 2.8.3, so a real install computes log-probs with flash-attn's Triton cross entropy
(`flash_attn.ops.triton.cross_entropy.cross_entropy_loss`) and attention with FlashAttention-2. Where flash-attn is
missing this runs sdpa attention and, for the log-probs, a stand-in that allocates what the Triton kernel allocates
(fp32 logsumexp per token forward, one fp32 [tokens, vocab] gradient backward); RLCTL_DS_LOGPROB=torch runs
OpenRLHF's own no-flash-attn path instead (gather + logsumexp in chunks of 1024 rows, more memory). Each row says
which ran (`attn`, `logprob`), and which optimizer class (`optimizer`): DeepSpeed's FusedAdam, JIT-built once before
the cases, or torch.optim.AdamW(fused=True) if that build fails (same fp32 states, no large temporaries).

Each case runs in a fresh process (world size 1) for 3 steps; peaks from NVML (sampled every 20 ms) and torch.
Before the cases a child JIT-builds FusedAdam into TORCH_EXTENSIONS_DIR (default /tmp/rlctl-torch-extensions) unless
RLCTL_DS_OPTIMIZER is set (fused_adam: load or build it in each case; torch_adamw_fused: skip DeepSpeed's op).

    python bench/gpu_deepspeed.py --out gpu_deepspeed.json
    RLCTL_DS_CASES=ds-1.5b-full-z2-gc-mb4-s2048 python bench/gpu_deepspeed.py
    python bench/gpu_deepspeed.py --build-ops            # only the FusedAdam build, prints BUILD {json}
    python bench/gpu_deepspeed.py --only-import-check    # no GPU: print every case's DeepSpeed config
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3
STEPS = 3
CASES = [
    # name, shape, lora rank (0 = full), gradient checkpointing, micro batch, sequence length, ZeRO stage
    ("ds-0.5b-full-z2-gc-mb8-s1024", "Qwen/Qwen2.5-0.5B", 0, True, 8, 1024, 2),
    ("ds-1.5b-full-z2-gc-mb4-s2048", "Qwen/Qwen2.5-1.5B", 0, True, 4, 2048, 2),
    ("ds-1.5b-full-z2-nogc-mb2-s1024", "Qwen/Qwen2.5-1.5B", 0, False, 2, 1024, 2),
    ("ds-1.5b-full-z3-gc-mb4-s2048", "Qwen/Qwen2.5-1.5B", 0, True, 4, 2048, 3),
    ("ds-3b-full-z3-gc-mb2-s2048", "Qwen/Qwen2.5-3B", 0, True, 2, 2048, 3),
    ("ds-7b-lora16-z2-gc-mb2-s2048", "Qwen/Qwen2.5-7B", 16, True, 2, 2048, 2),
    ("ds-7b-lora16-z3-gc-mb4-s1024", "Qwen/Qwen2.5-7B", 16, True, 4, 1024, 3),
    ("ds-3b-full-z2-gc-mb2-s4096", "Qwen/Qwen2.5-3B", 0, True, 2, 4096, 2),
    # held out: the plan's DeepSpeed terms were fitted on every case above (docs/memory.md), then committed with
    # their predictions for these (docs/gpu/gpu_deepspeed_h100_heldout_predicted.json) before these ran
    ("ds-0.5b-full-z3-nogc-mb4-s1024", "Qwen/Qwen2.5-0.5B", 0, False, 4, 1024, 3),
    ("ds-3b-lora32-z2-nogc-mb4-s1024", "Qwen/Qwen2.5-3B", 32, False, 4, 1024, 2),
    ("ds-7b-lora8-z2-gc-mb1-s4096", "Qwen/Qwen2.5-7B", 8, True, 1, 4096, 2),
    ("ds-1.5b-full-z3-nogc-mb2-s2048", "Qwen/Qwen2.5-1.5B", 0, False, 2, 2048, 3),
    ("ds-3b-full-z2-gc-mb1-s2048", "Qwen/Qwen2.5-3B", 0, True, 1, 2048, 2),
]

# OpenRLHF 0.11.2 defaults (openrlhf/cli/train_ppo_ray.py unless said otherwise)
ADAM = {"lr": 1e-6, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}  # --actor.adam.{lr,betas,eps,weight_decay}
MAX_NORM = 1.0  # --actor.max_norm -> gradient_clipping (utils/utils.py:get_strategy passes 1.0 as well)
LORA_ALPHA, LORA_TARGETS, LORA_DROPOUT = 16, "all-linear", 0  # --ds.lora.{alpha,target_modules,dropout}
EPS_CLIP = 0.2  # --actor.eps_clip; eps_clip_low_high defaults to (eps_clip, eps_clip)
NO_DECAY = ("bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight")  # deepspeed_utils.py
SCHEDULER = ("cosine_with_min_lr", 0.03, 0.1)  # --actor.lr_scheduler, --actor.lr_warmup_ratio, --actor.min_lr_ratio
MASTER_PORT = "29513"


def ds_config(stage: int, micro_batch: int, *, with_optimizer: bool = True) -> dict:
    """The DeepSpeed training config OpenRLHF 0.11.2 hands to deepspeed.initialize for the actor.

    Keys and values: deepspeed_utils.py:get_train_ds_config(offload=False, adam_offload=False, stage,
    param_dtype="bf16", max_norm=1.0, zpg=1, grad_accum_dtype=None, overlap_comm=False, use_ds_universal_ckpt=False,
    deepcompile=False, tensor_parallel_size=1, optim_config=...), called by deepspeed.py:
    DeepspeedStrategy.get_ds_train_config, which adds train_micro_batch_size_per_gpu and train_batch_size (here both
    the micro batch: gradient accumulation 1).
    The optimizer section is deepspeed.py:DeepspeedStrategy._ds_init_train_model's {"type": "AdamW", ...}; DeepSpeed
    builds it (runtime/engine.py:_configure_basic_optimizer -> get_optimizer_configuration: no offload, no
    "torch_adam" -> deepspeed.ops.adam.FusedAdam(adam_w_mode=True)). Actor.__init__ gets the same config without the
    optimizer section (get_ds_train_config(optim_dict=None)) for HfDeepSpeedConfig under ZeRO-3.

    The "auto" values are passed through as OpenRLHF passes them. Nothing in OpenRLHF fills them in
    (HfDeepSpeedConfig only deep-copies the dict; only transformers' Trainer subclass HfTrainerDeepSpeedConfig would),
    and DeepSpeed drops "auto" keys when it parses the config (deepspeed/runtime/config_utils.py:
    DeepSpeedConfigModel.__init__), so DeepSpeed 0.19.6's defaults apply (deepspeed/runtime/zero/config.py):
    reduce_bucket_size 5e8 elements, sub_group_size 1e9, stage3_prefetch_bucket_size 5e7,
    stage3_param_persistence_threshold 1e5, stage3_max_live_parameters 1e9, stage3_max_reuse_distance 1e9; also by
    default allgather_bucket_size 5e8, contiguous_gradients true, overlap_comm true for stage 3 / false for stage 2
    (OpenRLHF sets it only with --ds.overlap_comm), reduce_scatter true. data_types.grad_accum_dtype None means
    gradients accumulate in the model dtype, bf16 (engine.py:get_data_types). `--only-import-check` prints what
    DeepSpeed resolves.
    """
    zero = {
        "stage": stage,
        "offload_param": {"device": "none"},
        "offload_optimizer": {"device": "none", "pin_memory": True},
        "sub_group_size": "auto",
        "stage3_max_live_parameters": "auto",
        "stage3_max_reuse_distance": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "reduce_bucket_size": "auto",
        "zero_hpz_partition_size": 1,  # --ds.zpg 1
        "zero_quantized_weights": False,
        "zero_quantized_gradients": False,
    }
    if stage == 3:
        zero["reduce_scatter"] = True
    cfg = {
        "steps_per_print": 100,
        "zero_optimization": zero,
        "bf16": {"enabled": True},
        "fp16": {"enabled": False},
        "gradient_clipping": MAX_NORM,
        "prescale_gradients": False,
        "wall_clock_breakdown": False,
        "data_types": {"grad_accum_dtype": None},
        "checkpoint": {"load_universal": False},
        "compile": {"deepcompile": False},
        "tensor_parallel": {"autotp_size": 1},
    }
    if with_optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": copy.deepcopy(ADAM)}
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["train_batch_size"] = micro_batch  # --train.batch_size = micro batch, world size 1: accumulation 1
    return cfg


def qwen2_config(shape: str):
    from transformers import Qwen2Config

    sys.path.insert(0, str(ROOT))
    from rlctl.recipe.models import KNOWN

    a = KNOWN[shape.lower()]
    return Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                       tie_word_embeddings=a.tie_embeddings, use_cache=False)


def build_actor(shape: str, rank: int, stage: int, micro_batch: int, attn: str, device: str = "cuda"):
    """openrlhf/models/actor.py:Actor.__init__ with a random-init model in place of from_pretrained."""
    import torch
    from transformers import Qwen2ForCausalLM
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    cfg = qwen2_config(shape)
    # ZeRO-3: HfDeepSpeedConfig alive while the model is built, so transformers builds it under deepspeed.zero.Init
    # (partitioned bf16 parameters); OpenRLHF drops it when Actor.__init__ returns.
    dschf = HfDeepSpeedConfig(ds_config(stage, micro_batch, with_optimizer=False)) if stage == 3 else None
    if dschf is None:
        # OpenRLHF loads on the CPU and deepspeed.initialize moves the module to the GPU: same state on the GPU
        with torch.device(device):
            model = Qwen2ForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation=attn)
    else:
        model = Qwen2ForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation=attn)
        if not all(hasattr(p, "ds_id") for p in model.parameters()):
            raise RuntimeError("transformers did not build the model under deepspeed.zero.Init")
    if rank:
        from peft import LoraConfig, TaskType, get_peft_model

        model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=LORA_ALPHA,
                                                 target_modules=LORA_TARGETS, lora_dropout=LORA_DROPOUT, bias="none"))
    # set_z3_leaf_modules: only MoE blocks (and hybrid layers, off by default) become leaves; none in Qwen2
    model.config.use_cache = False
    del dschf
    return model


def grouped_parameters(model, weight_decay: float) -> list[dict]:
    """deepspeed_utils.py:get_optimizer_grouped_parameters (bias and norms without weight decay)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if not any(nd in n for nd in NO_DECAY)], "weight_decay": weight_decay},
            {"params": [p for n, p in named if any(nd in n for nd in NO_DECAY)], "weight_decay": 0.0}]


def _flash_attn_ce():
    try:
        from flash_attn.ops.triton.cross_entropy import cross_entropy_loss
    except ImportError:
        return None
    return cross_entropy_loss


def logprob_impl() -> str:
    want = os.environ.get("RLCTL_DS_LOGPROB", "auto")
    if want not in ("auto", "flash_attn", "flash_emulated", "torch"):
        raise SystemExit(f"RLCTL_DS_LOGPROB={want}: expected auto, flash_attn, flash_emulated or torch")
    if want == "auto":
        return "flash_attn" if _flash_attn_ce() is not None else "flash_emulated"
    return want


def _flash_like_ce_class():
    import torch

    class FlashLikeCrossEntropy(torch.autograd.Function):
        """What flash_attn.ops.triton.cross_entropy.CrossEntropyLoss allocates, in torch ops: forward keeps the
        logits it is given plus an fp32 logsumexp per row (small chunks, no [rows, vocab] temporary survives),
        backward allocates one fp32 [rows, vocab] gradient (inplace_backward=False) and fills it in place."""

        @staticmethod
        def forward(ctx, logits, labels):
            lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
            for s in range(0, logits.shape[0], 128):
                torch.logsumexp(logits[s:s + 128], dim=-1, out=lse[s:s + 128])
            losses = lse - logits.gather(1, labels[:, None]).squeeze(1)
            ctx.save_for_backward(logits, lse, labels)
            return losses

        @staticmethod
        def backward(ctx, grad_losses):
            logits, lse, labels = ctx.saved_tensors
            dlogits = torch.empty_like(logits)
            torch.sub(logits, lse[:, None], out=dlogits)
            dlogits.exp_().mul_(grad_losses[:, None])
            dlogits.scatter_add_(1, labels[:, None], -grad_losses[:, None])
            return dlogits, None

    return FlashLikeCrossEntropy


def log_probs_from_logits(logits, labels, impl: str):
    """openrlhf/models/utils.py:log_probs_from_logits for fp32 logits, temperature 1.0."""
    import torch

    batch_dim, last_dim = logits.shape[:-1], logits.shape[-1]
    if impl == "flash_attn":
        return -_flash_attn_ce()(logits.reshape(-1, last_dim), labels.reshape(-1))[0].view(*batch_dim)
    if impl == "flash_emulated":
        return -_flash_like_ce_class().apply(logits.reshape(-1, last_dim), labels.reshape(-1)).view(*batch_dim)
    # the ImportError branch: gather the label logits, subtract a logsumexp taken 1024 rows at a time
    logits_labels = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    flat = logits.reshape(-1, last_dim)
    lse = torch.zeros(flat.shape[0], device=logits.device, dtype=logits.dtype)
    for s in range(0, flat.shape[0], 1024):
        lse[s:s + 1024] = torch.logsumexp(flat[s:s + 1024], dim=-1)
    return logits_labels - lse.view(*batch_dim)


def actor_forward(model, sequences, action_mask, attention_mask, impl: str):
    """openrlhf/models/actor.py:Actor.forward(sequences, action_mask, attention_mask, return_output=True), no packing,
    temperature 1.0, no entropy (--actor.entropy_coef None)."""
    import torch

    rolled_sequences = torch.roll(sequences, shifts=-1, dims=1)
    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)
    output = model(sequences, attention_mask=attention_mask, position_ids=position_ids)
    output["logits"] = output["logits"].to(torch.float32)
    log_probs = log_probs_from_logits(output["logits"], rolled_sequences, impl)
    log_probs = log_probs[:, :-1]
    action_log_probs = log_probs[:, -action_mask.shape[1]:] * action_mask.float()
    return action_log_probs, output


def masked_mean(t, mask):
    return (t * mask).sum() / mask.sum()


def policy_loss(log_probs, old_log_probs, advantages, action_mask, dp_size, batch_num_tokens, global_batch_size):
    """openrlhf/models/loss.py:PolicyLoss.forward, policy_loss_type "ppo", no dual clip, no IS correction,
    token-level aggregation (--actor.loss_agg_mode token-mean)."""
    import torch

    raw_policy_log_ratio = log_probs - old_log_probs
    ratio = raw_policy_log_ratio.clamp(min=-20.0, max=20.0).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - EPS_CLIP, 1 + EPS_CLIP) * advantages
    loss = -torch.min(surr1, surr2)
    loss = (loss * action_mask).sum() / batch_num_tokens * dp_size
    clip_ratio = masked_mean(torch.lt(surr2, surr1).float(), action_mask)
    ppo_kl = masked_mean(-raw_policy_log_ratio.detach(), action_mask)
    return loss, clip_ratio, ppo_kl


def loss_batch_info(action_mask, dp_group, gas: int = 1) -> dict:
    """openrlhf/utils/loss_utils.py:_optimizer_step_loss_norm for one micro batch per optimizer step."""
    import torch
    import torch.distributed as dist

    num_tokens = torch.zeros((), dtype=torch.float32, device=action_mask.device)
    num_samples = torch.zeros((), dtype=torch.float32, device=action_mask.device)
    mask = action_mask.to(dtype=torch.float32)
    num_tokens += mask.sum()
    num_samples += (mask.reshape(mask.shape[0], -1).sum(dim=-1) > 0).sum()
    if dist.is_initialized():
        dist.all_reduce(num_tokens, op=dist.ReduceOp.SUM, group=dp_group)
        dist.all_reduce(num_samples, op=dist.ReduceOp.SUM, group=dp_group)
    dp_size = dist.get_world_size(group=dp_group) if dist.is_initialized() else 1
    return {"dp_size": dp_size, "batch_num_tokens": num_tokens / gas, "global_batch_size": num_samples / gas}


def training_step(engine, experience: dict, dp_group, impl: str) -> dict:
    """ppo_actor.py:ActorPPOTrainer.training_step without KL loss (--algo.kl.use_loss off), entropy or aux loss.
    `output` (the fp32 logits) stays referenced until this returns, as there."""
    import torch
    import torch.distributed as dist

    engine.train()
    info = loss_batch_info(experience["action_mask"], dp_group)
    action_log_probs, output = actor_forward(engine, experience["sequences"], experience["action_mask"],
                                             experience["attention_mask"], impl)
    actor_loss, clip_ratio, ppo_kl = policy_loss(action_log_probs, experience["action_log_probs"],
                                                 experience["advantages"], experience["action_mask"], **info)
    engine.backward(actor_loss)  # DeepspeedStrategy.backward
    engine.step()  # DeepspeedStrategy.optimizer_step
    grad_norm = engine.get_global_grad_norm()  # DeepspeedStrategy.get_grad_norm
    status = torch.stack([actor_loss.detach().float(), clip_ratio.float(), ppo_kl.float()])
    if dist.is_initialized():
        dist.all_reduce(status)  # ppo_train: strategy.all_reduce of the step's metrics
    grad_norm = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else float(grad_norm or 0.0)
    return {"policy_loss": status[0].item(), "grad_norm": grad_norm}


def make_experience(vocab: int, mb: int, seq: int, device: str) -> dict:
    """Random rollout: sequence = prompt + completion, completion = the last half, no padding."""
    import torch

    actions = seq // 2
    return {"sequences": torch.randint(0, vocab, (mb, seq), device=device),
            "attention_mask": torch.ones(mb, seq, dtype=torch.long, device=device),
            "action_mask": torch.ones(mb, actions, dtype=torch.bool, device=device),
            "action_log_probs": -torch.rand(mb, actions, device=device) * 4,
            "advantages": torch.randn(mb, actions, device=device)}


def child(name: str) -> dict:
    _, shape, rank, gc, mb, seq, stage = next(c for c in CASES if c[0] == name)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=MASTER_PORT, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    import deepspeed
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import get_scheduler
    from transformers.utils import is_flash_attn_2_available

    # DeepspeedStrategy.setup_distributed
    transformers.set_seed(42)
    deepspeed.init_distributed(dist_backend="nccl")
    mesh = init_device_mesh("cuda", (1, 1, 1), mesh_dim_names=("dp", "sp", "tp"))
    dp_group = mesh["dp"].get_group()

    impl = logprob_impl()
    attn = "flash_attention_2" if is_flash_attn_2_available() else "sdpa"  # --ds.attn_implementation
    model = build_actor(shape, rank, stage, mb, attn)
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)

    # DeepspeedStrategy._ds_init_train_model
    fused_adam = os.environ.get("RLCTL_DS_OPTIMIZER", "fused_adam") == "fused_adam"
    groups = grouped_parameters(model, ADAM["weight_decay"])
    client_optimizer = None
    if not fused_adam:
        client_optimizer = torch.optim.AdamW(groups, lr=ADAM["lr"], betas=tuple(ADAM["betas"]), eps=ADAM["eps"],
                                             weight_decay=ADAM["weight_decay"], fused=True)
    sched_name, warmup_ratio, min_lr_ratio = SCHEDULER
    scheduler_steps = 100  # max_steps in OpenRLHF; no bearing on memory
    sched = partial(get_scheduler, sched_name, num_warmup_steps=math.ceil(scheduler_steps * warmup_ratio),
                    num_training_steps=scheduler_steps, scheduler_specific_kwargs={"min_lr_rate": min_lr_ratio})
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=client_optimizer, model_parameters=groups if fused_adam else None, lr_scheduler=sched,
        config=ds_config(stage, mb, with_optimizer=fused_adam), args={"local_rank": 0}, dist_init_required=True)
    basic = engine.basic_optimizer
    optimizer = f"{type(basic).__module__}.{type(basic).__qualname__}" + ("" if fused_adam else "(fused=True)")
    torch.cuda.synchronize()
    after_load = torch.cuda.memory_allocated()

    vocab = qwen2_config(shape).vocab_size
    torch.cuda.empty_cache()  # PolicyModelActor.fit
    torch.cuda.reset_peak_memory_stats()
    steps, step_s = [], []
    for _ in range(STEPS):
        t0 = time.time()
        steps.append(training_step(engine, make_experience(vocab, mb, seq, "cuda"), dp_group, impl))
        torch.cuda.synchronize()
        step_s.append(round(time.time() - t0, 3))
    out = {"after_load_allocated_gib": after_load / GiB,
           "torch_peak_allocated_gib": torch.cuda.max_memory_allocated() / GiB,
           "torch_peak_reserved_gib": torch.cuda.max_memory_reserved() / GiB,
           "trainable": trainable, "zero_stage": stage, "optimizer": optimizer,
           "zero_optimizer": type(engine.optimizer).__name__, "attn": attn, "logprob": impl,
           "step_s": step_s, "last_step": steps[-1], "deepspeed": deepspeed.__version__, "torch": torch.__version__}
    torch.cuda.empty_cache()
    dist.destroy_process_group()
    return out


def build_ops() -> dict:
    """JIT-build DeepSpeed's FusedAdam once (nvcc + ninja), so that the cases only load it."""
    t0 = time.time()
    try:
        from deepspeed.ops.op_builder import FusedAdamBuilder

        FusedAdamBuilder().load(verbose=False)
    except Exception as e:  # noqa: BLE001 - any failure means: fall back to torch's fused AdamW
        return {"ok": False, "seconds": time.time() - t0, "error": f"{type(e).__name__}: {e}"[-1500:]}
    return {"ok": True, "seconds": time.time() - t0}


def import_check() -> None:
    """No GPU: import deepspeed, print every case's config and what DeepSpeed resolves from it."""
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    print(f"deepspeed {deepspeed.__version__} from {deepspeed.__file__}")
    for name, shape, rank, gc, mb, seq, stage in CASES:
        cfg = ds_config(stage, mb)
        ds = DeepSpeedConfig(copy.deepcopy(cfg))
        z = ds.zero_config
        keys = ("stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
                "reduce_scatter", "prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters",
                "max_reuse_distance", "sub_group_size", "zero_hpz_partition_size")
        resolved = {k: getattr(z, k) for k in keys}
        resolved.update(offload_param=str(z.offload_param.device) if z.offload_param else None,
                        offload_optimizer=str(z.offload_optimizer.device) if z.offload_optimizer else None,
                        bf16=ds.bfloat16_config.enabled, grad_accum_dtype=ds.grad_accum_dtype,
                        gradient_clipping=ds.gradient_clipping, train_batch_size=ds.train_batch_size,
                        micro_batch=ds.train_micro_batch_size_per_gpu,
                        gradient_accumulation_steps=ds.gradient_accumulation_steps, optimizer=ds.optimizer_name,
                        optimizer_params=ds.optimizer_params)
        print(json.dumps({"config": name, "shape": shape, "lora": rank, "ac": gc, "mb": mb, "seq": seq,
                          "zero_stage": stage, "ds_config": cfg, "deepspeed_resolved": resolved}))


def run_case(case: tuple, h) -> dict:
    import pynvml

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
    try:
        p = subprocess.run([sys.executable, __file__, "--child", case[0]], capture_output=True, text=True, timeout=300)
        stdout, stderr = p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + "\ntimeout after 300 s"
    stop.set()
    t.join()
    line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
    row = {"config": case[0], "shape": case[1], "lora": case[2], "ac": case[3], "mb": case[4], "seq": case[5],
           "zero_stage": case[6], "nvml_before_gib": before, "nvml_peak_run_gib": peak[0] - before,
           "wall_s": time.time() - t0, **(json.loads(line[7:]) if line else {"error": stderr[-1500:]})}
    row["oom"] = "out of memory" in stderr.lower()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu_deepspeed.json"))
    ap.add_argument("--child")
    ap.add_argument("--build-ops", action="store_true", help="only JIT-build DeepSpeed's FusedAdam")
    ap.add_argument("--only-import-check", action="store_true")
    a = ap.parse_args()
    # nvcc and torch's CUDA must agree on major.minor for DeepSpeed's op builder; the JIT build of one op for the
    # GPU at hand does not need that guard (deepspeed/ops/op_builder/builder.py:assert_no_cuda_mismatch)
    os.environ.setdefault("DS_SKIP_CUDA_CHECK", "1")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/rlctl-torch-extensions")
    if a.only_import_check:
        import_check()
        return
    if a.build_ops:
        print("BUILD " + json.dumps(build_ops()), flush=True)
        return
    if a.child:
        print("RESULT " + json.dumps(child(a.child)), flush=True)
        return
    import pynvml

    only = set(filter(None, os.environ.get("RLCTL_DS_CASES", "").split(",")))
    cases = [c for c in CASES if not only or c[0] in only]
    build = {"skipped": "RLCTL_DS_OPTIMIZER set"}
    if "RLCTL_DS_OPTIMIZER" not in os.environ:
        try:
            p = subprocess.run([sys.executable, __file__, "--build-ops"], capture_output=True, text=True, timeout=300)
            line = next((x for x in p.stdout.splitlines() if x.startswith("BUILD ")), None)
            build = json.loads(line[6:]) if line else {"ok": False, "error": p.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            build = {"ok": False, "error": "FusedAdam build timed out after 300 s"}
        os.environ["RLCTL_DS_OPTIMIZER"] = "fused_adam" if build.get("ok") else "torch_adamw_fused"
        print("FusedAdam build: " + json.dumps(build), flush=True)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    results = []
    for case in cases:
        row = run_case(case, h)
        results.append(row)
        print(json.dumps(row), flush=True)
        a.out.write_text(json.dumps({"results": results, "fused_adam_build": build}, indent=2))


if __name__ == "__main__":
    main()
