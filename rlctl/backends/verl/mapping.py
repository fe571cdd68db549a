"""Recipe keys verl (per release) cannot honour: each becomes a Finding, never a silent drop.

Levels (docs/backends/verl.md): `error` when the run would train something other than the recipe says (the reward,
the number of optimizer steps, the LR curve, the data); `warn` when only placement, speed or a minor knob differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlctl.backends.base import Finding

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe


def _set(section: Any, name: str) -> bool:
    """Whether the recipe sets this key itself (not left at its default)."""
    return name in getattr(section, "model_fields_set", set())


def unhonoured(adapter: Any, recipe: Recipe, snap: dict[str, Any]) -> list[Finding]:
    r = recipe
    v = snap["version"]
    out: list[Finding] = []

    def add(level: str, key: str, message: str, fix: str | None = None) -> None:
        out.append(Finding(level, key, f"verl {v}: {message}", fix))

    k = adapter.optimizer_steps_per_logged_step(r)
    mini = adapter.mini_batch_prompts(r)
    # ---- steps and schedule
    if r.rollout.prompts_per_step < mini:
        add("error", "train.train_batch_size",
            f"the mini-batch ({mini} prompts) is larger than a rollout ({r.rollout.prompts_per_step} prompts): "
            "verl's ActorConfig.validate rejects it (workers/config/actor.py: \"train_batch_size must be >= "
            "actor.ppo_mini_batch_size\")", "lower train.train_batch_size")
    elif r.rollout.prompts_per_step % mini:
        # each rank's share of the rollout is cut into mini-batches by utils/tensordict_utils.py make_iterator,
        # `assert tensordict.batch_size[0] % mini_batch_size == 0` (engine_workers.py train_mini_batch calls it)
        add("error", "train.train_batch_size",
            f"a rollout of {r.rollout.prompts_per_step} prompts is not whole mini-batches of {mini} prompts "
            f"(train_batch_size {r.train.train_batch_size} / group {r.rollout.group_size}): verl asserts it at the "
            "first update, after the first rollout (utils/tensordict_utils.py make_iterator: `assert "
            "tensordict.batch_size[0] % mini_batch_size == 0`, from engine_workers.py train_mini_batch)",
            "make rollout.prompts_per_step a multiple of train.train_batch_size / rollout.group_size")
    if r.train.steps is not None and r.train.steps % k:
        add("error", "train.steps",
            f"verl runs whole iterations of {k} optimizer steps: train.steps = {r.train.steps} becomes "
            f"{adapter.iterations(r, None) * k}", f"make train.steps a multiple of {k}")
    if r.optim.warmup_steps and r.optim.warmup_steps % k:
        add("error", "optim.warmup_steps",
            f"optim.warmup_steps = {r.optim.warmup_steps}: verl's LR scheduler steps once per iteration ({k} "
            f"optimizer steps), so rlctl renders actor.optim.lr_warmup_steps={adapter.warmup_iterations(r, 0)}: "
            f"{adapter.warmup_iterations(r, 0) * k} optimizer steps", f"make optim.warmup_steps a multiple of {k}")
    if r.optim.schedule == "linear":
        add("error", "optim.schedule",
            f"verl has no linear decay (lr_scheduler_type: {', '.join(snap['lr_scheduler_types'])})",
            'use "cosine", "cosine_with_min_lr" or "constant"')
    if r.optim.schedule == "constant" and _set(r.optim, "min_lr_ratio"):
        add("warn", "optim.min_lr_ratio", "ignored with a constant schedule")
    for key, every, freq in (("checkpoint.every", r.checkpoint.every, "trainer.save_freq"),
                             ("eval.every", r.eval.every, "trainer.test_freq")):
        if every and every % k and (key == "checkpoint.every" or r.data.eval):
            used = adapter.every_iterations(every, r)
            add("warn", key, f"{key} = {every} optimizer steps: verl counts {freq} in iterations of {k} optimizer "
                f"steps, so rlctl renders {freq}={used}: every {used * k} optimizer steps, not {every}",
                f"make {key} a multiple of {k}")
    if r.eval.every and not r.data.eval:
        add("warn", "eval.every", "no data.eval: nothing to evaluate, test_freq = -1")
    # ---- model and LoRA
    if r.lora and r.lora.dropout > 0:
        add("warn", "lora.dropout", "the FSDP engine builds peft's LoraConfig without lora_dropout "
            "(workers/engine/fsdp/transformer_impl.py): dropout is 0")
    if r.lora:
        out += _lora_sync_overridden(r, v)
    if _set(r.model, "dtype") and r.model.dtype not in ("bfloat16", "auto"):
        add("warn", "model.dtype", f"not rendered: verl's FSDP actor trains in bf16 mixed precision and vLLM "
            f"rolls out in bf16 ({r.model.dtype} asked)")
    if r.model.precision == "pure":
        add("warn", "model.precision", "not rendered: verl keeps fp32 master parameters (FSDP mixed precision)")
    # ---- data
    if r.data.label_key not in (None, "ground_truth"):
        add("warn", "data.label_key", f"verl's reward managers read the answer from the dataset's "
            f"reward_model.ground_truth column, not {r.data.label_key!r}", 'store it there; set label_key = '
            '"ground_truth"')
    if _set(r.data, "apply_chat_template") and not r.data.apply_chat_template:
        add("warn", "data.apply_chat_template", "verl's RLHFDataset always applies the chat template to the "
            "prompt messages")
    # ---- rollout and placement
    engines = r.resources.nodes * r.resources.gpus_per_node // max(r.rollout.tensor_parallel, 1)
    if _set(r.rollout, "engines") and r.rollout.engines != engines:
        add("warn", "rollout.engines", f"verl starts one vLLM engine per {r.rollout.tensor_parallel} GPU(s) of "
            f"the trainer: {engines}, not {r.rollout.engines}")
    if not r.resources.colocate:
        add("warn", "resources.colocate", "verl's synchronous trainer always colocates the actor and vLLM "
            "(hybrid engine) on every GPU: colocate = false is not honoured", "set resources.colocate = true")
    if r.resources.trainer_gpus is not None or r.resources.inference_gpus is not None:  # [] is said too
        add("warn", "resources.trainer_gpus", "verl places actor and vLLM itself (hybrid engine on all GPUs); "
            "trainer_gpus/inference_gpus are not honoured")
    if _set(r.train, "zero_stage"):
        add("warn", "train.zero_stage", "verl trains with FSDP, not DeepSpeed ZeRO: not rendered")
    # ---- reward
    if r.reward.environment:
        add("error", "reward.environment", "verl has no verifiers environments; the run would use verl's default "
            "reward for the data source", "give reward.function (a Python file) instead")
    # ---- checkpoints and logging
    if r.checkpoint.final_dir:
        add("warn", "checkpoint.final_dir", "verl writes no final export: the last checkpoint is "
            "global_step_N/actor under checkpoint.dir (save_freq saves the last step too)")
    if r.algorithm.name == "ppo":
        add("warn", "algorithm.name", "ppo: the critic starts from model.path with verl's own critic optimizer "
            "defaults (critic.optim.lr 1e-5, no LoRA); set others with backend.verl.extra")
    return out


def _lora_sync_overridden(r: Recipe, version: str) -> list[Finding]:
    """A LoRA recipe whose backend.verl.extra undoes what rlctl renders for the adapter's sync into vLLM (LORA_SYNC:
    why each key, in rlctl/backends/verl/__init__.py)."""
    from rlctl.backends.verl.extra import extra_leaves
    from rlctl.backends.verl.memory import LORA_SYNC, A, recipe_key

    extra = extra_leaves(r)
    out: list[Finding] = []
    strategy_key, format_key = list(LORA_SYNC)
    if str(extra.get(strategy_key, LORA_SYNC[strategy_key])) == "fsdp":
        out.append(Finding(
            "error", recipe_key(strategy_key),
            f"verl {version}: LoRA under FSDP1 (strategy fsdp) sends vLLM an empty adapter with peft >= 0.21 "
            "(utils/fsdp_utils.py collect_lora_params -> peft get_peft_model_state_dict finds no key under FSDP1's "
            "nested wrapper names): vLLM's add_lora stops before step 1 (model_manager.py "
            "_create_merged_loras_inplace, StopIteration)",
            f'drop {recipe_key(strategy_key)} (rlctl renders "fsdp2" for LoRA)'))
    fmt = str(extra.get(format_key, LORA_SYNC[format_key]))
    if "dummy" in fmt and bool(extra.get(f"{A}.rollout.layered_summon")):
        out.append(Finding(
            "error", recipe_key(format_key),
            f"verl {version}: layered_summon with load_format {fmt!r} raises at the first weight sync "
            "(utils/fsdp_utils.py collect_lora_params: \"To use layered_summon, you must make sure base-model is "
            "preloaded in vllm\")", f'drop {recipe_key(format_key)} (rlctl renders "{LORA_SYNC[format_key]}")'))
    elif "dummy" in fmt:
        out.append(Finding(
            "warn", recipe_key(format_key),
            f"verl {version}: with load_format {fmt!r} vLLM starts on random weights and the first sync sends the "
            "whole base model through a CPU copy (utils/fsdp_utils.py collect_lora_params, base_sync_done=False); "
            "verl's LoRA guide requires vLLM to load the base itself (docs/advance/ppo_lora.rst)",
            f'drop {recipe_key(format_key)} (rlctl renders "{LORA_SYNC[format_key]}")'))
    return out
