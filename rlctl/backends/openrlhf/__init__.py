"""OpenRLHF: `openrlhf.cli.train_ppo_ray`, submitted as a Ray job.

Two flag dialects exist: flat flags up to 0.10.1 (`--n_samples_per_prompt`, the seeds' 0.9.3) and dotted flags
from 0.10.2 on (`--rollout.n_samples_per_prompt`, `--actor.adam.lr`). The mapping below names both; which one is
rendered follows the recipe's pinned version (else the installed one, else the newest known).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends._static import argparse_flags, installed_version, package_file
from rlctl.backends.base import Backend, Finding, LaunchPlan, check_keys, load_snapshot, nearest_snapshot, version_key
from rlctl.estimate.schedules import hf_schedule

if TYPE_CHECKING:
    from rlctl.backends.layout import Checkpoint
    from rlctl.recipe.schema import Recipe

DOTTED_SINCE = "0.10.2"
CLI_MODULE = "openrlhf.cli.train_ppo_ray"
CLI_FILE = "cli/train_ppo_ray.py"
DEFAULT_RAY_ADDRESS = "http://127.0.0.1:8265"

ADVANTAGE = {"grpo": "group_norm", "dr_grpo": "dr_grpo", "reinforce_baseline": "reinforce_baseline", "ppo": "gae"}
PARAM_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}

# concept -> (flat flag, dotted flag)
FLAGS: dict[str, tuple[str, str]] = {
    "ref_num_nodes": ("--ref_num_nodes", "--ref.num_nodes"),
    "ref_num_gpus_per_node": ("--ref_num_gpus_per_node", "--ref.num_gpus_per_node"),
    "actor_num_nodes": ("--actor_num_nodes", "--actor.num_nodes"),
    "actor_num_gpus_per_node": ("--actor_num_gpus_per_node", "--actor.num_gpus_per_node"),
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
    "micro_train_batch_size": ("--micro_train_batch_size", "--train.micro_batch_size"),
    "train_batch_size": ("--train_batch_size", "--train.batch_size"),
    "micro_rollout_batch_size": ("--micro_rollout_batch_size", "--rollout.micro_batch_size"),
    "rollout_batch_size": ("--rollout_batch_size", "--rollout.batch_size"),
    "n_samples_per_prompt": ("--n_samples_per_prompt", "--rollout.n_samples_per_prompt"),
    "num_episodes": ("--num_episodes", "--train.num_episodes"),
    "max_epochs": ("--max_epochs", "--train.max_epochs"),
    "prompt_max_len": ("--prompt_max_len", ""),
    "generate_max_len": ("--generate_max_len", "--rollout.max_new_tokens"),
    "max_len": ("", "--data.max_len"),
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
    "use_wandb": ("--use_wandb", ""),
    "wandb_project": ("--wandb_project", "--logger.wandb.project"),
    "wandb_org": ("--wandb_org", "--logger.wandb.org"),
    "wandb_run_name": ("--wandb_run_name", "--logger.wandb.run_name"),
    "use_tensorboard": ("--use_tensorboard", "--logger.tensorboard_dir"),
}


def dialect(version: str | None) -> str:
    if version is None:
        return "dotted"
    return "dotted" if version_key(version) >= version_key(DOTTED_SINCE) else "flat"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return repr(v) if abs(v) >= 1e-3 or v == 0 else f"{v:g}"
    return str(v)


class OpenRLHFBackend(Backend):
    name = "openrlhf"
    sharding = "deepspeed"  # memory engine: ZeRO stage from train.zero_stage
    sleep_switch = "vllm_enable_sleep"  # colocated vLLM frees its memory while training
    packages = ("openrlhf",)
    known_versions = ("0.9.3", "0.11.2")
    metric_needles = ("lobal step", "global_step", "act_lr=", "pg=", "critic_loss=", "policy_loss=", "Eval at step")

    # ---- version -------------------------------------------------------------------------------------------
    def target_version(self, recipe: Recipe) -> str:
        return recipe.backend.version or installed_version("openrlhf") or self.known_versions[-1]

    # ---- steps and schedule ----------------------------------------------------------------------------------
    def total_steps(self, recipe: Recipe, dataset_size: int | None) -> int | None:
        """trainer/ppo_trainer.py prepare_datasets(): len(prompts) * n // train_batch_size * episodes * max_epochs."""
        if recipe.train.steps is not None and dataset_size is None:
            return recipe.train.steps
        if dataset_size is None:
            return None
        steps = (
            dataset_size * recipe.rollout.group_size // recipe.train.train_batch_size
            * (recipe.train.episodes or 1) * recipe.train.epochs_per_rollout
        )
        return steps

    def warmup_steps(self, recipe: Recipe, total: int) -> int:
        # ppo_actor.py: math.ceil(max_steps * args.lr_warmup_ratio); there is no warmup-steps flag
        return math.ceil(total * self._warmup_ratio(recipe, total))

    def _warmup_ratio(self, recipe: Recipe, total: int | None) -> float:
        if recipe.optim.warmup_ratio is not None:
            return recipe.optim.warmup_ratio
        if recipe.optim.warmup_steps is not None and total:
            return recipe.optim.warmup_steps / total
        return 0.03  # OpenRLHF's default

    def schedule(self, recipe: Recipe, dataset_size: int | None) -> list[float]:
        total = self.total_steps(recipe, dataset_size)
        if not total:
            return []
        name = "cosine_with_min_lr" if recipe.optim.schedule == "cosine_with_min_lr" else recipe.optim.schedule
        if name == "constant" and self.warmup_steps(recipe, total) > 0:
            name = "constant_with_warmup"
        # 0.9.x passes min_lr = lr * 0.1 (fixed); >= 0.10.2 passes min_lr_rate = --actor.min_lr_ratio
        ratio = recipe.optim.min_lr_ratio if dialect(self.target_version(recipe)) == "dotted" else 0.1
        return hf_schedule(name, recipe.optim.lr, self.warmup_steps(recipe, total), total, ratio)

    # ---- render ----------------------------------------------------------------------------------------------
    def concepts(self, recipe: Recipe, dataset_size: int | None) -> list[tuple[str, Any]]:
        r = recipe
        style = dialect(self.target_version(r))
        res = r.resources
        trainer_per_node = (
            len(res.trainer_gpus) if res.trainer_gpus is not None
            else (res.gpus_per_node if res.colocate else max(res.gpus_per_node - r.inference_gpu_count // res.nodes, 1))
        )
        c: list[tuple[str, Any]] = [
            ("ref_num_nodes", res.nodes),
            ("ref_num_gpus_per_node", trainer_per_node),
            ("actor_num_nodes", res.nodes),
            ("actor_num_gpus_per_node", trainer_per_node),
            ("colocate_actor_ref", True),
        ]
        if res.colocate:
            c.append(("colocate_all", True))
        c += [
            ("vllm_num_engines", r.rollout.engines),
            ("vllm_tp", r.rollout.tensor_parallel),
            ("vllm_mem", r.rollout.gpu_memory_utilization),
        ]
        if r.rollout.enforce_eager:
            c.append(("enforce_eager", True))
        c.append(("pretrain", r.model.path))
        if r.reward.function:
            c.append(("remote_rm_url", r.reward.function))
        ck = r.checkpoint
        c += [
            ("save_path", ck.final_dir or f"{ck.dir}/final"),
            ("ckpt_path", ck.dir),
            ("save_hf_ckpt", True),
        ]
        if ck.keep_last:
            c.append(("max_ckpt_num", ck.keep_last))
        if not ck.save_optimizer:
            c.append(("disable_ds_ckpt", True))
        if ck.every:
            c.append(("save_steps", ck.every))
        if ck.resume != "off":
            c.append(("load_checkpoint", True))
        c += [
            ("micro_train_batch_size", r.train.micro_batch_size),
            ("train_batch_size", r.train.train_batch_size),
            ("micro_rollout_batch_size", r.rollout.micro_batch_size or r.train.micro_batch_size),
            ("rollout_batch_size", r.rollout.prompts_per_step),
            ("n_samples_per_prompt", r.rollout.group_size),
            ("num_episodes", self._episodes(r, dataset_size)),
            ("max_epochs", r.train.epochs_per_rollout),
        ]
        if style == "flat":
            c += [("prompt_max_len", r.data.max_prompt_tokens), ("generate_max_len", r.rollout.max_tokens)]
        else:
            c += [("max_len", r.data.max_prompt_tokens + r.rollout.max_tokens),
                  ("generate_max_len", r.rollout.max_tokens)]
        c.append(("zero_stage", r.train.zero_stage))
        if r.train.gradient_checkpointing:
            c.append(("gradient_checkpointing", True))
        if r.model.dtype in PARAM_DTYPE:
            c.append(("param_dtype", PARAM_DTYPE[r.model.dtype]))
        if r.train.offload:
            c.append(("adam_offload", True))
        c += [
            ("actor_learning_rate", r.optim.lr),
            ("lr_warmup_ratio", round(self._warmup_ratio(r, self.total_steps(r, dataset_size)), 6)),
            ("lr_scheduler", r.optim.schedule if r.optim.schedule != "constant" else "constant_with_warmup"),
        ]
        if style == "dotted":
            c.append(("min_lr_ratio", r.optim.min_lr_ratio))
        c += [("max_norm", r.optim.max_grad_norm)]
        if r.optim.weight_decay:
            c.append(("l2", r.optim.weight_decay))
        kl = r.algorithm.kl_estimator if r.algorithm.kl_estimator != "low_var_kl" else "k3"
        c += [("init_kl_coef", r.algorithm.kl_coef), ("kl_estimator", kl)]
        if r.algorithm.use_kl_loss and r.algorithm.kl_coef > 0:
            c.append(("use_kl_loss", True))
        c += [
            ("eps_clip", r.algorithm.eps_clip),
            ("entropy_loss_coef", r.algorithm.entropy_coef),
            ("advantage_estimator", ADVANTAGE[r.algorithm.name]),
        ]
        if r.lora:
            targets = r.lora.target_modules
            c += [
                ("lora_rank", r.lora.rank),
                ("lora_alpha", r.lora.alpha),
                ("target_modules", targets if isinstance(targets, list) else [targets]),
            ]
            if r.lora.dropout:
                c.append(("lora_dropout", r.lora.dropout))
        c += [("prompt_data", r.data.train), ("input_key", r.data.input_key)]
        if r.data.label_key:
            c.append(("label_key", r.data.label_key))
        if r.data.apply_chat_template:
            c.append(("apply_chat_template", True))
        if r.data.eval:
            c.append(("eval_dataset", r.data.eval))
            if r.eval.every:
                c.append(("eval_steps", r.eval.every))
            c += [("eval_temperature", r.eval.temperature), ("eval_n_samples_per_prompt", r.eval.n_samples)]
        c += [("temperature", r.rollout.temperature)]
        if r.rollout.top_p != 1.0:
            c.append(("top_p", r.rollout.top_p))
        c.append(("seed", r.train.seed))
        wb = r.logging.wandb
        if wb:
            if style == "flat":
                c.append(("use_wandb", "True"))  # the key itself comes from WANDB_API_KEY in the environment
            c.append(("wandb_project", wb.project))
            if wb.entity:
                c.append(("wandb_org", wb.entity))
            c.append(("wandb_run_name", wb.name or r.name))
        if r.logging.tensorboard:
            c.append(("use_tensorboard", r.logging.tensorboard))
        return c

    def _episodes(self, r: Recipe, dataset_size: int | None) -> int:
        if r.train.steps is None or dataset_size is None:
            return r.train.episodes or 1
        per_episode = dataset_size * r.rollout.group_size // r.train.train_batch_size * r.train.epochs_per_rollout
        return max(1, math.ceil(r.train.steps / max(per_episode, 1)))

    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        version = self.target_version(recipe)
        style = dialect(version)
        args: list[str] = []
        keys: list[str] = []
        for concept, value in self.concepts(recipe, dataset_size):
            flag = FLAGS[concept][0 if style == "flat" else 1]
            if not flag:
                continue
            keys.append(flag)
            if value is True:
                args.append(flag)
            elif isinstance(value, list):
                args.append(flag)
                args.extend(_fmt(v) for v in value)
            else:
                args += [flag, _fmt(value)]
        for k, v in recipe.backend.extra().items():
            flag = k if k.startswith("--") else f"--{k}"
            keys.append(flag)
            if v is True:
                args.append(flag)
            elif v is False or v is None:
                continue
            elif isinstance(v, list):
                args.append(flag)
                args.extend(_fmt(x) for x in v)
            else:
                args += [flag, _fmt(v)]
        address = recipe.resources.ray_address or DEFAULT_RAY_ADDRESS
        runtime_env = {"working_dir": ".", "env_vars": {k: v for k, v in recipe.env.items()}}
        argv = [
            "ray", "job", "submit", f"--address={address}",
            f"--runtime-env-json={json.dumps(runtime_env, sort_keys=True)}",
            "--", "python3", "-m", CLI_MODULE, *args,
        ]
        env = dict(recipe.env)
        if recipe.logging.wandb:
            env["WANDB_API_KEY"] = "${WANDB_API_KEY}"
            if recipe.logging.wandb.offline:
                env["WANDB_MODE"] = "offline"
        plan = LaunchPlan(
            backend=self.name, version=version, argv=argv, env=env, keys=keys,
            total_steps=self.total_steps(recipe, dataset_size),
        )
        if style == "dotted" and recipe.data.max_prompt_tokens:
            plan.notes.append(
                f"OpenRLHF >= {DOTTED_SINCE} has no prompt limit flag: --data.max_len = prompt + response tokens"
            )
        return plan

    @staticmethod
    def entrypoint(plan: LaunchPlan) -> list[str]:
        """The command after `ray job submit ... --`."""
        return plan.argv[plan.argv.index("--") + 1:] if "--" in plan.argv else plan.argv

    # ---- validation ------------------------------------------------------------------------------------------
    def definitions(self, installed: str | None, wanted: str) -> tuple[set[str], str, str]:
        """(known flags, version, where they came from): the installed source when it is the wanted version."""
        if installed and installed == wanted:
            path = package_file("openrlhf", CLI_FILE)
            if path is not None:
                return set(argparse_flags(path.read_text())), installed, f"installed {path}"
        snap_version = nearest_snapshot(self.name, wanted)
        snap = load_snapshot(self.name, snap_version) if snap_version else None
        if snap is None:
            return set(), wanted, "no snapshot"
        exact = "" if snap_version == wanted else f", nearest to {wanted}"
        return set(snap["flags"]), snap_version, f"snapshot of {snap['source']}{exact}"

    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        known, version, source = self.definitions(installed_version, plan.version or self.known_versions[-1])
        if not known:
            return [Finding("warn", "openrlhf", f"no flag definitions for openrlhf {version}; flags not checked")]
        findings = check_keys(self.name, plan.keys, known, version, source)
        if installed_version and plan.version and installed_version != plan.version:
            findings.append(Finding(
                "warn", "openrlhf",
                f"recipe is for openrlhf {plan.version} but {installed_version} is installed",
                f"pip install openrlhf=={plan.version}, or set backend.version = \"{installed_version}\"",
            ))
        return findings

    # ---- metrics and checkpoints -----------------------------------------------------------------------------
    def parse(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        """A log line (or a W&B/TensorBoard row) in rlctl's unified names: see openrlhf/metrics.py."""
        from rlctl.backends.openrlhf.metrics import parse

        return parse(line)

    def checkpoint_bytes(self, arch: Any, recipe: Recipe) -> tuple[float, str]:
        r = recipe
        P = arch.params
        T = arch.lora_params(r.lora.rank, r.lora.target_modules) if r.lora else P
        keep_opt = r.checkpoint.save_optimizer
        hf = T * 2 if r.lora else P * 2
        ds = (P * 2 + T * 12) if keep_opt else 0
        return hf + ds, ("HF " + ("adapter" if r.lora else "weights")) + (" + DeepSpeed states" if keep_opt else "")

    def preflight(self, ctx: Any, family: str) -> list[Any]:
        from rlctl.preflight import WARN, Result

        r = ctx.recipe
        out = []
        if family != "disk":
            return out
        if r.checkpoint.save_optimizer:
            out.append(Result("disk.deepspeed", WARN,
                              "DeepSpeed checkpoints are on (OpenRLHF's default): optimizer + model states every save",
                              "set checkpoint.save_optimizer = false (--disable_ds_ckpt) if HF checkpoints suffice"))
        if r.lora and r.train.zero_stage == 3 and (r.patches.set or "") != f"openrlhf/{r.backend.version}":
            out.append(Result("disk.lora_zero3", WARN,
                              "OpenRLHF LoRA + ZeRO-3 saves full-model shards next to the adapter (~200 GB for 20B)",
                              "apply the openrlhf save_model patch set (patches.set) or use ZeRO-2"))
        return out

    def checkpoints(self, root: Path) -> list[Checkpoint]:
        from rlctl.backends.openrlhf.checkpoints import find

        return find(root)
