"""What OpenRLHF (per release) cannot honour in a recipe, and OpenRLHF's own preflight rules.

Each finding names the recipe key, the release, and what OpenRLHF would do instead. `error`: the run would crash or
silently do something else than the recipe says; `warn`: it runs, with the difference stated.
The facts behind each rule are cited from OpenRLHF's released code (the same in every release unless a range is named).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rlctl.backends.base import Finding
from rlctl.backends.openrlhf.releases import NO_FLOOR_SCHEDULERS
from rlctl.backends.openrlhf.steps import plan_steps

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe


def unhonoured(backend: Any, recipe: Recipe) -> list[Finding]:
    """What the release cannot honour, checked on what would run: where backend.openrlhf.extra overrides a value
    rendered from the recipe, on the effective recipe (argv.py), each error the override makes naming the overriding
    extra (one the recipe as written has too is not the override's)."""
    from rlctl.backends.openrlhf.argv import effective

    eff = effective(backend, recipe)
    found = _unhonoured(backend, eff.recipe)
    if eff.overridden:
        if "resources.trainer_gpus" in eff.lines and recipe.resources.trainer_gpus is None:  # rlctl's pin
            found = [f for f in found if f.key != "resources.trainer_gpus"]
        written = {(f.key, f.message) for f in _unhonoured(backend, recipe)}
        for f in found:
            if f.level == "error" and (f.key, f.message) not in written:
                f.message += f" (checked with what would run: {'; '.join(eff.lines.values())})"
    return found + eff.findings


def _unhonoured(backend: Any, recipe: Recipe) -> list[Finding]:
    r = recipe
    version = backend.target_version(r)
    rel = backend.release(r)
    out: list[Finding] = []

    def add(level: str, key: str, message: str, fix: str | None = None) -> None:
        out.append(Finding(level, key, f"{message} (openrlhf {version})", fix))

    extra = {k.lstrip("-") for k in r.backend.extra()}
    # reward: utils/agent.py SingleTurnAgentExecutor loads `reward_func` from a --remote_rm_url ending in .py;
    # anything else is an HTTP reward server; without either OpenRLHF needs a reward model
    if r.reward.environment is not None:
        add("error", "reward.environment", "OpenRLHF has no environments: the reward must be a Python file",
            "set reward.function to a .py file defining reward_func(queries, prompts, labels)")
    elif r.reward.function is None:
        if not extra & {"reward_pretrain", "reward.model_name_or_path", "remote_rm_url", "reward.remote_url"}:
            add("error", "reward.function", "no reward: OpenRLHF would look for a reward model (--reward_pretrain)",
                "set reward.function to a .py file defining reward_func(queries, prompts, labels)")
    else:
        if not r.reward.function.endswith(".py"):
            add("error", "reward.function", f"{r.reward.function!r} does not end in .py: OpenRLHF would call it as an "
                "HTTP reward server", "point reward.function at the .py file")
        if r.reward.function_name != "reward_func":
            add("error", "reward.function_name", f"OpenRLHF always calls `reward_func` in the reward file, not "
                f"`{r.reward.function_name}`", "rename the function to reward_func (or add `reward_func = "
                f"{r.reward.function_name}` to the file) and drop reward.function_name")
    if r.data.eval and r.reward.function is None:
        add("error", "data.eval", "evaluation needs a reward file: train_ppo_ray asserts `--eval_dataset` is only "
            "supported with `--remote_rm_url`", "set reward.function, or remove data.eval")

    if r.data.eval and not r.eval.every:
        add("warn", "eval.every", "data.eval without eval.every: OpenRLHF never evaluates (--eval_steps -1)",
            "set eval.every")
    if r.eval.every and not r.data.eval:
        add("warn", "eval.every", "eval.every without data.eval: there is nothing to evaluate", "set data.eval")
    k = backend.optimizer_steps_per_logged_step(r)
    for key, every, does in (("checkpoint.every", r.checkpoint.every, "saves"),
                             ("eval.every", r.eval.every if r.data.eval else None, "evaluates")):
        if every and every % k:
            add("warn", key, f"OpenRLHF {does} every N global steps (rollouts) of {k} optimizer steps: {every} "
                f"becomes {backend.every_rollouts(every, r) * k}", f"make it a multiple of {k}")

    # algorithm
    if r.algorithm.name in ("grpo", "dr_grpo", "reinforce_baseline") and r.rollout.group_size < 2:
        if backend.refuses_single_sample(r):
            add("error", "rollout.group_size", f"{r.algorithm.name} normalises within a group: with group_size 1 "
                "every advantage is 0 (OpenRLHF asserts n_samples_per_prompt > 1)", "set rollout.group_size >= 2")
        else:  # train_ppo_ray's assert lists rloo/reinforce_baseline/group_norm, dr_grpo from 0.11.0
            add("warn", "rollout.group_size", f"{r.algorithm.name} with group_size 1: every advantage is 0 and the "
                "run learns nothing (this release does not refuse it)", "set rollout.group_size >= 2")
    if r.algorithm.name == "ppo":
        add("warn", "algorithm.name", "ppo (gae): the critic starts from model.path, on the trainer's GPUs, with "
            "OpenRLHF's default critic learning rate 9e-6 (the recipe has no critic settings)",
            "set the critic's LR through backend.openrlhf.extra (critic_learning_rate / critic.adam.lr)")
    if r.algorithm.kl_estimator == "low_var_kl":
        add("warn", "algorithm.kl_estimator", "low_var_kl is rendered as OpenRLHF's k3 (same estimator, no clamp)")

    # schedule: the floor the actor's scheduler gets (releases.py, Release.floor_kwargs)
    floor = rel.floor_kwargs
    s = r.optim.schedule
    if s in NO_FLOOR_SCHEDULERS and (floor == "always_min_lr" or (floor == "always_min_lr_rate" and s == "linear")):
        arg = "min_lr" if floor == "always_min_lr" else "min_lr_rate"
        add("error", "optim.schedule", f"{s!r} crashes at start: this release passes {arg} to every scheduler and "
            f"transformers' {s} schedule takes none (TypeError)",
            "use cosine_with_min_lr or constant, or openrlhf >= 0.10.4")
    if s == "cosine_with_min_lr" and floor == "always_min_lr" and abs(r.optim.min_lr_ratio - 0.1) > 1e-12:
        add("warn", "optim.min_lr_ratio", f"min_lr is fixed at 0.1 x lr in this release; {r.optim.min_lr_ratio} "
            "cannot be set", "openrlhf >= 0.10.2 has --actor.min_lr_ratio")

    # steps and warmup
    steps = plan_steps(r, backend._dataset_size(r))
    if steps.max_samples is not None and r.data.eval:
        # trainer/ppo_trainer.py prepare_datasets: eval_data.select(range(min(max_samples, len(eval_data)))), the
        # same --max_samples that caps the training prompts (0.9.3 :51, 0.11.2 :59)
        from rlctl.recipe.data import count_records, is_local

        n_eval = count_records(r.data.eval) if is_local(r.data.eval) else None
        if n_eval is None or n_eval > steps.max_samples:
            cut = f"{n_eval} to {steps.max_samples}" if n_eval is not None else f"to its first {steps.max_samples}"
            add("warn", "data.eval", f"train.steps is rendered as --max_samples {steps.max_samples}, which also cuts "
                f"the eval set ({cut} prompts; trainer/ppo_trainer.py prepare_datasets)",
                "drop train.steps (use train.episodes), or keep an eval file of at most "
                f"{steps.max_samples} prompts")
    for level, key, message in steps.problems:
        add(level, key, message)
    if r.optim.warmup_steps is not None and steps.horizon is None:
        add("error", "optim.warmup_steps", "OpenRLHF takes a warmup ratio of its step count, which needs the dataset "
            "size", "point data.train at a local file, or set optim.warmup_ratio")
    spr = steps.per_rollout
    if abs(spr - round(spr)) > 1e-9 or spr < 1:
        add("warn", "train.train_batch_size", f"a rollout ({r.rollout.prompts_per_step} x {r.rollout.group_size} "
            f"samples x {r.train.epochs_per_rollout} epochs) is {spr:g} optimizer steps: updates straddle rollouts",
            "make prompts_per_step x group_size x epochs_per_rollout a multiple of train_batch_size")

    # lengths: vLLM's context is prompt + response tokens in every release (0.9.3-0.9.7 prompt_max_len +
    # generate_max_len; later --max_len, which rlctl sets to the same sum)
    context = r.data.max_prompt_tokens + r.rollout.max_tokens
    if r.model.max_model_len != context:
        add("warn", "model.max_model_len", f"vLLM's context will be data.max_prompt_tokens + rollout.max_tokens = "
            f"{context}, not {r.model.max_model_len}", "make model.max_model_len = max_prompt_tokens + max_tokens")
    if r.train.seq_len is not None and r.train.seq_len != context:
        add("warn", "train.seq_len", f"OpenRLHF has no trainer sequence length: it trains on the rollouts (at most "
            f"{context} tokens)")
    if r.rollout.max_num_batched_tokens is not None:
        add("warn", "rollout.max_num_batched_tokens", "train_ppo_ray has no flag for vLLM's max_num_batched_tokens")

    # precision
    if r.model.dtype not in ("bfloat16", "float16", "auto"):
        add("warn", "model.dtype", f"OpenRLHF trains in bf16 or fp16 only (--param_dtype); {r.model.dtype} becomes "
            "bf16")
    if r.model.precision == "pure":
        add("warn", "model.precision", "OpenRLHF has no pure-precision switch: DeepSpeed keeps fp32 master weights")
    if r.train.offload:
        add("warn", "train.offload", "rendered as --adam_offload: only optimizer states go to CPU, parameters stay")

    # placement
    res = r.resources
    if res.trainer_gpus is not None or res.inference_gpus is not None:
        add("warn", "resources.trainer_gpus", "OpenRLHF's actors and vLLM engines are placed by Ray: GPU ids cannot be "
            "chosen, only their counts are honoured")
    trainer = r.trainer_gpu_count
    out += placement_errors(backend, r)
    micro = r.rollout.micro_batch_size or r.train.micro_batch_size
    if r.rollout.group_size * r.rollout.prompts_per_step // micro < trainer:
        add("error", "rollout.prompts_per_step", "train_ppo_ray asserts the sample batches of a rollout "
            f"({r.rollout.group_size} x {r.rollout.prompts_per_step} // {micro}) >= actor processes ({trainer})")

    # checkpoints
    ck = r.checkpoint
    if isinstance(ck.resume, int):
        add("warn", "checkpoint.resume",
            f"OpenRLHF resumes from the tag in checkpoint.dir/_actor/latest, whatever it is, not step {ck.resume} "
            "(`rlctl launch --resume RUN` stages that step with its `latest`)",
            "set checkpoint.resume = \"latest\", or use `rlctl launch --resume RUN`")
    if ck.resume != "off" and not ck.save_optimizer:
        add("error", "checkpoint.resume", "resuming needs the DeepSpeed states (_actor/global_stepN), which "
            "checkpoint.save_optimizer = false turns off: OpenRLHF would silently start from scratch",
            "set checkpoint.save_optimizer = true")
    if ck.keep_last and rel.best_checkpoints and r.data.eval:
        add("warn", "checkpoint.keep_last", "best-eval checkpoints (best_global_stepN, whose HF exports OpenRLHF never "
            "deletes) are switched off (--best_metric_key none) so that keep_last holds on disk")

    # the Ray job's environment: train() starts Ray with its own env_vars (TOKENIZERS_PARALLELISM, NCCL_DEBUG, ...);
    # rlctl adds RAY_OVERRIDE_JOB_RUNTIME_ENV=1 so that Ray merges instead of refusing, and then train()'s value wins
    for k, v in rel.facts.get("ray_init_env_fixed", {}).items():
        if k in r.env and r.env[k] != v:
            add("warn", f"env.{k}", f"train() starts Ray with {k}={v}, which replaces the recipe's {r.env[k]!r} for "
                "the trainer's actors", f"openrlhf >= 0.9.10 keeps the job's {k}")
    return out  # backend.openrlhf.extra: unhonoured() adds what argv.py says of it


def placement_errors(backend: Any, recipe: Recipe) -> list[Finding]:
    r = recipe
    trainer = r.trainer_gpu_count
    if r.resources.colocate and trainer != r.inference_gpu_count:
        engines = trainer // r.rollout.tensor_parallel
        fix = (f"set rollout.engines = {engines}" if engines * r.rollout.tensor_parallel == trainer else
               "set rollout.engines x rollout.tensor_parallel to the trainer's GPU count")
        return [Finding("error", "resources.colocate", f"colocated, train() asserts actor GPUs ({trainer}) == vLLM "
                        f"engines x TP ({r.inference_gpu_count}) (openrlhf {backend.target_version(r)})", fix)]
    res = r.resources
    if not res.colocate and res.gpus_per_node and res.trainer_gpus is None:
        # what render asks Ray for: actor (and the critic, its own RayActorGroup with the same counts) on
        # max(gpus_per_node - engines x TP // nodes, 1) GPUs of each node, and the vLLM engines on GPUs of their own
        per_node = max(res.gpus_per_node - r.inference_gpu_count // res.nodes, 1)
        actor = per_node * res.nodes
        critic = actor if r.algorithm.name == "ppo" else 0
        need = actor + critic + r.inference_gpu_count
        if need > r.total_gpus:
            left = (r.total_gpus - r.inference_gpu_count) // (2 if critic else 1) // res.nodes
            what = f"actor {actor}" + (f" + critic {critic}" if critic else "")
            fix = ("set resources.colocate = true (actor, critic and vLLM share the GPUs)"
                   if r.inference_gpu_count == r.total_gpus else
                   f"set resources.trainer_gpus to {left} GPU(s) per node" if left else
                   "more GPUs, or fewer engines / a smaller TP")
            return [Finding("error", "resources.gpus_per_node", f"{what} + vLLM {r.inference_gpu_count} GPUs > "
                            f"{r.total_gpus}: Ray's placement groups would wait forever "
                            f"(openrlhf {backend.target_version(r)})", fix)]
    elif not res.colocate and r.algorithm.name == "ppo" and res.gpus_per_node:
        need = 2 * trainer + r.inference_gpu_count
        if need > r.total_gpus:
            return [Finding("error", "algorithm.name", f"ppo without colocation: actor {trainer} + critic {trainer} + "
                            f"vLLM {r.inference_gpu_count} GPUs > {r.total_gpus}: Ray's placement groups would wait "
                            f"forever (openrlhf {backend.target_version(r)})", "more GPUs, or fewer engines")]
    return []


def preflight(backend: Any, ctx: Any, family: str) -> list[Any]:
    from rlctl.preflight import FAIL, OK, WARN, Result

    r = ctx.recipe
    out = []
    if family == "env" and r.logging.wandb is not None:
        if r.logging.wandb.offline:
            out.append(Result("env.wandb_job", OK, "W&B offline in the Ray job (WANDB_MODE=offline): no key needed"))
        elif r.resources.executor != "ray" or r.resources.ray_address or os.environ.get("RAY_ADDRESS"):
            out.append(Result(
                "env.wandb_job", WARN,
                "WANDB_API_KEY is not sent to a Ray cluster rlctl did not start (a job's runtime env is on the "
                "command line and in the job record its dashboard shows): OpenRLHF finds it only if the nodes have it",
                "set WANDB_API_KEY in the environment `ray start` runs with on every node, or executor = \"ray\" "
                "with no address (rlctl's own head inherits it); see docs/ray.md"))
        elif os.environ.get("WANDB_API_KEY"):
            out.append(Result("env.wandb_job", OK, "WANDB_API_KEY reaches the Ray job through the environment of the "
                              "Ray head rlctl starts (never in the job's runtime env or on a command line)"))
        else:
            out.append(Result(
                "env.wandb_job", FAIL,
                "W&B is on but WANDB_API_KEY is not set here: a Ray job does not inherit this shell's environment or "
                "read this machine's ~/.netrc, so OpenRLHF would log in with the placeholder key and die",
                "export WANDB_API_KEY=... (the Ray head rlctl starts inherits it; never written), set "
                "logging.wandb.offline = true, or keep the key on the cluster and pass W&B flags through "
                "backend.openrlhf.extra instead of [logging.wandb] (docs/backends/openrlhf.md)",
                set={"logging.wandb.offline": True}))
    if family == "lora":
        out += _lora_vllm_sync(backend, r)
    if family == "disk":
        if r.checkpoint.save_optimizer:
            out.append(Result("disk.deepspeed", WARN,
                              "DeepSpeed checkpoints are on (OpenRLHF's default): optimizer + model states every save",
                              "set checkpoint.save_optimizer = false (--disable_ds_ckpt) if HF checkpoints suffice"))
        if backend.leaks_shards(r):  # counted in disk.checkpoints too (checkpoint_bytes)
            [(fix, sets), *others] = leak_fixes(backend, r)
            out.append(Result("disk.lora_zero3", WARN,
                              "OpenRLHF LoRA + ZeRO-3 saves full-model shards next to the adapter (~200 GB for 20B; "
                              "disk.checkpoints counts them)",
                              fix + ", or " + _set_that_fixes(backend, r, "disk.lora_zero3"), set=sets,
                              other_fixes=others))
        if r.checkpoint.every and not r.checkpoint.keep_last:
            out.append(Result("disk.hf_exports", WARN,
                              "OpenRLHF never deletes its HF exports (global_stepN_hf): one per checkpoint.every "
                              "steps stays on disk for the whole run", "set checkpoint.keep_last (rlctl then prunes "
                              "them during the run)"))
    return out


def _lora_vllm_sync(backend: Any, r: Recipe) -> list[Any]:
    """A LoRA actor with vLLM engines: trainer/ray/ppo_actor.py broadcast_to_vllm sends model.named_parameters() as
    named, a PeftModel's `base_model.model.….base_layer.weight` and `lora_A`/`lora_B`, and vLLM's load_weights refuses
    the first (seen on 2 x H100, 0.10.4: every attempt died after step 1). No release handles it (Release fact)."""
    from rlctl.preflight import FAIL, OK, Result

    rel, version = backend.release(r), backend.target_version(r)
    if rel.lora_vllm_sync:
        return []
    if "lora.vllm_sync" in patch_set_fixes(r):
        return [Result("lora.vllm_sync", OK, f"LoRA actor -> vLLM: patch set {r.patches.set} declares it fixes "
                       "lora.vllm_sync (the engines get the merged weights under the base model's names; openrlhf "
                       f"{version}'s own broadcast_to_vllm cannot)")]
    flags = ", ".join(f for f in (rel.flag("lora_rank"), rel.flag("vllm_num_engines")) if f)
    bundled = _bundled_set_that_fixes(backend, r, "lora.vllm_sync")
    return [Result(
        "lora.vllm_sync", FAIL,
        f"lora.rank {r.lora.rank} with rollout.engines {r.rollout.engines} ({flags}): openrlhf {version}'s "
        "broadcast_to_vllm sends the LoRA actor's parameters under peft's names (base_model.model.….base_layer.weight, "
        "lora_A, lora_B), which vLLM's model does not have: the run dies at the first weight sync, after step 1 "
        "(ValueError: There is no module or parameter named 'base_model'), on every restart",
        f"{_set_that_fixes(backend, r, 'lora.vllm_sync')}: it sends the merged weights under the base model's names; "
        "or a full fine-tune (remove [lora])",
        set={"patches.set": bundled} if bundled and not r.patches.set else None)]


def leak_fixes(backend: Any, r: Recipe) -> list[tuple[str, dict[str, Any]]]:
    """What stops the LoRA + ZeRO-3 shard leak, best first: ZeRO-2 (save_model's stage-3 path is the one that leaks;
    but the trainer then holds the whole model: preflight offers it only where memory.trainer still fits), the
    bundled set for the release that declares the save fix (ZeRO-3 kept)."""
    out = [("set train.zero_stage = 2", {"train.zero_stage": 2})]
    bundled = None if r.patches.set else _bundled_set_that_fixes(backend, r, "disk.lora_zero3")
    if bundled:
        out.append((f'set patches.set = "{bundled}" (the bundled set, which fixes it; ZeRO-3 kept)',
                    {"patches.set": bundled}))
    return out


def _bundled_set_that_fixes(backend: Any, recipe: Recipe, check: str) -> str | None:
    """The bundled patch set for the release, if its manifest declares it fixes `check`."""
    from rlctl.patching import discover

    name = f"openrlhf/{backend.target_version(recipe)}"
    try:
        return name if any(s.name == name and check in s.fixes for s in discover()) else None
    except Exception:  # a broken bundled manifest is `rlctl patch list`'s error; here it names nothing
        return None


def _set_that_fixes(backend: Any, recipe: Recipe, check: str) -> str:
    """The patch set to name in `check`'s fix: the bundled one for the release if it declares the fix."""
    name = _bundled_set_that_fixes(backend, recipe, check)
    if name:
        return f'patches.set = "{name}" (the bundled set, which fixes it)'
    return (f'a patch set whose manifest declares fixes = ["{check}"] (patches.set; no bundled set for this release '
            "has one)")


def patch_set_fixes(recipe: Recipe) -> list[str]:
    """The checks the recipe's patch set declares it fixes (its manifest's `fixes`): only those may go silent."""
    if not recipe.patches.set:
        return []
    from rlctl.backends import get_backend
    from rlctl.patching import recipe_set

    try:  # only a set that exists and is for this release (render and preflight refuse any other)
        ps = recipe_set(recipe, get_backend(recipe.backend.name).target_version(recipe))
        return ps.fixes if ps else []
    except Exception:  # an unknown or mismatched set fixes nothing here
        return []
