"""verl: `python3 -m verl.trainer.main_ppo` with Hydra overrides, checked against verl's generated ppo_trainer.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends._static import installed_version, package_file, yaml_key_paths
from rlctl.backends.base import Backend, Finding, LaunchPlan, check_keys, load_snapshot, nearest_snapshot
from rlctl.estimate.schedules import verl_schedule

if TYPE_CHECKING:
    from rlctl.backends.layout import Checkpoint
    from rlctl.recipe.schema import Recipe

ADV = {"grpo": "grpo", "dr_grpo": "grpo", "reinforce_baseline": "reinforce_plus_plus_baseline", "ppo": "gae"}
KL_TYPE = {"k1": "kl", "k2": "mse", "k3": "low_var_kl", "low_var_kl": "low_var_kl"}
CONFIG_FILE = "trainer/config/_generated_ppo_trainer.yaml"
A = "actor_rollout_ref"


def _val(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, list):
        return "[" + ",".join(_val(x) for x in v) + "]"
    if v is None:
        return "null"
    if isinstance(v, float):
        return repr(v) if abs(v) >= 1e-3 or v == 0 else f"{v:g}"
    if isinstance(v, dict):
        return json.dumps(v)
    return str(v)


class VerlBackend(Backend):
    name = "verl"
    sharding = "fsdp"  # memory engine: FSDP, fp32 sharded master parameters
    colocation = "sleep"  # hybrid engine: vLLM frees weights + KV cache while the actor trains
    packages = ("verl",)
    known_versions = ("0.9.1",)
    metric_needles = ("step:", '{"step"')  # as in verl/metrics.py NEEDLES

    def target_version(self, recipe: Recipe) -> str:
        return recipe.backend.version or installed_version("verl") or self.known_versions[-1]

    # ---- steps and schedule ----------------------------------------------------------------------------------
    def total_steps(self, recipe: Recipe, dataset_size: int | None) -> int | None:
        """ray_trainer.py: len(train_dataloader) * total_epochs (drop_last=True), unless total_training_steps."""
        if recipe.train.steps is not None:
            return recipe.train.steps
        if dataset_size is None:
            return None
        return dataset_size // recipe.rollout.prompts_per_step * (recipe.train.episodes or 1)

    def steps_formula(self, recipe: Recipe, dataset_size: int) -> str:
        return f"{dataset_size} prompts // {recipe.rollout.prompts_per_step} per step x {recipe.train.episodes}"

    def warmup_steps(self, recipe: Recipe, total: int) -> int:
        # transformer_impl.py: lr_warmup_steps if > 0 else int(lr_warmup_steps_ratio * total)
        if recipe.optim.warmup_steps:
            return recipe.optim.warmup_steps
        return int((recipe.optim.warmup_ratio or 0.0) * total)

    def _kind(self, recipe: Recipe) -> str:
        return "constant" if recipe.optim.schedule == "constant" else "cosine"

    def schedule(self, recipe: Recipe, dataset_size: int | None) -> list[float]:
        total = self.total_steps(recipe, dataset_size)
        if not total:
            return []
        kind = self._kind(recipe)
        ratio = recipe.optim.min_lr_ratio if kind == "cosine" else 0.0
        return verl_schedule(kind, recipe.optim.lr, self.warmup_steps(recipe, total), total, ratio)

    # ---- render ----------------------------------------------------------------------------------------------
    def overrides(self, recipe: Recipe, dataset_size: int | None) -> list[tuple[str, Any]]:
        r = recipe
        g = r.rollout.group_size
        o: list[tuple[str, Any]] = [
            ("algorithm.adv_estimator", ADV[r.algorithm.name]),
        ]
        if r.algorithm.name == "dr_grpo":
            o.append(("algorithm.norm_adv_by_std_in_grpo", False))
        o += [
            ("algorithm.use_kl_in_reward", False),
            ("data.train_files", r.data.train),
        ]
        if r.data.eval:
            o.append(("data.val_files", r.data.eval))
        o += [
            ("data.prompt_key", r.data.input_key),
            ("data.train_batch_size", r.rollout.prompts_per_step),
            ("data.max_prompt_length", r.data.max_prompt_tokens),
            ("data.max_response_length", r.rollout.max_tokens),
            ("data.filter_overlong_prompts", True),
            (f"{A}.model.path", r.model.path),
            (f"{A}.model.enable_gradient_checkpointing", r.train.gradient_checkpointing),
        ]
        if r.lora:
            tm = r.lora.target_modules
            o += [(f"{A}.model.lora_rank", r.lora.rank), (f"{A}.model.lora_alpha", r.lora.alpha),
                  (f"{A}.model.target_modules", tm)]
        o += [
            (f"{A}.actor.optim.lr", r.optim.lr),
            (f"{A}.actor.optim.lr_scheduler_type", self._kind(r)),
        ]
        if r.optim.warmup_steps:
            o.append((f"{A}.actor.optim.lr_warmup_steps", r.optim.warmup_steps))
        elif r.optim.warmup_ratio:
            o.append((f"{A}.actor.optim.lr_warmup_steps_ratio", r.optim.warmup_ratio))
        if self._kind(r) == "cosine":
            o.append((f"{A}.actor.optim.min_lr_ratio", r.optim.min_lr_ratio))
        o += [
            (f"{A}.actor.optim.weight_decay", r.optim.weight_decay),
            (f"{A}.actor.optim.clip_grad", r.optim.max_grad_norm),
            # verl counts the mini batch in prompts; rlctl's train_batch_size counts samples
            (f"{A}.actor.ppo_mini_batch_size", max(r.train.train_batch_size // g, 1)),
            (f"{A}.actor.ppo_micro_batch_size_per_gpu", r.train.micro_batch_size),
            (f"{A}.actor.ppo_epochs", r.train.epochs_per_rollout),
            (f"{A}.actor.use_kl_loss", r.algorithm.use_kl_loss and r.algorithm.kl_coef > 0),
            (f"{A}.actor.kl_loss_coef", r.algorithm.kl_coef),
            (f"{A}.actor.kl_loss_type", KL_TYPE[r.algorithm.kl_estimator]),
            (f"{A}.actor.entropy_coeff", r.algorithm.entropy_coef),
            (f"{A}.actor.clip_ratio", r.algorithm.eps_clip),
            (f"{A}.actor.fsdp_config.param_offload", r.train.offload),
            (f"{A}.actor.fsdp_config.optimizer_offload", r.train.offload),
        ]
        if r.algorithm.name == "dr_grpo":
            o.append((f"{A}.actor.loss_agg_mode", "seq-mean-token-sum-norm"))
        o += [
            (f"{A}.rollout.name", "vllm"),
            (f"{A}.rollout.n", g),
            (f"{A}.rollout.temperature", r.rollout.temperature),
            (f"{A}.rollout.gpu_memory_utilization", r.rollout.gpu_memory_utilization),
            (f"{A}.rollout.tensor_model_parallel_size", r.rollout.tensor_parallel),
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
        if r.reward.function:
            o += [("custom_reward_function.path", r.reward.function),
                  ("custom_reward_function.name", r.reward.function_name)]
        loggers = ["console"] + (["wandb"] if r.logging.wandb else [])
        loggers += ["tensorboard"] if r.logging.tensorboard else []
        o += [
            ("trainer.logger", loggers),
            ("trainer.project_name", r.logging.wandb.project if r.logging.wandb else r.name),
            ("trainer.experiment_name", (r.logging.wandb.name if r.logging.wandb else None) or r.name),
            ("trainer.nnodes", r.resources.nodes),
            ("trainer.n_gpus_per_node", r.resources.gpus_per_node),
            ("trainer.default_local_dir", r.checkpoint.dir),
            ("trainer.save_freq", r.checkpoint.every or -1),
            ("trainer.test_freq", r.eval.every or -1),
            ("trainer.val_before_train", bool(r.data.eval and r.eval.every)),
            ("trainer.total_epochs", r.train.episodes or 1),
        ]
        if r.train.steps is not None:
            o.append(("trainer.total_training_steps", r.train.steps))
        if r.checkpoint.keep_last:
            o.append(("trainer.max_actor_ckpt_to_keep", r.checkpoint.keep_last))
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
            o.append((k, v))
        return o

    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        overrides = self.overrides(recipe, dataset_size)
        argv = ["python3", "-m", "verl.trainer.main_ppo", *[f"{k}={_val(v)}" for k, v in overrides]]
        env = dict(recipe.env)
        if recipe.logging.wandb:
            env["WANDB_API_KEY"] = "${WANDB_API_KEY}"
            if recipe.logging.wandb.offline:
                env["WANDB_MODE"] = "offline"
        return LaunchPlan(
            backend=self.name, version=self.target_version(recipe), argv=argv, env=env,
            keys=[k.lstrip("+") for k, _ in overrides], total_steps=self.total_steps(recipe, dataset_size),
        )

    # ---- validation ------------------------------------------------------------------------------------------
    def definitions(self, installed: str | None, wanted: str) -> tuple[set[str], str, str]:
        if installed and installed == wanted:
            path = package_file("verl", CONFIG_FILE)
            if path is not None:
                return set(yaml_key_paths(path.read_text())), installed, f"installed {path}"
        snap_version = nearest_snapshot(self.name, wanted)
        snap = load_snapshot(self.name, snap_version) if snap_version else None
        if snap is None:
            return set(), wanted, "no snapshot"
        exact = "" if snap_version == wanted else f", nearest to {wanted}"
        return set(snap["keys"]), snap_version, f"snapshot of {snap['source']}{exact}"

    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        known, version, source = self.definitions(installed_version, plan.version or self.known_versions[-1])
        if not known:
            return [Finding("warn", "verl", f"no config definitions for verl {version}; keys not checked")]
        # Hydra rejects an override of a key that is not in the config unless it is prefixed with `+`
        return check_keys(self.name, plan.keys, known, version, source, kind="key")

    def parse(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        """A log line (or a W&B/TensorBoard row) in rlctl's unified names: see verl/metrics.py."""
        from rlctl.backends.verl.metrics import parse

        return parse(line)

    def checkpoint_bytes(self, arch: Any, recipe: Recipe) -> tuple[float, str]:
        r = recipe
        P = arch.params
        T = arch.lora_params(r.lora.rank, r.lora.target_modules) if r.lora else P
        return P * 4 + (T * 8 if r.checkpoint.save_optimizer else 0), "FSDP model + optimizer shards"

    def preflight(self, ctx: Any, family: str) -> list[Any]:
        from rlctl.preflight import FAIL, Result

        r = ctx.recipe
        tbs, g = r.train.train_batch_size, r.rollout.group_size
        if family == "placement" and tbs % g:
            return [Result("placement.batch", FAIL,
                           f"verl counts ppo_mini_batch_size in prompts: {tbs} samples is not whole groups of {g}",
                           "make train.train_batch_size a multiple of rollout.group_size")]
        return []

    def checkpoints(self, root: Path) -> list[Checkpoint]:
        from rlctl.backends.verl.checkpoints import find

        return find(root)
