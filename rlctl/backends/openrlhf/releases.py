"""What differs between OpenRLHF releases, read from the per-release snapshots (scripts/snapshot_openrlhf.py).

Each release rlctl knows has a snapshot `rlctl/backends/snapshots/openrlhf-<version>.json`: its `train_ppo_ray` flags
and the behaviours the adapter depends on ("facts"), established from the released wheel by source patterns. The
adapter never guesses a release from a neighbour: an unknown one is an error (Backend.require_known).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from rlctl.backends.base import load_snapshot

# Every release rlctl renders and checks exactly (the conformance suite runs each one's own parser and checks).
KNOWN_VERSIONS = (
    "0.9.3", "0.9.4", "0.9.5", "0.9.6", "0.9.7", "0.9.8", "0.9.9", "0.9.10",
    "0.10.0", "0.10.1", "0.10.1.post1", "0.10.1.post2", "0.10.2", "0.10.3", "0.10.4",
    "0.11.0", "0.11.1", "0.11.2",
)

# concept -> (flat flag, dotted flag); a release has one of them, or neither (then the concept is unhonoured there)
FLAGS: dict[str, tuple[str, str]] = {
    "ref_num_nodes": ("--ref_num_nodes", "--ref.num_nodes"),
    "ref_num_gpus_per_node": ("--ref_num_gpus_per_node", "--ref.num_gpus_per_node"),
    "actor_num_nodes": ("--actor_num_nodes", "--actor.num_nodes"),
    "actor_num_gpus_per_node": ("--actor_num_gpus_per_node", "--actor.num_gpus_per_node"),
    "critic_num_nodes": ("--critic_num_nodes", "--critic.num_nodes"),
    "critic_num_gpus_per_node": ("--critic_num_gpus_per_node", "--critic.num_gpus_per_node"),
    "colocate_actor_ref": ("--colocate_actor_ref", "--train.colocate_actor_ref"),
    "colocate_all": ("--colocate_all_models", "--train.colocate_all"),
    "vllm_num_engines": ("--vllm_num_engines", "--vllm.num_engines"),
    "vllm_tp": ("--vllm_tensor_parallel_size", "--vllm.tensor_parallel_size"),
    "vllm_mem": ("--vllm_gpu_memory_utilization", "--vllm.gpu_memory_utilization"),
    "enforce_eager": ("--enforce_eager", "--vllm.enforce_eager"),
    "pretrain": ("--pretrain", "--actor.model_name_or_path"),
    "remote_rm_url": ("--remote_rm_url", "--reward.remote_url"),
    "save_path": ("--save_path", "--ckpt.output_dir"),
    "ckpt_path": ("--ckpt_path", "--ckpt.path"),
    "save_hf_ckpt": ("--save_hf_ckpt", "--ckpt.save_hf"),
    "max_ckpt_num": ("--max_ckpt_num", "--ckpt.max_num"),
    "disable_ds_ckpt": ("--disable_ds_ckpt", "--ckpt.disable_ds"),
    "save_steps": ("--save_steps", "--ckpt.save_steps"),
    "load_checkpoint": ("--load_checkpoint", "--ckpt.load_enable"),
    "best_metric_key": ("--best_metric_key", "--ckpt.best_metric_key"),
    "micro_train_batch_size": ("--micro_train_batch_size", "--train.micro_batch_size"),
    "train_batch_size": ("--train_batch_size", "--train.batch_size"),
    "micro_rollout_batch_size": ("--micro_rollout_batch_size", "--rollout.micro_batch_size"),
    "rollout_batch_size": ("--rollout_batch_size", "--rollout.batch_size"),
    "n_samples_per_prompt": ("--n_samples_per_prompt", "--rollout.n_samples_per_prompt"),
    "num_episodes": ("--num_episodes", "--train.num_episodes"),
    "max_epochs": ("--max_epochs", "--train.max_epochs"),
    "max_samples": ("--max_samples", "--data.max_samples"),
    "prompt_max_len": ("--prompt_max_len", ""),
    "generate_max_len": ("--generate_max_len", ""),
    "max_new_tokens": ("--max_new_tokens", "--rollout.max_new_tokens"),
    "max_len": ("--max_len", "--data.max_len"),
    "zero_stage": ("--zero_stage", "--ds.zero_stage"),
    "gradient_checkpointing": ("--gradient_checkpointing", "--actor.gradient_checkpointing_enable"),
    "param_dtype": ("--param_dtype", "--ds.param_dtype"),
    "adam_offload": ("--adam_offload", "--ds.adam_offload"),
    "actor_learning_rate": ("--actor_learning_rate", "--actor.adam.lr"),
    "lr_warmup_ratio": ("--lr_warmup_ratio", "--actor.lr_warmup_ratio"),
    "lr_scheduler": ("--lr_scheduler", "--actor.lr_scheduler"),
    "min_lr_ratio": ("", "--actor.min_lr_ratio"),
    "max_norm": ("--max_norm", "--actor.max_norm"),
    "l2": ("--l2", "--actor.adam.weight_decay"),
    "init_kl_coef": ("--init_kl_coef", "--algo.kl.init_coef"),
    "kl_estimator": ("--kl_estimator", "--algo.kl.estimator"),
    "use_kl_loss": ("--use_kl_loss", "--algo.kl.use_loss"),
    "eps_clip": ("--eps_clip", "--actor.eps_clip"),
    "entropy_loss_coef": ("--entropy_loss_coef", "--actor.entropy_coef"),
    "advantage_estimator": ("--advantage_estimator", "--algo.advantage.estimator"),
    "lora_rank": ("--lora_rank", "--ds.lora.rank"),
    "lora_alpha": ("--lora_alpha", "--ds.lora.alpha"),
    "target_modules": ("--target_modules", "--ds.lora.target_modules"),
    "lora_dropout": ("--lora_dropout", "--ds.lora.dropout"),
    "prompt_data": ("--prompt_data", "--data.prompt_dataset"),
    "input_key": ("--input_key", "--data.input_key"),
    "label_key": ("--label_key", "--data.label_key"),
    "apply_chat_template": ("--apply_chat_template", "--data.apply_chat_template"),
    "eval_dataset": ("--eval_dataset", "--eval.dataset"),
    "eval_steps": ("--eval_steps", "--eval.steps"),
    "eval_temperature": ("--eval_temperature", "--eval.temperature"),
    "eval_n_samples_per_prompt": ("--eval_n_samples_per_prompt", "--eval.n_samples_per_prompt"),
    "temperature": ("--temperature", "--rollout.temperature"),
    "top_p": ("--top_p", "--rollout.top_p"),
    "seed": ("--seed", "--train.seed"),
    "wandb_key": ("--use_wandb", "--logger.wandb.key"),
    "wandb_project": ("--wandb_project", "--logger.wandb.project"),
    "wandb_org": ("--wandb_org", "--logger.wandb.org"),
    "wandb_run_name": ("--wandb_run_name", "--logger.wandb.run_name"),
    "tensorboard": ("--use_tensorboard", "--logger.tensorboard_dir"),
}

# transformers' schedulers that take no floor argument: 0.9.3-0.10.3 pass one to every scheduler (TypeError at start)
NO_FLOOR_SCHEDULERS = {"linear", "cosine"}


@dataclass(frozen=True)
class Release:
    version: str
    flags: dict[str, dict[str, Any]]
    facts: dict[str, Any]
    source: str

    @property
    def dotted(self) -> bool:
        return "--rollout.n_samples_per_prompt" in self.flags

    def flag(self, concept: str) -> str | None:
        """This release's flag for a concept, or None when it has none."""
        flat, dotted = FLAGS[concept]
        name = dotted if self.dotted else flat
        return name if name and name in self.flags else None

    def default(self, concept: str) -> Any:
        flag = self.flag(concept)
        return self.flags[flag].get("default") if flag else None

    @property
    def floor_kwargs(self) -> str:
        """How the actor's scheduler gets its floor: `always_min_lr` (0.1 x lr, every scheduler),
        `always_min_lr_rate` (--actor.min_lr_ratio, every scheduler), `cosine_min_lr_rate` (only cosine_with_min_lr)."""
        k = self.facts["scheduler_kwargs"]
        if k.startswith("min_lr=0.1*lr"):
            return "always_min_lr"
        return "cosine_min_lr_rate" if "cosine_with_min_lr only" in k else "always_min_lr_rate"

    @property
    def best_checkpoints(self) -> bool:
        return bool(self.facts.get("best_checkpoints"))

    @property
    def lora_vllm_sync(self) -> bool:
        """Whether ActorPPOTrainer.broadcast_to_vllm can sync a LoRA (PEFT) actor to the vLLM engines: no release
        can (it sends the PeftModel's own parameter names, which vLLM's model does not have)."""
        return bool(self.facts["lora_vllm_sync"])


@cache
def release(version: str) -> Release:
    snap = load_snapshot("openrlhf", version)
    if snap is None or "facts" not in snap:
        raise FileNotFoundError(f"no snapshot for openrlhf {version}: run scripts/snapshot_openrlhf.py {version}")
    return Release(version, snap["flags"], snap["facts"], snap["source"])
