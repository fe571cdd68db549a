#!/usr/bin/env python3
"""Write docs/recipe.md: every recipe key with its type, default, description and backend mapping."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pydantic_core import PydanticUndefined  # noqa: E402

from rlctl.recipe.schema import SECTIONS  # noqa: E402

# key -> (OpenRLHF 0.9.x flag / 0.11 flag, prime-rl v0.3 key, verl override, TRL GRPOConfig field)
MAP = {
    "model.path": ("--pretrain / --actor.model_name_or_path", "model.name", "actor_rollout_ref.model.path",
                   "model (runner)"),
    "model.precision": ("fp32 master weights (DeepSpeed); pure: not honoured", "fp32 master (FSDP); pure: not "
                        "honoured", "fp32 master (FSDP); pure: not honoured", "model_init_kwargs.dtype + bf16/fp16"),
    "model.dtype": ("--param_dtype / --ds.param_dtype", "inference.model.dtype", "-", "bf16 + model dtype"),
    "model.max_model_len": ("(prompt_max_len + generate_max_len) / --data.max_len", "inference.model.max_model_len",
                            "data.max_prompt_length + data.max_response_length", "-"),
    "lora.rank": ("--lora_rank / --ds.lora.rank", "trainer.model.lora.rank", "actor_rollout_ref.model.lora_rank",
                  "peft LoraConfig.r"),
    "lora.alpha": ("--lora_alpha", "trainer.model.lora.alpha", "actor_rollout_ref.model.lora_alpha", "lora_alpha"),
    "lora.target_modules": ("--target_modules", "trainer.model.lora.target_modules",
                            "actor_rollout_ref.model.target_modules", "target_modules"),
    "lora.dropout": ("--lora_dropout", "trainer.model.lora.dropout", "-", "lora_dropout"),
    "data.train": ("--prompt_data / --data.prompt_dataset", "(environment)", "data.train_files", "train_data"),
    "data.eval": ("--eval_dataset", "-", "data.val_files", "eval_data"),
    "data.input_key": ("--input_key", "-", "data.prompt_key", "renamed to prompt"),
    "data.label_key": ("--label_key", "-", "-", "column passed to the reward"),
    "data.max_prompt_tokens": ("--prompt_max_len", "-", "data.max_prompt_length", "-"),
    "data.apply_chat_template": ("--apply_chat_template", "-", "-", "-"),
    "rollout.group_size": ("--n_samples_per_prompt", "orchestrator.rollouts_per_example (v0.8: group_size)",
                           "actor_rollout_ref.rollout.n", "num_generations"),
    "rollout.prompts_per_step": ("--rollout_batch_size", "orchestrator.batch_size / group", "data.train_batch_size",
                                 "generation_batch_size / group"),
    "rollout.max_tokens": ("--generate_max_len / --rollout.max_new_tokens",
                           "orchestrator.sampling.max_tokens (v0.8: max_completion_tokens)",
                           "data.max_response_length", "max_completion_length"),
    "rollout.temperature": ("--temperature", "orchestrator.sampling.temperature",
                            "actor_rollout_ref.rollout.temperature", "temperature"),
    "rollout.top_p": ("--top_p", "-", "actor_rollout_ref.rollout.top_p", "top_p"),
    "rollout.engines": ("--vllm_num_engines", "(one server)", "-", "-"),
    "rollout.tensor_parallel": ("--vllm_tensor_parallel_size", "inference.parallel.tp",
                                "actor_rollout_ref.rollout.tensor_model_parallel_size", "-"),
    "rollout.gpu_memory_utilization": ("--vllm_gpu_memory_utilization", "inference.gpu_memory_utilization",
                                       "actor_rollout_ref.rollout.gpu_memory_utilization",
                                       "vllm_gpu_memory_utilization"),
    "rollout.enforce_eager": ("--enforce_eager", "inference.model.enforce_eager",
                              "actor_rollout_ref.rollout.enforce_eager", "-"),
    "rollout.max_num_batched_tokens": ("-", "-", "actor_rollout_ref.rollout.max_num_batched_tokens", "-"),
    "rollout.micro_batch_size": ("--micro_rollout_batch_size", "-", "...log_prob_micro_batch_size_per_gpu", "-"),
    "algorithm.name": ("--advantage_estimator (grpo=group_norm)", "-", "algorithm.adv_estimator", "loss_type"),
    "algorithm.kl_coef": ("--init_kl_coef", "trainer.loss.kl_tau", "actor_rollout_ref.actor.kl_loss_coef", "beta"),
    "algorithm.kl_estimator": ("--kl_estimator", "-", "actor_rollout_ref.actor.kl_loss_type", "-"),
    "algorithm.use_kl_loss": ("--use_kl_loss", "-", "actor_rollout_ref.actor.use_kl_loss", "-"),
    "algorithm.eps_clip": ("--eps_clip", "-", "actor_rollout_ref.actor.clip_ratio (+ _low, _high)", "epsilon"),
    "algorithm.entropy_coef": ("--entropy_loss_coef", "-", "actor_rollout_ref.actor.entropy_coeff", "-"),
    "optim.lr": ("--actor_learning_rate / --actor.adam.lr", "trainer.optim.lr", "actor_rollout_ref.actor.optim.lr",
                 "learning_rate"),
    "optim.schedule": ("--lr_scheduler", "trainer.scheduler.type", "...optim.lr_scheduler_type", "lr_scheduler_type"),
    "optim.warmup_ratio": ("--lr_warmup_ratio", "trainer.scheduler.warmup_steps", "...optim.lr_warmup_steps_ratio",
                           "warmup_steps (<1 = ratio)"),
    "optim.warmup_steps": ("(as a ratio)", "trainer.scheduler.warmup_steps", "...optim.lr_warmup_steps",
                           "warmup_steps"),
    "optim.min_lr_ratio": ("fixed 0.1 / --actor.min_lr_ratio", "trainer.scheduler.min_lr", "...optim.min_lr_ratio",
                           "lr_scheduler_kwargs.min_lr_rate"),
    "optim.max_grad_norm": ("--max_norm", "trainer.optim.max_norm", "...optim.clip_grad", "max_grad_norm"),
    "optim.weight_decay": ("--l2", "trainer.optim.weight_decay", "...optim.weight_decay", "weight_decay"),
    "train.episodes": ("--num_episodes", "max_steps (computed)", "trainer.total_epochs", "max_steps (computed)"),
    "train.steps": ("--num_episodes (computed)", "max_steps", "trainer.total_training_steps", "max_steps"),
    "train.epochs_per_rollout": ("--max_epochs", "-", "actor_rollout_ref.actor.ppo_epochs", "num_iterations"),
    "train.seq_len": ("-", "trainer.model.seq_len, orchestrator.seq_len", "-", "-"),
    "train.train_batch_size": ("--train_batch_size", "orchestrator.batch_size",
                               "actor_rollout_ref.actor.ppo_mini_batch_size (÷ group)",
                               "per_device × gradient_accumulation_steps"),
    "train.micro_batch_size": ("--micro_train_batch_size", "-", "...ppo_micro_batch_size_per_gpu",
                               "per_device_train_batch_size"),
    "train.gradient_checkpointing": ("--gradient_checkpointing", "trainer.model.ac.freq = 1",
                                     "actor_rollout_ref.model.enable_gradient_checkpointing",
                                     "gradient_checkpointing"),
    "train.zero_stage": ("--zero_stage", "(FSDP)", "(FSDP)", "-"),
    "train.offload": ("--adam_offload", "trainer.model.fsdp_cpu_offload", "...fsdp_config.*_offload", "-"),
    "train.seed": ("--seed", "-", "data.seed", "seed"),
    "resources.trainer_gpus": ("--actor_num_gpus_per_node (count)", "trainer_gpu_ids", "-", "-"),
    "resources.inference_gpus": ("-", "inference_gpu_ids", "-", "-"),
    "resources.colocate": ("--colocate_all_models", "same ids", "(hybrid engine)", "-"),
    "reward.function": ("--remote_rm_url FILE", "-", "custom_reward_function.path", "reward_file"),
    "reward.function_name": ("(reward_func)", "-", "custom_reward_function.name", "reward_name"),
    "reward.environment": ("-", "[[orchestrator.env]] id/args", "-", "-"),
    "checkpoint.dir": ("--ckpt_path", "(output_dir)", "trainer.default_local_dir", "output_dir"),
    "checkpoint.final_dir": ("--save_path", "-", "-", "output_dir/final"),
    "checkpoint.every": ("--save_steps", "ckpt.interval", "trainer.save_freq", "save_steps"),
    "checkpoint.keep_last": ("--max_ckpt_num", "ckpt.keep_last (+ rlctl pruning)", "trainer.max_actor_ckpt_to_keep",
                             "save_total_limit"),
    "checkpoint.resume": ("--load_checkpoint", "ckpt.resume_step", "trainer.resume_mode", "resume_from_checkpoint"),
    "checkpoint.save_optimizer": ("not --disable_ds_ckpt", "-", "-", "-"),
    "logging.tensorboard": ("--use_tensorboard", "-", "trainer.logger", "report_to"),
    "eval.every": ("--eval_steps", "-", "trainer.test_freq", "eval_steps"),
    "eval.temperature": ("--eval_temperature", "-", "...val_kwargs.temperature", "-"),
    "eval.n_samples": ("--eval_n_samples_per_prompt", "-", "...val_kwargs.n", "-"),
}


def type_name(field) -> str:
    t = str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
    t = t.replace("Annotated[", "")
    for marker in (", FieldInfo", ", Interval", ", BeforeValidator", ", AfterValidator", ", Ge(", ", Gt("):
        t = t.split(marker)[0]
    if t.startswith("Optional[") and not t.endswith("]"):
        t += "]"
    return t.replace("|", "\\|")


def main() -> None:
    lines = ["# Recipe reference", "",
             "Generated by `scripts/gen_recipe_docs.py` from the schema (`rlctl/recipe/schema.py`). Batch sizes in "
             "`train` count samples (completions); `rollout.prompts_per_step` counts prompts. Unknown keys are errors "
             "with a did-you-mean. `extends = \"base.toml\"` inherits another recipe; `--set a.b=c` overrides any key "
             "(values are TOML values; `--grid` values too). TOML has no null: `--set a.b=null` unsets a key whose "
             "default is none (`optim.warmup_steps` a file set, an optional table such as `lora`, an `[env]` or "
             "`extra` entry); a key with a default cannot be unset (exit 2, naming the default to give instead); "
             "`--set 'a.b=\"null\"'` is the string. Under `backend.<name>.extra` everything after `extra.` is one key "
             "of the backend's own, dots and `+` included: `--set backend.verl.extra.a.b.c=x` is the TOML "
             "`[backend.verl.extra] \"a.b.c\" = \"x\"`.",
             "", "Paths (`data.train`, `data.eval`, `eval.sets.<name>.data`, `reward.function`, a local `model.path`, "
             "`patches.dir`, `backend.prime_rl.checkout`) are resolved once, when the recipe is loaded "
             "(`rlctl/recipe/paths.py`): a path written in a recipe file is relative to that file's directory (an "
             "extended file's to its own), one given with `--set` to the directory the command is typed in. "
             "`recipe show` and `render` print them absolute; a value left relative is an id (a Hub model, a dataset "
             "name): write `./` before a relative local model directory. Where a run writes (`checkpoint.dir`, "
             "`checkpoint.final_dir`, `logging.tensorboard`) is relative to the run directory.",
             "", "The backend columns are an overview; every release's exact mapping, and what a release cannot "
             "honour, is in docs/backends/<name>.md (rlctl render and preflight report unhonoured keys).",
             "", "Backend columns: OpenRLHF (0.9.x flag / >= 0.10.2 dotted flag), prime-rl (v0.3 key), verl (Hydra "
             "override), TRL (GRPOConfig field).", ""]
    for prefix, model in SECTIONS.items():
        if prefix == "doctor":
            continue
        title = f"[{prefix}]" if prefix else "top level"
        lines += [f"## {title}", "", "| key | type | default | description | OpenRLHF | prime-rl | verl | TRL |",
                  "|---|---|---|---|---|---|---|---|"]
        fields = [(f"{prefix}.{name}" if prefix else name, f) for name, f in model.model_fields.items()]
        if prefix == "executor":  # no keys of its own: each executor's table (`[executor.slurm]`) declares them
            from rlctl import executors
            from rlctl.recipe.schema import executor_table_model

            lines[-2:-2] = ["Each executor's own table; `rlctl render` shows what it makes of it.", ""]
            for ex in sorted(executors.available()):
                table = executor_table_model(ex)
                fields += [(f"executor.{ex}.{name}", f) for name, f in (table.model_fields if table else {}).items()]
        if prefix == "backend":  # the backends' own tables are theirs (docs/backends/<name>.md)
            lines[-2:-2] = ["Each backend's own table is in its page: `[backend.command]` (your trainer's command, its "
                            "log pattern, checkpoint layout and resume arguments) in docs/backends/command.md, "
                            "`[backend.<name>.extra]` (a backend's own keys, passed as they are) in "
                            "docs/backends/<name>.md.", ""]
        for key, f in fields:
            if key in SECTIONS and key not in ("env",):
                continue
            default = "required" if f.default is PydanticUndefined and f.default_factory is None else (
                "{}" if f.default_factory is not None else repr(f.default))
            m = MAP.get(key, ("", "", "", ""))
            desc = (f.description or "").replace("|", "\\|")
            lines.append(f"| `{key}` | {type_name(f)} | {default} | {desc} | {m[0]} | {m[1]} | {m[2]} | {m[3]} |")
        lines.append("")
    (ROOT / "docs" / "recipe.md").write_text("\n".join(lines))
    print("wrote docs/recipe.md")


if __name__ == "__main__":
    main()
