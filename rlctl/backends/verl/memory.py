"""What verl's FSDP actor does with GPU memory during its update, as the releases rlctl renders (0.9.0, 0.9.1) run
it: read from the keys rlctl renders plus the recipe's `backend.verl.extra` passthrough, over verl's own defaults.

Paths below are inside the verl wheel. Both releases train through the new worker (workers/engine_workers.py,
ActorRolloutRefWorker -> TrainingWorker -> workers/engine/fsdp/transformer_impl.py FSDPEngineWithLMHead); there is no
legacy dp_actor.py in 0.9.

- Micro batches (workers/engine/utils.py prepare_micro_batches). `actor.use_dynamic_bsz`: packed by token count,
  `max_token_len = max_token_len_per_gpu x sp_size` per sequence-parallel group (each of its sp GPUs holds 1/sp), with
  engine_workers.py init_model setting the update's max_token_len_per_gpu = `actor.ppo_max_token_len_per_gpu` and the
  log-prob recomputation's = `rollout.log_prob_max_token_len_per_gpu` (which defaults to the former,
  rollout.yaml `${oc.select:...}`). utils/seqlen_balancing.py rearrange_micro_batches: 0.9.1 caps every micro batch
  at the budget; 0.9.0 only splits into ceil(tokens / budget) micro batches balanced by attention workload, so one
  can exceed it. Without dynamic batching: `ppo_micro_batch_size_per_gpu` samples. With `model.use_remove_padding`
  (default True, workers/config/model.py HFModelConfig) a micro batch is its samples' real tokens, packed.
- Activation checkpointing: transformer_impl.py _build_module calls HF `gradient_checkpointing_enable` (every decoder
  layer) when `model.enable_gradient_checkpointing` (default True; rlctl renders train.gradient_checkpointing, a
  passthrough rendered after it wins). `model.enable_activation_offload` (default False): utils/activation_offload.py
  enable_activation_offloading offloads each FSDP-wrapped layer's saved tensors, all layers but the last, "at most
  two activation groups in GPU memory".
- Offload: workers/engine/base.py BaseEngineCtx._context_switch moves parameters (`param_offload`) and optimizer
  states (`optimizer_offload`) back to the GPU on entering train mode, which engine_workers.py
  TrainingWorker.train_mini_batch holds around the whole update (forward, backward and optimizer step of every
  mini-batch), and to the CPU on leaving it. Only FSDP2's CPUOffloadPolicy (`fsdp_config.offload_policy` with
  strategy fsdp2, transformer_impl.py _build_fsdp_module) keeps them on the CPU during training.
- Log-probs: transformer_impl.py prepare_model_outputs takes the model's bf16 logits over every packed token (prompt
  and response), divides them by the rollout temperature (0.9.1 skips that copy at temperature 1,
  _scale_logits_by_temperature) and calls utils/torch_functional.py logprobs_from_logits: flash-attn's Triton
  cross_entropy_loss (flash-attn: verl[gpu] in 0.9.0, verl[fsdp] in 0.9.1, needed by the default
  flash_attention_2; inplace_backward unless entropy is computed). Entropy only when
  `actor.entropy_coeff != 0` or `actor.calculate_entropy` (trainer/ppo/v1/trainer_base.py _update_actor).
  `model.use_fused_kernels` (default False) replaces all that with utils/experimental/torch_functional.py
  FusedLinearForPPO, 512 tokens x vocab at a time (impl_backend torch).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlctl.backends.base import MemoryFeatures

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

A = "actor_rollout_ref"

# What a LoRA recipe renders so that vLLM gets the adapter (0.9.0 and 0.9.1; tests/conformance/test_verl_lora_sync.py
# runs the sync with verl's and vLLM's own code). At every weight sync engine_workers.py update_weights takes the
# adapter from the FSDP engine (transformer_impl.py get_per_tensor_param -> utils/fsdp_utils.py collect_lora_params ->
# peft's get_peft_model_state_dict) and vLLM builds a LoRA model of it (utils/vllm/utils.py VLLMHijack -> vLLM's
# LoRAModel.from_lora_tensors). Under FSDP1, verl's default strategy "fsdp", peft >= 0.21 (what verl's unpinned peft
# installs) returns nothing: it picks the adapter's keys by the module names of the model it is given
# (tuners_utils.py _get_tuner_state_dict_key_prefixes), names that carry FSDP1's nested `_fsdp_wrapped_module.` while
# the state dict's keys do not. vLLM then gets an empty adapter and add_lora stops before step 1 (model_manager.py
# _create_merged_loras_inplace: `next(iter(lora_model.loras.values()))`, StopIteration; an H100, verl 0.9.1 + vLLM
# 0.24 + peft 0.21). FSDP2 keeps the module names: the whole adapter arrives. A load_format other than "dummy" has
# vLLM load the base from model.path itself (engine_workers.py: `base_sync_done = "dummy" not in load_format`), so a
# sync sends the adapter alone, as verl's LoRA guide asks (docs/advance/ppo_lora.rst, "safetensors"; "auto" loads
# .bin checkpoints too), not first the whole base through a CPU copy (collect_lora_params, base_sync_done=False).
LORA_SYNC = {f"{A}.actor.strategy": "fsdp2", f"{A}.rollout.load_format": "auto"}
BUDGET = f"{A}.actor.ppo_max_token_len_per_gpu"
LOG_PROB_BUDGET = f"{A}.rollout.log_prob_max_token_len_per_gpu"
DYNAMIC = f"{A}.actor.use_dynamic_bsz"
LOG_PROB_DYNAMIC = f"{A}.rollout.log_prob_use_dynamic_bsz"
NO_SYNC = f"{A}.actor.fsdp_config.use_no_sync_for_gradient_accumulation"
FUSED_CHUNK_TOKENS = 512  # utils/experimental/torch_functional.py FusedLinearForPPO(chunk_size=512)
OFFLOAD_GROUPS_ON_GPU = 2  # utils/activation_offload.py enable_activation_offloading: "at most two activation groups"


def recipe_key(key: str) -> str:
    """How a verl key is written in a recipe (the passthrough table), for fixes: backend.verl.extra."<key>"."""
    return f'backend.verl.extra."{key}"'


@dataclass(frozen=True)
class From:
    """A default that is an `${oc.select:<key>,...}` interpolation: the value of `key` unless set itself."""

    key: str


# verl's defaults, identical in 0.9.0 and 0.9.1 (trainer/config/_generated_ppo_trainer.yaml; actor/actor.yaml,
# actor/dp_actor.yaml, engine/fsdp.yaml, model/hf_model.yaml, rollout/rollout.yaml). tests/backends/
# test_verl_memory.py composes each release's config and checks every one.
COMMON: dict[str, Any] = {
    DYNAMIC: False,
    BUDGET: 16384,
    f"{A}.actor.ppo_micro_batch_size_per_gpu": None,
    f"{A}.actor.strategy": "fsdp",  # FSDP1; FSDPActorConfig.__post_init__ copies it to the engine config
    f"{A}.actor.ulysses_sequence_parallel_size": 1,  # deprecated spelling, copied to fsdp_config when > 1
    f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size": 1,
    f"{A}.actor.fsdp_config.param_offload": False,
    f"{A}.actor.fsdp_config.optimizer_offload": False,
    f"{A}.actor.fsdp_config.offload_policy": False,
    f"{A}.actor.pad_to_length": False,
    f"{A}.actor.fsdp_config.pad_to_length": From(f"{A}.actor.pad_to_length"),
    f"{A}.actor.fsdp_config.pad_to_length_bucket": 1024,
    f"{A}.actor.entropy_coeff": 0,
    f"{A}.actor.calculate_entropy": False,
    f"{A}.model.enable_gradient_checkpointing": True,
    f"{A}.model.enable_activation_offload": False,
    f"{A}.model.use_remove_padding": True,
    f"{A}.model.use_fused_kernels": False,
    f"{A}.model.fused_kernel_options.impl_backend": "torch",
    f"{A}.model.use_liger": False,
    LOG_PROB_DYNAMIC: From(DYNAMIC),
    LOG_PROB_BUDGET: From(BUDGET),
    f"{A}.rollout.log_prob_micro_batch_size_per_gpu": None,
    f"{A}.rollout.temperature": 1.0,
}
DEFAULTS: dict[str, dict[str, Any]] = {
    # 0.9.0 has no such key: transformer_impl.py _gradient_sync_context always defers the gradient sync
    "0.9.0": COMMON,
    # engine/fsdp.yaml sets it false (FSDPEngineConfig's own default is True, but the composed config wins)
    "0.9.1": {**COMMON, NO_SYNC: False},
}

_INT = r"[+-]?(?:0|[1-9](?:_?\d)*)"
_DIGITS = r"\d(?:_?\d)*"
_POINT = rf"(?:(?:0|[1-9](?:_?\d)*)?\.{_DIGITS}|(?:0|[1-9](?:_?\d)*)\.)"
_FLOAT = rf"[+-]?(?:{_POINT}|(?:(?:0|[1-9](?:_?\d)*)|{_POINT})[eE][+-]?{_DIGITS}|[Ii][Nn][Ff]|[Nn][Aa][Nn])"


def hydra_value(text: str) -> Any:
    """A rendered override's value as Hydra's override grammar reads it (primitives only): bool, null, int, float,
    a quoted or bare string."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    if re.fullmatch(_INT, s):
        return int(s)
    if re.fullmatch(_FLOAT, s):
        return float(s)
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def settings(version: str, rendered: list[tuple[str, str]]) -> dict[str, Any]:
    """The memory-relevant keys as verl resolves them: its default, then the rendered overrides (`key`, `value` as
    on the command line) in order: rlctl's own keys, then the recipe's passthrough (Hydra keeps the last override of
    a key)."""
    values = dict(DEFAULTS[version])
    for key, text in rendered:
        key = key.lstrip("+")
        if key in values:
            values[key] = hydra_value(text)
    for key, value in values.items():
        if isinstance(value, From):
            values[key] = values[value.key]
    return values


def whole_tokens(value: Any) -> int | None:
    """A token budget verl can use (a positive whole number), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def sp_size(s: dict[str, Any]) -> int:
    """Ulysses sequence-parallel size (FSDPActorConfig.__post_init__: the deprecated actor key wins when > 1)."""
    for key in (f"{A}.actor.ulysses_sequence_parallel_size", f"{A}.actor.fsdp_config.ulysses_sequence_parallel_size"):
        v = s.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return v
    return 1


def longest_sample(recipe: Recipe) -> int:
    """The most tokens one sample has in the update: prompt (filter_overlong_prompts) + response, within the
    engine's context."""
    r = recipe
    return min(r.data.max_prompt_tokens + r.rollout.max_tokens, r.model.max_model_len)


def micro_tokens(recipe: Recipe, s: dict[str, Any], micro_batch: int) -> int:
    """Tokens per GPU of a micro batch of `micro_batch` samples: at most each sample's longest length; the sp GPUs of
    a sequence-parallel group share it."""
    return math.ceil(micro_batch * longest_sample(recipe) / sp_size(s))


def features(recipe: Recipe, s: dict[str, Any], version: str, vocab: int | None = None) -> MemoryFeatures:
    r = recipe
    notes: list[str] = []
    sp = sp_size(s)
    gc = bool(s[f"{A}.model.enable_gradient_checkpointing"])
    strategy = s[f"{A}.actor.strategy"]
    act_offload = OFFLOAD_GROUPS_ON_GPU if (s[f"{A}.model.enable_activation_offload"]
                                            and strategy in ("fsdp", "fsdp2")) else None

    # ---- optimizer and parameter offload
    optimizer = "gpu"
    if s[f"{A}.actor.fsdp_config.offload_policy"] and strategy == "fsdp2":
        optimizer = "cpu"
        notes.append("verl fsdp_config.offload_policy (FSDP2 CPUOffloadPolicy): parameters, gradients and optimizer "
                     "states live on the CPU (the plan still counts parameters and gradients on the GPU: an upper "
                     "bound)")
    else:
        if s[f"{A}.actor.fsdp_config.offload_policy"]:
            notes.append(f"verl fsdp_config.offload_policy only applies with strategy fsdp2 (here {strategy}): "
                         "ignored")
        moved = [name for name, key in (("parameters", "param_offload"), ("optimizer states", "optimizer_offload"))
                 if s[f"{A}.actor.fsdp_config.{key}"]]
        if moved:
            notes.append(f"verl offload ({' and '.join(moved)}): on the CPU between updates (room for vLLM's "
                         "rollout), back on the GPU for the whole update: the update's peak is unchanged")

    # ---- micro batches
    budget: tuple[str, int] | None = None
    if s[DYNAMIC]:
        tokens = whole_tokens(s[BUDGET])
        if tokens is None:
            notes.append(f"verl use_dynamic_bsz: {BUDGET.rsplit('.', 1)[-1]} = {s[BUDGET]!r} is not a positive whole "
                         "number of tokens (preflight placement.token_budget); the plan counts "
                         "train.micro_batch_size samples instead")
        else:
            budget = (recipe_key(BUDGET), tokens)
            per_group = f" ({tokens} x {sp} per sequence-parallel group)" if sp > 1 else ""
            notes.append(f"verl use_dynamic_bsz: micro batches packed up to {tokens} tokens per GPU{per_group}"
                         + ("; 0.9.0 balances them by attention workload without capping each: one can exceed "
                            "that by part of a sequence" if version == "0.9.0" else ""))
            log_prob = whole_tokens(s[LOG_PROB_BUDGET])
            if s[LOG_PROB_DYNAMIC] and log_prob and log_prob > tokens:
                notes.append(f"verl log-prob recomputation (forward only) packs {log_prob} tokens "
                             f"({LOG_PROB_BUDGET.rsplit('.', 1)[-1]}): its logits are not in this plan")
    else:
        micro = s[f"{A}.actor.ppo_micro_batch_size_per_gpu"]
        if micro != r.train.micro_batch_size:
            notes.append(f"verl ppo_micro_batch_size_per_gpu = {micro!r} (passthrough); the plan counts "
                         f"train.micro_batch_size = {r.train.micro_batch_size}")
        how = ("its samples' real tokens, packed (use_remove_padding)" if s[f"{A}.model.use_remove_padding"]
               else "padded to its longest sample")
        notes.append(f"verl micro batch: {how}; the plan counts every sample at prompt + response = "
                     f"{longest_sample(r)} tokens, an upper bound")
        log_prob_micro = s[f"{A}.rollout.log_prob_micro_batch_size_per_gpu"]
        if isinstance(log_prob_micro, int) and not isinstance(log_prob_micro, bool) and log_prob_micro > (
                micro if isinstance(micro, int) else r.train.micro_batch_size):
            notes.append(f"verl log-prob recomputation (forward only) runs micro batches of {log_prob_micro} samples "
                         "(rollout.micro_batch_size): their logits are not in this plan")
    if s[f"{A}.actor.fsdp_config.pad_to_length"]:
        notes.append(f"verl pad_to_length: each packed micro batch is padded up to a multiple of "
                     f"{s[f'{A}.actor.fsdp_config.pad_to_length_bucket']} tokens")

    # ---- gradients held unsharded across a mini-batch's micro batches (FSDP no_sync)
    deferred = version == "0.9.0" or bool(s.get(NO_SYNC))
    unsharded = 0.0
    if deferred and _several_micro_batches(r, s, budget, sp):
        unsharded = 2.0
        notes.append("verl defers FSDP's gradient reduce-scatter to a mini-batch's last micro batch "
                     "(_gradient_sync_context, no_sync): unsharded bf16 gradients of all trainable parameters (2 "
                     "bytes each, not divided by the GPUs) stay on every GPU"
                     + (f"; 0.9.1: {NO_SYNC.rsplit('.', 1)[-1]} = false turns it off" if version != "0.9.0" else ""))

    # ---- log-probs
    chunk = None
    logit_bytes = None
    if s[f"{A}.model.use_fused_kernels"]:
        backend = s[f"{A}.model.fused_kernel_options.impl_backend"]
        if backend == "torch" and vocab:
            chunk = FUSED_CHUNK_TOKENS * vocab
        else:
            notes.append(f"verl use_fused_kernels ({backend}): the plan counts materialised logits (an upper bound)")
    elif s[f"{A}.actor.entropy_coeff"] or s[f"{A}.actor.calculate_entropy"]:
        logit_bytes = 6.0
        notes.append("verl computes entropy in the update (entropy_coeff != 0): its log-prob head holds about 6 bytes "
                     "per token x vocab (measured)")
    elif version != "0.9.0" and s[f"{A}.rollout.temperature"] == 1:
        logit_bytes = 2.0
        notes.append("verl 0.9.1 at temperature 1 keeps no temperature-scaled copy of the logits: its log-prob head "
                     "holds about 2 bytes per token x vocab (measured)")

    # ---- the reference policy
    if r.algorithm.kl_coef > 0 and r.lora is None:
        notes.append("verl's reference policy is a forward-only FSDP engine with CPUOffload(offload_params=True): its "
                     "weights stay on the CPU, not counted on the GPU")
    return MemoryFeatures(checkpoint_every=1 if gc else None, activation_offload=act_offload, optimizer=optimizer,
                          logits_chunk=chunk, token_budget=budget, logit_bytes=logit_bytes,
                          unsharded_grad_bytes=unsharded, reference_on_gpu=False, notes=notes)


def _several_micro_batches(recipe: Recipe, s: dict[str, Any], budget: tuple[str, int] | None, sp: int) -> bool:
    """Whether a mini-batch can take more than one micro batch on a GPU (gradient accumulation)."""
    r = recipe
    dp = max(r.trainer_gpu_count // sp, 1)
    per_gpu = max(r.train.train_batch_size // dp, 1)  # samples of a mini-batch on one data-parallel rank
    if budget is not None:
        return per_gpu * longest_sample(r) > budget[1] * sp
    micro = s[f"{A}.actor.ppo_micro_batch_size_per_gpu"]
    micro = micro if isinstance(micro, int) and not isinstance(micro, bool) and micro > 0 else r.train.micro_batch_size
    return per_gpu > micro


def budget_problems(recipe: Recipe, s: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, what is wrong, fix) for the token budgets verl would use, each caught before verl fails on it after the
    first rollout (seqlen_balancing.py rearrange_micro_batches, engine_workers.py init_model)."""
    out = []
    if bool(s[DYNAMIC]) != bool(s[LOG_PROB_DYNAMIC]):
        out.append((LOG_PROB_DYNAMIC, f"{DYNAMIC} = {s[DYNAMIC]!r} but {LOG_PROB_DYNAMIC} = {s[LOG_PROB_DYNAMIC]!r}: "
                    "verl asserts they are equal when it builds the actor (engine_workers.py init_model)",
                    f"remove {recipe_key(LOG_PROB_DYNAMIC)} (it follows use_dynamic_bsz)"))
    longest, sp = longest_sample(recipe), sp_size(s)
    for flag, key in ((DYNAMIC, BUDGET), (LOG_PROB_DYNAMIC, LOG_PROB_BUDGET)):
        if not s[flag] or (key == LOG_PROB_BUDGET and s[key] == s[BUDGET]):
            continue
        tokens = whole_tokens(s[key])
        if tokens is None:
            out.append((key, f"{key} = {s[key]!r} with use_dynamic_bsz: not a positive whole number of tokens; verl "
                        "fails at its first update", f"set {recipe_key(key)} to a whole number of tokens, at least "
                        f"{longest}"))
        elif tokens * sp < longest:
            out.append((key, f"{key} = {tokens} tokens{f' x {sp} (sequence parallel)' if sp > 1 else ''} is less "
                        f"than one sample of up to {longest} tokens (prompt + response): verl asserts max_token_len >= "
                        "the longest sequence after the first rollout", f"set {recipe_key(key)} >= {longest}"))
    return out
