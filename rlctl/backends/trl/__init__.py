"""TRL: GRPOTrainer driven by a rendered JSON config through `python3 -m rlctl.backends.trl.runner`.

The runner lives here (not in TRL) so that a recipe is all it needs: a model path or `random:` tiny model, a
prompts file, a reward function file. Keys are checked against GRPOConfig (+ transformers TrainingArguments).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends._static import dataclass_fields, installed_version, package_file
from rlctl.backends.base import Backend, Finding, Inert, LaunchPlan, check_keys, load_snapshot
from rlctl.estimate.schedules import hf_schedule

if TYPE_CHECKING:
    from rlctl.backends.layout import Checkpoint
    from rlctl.recipe.schema import Recipe

CONFIG_FILE = "trl_config.json"
RUNNER = "rlctl.backends.trl.runner"
LOSS_TYPE = {"grpo": "grpo", "dr_grpo": "dr_grpo", "reinforce_baseline": "grpo", "ppo": "grpo"}
# GRPOTrainer's loss types whose policy term is PPO's clipped ratio (trl 1.16.0 trainer/grpo_trainer.py _compute_loss:
# coef_2 = clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high), coef_1 capped at delta): where the ratio coef_1 is
# exactly 1 these keys change nothing. Other loss types (cispo, sapo, vespo) use them otherwise: not judged.
CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
CLIP_EXTRAS = ("epsilon", "epsilon_high", "delta")


class TRLBackend(Backend):
    name = "trl"
    own_rotation = "save_total_limit is not rendered"
    packages = ("trl", "transformers")
    needs_local_install = True  # the runner runs in rlctl's own Python
    runs_on_cpu = True
    install_hint = 'pip install "rlctl[trl]"'
    known_versions = ("1.16.0",)
    metric_needles = ("{'", "'step'", "Training Loss")  # as in trl/metrics.py NEEDLES
    foreach_adam = False  # TrainingArguments.optim defaults to adamw_torch_fused (no step temporaries)
    logits_scope = "completion"  # TRL computes log-probs of the completion tokens only (logits_to_keep)
    # GRPOConfig has no trainer sequence length (max_completion_length; max_prompt_length before 1.x): it trains on
    # prompt + completion, so train.seq_len is never rendered and no fix may name it
    seq_len_key = None
    precisions = ("mixed", "pure")
    logit_bytes = 3.0  # bf16 completion logits, row-wise log-softmax (measured on an H100, docs/memory.md)
    updates_straddle_rollouts = True  # generation_batch_size and gradient accumulation are independent in GRPOConfig
    train_batch_rounds = True  # accumulation = train_batch_size // (micro x processes): unhonoured() warns
    sleep_switch = "vllm_enable_sleep_mode"  # colocated vLLM sleeps (level 2: weights and KV cache) while training

    def uses_vllm(self, recipe: Recipe) -> bool:
        """TRL generates with the trainer's own model unless `use_vllm` is set in its extras."""
        return bool(recipe.backend.extra().get("use_vllm"))

    def colocated(self, recipe: Recipe) -> bool:
        """With use_vllm, GRPOConfig's vllm_mode (default "colocate" in trl 1.16, grpo_config.py) starts vLLM inside
        each training process, on its GPU; "server" talks to a `trl vllm-serve` on GPUs of its own."""
        extra = recipe.backend.extra()
        return recipe.resources.colocate or (bool(extra.get("use_vllm"))
                                             and extra.get("vllm_mode", "colocate") == "colocate")

    def in_loop_eval(self, recipe: Recipe, sets: list[Any]) -> tuple[list[Any], list[tuple[Any, str]]]:
        """GRPOTrainer's evaluation (rendered as eval_strategy/eval_steps) generates like training does — the
        training temperature and num_generations — so no set's mode runs in-loop: rlctl evaluates them all."""
        why = ("GRPOTrainer evaluates with the training temperature and num_generations, not the set's mode")
        return [], [(s, why) for s in sets]

    def _evaluates_checkpoints(self, recipe: Recipe) -> bool:
        return bool(recipe.data.eval or recipe.eval.sets)

    def prune_during_run(self, recipe: Recipe) -> bool:
        """With eval sets rlctl keeps keep_last itself (never the best-eval checkpoint, nor one being evaluated);
        the Trainer's own save_total_limit would delete by age only."""
        return self._evaluates_checkpoints(recipe)

    def patch_locally(self, recipe: Recipe) -> bool:
        return True  # the runner runs in rlctl's own Python, whichever executor starts it

    def target_version(self, recipe: Recipe) -> str:
        """Pinned, else installed, else the newest snapshot. The runner runs in this Python, so an installed release
        is read exactly from its own source; a pinned release that is neither installed nor snapshotted is an error."""
        installed = installed_version("trl")
        version = recipe.backend.version or installed or self.known_versions[-1]
        if version != installed:
            self.require_known(version)
        return version

    def world_size(self, recipe: Recipe) -> int:
        return max(recipe.trainer_gpu_count, 1)

    # ---- steps and schedule ----------------------------------------------------------------------------------
    def total_steps(self, recipe: Recipe, dataset_size: int | None) -> int | None:
        """rlctl renders max_steps explicitly: TRL then runs exactly that many optimizer steps."""
        if recipe.train.steps is not None:
            return recipe.train.steps
        if dataset_size is None:
            return None
        return (dataset_size * recipe.rollout.group_size // recipe.train.train_batch_size
                * (recipe.train.episodes or 1) * recipe.train.epochs_per_rollout)

    def warmup_steps(self, recipe: Recipe, total: int) -> int:
        # transformers TrainingArguments.get_warmup_steps: int(w) if w >= 1 else ceil(total * w)
        w = self._warmup_value(recipe)
        return int(w) if w >= 1 else math.ceil(total * w)

    def _warmup_value(self, recipe: Recipe) -> float:
        if recipe.optim.warmup_steps is not None:
            return float(recipe.optim.warmup_steps)
        return recipe.optim.warmup_ratio or 0.0

    def _scheduler(self, recipe: Recipe) -> tuple[str, dict[str, Any]]:
        s = recipe.optim.schedule
        if s == "cosine_with_min_lr":
            return "cosine_with_min_lr", {"min_lr_rate": recipe.optim.min_lr_ratio}
        if s == "constant":
            return ("constant_with_warmup" if self._warmup_value(recipe) else "constant"), {}
        return s, {}

    def schedule(self, recipe: Recipe, dataset_size: int | None) -> list[float]:
        total = self.total_steps(recipe, dataset_size)
        if not total:
            return []
        name, kw = self._scheduler(recipe)
        return hf_schedule(name, recipe.optim.lr, self.warmup_steps(recipe, total), total, kw.get("min_lr_rate", 0.0))

    # ---- render ----------------------------------------------------------------------------------------------
    def honours(self, recipe: Recipe, key: str) -> bool | None:
        """GRPOConfig has no entropy bonus and one KL estimator (k3): grpo_config() renders neither key."""
        if key in ("algorithm.entropy_coef", "algorithm.kl_estimator"):
            return False
        return super().honours(recipe, key)

    def grpo_config(self, recipe: Recipe, dataset_size: int | None) -> dict[str, Any]:
        r = recipe
        world = self.world_size(r)
        micro = r.train.micro_batch_size
        accum = max(r.train.train_batch_size // (micro * world), 1)
        sched, sched_kw = self._scheduler(r)
        total = self.total_steps(r, dataset_size)
        cfg: dict[str, Any] = {
            "output_dir": r.checkpoint.dir,
            "num_generations": r.rollout.group_size,
            "generation_batch_size": r.samples_per_rollout,
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": accum,
            "num_iterations": r.train.epochs_per_rollout,
            "max_completion_length": r.rollout.max_tokens,
            "temperature": r.rollout.temperature,
            "top_p": r.rollout.top_p,
            "learning_rate": r.optim.lr,
            "lr_scheduler_type": sched,
            "warmup_steps": self._warmup_value(r),
            "max_grad_norm": r.optim.max_grad_norm,
            "weight_decay": r.optim.weight_decay,
            "beta": r.algorithm.kl_coef,
            "epsilon": r.algorithm.eps_clip,
            "loss_type": LOSS_TYPE[r.algorithm.name],
            "gradient_checkpointing": r.train.gradient_checkpointing,
            **self.precision_config(r),
            "seed": r.train.seed,
            "logging_steps": 1,
            "disable_tqdm": True,
            "report_to": (["wandb"] if r.logging.wandb else []) + (["tensorboard"] if r.logging.tensorboard else []),
            "run_name": (r.logging.wandb.name if r.logging.wandb else None) or r.name,
        }
        if sched_kw:
            cfg["lr_scheduler_kwargs"] = sched_kw
        if total:
            cfg["max_steps"] = total
        if r.algorithm.name == "dr_grpo":
            cfg["scale_rewards"] = "none"
        if r.checkpoint.every:
            cfg["save_strategy"] = "steps"
            cfg["save_steps"] = r.checkpoint.every
        else:
            cfg["save_strategy"] = "no"
        if r.checkpoint.keep_last and not self.rotation_by_rlctl(r):
            cfg["save_total_limit"] = r.checkpoint.keep_last  # with checkpoint evals rlctl prunes (keeps the best)
        if isinstance(r.checkpoint.resume, int):  # "latest" is resolved to a step number by rlctl launch/restart
            cfg["resume_from_checkpoint"] = f"{r.checkpoint.dir}/checkpoint-{r.checkpoint.resume}"
        if r.resources.gpus_per_node == 0:
            cfg["use_cpu"] = True
        if r.rollout.engines and r.resources.gpus_per_node > 0 and r.backend.extra().get("use_vllm"):
            cfg["vllm_gpu_memory_utilization"] = r.rollout.gpu_memory_utilization
        if "max_prompt_length" in self.release_fields(r):  # releases before TRL removed it truncate prompts
            cfg["max_prompt_length"] = r.data.max_prompt_tokens
        if r.data.eval and r.eval.every:
            cfg["eval_strategy"] = "steps"
            cfg["eval_steps"] = r.eval.every
            # GRPOConfig needs the global eval batch to hold whole groups (grpo_config.py __post_init__); the
            # TrainingArguments default of 8 does not for a group of 3
            cfg["per_device_eval_batch_size"] = r.rollout.group_size * max(8 // r.rollout.group_size, 1)
        cfg.update(r.backend.extra())
        return cfg

    def unhonoured(self, recipe: Recipe) -> list[Finding]:
        """GRPOConfig.__post_init__'s own batch rules (trl 1.16.0 trainer/grpo_config.py:1101-1141), on the rendered
        config after backend.trl.extra, and what the render rounds or maps."""
        r = recipe
        out: list[Finding] = []
        rendered = self.grpo_config(r, None)
        extra = r.backend.extra()
        plain = {k: v for k, v in rendered.items() if k not in extra}
        world = self.world_size(r)
        gen, micro, n = (rendered.get("generation_batch_size"), rendered["per_device_train_batch_size"],
                         rendered["num_generations"])
        cite = "(trl trainer/grpo_config.py GRPOConfig.__post_init__)"
        for k in extra:
            if k in plain or k in ("num_generations", "generation_batch_size"):
                out.append(Finding("warn", f"backend.trl.extra.{k}", f"backend.trl.extra sets {k}, which rlctl "
                                   "renders from the recipe: the extra wins", "set it through the recipe instead"))
        if r.train.seq_len is not None:
            out.append(Finding("warn", "train.seq_len", "TRL has no trainer sequence length (GRPOConfig: "
                               "max_completion_length only): it trains on prompt + completion, at most "
                               f"{r.data.max_prompt_tokens + r.rollout.max_tokens} tokens; train.seq_len is not used",
                               "remove train.seq_len; data.max_prompt_tokens and rollout.max_tokens bound it"))
        if r.lora and isinstance(r.lora.target_modules, list) and "lm_head" in r.lora.target_modules:
            # GRPOTrainer.__init__ (trl 1.16.0 trainer/grpo_trainer.py): log-probs come from lm_head.weight directly,
            # so an adapter there would never train: refused at start (found making the doctor corpus's LoRA run)
            out.append(Finding("error", "lora.target_modules", "GRPOTrainer refuses a LoRA adapter on lm_head: the "
                               "log-probabilities are computed from lm_head.weight directly, so it would never train "
                               "(trl trainer/grpo_trainer.py GRPOTrainer.__init__)",
                               "remove \"lm_head\" from lora.target_modules"))
        if r.resources.nodes > 1:
            out.append(Finding("error", "resources.nodes", f"rlctl starts TRL on one node (torch.distributed.run "
                               f"--standalone, one process per GPU); {r.resources.nodes} nodes are not supported",
                               "set resources.nodes = 1, or run TRL through the command backend with your own "
                               "launcher"))
        if n < 2:
            out.append(Finding("error", "rollout.group_size", f"GRPOConfig refuses num_generations {n} < 2 {cite}",
                               "set rollout.group_size >= 2"))
        if gen is not None and gen % (micro * world):
            fix = _generation_fix(gen, r.train.train_batch_size, micro, world)
            whence = ("backend.trl.extra.generation_batch_size" if "generation_batch_size" in extra else
                      f"rollout.prompts_per_step {r.rollout.prompts_per_step} x rollout.group_size "
                      f"{r.rollout.group_size}")
            out.append(Finding("error", "train.micro_batch_size", f"GRPOConfig refuses generation_batch_size {gen} "
                               f"not divisible by the global batch {micro} x {world} {cite}",
                               (f"set {', '.join(f'{k} = {v}' for k, v in fix.items())}: " if fix else "")
                               + f"the micro batch x {world} process(es) must divide generation_batch_size {gen} "
                               f"({whence}), and a train batch of at most {gen} makes each rollout whole optimizer "
                               "steps", set=fix))
        if gen is not None and n >= 1 and gen % n:
            out.append(Finding("error", "rollout.group_size", f"GRPOConfig refuses generation_batch_size {gen} not "
                               f"divisible by num_generations {n} {cite}", "remove the override from "
                               "backend.trl.extra"))
        if rendered.get("eval_strategy", "no") != "no" and n >= 1 and \
                (rendered.get("per_device_eval_batch_size", 8) * world) % n:
            out.append(Finding("error", "backend.trl.extra", f"GRPOConfig refuses a global eval batch of "
                               f"{rendered.get('per_device_eval_batch_size', 8)} x {world} that is not whole groups "
                               f"of {n} {cite}", "remove per_device_eval_batch_size from backend.trl.extra"))
        tbs = r.train.train_batch_size
        step = micro * world * max(tbs // (micro * world), 1)
        if step != tbs:
            out.append(Finding("warn", "train.train_batch_size", f"TRL steps the optimizer every "
                               f"{max(tbs // (micro * world), 1)} micro batch(es) of {micro} x {world}: {step} "
                               f"samples, not train.train_batch_size {tbs}",
                               f"make train.train_batch_size a multiple of {micro * world}"))
        fields = self.release_fields(r)
        if fields and "max_prompt_length" not in fields:  # TRL removed it: no prompt is cut or left out
            out.append(Finding("note", "data.max_prompt_tokens", f"GRPOConfig of trl {self.target_version(r)} has no "
                               f"prompt limit: a prompt longer than data.max_prompt_tokens {r.data.max_prompt_tokens} "
                               "reaches generation whole (preflight's context.prompt_lengths counts them)",
                               "filter or shorten the data if some prompts are longer"))
        if r.algorithm.name in ("ppo", "reinforce_baseline"):
            out.append(Finding("warn", "algorithm.name", f"TRL's GRPOTrainer has no {r.algorithm.name}: it runs "
                               "the GRPO loss", 'set algorithm.name = "grpo" (or "dr_grpo")'))
        return out

    def inert(self, recipe: Recipe) -> list[Inert]:
        """The clip keys where GRPOTrainer's ratio pi/pi_old is exactly 1 at every update (trl 1.16.0
        trainer/grpo_trainer.py): it computes old_per_token_logps only when `gradient_accumulation_steps %
        (steps_per_generation x num_iterations) != 0` (or with vLLM's importance-sampling correction, from the same
        weights), i.e. when a completion is trained on after an optimizer step since it was generated; otherwise
        _compute_loss takes per_token_logps.detach() as the old log-probs, and clamp(1, 1 - epsilon, 1 + epsilon)
        never binds. And algorithm.eps_clip where backend.trl.extra sets epsilon (the extra wins)."""
        r = recipe
        cfg = self.grpo_config(r, None)
        extra = r.backend.extra()
        out: dict[str, Inert] = {}
        if "epsilon" in extra:
            out["algorithm.eps_clip"] = Inert(
                "algorithm.eps_clip", f"backend.trl.extra sets epsilon = {extra['epsilon']}, which is what GRPOConfig "
                "gets (the extra wins over the value rlctl renders from algorithm.eps_clip)",
                "remove epsilon from backend.trl.extra and set algorithm.eps_clip")
        if cfg.get("loss_type") not in CLIPPED_LOSSES:
            return list(out.values())
        world = self.world_size(r)
        micro, accum = cfg["per_device_train_batch_size"], cfg["gradient_accumulation_steps"]
        iters = cfg["num_iterations"]
        gen = cfg.get("generation_batch_size")
        if cfg.get("steps_per_generation"):
            spg = cfg["steps_per_generation"]
        elif gen:  # GRPOConfig.__post_init__: generation_batch_size // (per_device_train_batch_size x processes)
            spg = max(gen // (micro * world), 1)
        else:
            spg = accum
        if accum % (spg * iters):
            return list(out.values())  # a completion is trained on after an update: the ratio moves, the clip acts
        samples = gen or micro * world * spg
        why = (f"GRPOConfig num_iterations = {iters}, steps_per_generation = {spg}, gradient_accumulation_steps = "
               f"{accum}: " + ("one optimizer step per generation batch" if spg * iters == accum else
                               f"one optimizer step per {accum // (spg * iters)} generation batches")
               + f" of {samples} completions, so each completion is trained on only with the weights that generated "
               "it: GRPOTrainer sets old_per_token_logps = per_token_logps.detach() (trl trainer/grpo_trainer.py "
               "_compute_loss), the ratio pi/pi_old is exactly 1 and clamp(ratio, 1 - epsilon, 1 + epsilon) never "
               "binds")
        epochs = next(n for n in range(2, accum // spg + 2) if accum % (spg * n))
        fix = (f"set train.epochs_per_rollout = {epochs} (num_iterations = {epochs}: each generation batch is trained "
               "on again after an optimizer step, where the ratio moves and the clip acts), or make "
               f"train.train_batch_size smaller than a rollout ({samples} samples) together with the micro batch, "
               f"e.g. train.train_batch_size = {samples // 2} and train.micro_batch_size = "
               f"{max(samples // 2 // world, 1)}, so that each rollout gets several optimizer steps (the train "
               "batch alone leaves TRL's per-device batch, and so its steps, as they are)")
        keys = ["algorithm.eps_clip"] + [f"backend.trl.extra.{k}" for k in CLIP_EXTRAS]
        for key in keys:
            out.setdefault(key, Inert(key, why, fix, {"train.epochs_per_rollout": epochs}))
        return list(out.values())

    def micro_tokens(self, recipe: Recipe, micro_batch: int) -> int:
        """TRL pads each batch to its longest prompt + completion, at most max_prompt_tokens + max_tokens."""
        r = recipe
        return micro_batch * min(r.data.max_prompt_tokens + r.rollout.max_tokens, r.model.max_model_len)

    def precision_config(self, recipe: Recipe) -> dict[str, Any]:
        """model.precision rendered faithfully (docs/precision.md).

        TRL loads the model in `model_init_kwargs.dtype` (float32 when unset) and `bf16`/`fp16` turn on accelerate's
        autocast. mixed: fp32 parameters (so AdamW updates fp32 master weights) with compute autocast to model.dtype;
        with LoRA the frozen base is loaded in model.dtype and PEFT keeps the adapters in fp32
        (autocast_adapter_dtype=True). pure: the parameters themselves in model.dtype. Autocast only on a GPU.
        """
        r = recipe
        compute = "bfloat16" if r.model.dtype == "auto" else r.model.dtype
        param = self.param_dtype(r)
        if r.lora is not None:
            param = compute  # frozen base in the compute dtype; PEFT keeps the adapters in fp32
        gpu = r.resources.gpus_per_node > 0
        return {"model_init_kwargs": {"dtype": param},
                "bf16": gpu and compute == "bfloat16", "fp16": gpu and compute == "float16"}

    def config(self, recipe: Recipe, dataset_size: int | None) -> dict[str, Any]:
        r = recipe
        out: dict[str, Any] = {
            "model": r.model.path,
            "dtype": r.model.dtype,
            "train_data": r.data.train,
            "eval_data": r.data.eval,
            "input_key": r.data.input_key,
            "max_prompt_tokens": r.data.max_prompt_tokens,
            "reward_file": r.reward.function,
            "reward_name": r.reward.function_name,
            "final_dir": r.checkpoint.final_dir or f"{r.checkpoint.dir}/final",  # the runner saves it at the end
            "precision": r.model.precision,
            "lora": None,
            "grpo": self.grpo_config(r, dataset_size),
        }
        if r.lora:
            out["lora"] = {"r": r.lora.rank, "lora_alpha": r.lora.alpha, "lora_dropout": r.lora.dropout,
                           "target_modules": r.lora.target_modules}
        if r.logging.wandb:
            out["wandb"] = {"project": r.logging.wandb.project, "entity": r.logging.wandb.entity}
        return out

    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        cfg = self.config(recipe, dataset_size)
        env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **recipe.env}
        if recipe.logging.wandb:
            env["WANDB_PROJECT"] = recipe.logging.wandb.project
            if recipe.logging.wandb.offline:
                env["WANDB_MODE"] = "offline"
            else:
                env["WANDB_API_KEY"] = "${WANDB_API_KEY}"
        world = self.world_size(recipe)
        # GRPOTrainer on several GPUs needs one process per GPU (a single process would wrap the model in
        # DataParallel, which it refuses): torch's own launcher, as `accelerate launch` would start it
        launcher = (["python3", "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
                    if world > 1 and recipe.resources.gpus_per_node > 0 else ["python3"])
        return LaunchPlan(
            backend=self.name, version=self.target_version(recipe),
            argv=[*launcher, "-m", RUNNER, CONFIG_FILE], env=env,
            files={CONFIG_FILE: json.dumps(cfg, indent=2) + "\n"},
            keys=sorted(cfg["grpo"]), total_steps=self.total_steps(recipe, dataset_size),
        )

    # ---- validation ------------------------------------------------------------------------------------------
    def definitions(self, installed: str | None, wanted: str) -> tuple[set[str], str, str]:
        if installed and installed == wanted:
            grpo = package_file("trl", "trainer/grpo_config.py")
            base = package_file("trl", "trainer/base_config.py")
            targs = package_file("transformers", "training_args.py")
            if grpo and targs:
                sources = {"trl.trainer.grpo_config": grpo.read_text(),
                           "transformers.training_args": targs.read_text(),
                           "transformers": "from transformers.training_args import TrainingArguments\n"}
                if base:
                    sources["trl.trainer.base_config"] = base.read_text()
                return _installed_fields(sources), installed, f"installed {grpo}"
        # not installed (or another release is): only an exact snapshot of the wanted release will do, never a neighbour
        self.require_known(wanted)
        snap = load_snapshot(self.name, wanted)
        if snap is None:
            return set(), wanted, "no snapshot"
        return set(snap["keys"]), wanted, f"snapshot of {snap['source']}"

    def prompt_limit(self, recipe: Recipe) -> str | None:
        """Releases whose GRPOConfig has max_prompt_length (rendered from data.max_prompt_tokens) truncate longer
        prompts; later ones (1.16) hold none."""
        if "max_prompt_length" in self.release_fields(recipe):
            return "TRL truncates prompts to max_prompt_length (from the left)"
        return None

    def release_fields(self, recipe: Recipe) -> set[str]:
        """GRPOConfig's fields in the release the recipe targets (the installed one's own source, else its snapshot);
        empty when unknown."""
        from rlctl.backends._static import installed_version

        try:
            return self.definitions(installed_version(self.packages[0]), self.target_version(recipe))[0]
        except Exception:  # an unknown release: validate() says so
            return set()

    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        known, version, source = self.definitions(installed_version, plan.version or self.known_versions[-1])
        if not known:
            return [Finding("warn", "trl", f"no GRPOConfig definition for trl {version}; keys not checked")]
        return check_keys(self.name, plan.keys, known, version, source, kind="GRPOConfig field")

    def parse(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        """A log line (or a W&B/TensorBoard row) in rlctl's unified names: see trl/metrics.py."""
        from rlctl.backends.trl.metrics import parse

        return parse(line)

    def in_loop_eval_run(self, recipe: Recipe) -> dict[str, Any] | None:
        """GRPOTrainer's own evaluation as rendered (eval_strategy, extras included): it samples at the training
        temperature, num_generations_eval (else num_generations) completions per prompt (grpo_trainer.py)."""
        from rlctl.evals.in_loop import context
        from rlctl.evals.sets import LEGACY

        cfg = self.grpo_config(recipe, None)
        if not recipe.data.eval or cfg.get("eval_strategy", "no") == "no":
            return None
        n = cfg.get("num_generations_eval") or cfg.get("num_generations") or recipe.rollout.group_size
        # not the set's evaluation (rlctl evaluates the set in its own mode): never its primary score
        return context(LEGACY, float(cfg.get("temperature", 1.0)), int(n), scores_set=False)

    def name_in_loop_evals(self, rec: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
        from rlctl.backends.trl.metrics import name_in_loop_evals

        return name_in_loop_evals(rec, ctx)

    def metric_bulk(self, text: str) -> dict[int, dict[str, Any]]:
        """The records of a chunk's plain metrics lines, read together (the stream's fast path): see
        trl/metrics.py."""
        from rlctl.backends.trl.metrics import bulk

        return bulk(text)

    def checkpoints(self, root: Path) -> list[Checkpoint]:
        from rlctl.backends.trl.checkpoints import find

        return find(root)


_FIELDS: dict[int, set[str]] = {}


def _installed_fields(sources: dict[str, str]) -> set[str]:
    """GRPOConfig's fields from the installed sources, parsed once per content (render and preflight both ask)."""
    key = hash(tuple(sorted(sources.items())))
    if key not in _FIELDS:
        _FIELDS[key] = set(dataclass_fields(sources, "GRPOConfig"))
    return set(_FIELDS[key])



def _generation_fix(gen: int, tbs: int, micro: int, world: int) -> dict[str, int] | None:
    """The batch keys that satisfy GRPOConfig's rule (the per-device micro batch x processes divides
    generation_batch_size), nearest the recipe: the largest micro batch that divides, and the train batch kept where it
    is a multiple of the new global micro batch no larger than a rollout, else the divisor of the rollout nearest it."""
    m = next((m for m in range(micro, 0, -1) if gen % (m * world) == 0), None)
    if m is None:
        return None
    step = m * world
    fix = {"train.micro_batch_size": m}
    if tbs % step or tbs > gen:
        fix["train.train_batch_size"] = min((d for d in range(step, gen + 1, step) if gen % d == 0),
                                            key=lambda d: (abs(d - tbs), d))
    return fix
