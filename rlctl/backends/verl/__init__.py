"""verl: `python3 -m verl.trainer.main_ppo` with Hydra overrides, per release, checked against that release's config.

Everything rlctl knows about verl lives here; docs/backends/verl.md is the human version (mapping per release, what
cannot be mapped) and tests/conformance/test_verl.py proves it with verl's own code (Hydra compose of the packaged
ppo_trainer config, validate_config, the trainer's step/epoch loop, its LR schedulers and checkpoint manager).

Units. verl's trainer counts *iterations* (`global_steps`: one rollout of data.train_batch_size prompts, then
ppo_epochs passes over it in mini-batches of ppo_mini_batch_size prompts, one optimizer step each). rlctl counts
optimizer steps. One logged verl step = `optimizer_steps_per_logged_step()` optimizer steps, and verl's LR scheduler
steps once per iteration (engine_workers.py: `update_lr_scheduler=batch_idx == total_num_iterations - 1`).
"""

from __future__ import annotations

import json
import math
import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends._static import installed_version, package_file, yaml_key_paths
from rlctl.backends.base import (
    NCCL_VLLM_STALL_SIGNS,
    Backend,
    EffectiveRecipe,
    Finding,
    Inert,
    LaunchPlan,
    check_keys,
)
from rlctl.backends.verl.argv import _val
from rlctl.backends.verl.extra import extra_leaves, leaves
from rlctl.backends.verl.memory import LORA_SYNC
from rlctl.backends.verl.schedule import verl_schedule
from rlctl.core.components import Component

if TYPE_CHECKING:
    from rlctl.backends.base import MemoryFeatures
    from rlctl.backends.layout import Checkpoint
    from rlctl.recipe.schema import Recipe

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
ADV = {"grpo": "grpo", "dr_grpo": "grpo", "reinforce_baseline": "reinforce_plus_plus_baseline", "ppo": "gae"}
KL_TYPE = {"k1": "kl", "k2": "mse", "k3": "low_var_kl", "low_var_kl": "low_var_kl"}
CONFIG_FILE = "trainer/config/_generated_ppo_trainer.yaml"
A = "actor_rollout_ref"
# The attention verl's FSDP workers load a model with (0.9.0 and 0.9.1): the actor and the reference take
# actor_rollout_ref.model.override_config.attn_implementation, "flash_attention_2" when unset
# (workers/config/model.py HFModelConfig.__post_init__); a PPO critic always gets "flash_attention_2"
# (utils/model.py load_valuehead_model passes it to from_pretrained). transformers then needs the package below
# where the workers run, or it stops the worker's init: "FlashAttention2 has been toggled on, but ... the package for
# FlashAttention2 doesn't seem to be installed" (seen on an H100, docs/gpu/verl-2.json).
DEFAULT_ATTENTION = "flash_attention_2"
ATTENTION_PACKAGE = {"flash_attention_2": "flash-attn", "flash_attention_3": "flash-attn-3"}
SDPA_KEY = f"+{A}.model.override_config.attn_implementation"
# verl never requires TRL, but when one is importable its workers import trl.experimental.ppo's (or trl's)
# AutoModelForCausalLMWithValueHead at every model build (models/transformers/monkey_patch.py apply_monkey_patch, 0.9.0
# and 0.9.1) and stop there without it: TRL 1.13.0 removed trl.experimental.ppo (1.12.0 is the last that has it)
TRL_WITHOUT_VALUE_HEAD = "1.13.0"


@cache
def snapshot(version: str) -> dict[str, Any]:
    """Facts about one verl release, generated from its wheel by scripts/snapshot_verl.py."""
    return json.loads((SNAPSHOTS / f"{version}.json").read_text())


class VerlBackend(Backend):
    name = "verl"
    checks = {"placement": ("placement.token_budget", "placement.nodes"), "env": ("env.flash_attn", "env.verl_trl",
              "env.wandb_job"), "reference": ("reference.data_format",)}  # preflight below, data.py
    multi_node_launcher = "ray"  # its trainer and vLLM engines are Ray actors placed over the cluster
    in_loop_eval_single = True  # data.eval, eval.every/temperature/n_samples rendered into its own eval
    own_rotation = "trainer.max_actor_ckpt_to_keep (and max_critic_ckpt_to_keep) stays at null, keep all"
    sharding = "fsdp"  # memory engine: FSDP, fp32 sharded master parameters
    # train_mini_batch splits each GPU's share of a mini-batch into micro batches, the last one smaller: no
    # divisibility by micro x GPUs (placement_rules checks what verl asserts: the mini-batch over the data-parallel
    # ranks, and mapping.py a rollout of whole mini-batches)
    train_batch_rounds = True
    refuses_single_sample_groups = False  # rollout.n = 1 passes validate_config (GRPO then has no group baseline)
    lora_base_master = True  # the FSDP trainer loads the whole model in fp32, frozen base included
    colocation = "sleep"  # hybrid engine: vLLM frees weights + KV cache while the actor trains
    # a rollout replica of TP > GPUs per node takes whole nodes: one vLLM server per node of the replica
    # (workers/rollout/replica.py RolloutReplica.__init__ nnodes, vllm_async_server.py launch_servers)
    tp_spans_nodes = True
    packages = ("verl",)
    known_versions = ("0.9.0", "0.9.1")  # each has a snapshot and passes tests/conformance/test_verl.py
    metric_needles = ("step:", '{"step"')  # as in verl/metrics.py NEEDLES

    def stall_patterns(self) -> list[str]:
        """Log lines that mean the run is stuck or a component it needs died (rlctl.runs.stall)."""
        return [
            *NCCL_VLLM_STALL_SIGNS,
            r"RayActorError|ActorDiedError|The actor died unexpectedly",
        ]

    def log_components(self, recipe: Recipe) -> dict[str, Component]:
        """rollout.mode is async (0.9's default): each vLLM server is a `vLLMHttpServer` Ray actor
        (verl/workers/rollout/vllm_rollout/vllm_async_server.py) whose lines Ray's driver prints into the run's output
        prefixed with its name; the rest is the driver and the `WorkerDict` training workers."""
        engines = ("vLLMHttpServer",)
        return {"trainer": Component("trainer", main_log=True, other_actors=engines,
                                     where="the run's stdout.log without the vLLM servers' lines"),
                "inference": Component("inference", ray_actors=engines,
                                       where="the vLLM servers' lines in the run's stdout.log (Ray actor "
                                             "vLLMHttpServer)")}

    # ---- steps and schedule ----------------------------------------------------------------------------------

    @staticmethod
    def mini_batch_prompts(recipe: Recipe) -> int:
        """actor.ppo_mini_batch_size: verl counts it in prompts (x rollout.n samples); rlctl's train_batch_size
        counts samples."""
        return max(recipe.train.train_batch_size // recipe.rollout.group_size, 1)

    def optimizer_steps_per_logged_step(self, recipe: Recipe) -> int:
        """Optimizer steps per verl iteration: ppo_epochs x (train_batch_size // ppo_mini_batch_size) mini-batches
        (engine_workers.py train_mini_batch: `total_num_iterations = data.shape[0] // mini_batch_size_per_gpu *
        epochs`)."""
        per_rollout = max(recipe.rollout.prompts_per_step // self.mini_batch_prompts(recipe), 1)
        return per_rollout * recipe.train.epochs_per_rollout

    def iterations(self, recipe: Recipe, dataset_size: int | None) -> int | None:
        """verl's total_training_steps (iterations): train.steps optimizer steps rounded up to whole iterations, else
        trainer_base.py `steps_per_epoch * total_epochs` with steps_per_epoch = len(dataset) // train_batch_size."""
        k = self.optimizer_steps_per_logged_step(recipe)
        if recipe.train.steps is not None:
            return math.ceil(recipe.train.steps / k)
        if dataset_size is None:
            return None
        return dataset_size // recipe.rollout.prompts_per_step * (recipe.train.episodes or 1)

    def total_steps(self, recipe: Recipe, dataset_size: int | None) -> int | None:
        it = self.iterations(recipe, dataset_size)
        return None if it is None else it * self.optimizer_steps_per_logged_step(recipe)

    def steps_formula(self, recipe: Recipe, dataset_size: int) -> str:
        k = self.optimizer_steps_per_logged_step(recipe)
        return (f"{dataset_size} prompts // {recipe.rollout.prompts_per_step} per iteration x "
                f"{recipe.train.episodes or 1} epochs x {k} optimizer steps per iteration")

    def warmup_iterations(self, recipe: Recipe, iterations: int) -> int:
        # fsdp/transformer_impl.py: lr_warmup_steps if > 0 else int(lr_warmup_steps_ratio * total_training_steps),
        # both counted in scheduler steps = iterations
        if recipe.optim.warmup_steps:
            return math.ceil(recipe.optim.warmup_steps / self.optimizer_steps_per_logged_step(recipe))
        return int((recipe.optim.warmup_ratio or 0.0) * iterations)

    def warmup_steps(self, recipe: Recipe, total: int) -> int:
        k = self.optimizer_steps_per_logged_step(recipe)
        return self.warmup_iterations(recipe, total // k) * k

    @staticmethod
    def _kind(recipe: Recipe) -> str:
        return "constant" if recipe.optim.schedule == "constant" else "cosine"

    @staticmethod
    def _min_lr_ratio(recipe: Recipe) -> float:
        return recipe.optim.min_lr_ratio if recipe.optim.schedule == "cosine_with_min_lr" else 0.0

    def schedule(self, recipe: Recipe, dataset_size: int | None) -> list[float]:
        """The LR of each optimizer step: verl's per-iteration LR, held for the iteration's mini-batches."""
        it = self.iterations(recipe, dataset_size)
        if not it or recipe.optim.schedule == "linear":
            return []
        k = self.optimizer_steps_per_logged_step(recipe)
        per_iter = verl_schedule(self._kind(recipe), recipe.optim.lr, self.warmup_iterations(recipe, it), it,
                                 self._min_lr_ratio(recipe))
        return [lr for lr in per_iter for _ in range(k)]

    # ---- render ----------------------------------------------------------------------------------------------
    def overrides(self, recipe: Recipe, dataset_size: int | None, version: str | None = None) -> list[tuple[str, Any]]:
        r = recipe
        version = version or self.target_version(r) or self.known_versions[-1]
        snap = snapshot(version)
        g = r.rollout.group_size
        kl_on = r.algorithm.kl_coef > 0
        kl_in_reward = kl_on and not r.algorithm.use_kl_loss
        o: list[tuple[str, Any]] = [
            ("algorithm.adv_estimator", ADV[r.algorithm.name]),
        ]
        if r.algorithm.name == "dr_grpo":
            o.append(("algorithm.norm_adv_by_std_in_grpo", False))
        o.append(("algorithm.use_kl_in_reward", kl_in_reward))
        if kl_in_reward:
            o += [("algorithm.kl_penalty", KL_TYPE[r.algorithm.kl_estimator]),
                  ("algorithm.kl_ctrl.kl_coef", r.algorithm.kl_coef)]
        o.append(("data.train_files", r.data.train))
        if r.data.eval:
            o.append(("data.val_files", r.data.eval))
        else:
            # the trainer builds a validation dataset whatever test_freq says (trainer_base._init_dataloader), from
            # verl's default ~/data/rlhf/gsm8k/test.parquet unless told otherwise: one prompt of the train set
            o += [("data.val_files", r.data.train), ("data.val_max_samples", 1)]
        o += [
            ("data.prompt_key", r.data.input_key),
            ("data.train_batch_size", r.rollout.prompts_per_step),
            ("data.max_prompt_length", r.data.max_prompt_tokens),
            ("data.max_response_length", r.rollout.max_tokens),
            ("data.filter_overlong_prompts", True),
            (f"{A}.model.path", r.model.path),
            (f"{A}.model.enable_gradient_checkpointing", r.train.gradient_checkpointing),
        ]
        if r.model.trust_remote_code:
            o.append((f"{A}.model.trust_remote_code", True))
        if r.lora:
            o += [(f"{A}.model.lora_rank", r.lora.rank), (f"{A}.model.lora_alpha", r.lora.alpha),
                  (f"{A}.model.target_modules", r.lora.target_modules), *LORA_SYNC.items()]
        o += [
            (f"{A}.actor.optim.lr", r.optim.lr),
            (f"{A}.actor.optim.lr_scheduler_type", self._kind(r)),
        ]
        if r.optim.warmup_steps:
            o.append((f"{A}.actor.optim.lr_warmup_steps", self.warmup_iterations(r, 0)))
        elif r.optim.warmup_ratio:
            o.append((f"{A}.actor.optim.lr_warmup_steps_ratio", r.optim.warmup_ratio))
        if self._kind(r) == "cosine":
            o.append((f"{A}.actor.optim.min_lr_ratio", self._min_lr_ratio(r)))
        o += [
            (f"{A}.actor.optim.weight_decay", r.optim.weight_decay),
            (f"{A}.actor.optim.clip_grad", r.optim.max_grad_norm),
            # verl counts the mini batch in prompts; rlctl's train_batch_size counts samples
            (f"{A}.actor.ppo_mini_batch_size", self.mini_batch_prompts(r)),
            (f"{A}.actor.ppo_micro_batch_size_per_gpu", r.train.micro_batch_size),
            (f"{A}.actor.ppo_epochs", r.train.epochs_per_rollout),
            (f"{A}.actor.use_kl_loss", kl_on and r.algorithm.use_kl_loss),
            (f"{A}.actor.kl_loss_coef", r.algorithm.kl_coef),
            (f"{A}.actor.kl_loss_type", KL_TYPE[r.algorithm.kl_estimator]),
            (f"{A}.actor.entropy_coeff", r.algorithm.entropy_coef),
            # the vanilla policy loss clips at clip_ratio_low / clip_ratio_high, which the packaged actor.yaml sets to
            # 0.2 (trainer/ppo/core_algos.py compute_policy_loss_vanilla falls back to clip_ratio only when they are
            # None; 0.9.0 and 0.9.1): clip_ratio alone would leave the clip range at 0.2 whatever eps_clip says
            (f"{A}.actor.clip_ratio", r.algorithm.eps_clip),
            (f"{A}.actor.clip_ratio_low", r.algorithm.eps_clip),
            (f"{A}.actor.clip_ratio_high", r.algorithm.eps_clip),
            (f"{A}.actor.fsdp_config.param_offload", r.train.offload),
            (f"{A}.actor.fsdp_config.optimizer_offload", r.train.offload),
        ]
        if not r.checkpoint.save_optimizer:
            o.append((f"{A}.actor.checkpoint.save_contents", ["model", "extra"]))
        if r.algorithm.name == "dr_grpo":
            # Dr. GRPO divides by a constant; unset, core_algos.agg_loss divides by the padded batch width
            o += [(f"{A}.actor.loss_agg_mode", "seq-mean-token-sum-norm"),
                  (f"{A}.actor.loss_scale_factor", r.rollout.max_tokens)]
        o += [
            (f"{A}.rollout.name", "vllm"),
            (f"{A}.rollout.n", g),
            (f"{A}.rollout.temperature", r.rollout.temperature),
            (f"{A}.rollout.gpu_memory_utilization", r.rollout.gpu_memory_utilization),
            (f"{A}.rollout.tensor_model_parallel_size", r.rollout.tensor_parallel),
            # unset, the vLLM server takes the model's max_position_embeddings (vllm_async_server.py
            # _validate_configs) and sizes its KV cache for that, not for the recipe's context
            (f"{A}.rollout.max_model_len", r.model.max_model_len),
            (f"{A}.rollout.log_prob_micro_batch_size_per_gpu", r.rollout.micro_batch_size or r.train.micro_batch_size),
            (f"{A}.ref.log_prob_micro_batch_size_per_gpu", r.rollout.micro_batch_size or r.train.micro_batch_size),
        ]
        if r.rollout.top_p != 1.0:
            o.append((f"{A}.rollout.top_p", r.rollout.top_p))
        if r.rollout.max_num_batched_tokens:
            o += [(f"{A}.rollout.max_num_batched_tokens", r.rollout.max_num_batched_tokens),
                  (f"{A}.rollout.enable_chunked_prefill", True)]
        if r.rollout.enforce_eager:
            o.append((f"{A}.rollout.enforce_eager", True))
        if r.data.eval:
            o += [(f"{A}.rollout.val_kwargs.temperature", r.eval.temperature),
                  (f"{A}.rollout.val_kwargs.n", r.eval.n_samples),
                  (f"{A}.rollout.val_kwargs.do_sample", r.eval.temperature > 0)]
        if r.algorithm.name == "ppo":
            # the critic (GAE needs a value model): same base model, verl's own critic LR default
            o += [("critic.model.path", r.model.path),
                  ("critic.model.enable_gradient_checkpointing", r.train.gradient_checkpointing),
                  ("critic.ppo_micro_batch_size_per_gpu", r.train.micro_batch_size),
                  ("critic.ppo_epochs", r.train.epochs_per_rollout),
                  ("critic.optim.clip_grad", r.optim.max_grad_norm),
                  ("critic.fsdp.param_offload", r.train.offload),
                  ("critic.fsdp.optimizer_offload", r.train.offload)]
        if r.reward.function:
            key = snap["reward_function_key"]
            o += [(f"{key}.path", r.reward.function), (f"{key}.name", r.reward.function_name)]
        loggers = ["console"] + (["wandb"] if r.logging.wandb else [])
        loggers += ["tensorboard"] if r.logging.tensorboard else []
        it = self.iterations(r, dataset_size)
        o += [
            ("trainer.logger", loggers),
            ("trainer.project_name", r.logging.wandb.project if r.logging.wandb else r.name),
            ("trainer.experiment_name", (r.logging.wandb.name if r.logging.wandb else None) or r.name),
            ("trainer.nnodes", r.resources.nodes),
            ("trainer.n_gpus_per_node", r.resources.gpus_per_node),
            ("trainer.default_local_dir", r.checkpoint.dir),
            ("trainer.save_freq", self.every_iterations(r.checkpoint.every, r)),
            ("trainer.test_freq", self.every_iterations(r.eval.every, r) if r.data.eval else -1),
            ("trainer.val_before_train", bool(r.data.eval and r.eval.every)),
        ]
        if r.train.steps is not None:
            # trainer_base.py fit(): `while current_epoch < total_epochs and global_steps <= total_training_steps`,
            # so total_epochs must not stop the run first: every epoch has at least one iteration, hence
            # total_epochs = iterations is an upper bound that never binds (a filtered dataset included)
            o += [("trainer.total_epochs", it), ("trainer.total_training_steps", it)]
        else:
            o.append(("trainer.total_epochs", r.train.episodes or 1))
        if r.checkpoint.keep_last and not self.rotation_by_rlctl(r):
            # with eval sets rlctl rotates, keeping the best-eval checkpoint: left at verl's null, which keeps all
            # (utils/checkpoint/checkpoint_manager.py register_checkpoint, 0.9.0 and 0.9.1)
            o.append(("trainer.max_actor_ckpt_to_keep", r.checkpoint.keep_last))
            if r.algorithm.name == "ppo":
                o.append(("trainer.max_critic_ckpt_to_keep", r.checkpoint.keep_last))
        resume = r.checkpoint.resume
        if resume == "off":
            o.append(("trainer.resume_mode", "disable"))
        elif resume == "latest":
            o.append(("trainer.resume_mode", "auto"))
        else:
            o += [("trainer.resume_mode", "resume_path"),
                  ("trainer.resume_from_path", f"{r.checkpoint.dir}/global_step_{resume}")]
        o.append(("data.seed", r.train.seed))
        for k, v in r.backend.extra().items():
            if not k.startswith("~"):  # a Hydra deletion is refused (one error finding), never rendered
                o.append((k, v))
        return o

    def every_iterations(self, every: int | None, recipe: Recipe) -> int:
        """save_freq / test_freq count iterations; the recipe counts optimizer steps (-1: never)."""
        if not every:
            return -1
        return max(every // self.optimizer_steps_per_logged_step(recipe), 1)

    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        version = self.target_version(recipe) or self.known_versions[-1]
        overrides = self.overrides(recipe, dataset_size, version)
        argv = ["python3", "-m", "verl.trainer.main_ppo", *[f"{k}={_val(v)}" for k, v in overrides]]
        env = dict(recipe.env)
        wb = recipe.logging.wandb
        if wb:
            if wb.offline:
                env["WANDB_MODE"] = "offline"
            else:
                # verl's Tracking calls wandb.init(project, name) in its TaskRunner; the key comes from this
                # variable (or that node's ~/.netrc), never from the config (main_ppo prints the config)
                env["WANDB_API_KEY"] = "${WANDB_API_KEY}"
            if wb.entity:
                env["WANDB_ENTITY"] = wb.entity
        if recipe.logging.tensorboard:
            env["TENSORBOARD_DIR"] = recipe.logging.tensorboard  # verl/utils/tracking.py reads it
        k = self.optimizer_steps_per_logged_step(recipe)
        notes = []
        if k > 1:
            notes.append(f"one verl step (iteration) = {k} optimizer steps; verl logs iterations")
        for models, impl in self.attention(recipe, overrides).items():
            if impl in ATTENTION_PACKAGE:
                notes.append(f"verl loads the {models} with {impl}"
                             + (" (its default)" if impl == DEFAULT_ATTENTION else "")
                             + f": the {ATTENTION_PACKAGE[impl]} package must be installed where its workers run "
                             "(preflight env.flash_attn checks this machine)")
        if recipe.lora and all(dict(overrides).get(k) == v for k, v in LORA_SYNC.items()):
            notes.append("LoRA: " + " ".join(f"{k}={v}" for k, v in LORA_SYNC.items()) + ": under FSDP1 (verl's "
                         "default strategy) peft >= 0.21 hands vLLM an empty adapter and add_lora stops before step "
                         "1 (StopIteration); vLLM loads the base from model.path, so each sync sends the adapter "
                         "alone")
        return LaunchPlan(
            backend=self.name, version=version, argv=argv, env=env,
            keys=[k for k, _ in overrides], total_steps=self.total_steps(recipe, dataset_size),
            notes=notes,
        )

    def attention(self, recipe: Recipe, overrides: list[tuple[str, Any]] | None = None) -> dict[str, str]:
        """{the models verl's workers load: their attention implementation} for this recipe (DEFAULT_ATTENTION)."""
        o = dict(overrides if overrides is not None else self.overrides(recipe, None))
        node = f"{A}.model.override_config"
        impl = DEFAULT_ATTENTION
        for key, value in o.items():
            k = key.lstrip("+")
            if k == f"{node}.attn_implementation":
                impl = str(value)
            elif k == node and isinstance(value, dict) and "attn_implementation" in value:
                impl = str(value["attn_implementation"])
        out = {"actor and reference model": impl}
        if recipe.algorithm.name == "ppo":
            out["critic"] = DEFAULT_ATTENTION
        return out

    # ---- what cannot be honoured -----------------------------------------------------------------------------
    def colocated(self, recipe: Recipe) -> bool:
        """The synchronous trainer's hybrid engine puts actor and vLLM on every GPU (colocate = false is said, not
        honoured: mapping.py)."""
        return True

    def restart_loses(self, recipe: Recipe) -> str | None:
        """save_contents without "optimizer" (rendered for save_optimizer = false): the checkpoint manager loads the
        model and the extra state (LR scheduler, RNG) it finds, and the optimizer starts from scratch."""
        if recipe.checkpoint.save_optimizer:
            return None
        return ("checkpoint.save_optimizer = false (actor.checkpoint.save_contents without optimizer): a restart "
                "loads the weights but starts the optimizer (its moments) from scratch")

    def unhonoured(self, recipe: Recipe) -> list[Finding]:
        from rlctl.backends.verl.mapping import unhonoured

        version = recipe.backend.version or installed_version("verl") or self.known_versions[-1]
        if version not in self.known_versions:
            return []  # render reports the unknown version
        # the batch splits verl refuses (validate_config) or asserts after the first rollout (train_mini_batch): render
        # shows them too, not only preflight's placement.batch
        from rlctl.backends.verl.passthrough import effective

        eff = effective(self, recipe)  # the checks read what runs: an extra that overrides a rendered key wins
        own = [Finding("error", "train.train_batch_size", res.figure, res.fix) for res in placement_rules(eff.recipe)
               if res.verdict == "fail"]
        return (eff.findings + unhonoured(self, eff.recipe, snapshot(version)) + own
                + self.placement_errors(eff.recipe) + _deletions(recipe))

    def inert(self, recipe: Recipe) -> list[Inert]:
        """The clip keys where the ratio of verl's vanilla policy loss is exactly 1 at every update (0.9.0, 0.9.1):
        the trainer recomputes the old log-probs with the actor right before updating it
        (trainer/ppo/v1/trainer_base.py _compute_old_log_prob, unless algorithm.rollout_correction.bypass_mode takes
        the rollout's), and with one optimizer step per iteration (ppo_epochs x data.train_batch_size //
        ppo_mini_batch_size = 1) that one update is the only one: clamp(ratio, 1 - clip_ratio_low, 1 +
        clip_ratio_high) and the dual clip (clip_ratio_c) never bind. Read from what renders (extras included, Hydra
        keeping the last value); another loss_mode is not judged. And algorithm.eps_clip where extras set both
        clip_ratio_low and clip_ratio_high (the loss reads those)."""
        o = {k.lstrip("+"): v for k, v in self.overrides(recipe, None)}  # Hydra keeps the last value of a key
        actor = f"{A}.actor"
        clip_keys = [f"{actor}.{k}" for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")]
        extra = extra_leaves(recipe)
        out: dict[str, Inert] = {}
        if f"{actor}.clip_ratio_low" in extra and f"{actor}.clip_ratio_high" in extra:
            out["algorithm.eps_clip"] = Inert(
                "algorithm.eps_clip", f"backend.verl.extra sets {actor}.clip_ratio_low and clip_ratio_high, the "
                "bounds verl's vanilla policy loss clips at (trainer/ppo/core_algos.py compute_policy_loss_vanilla)",
                "remove them from backend.verl.extra and set algorithm.eps_clip")
        mode = o.get(f"{actor}.policy_loss.loss_mode", "vanilla")
        bypass = o.get("algorithm.rollout_correction.bypass_mode", False)
        if mode != "vanilla" or bypass not in (False, None, "false", "False"):
            return list(out.values())
        prompts, mini, epochs = (o.get("data.train_batch_size"), o.get(f"{actor}.ppo_mini_batch_size"),
                                 o.get(f"{actor}.ppo_epochs", 1))
        if not all(isinstance(x, int) and x > 0 for x in (prompts, mini, epochs)):
            return list(out.values())  # not a number rlctl can read: no verdict
        steps = prompts // mini * epochs
        if steps != 1:
            return list(out.values())
        n = recipe.rollout.group_size
        why = (f"data.train_batch_size = {prompts} prompts, {actor}.ppo_mini_batch_size = {mini}, ppo_epochs = "
               f"{epochs}: one optimizer step per iteration, and the trainer recomputes the old log-probs with the "
               "actor right before it (trainer/ppo/v1/trainer_base.py _compute_old_log_prob; bypass_mode is off), "
               "so the ratio exp(log_prob - old_log_prob) is exactly 1 at that only update and clamp(ratio, 1 - "
               "clip_ratio_low, 1 + clip_ratio_high) never binds (trainer/ppo/core_algos.py "
               "compute_policy_loss_vanilla)")
        half = prompts // 2 * n
        fix = ("set train.epochs_per_rollout = 2 (ppo_epochs = 2: a second pass over each rollout after an optimizer "
               "step, where the ratio moves and the clip acts)"
               + (f", or train.train_batch_size = {half} (ppo_mini_batch_size {prompts // 2} prompts: two optimizer "
                  "steps per iteration)" if prompts >= 2 and prompts % 2 == 0 else ""))
        for key in ["algorithm.eps_clip"] + [f"backend.verl.extra.{k}" for k in clip_keys]:
            out.setdefault(key, Inert(key, why, fix, {"train.epochs_per_rollout": 2}))
        return list(out.values())

    def effective(self, recipe: Recipe) -> EffectiveRecipe:
        """backend.verl.extra overrides what rlctl renders (Hydra keeps the last value): the recipe that renders the
        command that runs (passthrough.py)."""
        from rlctl.backends.verl.passthrough import effective

        eff = effective(self, recipe)
        return EffectiveRecipe(eff.recipe, eff.lines, frozenset(eff.lines))

    def placement_errors(self, recipe: Recipe) -> list[Finding]:
        """The tensor parallel sizes verl's workers refuse, with the assert that fires (0.9.0 and 0.9.1):
        - the hybrid worker group (nnodes x n_gpus_per_node ranks) splits into rollout groups of TP (x rollout DP x
          PP, both 1 as rendered): workers/engine_workers.py init_model, `assert self.world_size % infer_world_size
          == 0` ("rollout world_size: N is not divisible by infer_world_size: TP");
        - a replica larger than a node takes whole nodes: workers/rollout/replica.py RolloutReplica.__init__,
          `assert self.world_size % self.gpus_per_replica_node == 0` (gpus_per_replica_node = min(gpus_per_node,
          TP)). vLLM's own rule (TP divides the attention heads) is placement.tensor_parallel's."""
        r = recipe
        tp, per_node = r.rollout.tensor_parallel, r.resources.gpus_per_node
        world = r.resources.nodes * per_node
        v = self.target_version(r)
        if not per_node:
            return []
        if world % tp:
            fit = [t for t in range(tp, 0, -1) if world % t == 0 and (t <= per_node or t % per_node == 0)][0]
            return [Finding("error", "rollout.tensor_parallel", f"TP {tp} does not divide the {world} GPUs of verl's "
                            f"hybrid worker group: workers/engine_workers.py init_model asserts `self.world_size % "
                            f"infer_world_size == 0` (\"rollout world_size: {world} is not divisible by "
                            f"infer_world_size: {tp}\") when the workers start (verl {v})",
                            f"set rollout.tensor_parallel = {fit} (a divisor of {world})")]
        if tp > per_node and tp % per_node:
            return [Finding("error", "rollout.tensor_parallel", f"TP {tp} spans nodes of {per_node} GPUs but not whole "
                            "ones: workers/rollout/replica.py RolloutReplica.__init__ asserts `self.world_size % "
                            f"self.gpus_per_replica_node == 0` (\"world_size {tp} must be divisible by gpus_per_node "
                            f"{per_node}\") (verl {v})",
                            f"set rollout.tensor_parallel to a divisor of {per_node} or a multiple of it")]
        return []

    # ---- validation ------------------------------------------------------------------------------------------
    def definitions(self, installed: str | None, wanted: str) -> tuple[set[str], str, str]:
        self.require_known(wanted)
        if installed and installed == wanted:
            path = package_file("verl", CONFIG_FILE)
            if path is not None:
                return set(yaml_key_paths(path.read_text())), installed, f"installed {path}"
        snap = snapshot(wanted)
        return set(snap["keys"]), wanted, f"snapshot of {snap['source'].split(',')[0]}"

    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        known, version, source = self.definitions(installed_version, plan.version or self.known_versions[-1])
        # Hydra rejects an override of a key that is not in the config unless it is prefixed with `+`, which adds
        # it under a node the config has (verl's open dicts: model.override_config) and refuses one already there;
        # `++` adds or overrides
        plain = [k for k in plan.keys if not k.startswith("+")]
        out = check_keys(self.name, plain, known, version, source, kind="key")
        for k in plan.keys:
            if not k.startswith("+"):
                continue
            key = k.lstrip("+")
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            if parent and parent not in known:
                out.append(Finding("error", k, f"`{k}` appends under `{parent}`, which is not in {self.name} "
                                   f"{version}'s config ({source})", "append under a node the config has"))
            elif not k.startswith("++") and key in known:
                out.append(Finding("error", k, f"`{k}`: `{key}` is in {self.name} {version}'s config already and "
                                   "Hydra refuses to append it", f"drop the `+`: `{key}`"))
        return out

    def prompt_limit(self, recipe: Recipe) -> str | None:
        """verl's RLHFDataset holds prompts to data.max_prompt_length: with truncation='error' (the default) a longer
        one stops the run with an error, filter_overlong_prompts drops them, left/right truncation cuts them."""
        del recipe  # Unused
        return "verl's data.max_prompt_length (longer prompts fail, are filtered or truncated: data.truncation)"

    def parse(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        """A log line (or a W&B/TensorBoard row) in rlctl's unified names: see verl/metrics.py."""
        from rlctl.backends.verl.metrics import parse

        return parse(line)

    def in_loop_eval_run(self, recipe: Recipe) -> dict[str, Any] | None:
        """The validation verl runs with the rendered overrides (data.val_files with trainer.test_freq > 0 or
        val_before_train; actor_rollout_ref.rollout.val_kwargs.temperature/n/do_sample; the last of a key wins)."""
        from rlctl.evals.in_loop import context
        from rlctl.evals.sets import LEGACY

        if not recipe.data.eval:
            return None  # the validation set rendered without data.eval is never run (test_freq -1)
        o = dict(self.overrides(recipe, None))
        if (o.get("trainer.test_freq") or -1) <= 0 and not o.get("trainer.val_before_train"):
            return None
        kw = f"{A}.rollout.val_kwargs"
        return context(LEGACY, float(o.get(f"{kw}.temperature", 0.0)), int(o.get(f"{kw}.n", 1)),
                       greedy=not o.get(f"{kw}.do_sample", False))

    def name_in_loop_evals(self, rec: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
        from rlctl.backends.verl.metrics import name_in_loop_evals

        return name_in_loop_evals(rec, ctx)

    def metric_bulk(self, text: str) -> dict[int, dict[str, Any]]:
        """The records of a chunk's plain step lines, read together (the stream's fast path): see verl/metrics.py."""
        from rlctl.backends.verl.metrics import bulk

        return bulk(text)

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def saved_checkpoints(self, recipe: Recipe, total_steps: int) -> int:
        """verl saves at every iteration that is a multiple of the rendered save_freq (iterations, every_iterations)
        and at the last one (trainer_base.py fit: `save_freq > 0 and (is_last_step or global_steps % save_freq ==
        0)`); total_steps counts optimizer steps."""
        freq = self.every_iterations(recipe.checkpoint.every, recipe)
        if freq <= 0:
            return 1
        iterations = max(total_steps // self.optimizer_steps_per_logged_step(recipe), 1)
        return iterations // freq + (1 if iterations % freq else 0)

    def checkpoint_bytes(self, arch: Any, recipe: Recipe) -> tuple[float, str]:
        r = recipe
        P = arch.params
        T = arch.lora_params(r.lora.rank, r.lora.target_modules) if r.lora else P
        # fp32 FSDP model shards (+ Adam's two fp32 states of what trains); hf_model in save_contents (set through
        # backend.verl.extra) adds a bf16 HF export under actor/huggingface
        actor = P * 4 + (T * 8 if r.checkpoint.save_optimizer else 0)
        contents = extra_leaves(r).get(f"{A}.actor.checkpoint.save_contents") or []
        hf = P * 2 if "hf_model" in contents else 0
        critic = (P * 4 + (P * 8 if r.checkpoint.save_optimizer else 0)) if r.algorithm.name == "ppo" else 0
        what = "FSDP model" + (" + optimizer" if r.checkpoint.save_optimizer else "") + " shards" \
            + (" + HF export" if hf else "")
        what += " (actor and critic)" if critic else ""
        return actor + hf + critic, what

    def prune_during_run(self, recipe: Recipe) -> bool:
        """verl's checkpoint manager remembers only the checkpoints saved by this process (previous_saved_paths,
        checkpoint_manager.py register_checkpoint): after a resume or restart the older ones are never deleted, and
        rotated steps keep their global_step_N/data.pt. rlctl prunes whole global_step_N dirs to keep_last."""
        return bool(recipe.checkpoint.keep_last)

    def checkpoints(self, root: Path) -> list[Checkpoint]:
        from rlctl.backends.verl.checkpoints import find

        return find(root)

    def eval_label_key(self, recipe: Recipe) -> str | None:
        # verl's reward manager reads reward_model['ground_truth'] of every row (backends/verl/data.py), whatever
        # data.label_key says
        return "reward_model.ground_truth"

    def export_for_eval(self, ckpt: Checkpoint) -> list[str] | None:
        from rlctl.backends.verl.checkpoints import merge_argv

        return merge_argv(ckpt.path) if (ckpt.path / "actor").is_dir() else None

    def evaluable_fix(self, ckpt: Checkpoint) -> str | None:
        from rlctl.backends.verl.checkpoints import merge_command

        return (f"verl saved FSDP shards; its actor/huggingface/ holds config and tokenizer only. Merge this one with "
                f"verl's own tool where verl is installed: `{merge_command(ckpt.path)}`, or have every checkpoint "
                f"carry its HF weights: "
                f'[backend.verl.extra] "{A}.actor.checkpoint.save_contents" = ["model", "extra", "hf_model"]')

    # ---- memory (verl/memory.py: what verl's FSDP actor holds during its update, read from verl's own code) -------
    # Bytes per (token x vocab) of the log-prob head at its peak, bf16 compute (workers/engine/fsdp/transformer_impl.py
    # prepare_model_outputs -> utils/torch_functional.py logprobs_from_logits): the bf16 logits (2) and their bf16 copy
    # divided by the rollout temperature (2; 0.9.1 skips the copy at temperature 1, _scale_logits_by_temperature).
    # flash-attn's Triton cross_entropy_loss reads them in place, in fp32 registers only, keeps no fp32 copy and writes
    # the gradient into the saved logits (inplace_backward); the division's backward makes one more bf16 tensor while
    # the original logits are already freed. Nothing fp32 is materialised, unlike the 14.5 of Backend. Measured on an
    # H100 with that code path (8192 tokens x 151936 vocab, torch 2.11, flash-attn 2.8.3's cross_entropy.py): peak 4.0
    # bytes per element at temperature 0.6 in both releases, 2.0 in 0.9.1 at temperature 1, 6.0 with entropy (a note
    # says so where it applies); an fp32 log-softmax head measured 12.0 in the same harness.
    logit_bytes = 4.0

    def memory_settings(self, recipe: Recipe) -> tuple[dict[str, Any], str] | None:
        """(the memory-relevant keys as verl resolves them for this recipe, the release), or None for a release rlctl
        does not know."""
        from rlctl.backends.base import UnknownVersion
        from rlctl.backends.verl import memory

        try:
            version = self.target_version(recipe) or self.known_versions[-1]
            self.require_known(version)
        except UnknownVersion:
            return None
        rendered = [(k2, _val(v2)) for k, v in self.overrides(recipe, None, version) for k2, v2 in leaves(k, v)]
        return memory.settings(version, rendered), version

    def memory_engine(self, recipe: Recipe) -> str:
        """FSDP1 (verl's default actor strategy "fsdp") or FSDP2 ("fsdp2"), as the recipe resolves it."""
        found = self.memory_settings(recipe)
        return "fsdp1" if found is None or found[0][f"{A}.actor.strategy"] == "fsdp" else "fsdp"

    def memory_features(self, recipe: Recipe) -> MemoryFeatures:
        """Checkpointing, activation/optimizer offload, dynamic batching and the log-prob head as verl runs them."""
        from rlctl.backends.verl import memory
        from rlctl.errors import RlctlError

        found = self.memory_settings(recipe)
        if found is None:
            return super().memory_features(recipe)
        s, version = found
        vocab = None
        if s[f"{A}.model.use_fused_kernels"]:
            from rlctl.recipe.models import resolve_arch

            try:
                vocab = resolve_arch(recipe.model.path).vocab
            except RlctlError:
                vocab = None
        return memory.features(recipe, s, version, vocab)

    def micro_tokens(self, recipe: Recipe, micro_batch: int) -> int:
        """verl packs a micro batch's real tokens (use_remove_padding): at most micro_batch x (prompt + response),
        shared by the GPUs of a sequence-parallel group."""
        from rlctl.backends.verl import memory

        found = self.memory_settings(recipe)
        if found is None:
            return super().micro_tokens(recipe, micro_batch)
        return memory.micro_tokens(recipe, found[0], micro_batch)

    def token_budget_rules(self, recipe: Recipe) -> list[Any]:
        """Dynamic batching's token budgets that verl would reject only after the first rollout."""
        from rlctl.backends.verl import memory
        from rlctl.preflight import FAIL, Result

        found = self.memory_settings(recipe)
        if found is None:
            return []
        return [Result("placement.token_budget", FAIL, what, fix)
                for _, what, fix in memory.budget_problems(recipe, found[0])]

    # ---- checks ----------------------------------------------------------------------------------------------
    def preflight(self, ctx: Any, family: str) -> list[Any]:
        r = ctx.recipe
        if family == "placement":
            return placement_rules(r) + nodes_rule(r, os.environ) + self.token_budget_rules(r)
        if family == "env":
            return wandb_reaches_job(r, os.environ) + attention_package(self, r, os.environ) + trl_beside(r, os.environ)
        if family == "reference":
            from rlctl.backends.verl.data import data_format

            return data_format(ctx)
        return []


def _deletions(recipe: Recipe) -> list[Finding]:
    """`~key` in backend.verl.extra: a deletion in Hydra's grammar, which rlctl does not pass through (the key it
    names is one rlctl renders, or absent)."""
    return [Finding("error", f"backend.verl.extra.{k}", f"backend.verl.extra.{k}: `~` (a deletion in Hydra's override "
                    "grammar) is not passed through: rlctl renders its own value for the keys it sets",
                    "remove it; set the recipe key rlctl renders the key from, or give the key a value")
            for k in extra_leaves(recipe) if k.startswith("~")]


def placement_rules(recipe: Recipe) -> list[Any]:
    """verl's batch-size rules that would otherwise fail at start or, worse, after the first rollout."""
    from rlctl.preflight import FAIL, Result

    r = recipe
    tbs, g = r.train.train_batch_size, r.rollout.group_size
    n_gpus = r.resources.nodes * r.resources.gpus_per_node
    out = []
    if tbs % g:
        out.append(Result("placement.batch", FAIL,
                          f"verl counts ppo_mini_batch_size in prompts: {tbs} samples is not whole groups of {g}",
                          "make train.train_batch_size a multiple of rollout.group_size"))
    dynamic = bool(extra_leaves(r).get(f"{A}.actor.use_dynamic_bsz"))
    rollout_samples = r.rollout.prompts_per_step * g
    if n_gpus and not dynamic and rollout_samples % n_gpus:
        # verl/utils/config.py validate_config: real_train_batch_size % minimal_bsz (n_gpus) == 0
        out.append(Result("placement.batch", FAIL,
                          f"a rollout of {rollout_samples} samples does not split over {n_gpus} GPUs: verl's "
                          "validate_config refuses it (utils/config.py: `real_train_batch_size % minimal_bsz == 0`)",
                          "make prompts_per_step x group_size a multiple of the GPUs"))
    if n_gpus and (tbs // g) * g % n_gpus:
        # workers/engine_workers.py train_mini_batch (update_actor's work on each rank): `assert mini_batch_size %
        # self.engine.get_data_parallel_size() == 0`, after the first rollout
        out.append(Result("placement.batch", FAIL,
                          f"a mini-batch of {(tbs // g) * g} samples does not split over {n_gpus} data-parallel "
                          "ranks: verl asserts it at the first update, after the first rollout (workers/"
                          "engine_workers.py train_mini_batch: `assert mini_batch_size % "
                          "self.engine.get_data_parallel_size() == 0`)",
                          "make train.train_batch_size a multiple of the GPUs"))
    return out


def ray_temp_dir(environ: Any) -> Path:
    """Ray's default temp dir as `ray start` and `ray.init()` compute it (ray/_common/utils.py
    get_default_system_temp_dir + "ray"): RAY_TMPDIR, else TMPDIR on Linux, else /tmp."""
    import sys

    base = environ.get("RAY_TMPDIR") or (environ.get("TMPDIR") if sys.platform.startswith("linux") else None)
    return Path(base or "/tmp") / "ray"


def ray_init_address(recipe: Recipe, environ: Any) -> tuple[str | None, str]:
    """(the Ray cluster main_ppo's `ray.init()` joins, where the address comes from), or (None, why it starts a
    one-machine Ray). main_ppo calls `ray.init(**ray_kwargs.ray_init)`; with no address Ray looks it up itself
    (ray/_private/services.py get_ray_address_from_environment): RAY_ADDRESS, else the address the last `ray start`
    on this machine (head or worker) wrote to <ray temp dir>/ray_current_cluster (`ray stop` removes it)."""
    r = recipe
    env = {**environ, **r.env}
    extra = r.backend.extra()
    given = extra.get("+ray_kwargs.ray_init.address") or extra.get("ray_kwargs.ray_init.address")
    if given and given not in ("auto", "local"):
        return str(given), "ray_kwargs.ray_init.address"
    addr = given or env.get("RAY_ADDRESS") or None
    if addr == "local":
        return None, "RAY_ADDRESS=local starts a new Ray"
    if addr and addr != "auto":
        return addr, "RAY_ADDRESS"
    marker = ray_temp_dir(env) / "ray_current_cluster"
    try:
        found = marker.read_text().strip() if marker.is_file() else ""
    except OSError:
        found = ""
    if found:
        return found, f"`ray start` on this machine ({marker})"
    return None, f"no RAY_ADDRESS and no cluster `ray start` left on this machine ({marker} absent)"


def nodes_rule(recipe: Recipe, environ: Any) -> list[Any]:
    """resources.nodes > 1 with the local executor: main_ppo's `ray.init()` joins a cluster only if Ray finds one
    (ray_init_address); otherwise it starts a Ray of this machine alone, and verl's resource pool of nnodes x
    n_gpus_per_node GPUs fails its check (single_controller/ray/base.py ResourcePoolManager._check_resource_available:
    ValueError "Total available GPUs ... is less than total desired GPUs ...")."""
    from rlctl import executors
    from rlctl.preflight import FAIL, OK, Result

    r = recipe
    if r.resources.nodes <= 1 or getattr(executors.executor_class(r.resources.executor), "gives_ray_cluster", False):
        return []  # the Ray executor's cluster, or one a batch job brings up over its nodes (RAY_ADDRESS set)
    need = f"{r.resources.nodes} x {r.resources.gpus_per_node} GPUs"
    address, where = ray_init_address(r, environ)
    if address:
        return [Result("placement.nodes", OK, f"resources.nodes = {r.resources.nodes}: main_ppo's ray.init() joins the "
                       f"Ray cluster at {address} (from {where}); verl's resource pool needs {need} there")]
    return [Result("placement.nodes", FAIL, f"resources.nodes = {r.resources.nodes}, but main_ppo's ray.init() would "
                   f"start a Ray of this machine only ({where}): verl's resource pool of {need} does not fit "
                   "(ResourcePoolManager._check_resource_available: \"Total available GPUs ... is less than total "
                   "desired GPUs\")",
                   "bring the cluster up first (`ray start --head` here, `ray start --address=HEAD:6379` on the other "
                   "nodes) and launch on the head, or export RAY_ADDRESS of a running cluster, or use executor = "
                   '"ray" with its address')]


def attention_package(backend: VerlBackend, recipe: Recipe, environ: Any) -> list[Any]:
    """env.flash_attn: the package the workers' attention needs (flash-attn for verl's default FlashAttention-2) is
    installed where they run: checked on this machine when they run here (the local executor, no Ray cluster to
    join), said to be the cluster's business otherwise. flash-attn is published as source only: a missing one is the
    first thing a GPU box without it meets, after Ray and vLLM have started."""
    from rlctl import executors
    from rlctl.backends._static import installed_version
    from rlctl.preflight import FAIL, OK, WARN, Result

    needs = {m: i for m, i in backend.attention(recipe).items() if i in ATTENTION_PACKAGE}
    if not needs:
        impls = sorted(set(backend.attention(recipe).values()))
        return [Result("env.flash_attn", OK, f"verl's workers load with {', '.join(impls)}: no flash-attn needed")]
    what = "; ".join(f"the {m} with {i}" + (" (verl's default)" if i == DEFAULT_ATTENTION else "")
                     for m, i in needs.items())
    missing = sorted({ATTENTION_PACKAGE[i] for i in needs.values() if installed_version(ATTENTION_PACKAGE[i]) is None})
    critic_only = set(needs) == {"critic"}
    # PyTorch's attention through verl's own key (what VerlBackend.attention reads): as `--set` would give it
    sets = None if critic_only else {f"backend.verl.extra.{SDPA_KEY}": "sdpa"}
    fix = ("PPO's critic always loads with flash_attention_2 in verl (utils/model.py load_valuehead_model): install "
           f"{', '.join(missing) or 'flash-attn'} where the workers run, or use a critic-free algorithm (grpo)"
           if critic_only else
           f"install {', '.join(missing) or 'flash-attn'} where the workers run, or load with PyTorch's attention: "
           f'backend.verl.extra "{SDPA_KEY}" = "sdpa"')
    remote = getattr(executors.executor_class(recipe.resources.executor), "remote", False)
    address, where = ray_init_address(recipe, environ)
    if remote or address:
        on = f"the {recipe.resources.executor} executor's machines" if remote else f"the Ray cluster at {address}"
        return [Result("env.flash_attn", WARN, f"verl loads {what}: {on} must have "
                       f"{', '.join(sorted(set(ATTENTION_PACKAGE[i] for i in needs.values())))} (not checked from "
                       "here)", fix, set=sets)]
    if missing:
        return [Result("env.flash_attn", FAIL, f"verl loads {what}, but {', '.join(missing)} is not installed in this "
                       "Python: every worker stops at its model's load (transformers: \"FlashAttention2 has been "
                       "toggled on, but ... doesn't seem to be installed\")", fix, set=sets)]
    return [Result("env.flash_attn", OK, f"verl loads {what}; "
                   + ", ".join(f"{p} {installed_version(p)}" for p in sorted({ATTENTION_PACKAGE[i]
                                                                            for i in needs.values()}))
                   + " installed")]


def trl_beside(recipe: Recipe, environ: Any) -> list[Any]:
    """env.verl_trl: a TRL installed beside verl that lacks AutoModelForCausalLMWithValueHead stops every FSDP worker
    at its model's build (TRL_WITHOUT_VALUE_HEAD); checked where the workers run here, as env.flash_attn is."""
    from rlctl import executors
    from rlctl.backends._static import installed_version
    from rlctl.backends.base import version_key
    from rlctl.preflight import FAIL, Result

    trl = installed_version("trl")
    remote = getattr(executors.executor_class(recipe.resources.executor), "remote", False)
    if trl is None or installed_version("verl") is None or remote or ray_init_address(recipe, environ)[0]:
        return []  # no TRL, or not verl's environment (env.backend says where verl must be)
    if version_key(trl) < version_key(TRL_WITHOUT_VALUE_HEAD):
        return []
    return [Result("env.verl_trl", FAIL, f"trl {trl} is installed beside verl: verl's workers import "
                   "trl.experimental.ppo.AutoModelForCausalLMWithValueHead whenever TRL is importable "
                   f"(models/transformers/monkey_patch.py) and TRL {TRL_WITHOUT_VALUE_HEAD} removed it: every worker "
                   "stops at its model's build", "pip install \"trl<1.13\" in verl's environment (verl itself needs "
                   "no TRL: uninstalling it works too)")]


def wandb_reaches_job(recipe: Recipe, environ: Any) -> list[Any]:
    """Can the W&B key reach verl's TaskRunner (the Ray actor that calls wandb.init)?"""
    from rlctl.preflight import FAIL, OK, WARN, Result

    wb = recipe.logging.wandb
    if wb is None or wb.offline:
        return []
    has_env = bool(environ.get("WANDB_API_KEY"))
    if recipe.resources.executor == "ray":
        remote = recipe.resources.ray_address or environ.get("RAY_ADDRESS")
        if remote:
            return [Result("env.wandb_job", WARN, f"WANDB_API_KEY is not sent to the Ray cluster at {remote} (a job's "
                           "runtime env is readable from its dashboard): verl's wandb.init finds it only if the "
                           "cluster's nodes have it", "set WANDB_API_KEY in the environment `ray start` runs with on "
                           "every node (or their ~/.netrc); see docs/ray.md")]
        if has_env:
            return [Result("env.wandb_job", OK, "WANDB_API_KEY reaches the job through the environment of the Ray "
                           "head rlctl starts (never in the job's runtime env or on a command line)")]
        return [Result("env.wandb_job", FAIL, "W&B is on and no WANDB_API_KEY is in the environment: the Ray job "
                       "does not read this machine's ~/.netrc, so verl's wandb.init fails",
                       "export WANDB_API_KEY before launching (the Ray head rlctl starts inherits it; never "
                       "written), or set logging.wandb.offline = true", set={"logging.wandb.offline": True})]
    ray_address = recipe.env.get("RAY_ADDRESS") or environ.get("RAY_ADDRESS")
    if ray_address:
        return [Result("env.wandb_job", WARN, f"RAY_ADDRESS={ray_address}: main_ppo joins that cluster and its "
                       "TaskRunner does not inherit this shell's WANDB_API_KEY (verl's runtime_env forwards only "
                       "its own variables, trainer/constants_ppo.py)",
                       "configure the key on the cluster's nodes (docs/ray.md), or use executor = \"ray\" with no "
                       "address (rlctl's own head inherits it)")]
    return []
