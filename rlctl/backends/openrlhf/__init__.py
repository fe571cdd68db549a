"""OpenRLHF: `openrlhf.cli.train_ppo_ray`, submitted as a Ray job.

Every release from 0.9.3 to 0.11.2 renders its own dialect, read from its snapshot (releases.py): flat flags up to
0.10.1.post2 (`--n_samples_per_prompt`; lengths `--prompt_max_len/--generate_max_len` up to 0.9.7, `--max_len/
--max_new_tokens` from 0.9.8), dotted flags from 0.10.2 (`--rollout.n_samples_per_prompt`, `--actor.adam.lr`).
An unknown release is an error, never a neighbour's dialect. docs/backends/openrlhf.md lists every concept per
release and what cannot be mapped; `unhonoured()` says it for a given recipe.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends._static import argparse_flags, package_file
from rlctl.backends.base import (
    NCCL_VLLM_STALL_SIGNS,
    Backend,
    EffectiveRecipe,
    Finding,
    Inert,
    LaunchPlan,
    check_keys,
)
from rlctl.backends.openrlhf.releases import FLAGS, KNOWN_VERSIONS, Release, release
from rlctl.backends.openrlhf.steps import DEFAULT_WARMUP_RATIO, Steps, plan_steps, warmup_ratio_for
from rlctl.core.components import Component
from rlctl.estimate.schedules import hf_schedule

if TYPE_CHECKING:
    from rlctl.backends.layout import Checkpoint
    from rlctl.recipe.schema import Recipe

CLI_MODULE = "openrlhf.cli.train_ppo_ray"
CLI_FILE = "cli/train_ppo_ray.py"
DEFAULT_RAY_ADDRESS = "http://127.0.0.1:8265"
REWARD_FUNC = "reward_func"  # utils/agent.py loads `reward_module.reward_func` from a --remote_rm_url ending in .py
# --use_wandb / --logger.wandb.key: truthy turns W&B on; it is the key only when the job has none (wandb.api.api_key
# empty). The flag's value is printed in the job log and sent as W&B config, so it is never the key: the key reaches
# the job as WANDB_API_KEY in the Ray runtime env, and this placeholder names where it must come from.
WANDB_FLAG_VALUE = "env:WANDB_API_KEY"

ADVANTAGE = {"grpo": "group_norm", "dr_grpo": "dr_grpo", "reinforce_baseline": "reinforce_baseline", "ppo": "gae"}
GROUP_ESTIMATORS = {"group_norm", "reinforce_baseline", "dr_grpo", "rloo"}
PARAM_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}
RUNTIME_ENV_VAR = "RLCTL_RUNTIME_ENV_JSON"


def _fmt(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)  # repr: the shortest text that parses back to the same float


# --max_ckpt_num when rlctl rotates instead (never reached: OpenRLHF has no value that turns its rotation off)
NO_ROTATION = 2**31 - 1
# seed 001 §4 measured ~203 GB of full-model shards next to gpt-oss-20b's 91 MB adapter (LoRA + ZeRO-3, no save
# fix): per parameter of the model (20.9e9 in rlctl's table), the figure disk.checkpoints scales to other models
LORA_ZERO3_LEAK_PER_PARAM = 203e9 / 20_908_050_240


@dataclass
class RayJobPlan(LaunchPlan):
    """A `ray job submit` plan. Its launch.sh builds `--runtime-env-json` when it runs, from the shell's environment
    (a submitted job does not inherit that shell's environment). Secrets never go into it (a runtime env is on the
    command line and in the job record the dashboard shows): the cluster's nodes have them, or the head rlctl's Ray
    executor starts inherits them."""

    runtime_env: dict[str, Any] = field(default_factory=dict)  # everything but env_vars (working_dir, pip)
    job_env: list[str] = field(default_factory=list)  # variables the job gets, values read at launch time
    secrets: list[str] = field(default_factory=list)  # the job needs them; never in a runtime env (the nodes have them)
    executor: str = "ray"  # who runs the plan: rlctl's Ray executor submits itself; `local` runs `ray job submit`

    def _lines(self) -> tuple[list[str], list[str]]:
        """(launch.sh up to the command, the commands that build the runtime env and submit the job)."""
        argv = []
        for a in self.argv:
            if a.startswith("--runtime-env-json"):
                argv += ["--runtime-env-json", f"${{{RUNTIME_ENV_VAR}}}"]
            else:
                argv.append(a)
        plain = LaunchPlan(self.backend, self.version, argv, self.env, self.files, self.cwd, self.total_steps,
                           self.keys, self.notes)
        lines = LaunchPlan.script(plain).splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("ray job submit"))
        code = ('import json, os, sys; env = json.loads(sys.argv[1]); '
                'env["env_vars"] = {k: os.environ[k] for k in sys.argv[2:] if k in os.environ}; print(json.dumps(env))')
        build = [
            "# the job's environment, read from this shell now (a Ray job does not inherit it; nothing is written):",
            *([f"# not sent: {', '.join(self.secrets)} (a runtime env is on the command line and in the job record the "
               "dashboard shows): the cluster's nodes must have it (docs/ray.md)"] if self.secrets else []),
            f'{RUNTIME_ENV_VAR}="$(python3 -c {shlex.quote(code)} \\',
            f"  {shlex.quote(json.dumps(self.runtime_env, sort_keys=True))} {' '.join(self.job_env)})\"",
        ]
        return lines[:at], build + lines[at:]

    def script(self) -> str:
        head, submit = self._lines()
        return "\n".join(head + submit) + "\n"

    def submit_command(self) -> list[str]:
        """An argv that builds the runtime env from its own environment and submits: what a local process runs."""
        return ["bash", "-c", "set -euo pipefail\n" + "\n".join(self._lines()[1]) + "\n"]


class OpenRLHFBackend(Backend):
    name = "openrlhf"
    multi_node_launcher = "ray"  # its trainer and vLLM engines are Ray actors placed over the cluster
    in_loop_eval_single = True  # data.eval, eval.every/temperature/n_samples rendered into its own eval
    own_rotation = "--max_ckpt_num (--ckpt.max_num) is set to 2147483647, a count never reached"
    sharding = "deepspeed"  # memory engine: ZeRO stage from train.zero_stage
    foreach_adam = False  # DeepSpeed's FusedAdam (strategy.create_optimizer)
    # bytes per (token x vocab) of the actor's log-probs: fp32 logits kept alive to the optimizer step (Actor.forward
    # casts the full-sequence logits) and flash-attn's cross-entropy gradient; 8.9 measured (bench/gpu_deepspeed.py)
    logit_bytes = 8.9
    updates_straddle_rollouts = True  # DeepSpeed counts micro batches across rollouts (honour.py warns)
    # vLLM engines with TP > 1 use Ray's executor in a PACK placement group of one-GPU bundles, which Ray may spread
    # over nodes (trainer/ray/vllm_engine.py create_vllm_engines, every release): a TP group need not fit one node
    tp_spans_nodes = True
    sleep_switch = "vllm_enable_sleep"  # colocated vLLM frees its memory while training
    packages = ("openrlhf",)
    patch_fixable = ("disk.lora_zero3", "lora.vllm_sync")  # honour.py: what a set's manifest `fixes` silences
    checks = {"env": ("env.wandb_job",), "disk": ("disk.deepspeed", "disk.lora_zero3", "disk.hf_exports")}  # honour.py
    known_versions = KNOWN_VERSIONS
    metric_needles = ("lobal step", "global_step", "act_lr=", "pg=", "critic_loss=", "policy_loss=", "Eval at step")

    def prompt_limit(self, recipe: Recipe) -> str | None:
        """OpenRLHF tokenizes prompts with truncation=True at --prompt_max_len (<= 0.9: experience_maker's
        tokenize_fn); from the dotted releases on, prompts are cut to --data.max_len - max_new_tokens."""
        if release(self.target_version(recipe)).dotted:
            return "OpenRLHF cuts prompts to data.max_len - max_new_tokens (truncation)"
        return "OpenRLHF truncates prompts to --prompt_max_len"

    def engine_context(self, recipe: Recipe) -> tuple[int, str]:
        """vLLM's max_model_len as OpenRLHF sizes it, whatever model.max_model_len says: train_ppo_ray.py train()
        `max_len = args.max_len if args.max_len else args.prompt_max_len + args.generate_max_len` (0.9.3-0.9.7), then
        `args.data.max_len` / `--max_len` (0.9.8 on), passed to create_vllm_engines as max_model_len. rlctl renders
        both as data.max_prompt_tokens + rollout.max_tokens (an extra that sets them is refused: argv.NO_RECIPE_KEY)."""
        r = recipe
        how = ("--prompt_max_len + --generate_max_len" if release(self.target_version(r)).flag("prompt_max_len")
               else release(self.target_version(r)).flag("max_len"))
        return r.data.max_prompt_tokens + r.rollout.max_tokens, f"OpenRLHF sizes vLLM to {how}"

    def stall_patterns(self) -> list[str]:
        """Log lines that mean the run is stuck or a component it needs died (rlctl.runs.stall)."""
        return [
            *NCCL_VLLM_STALL_SIGNS,
            r"RayActorError|ActorDiedError|The actor died unexpectedly",
        ]

    def log_components(self, recipe: Recipe) -> dict[str, Component]:
        """The vLLM engines are Ray actors (`LLMRayActor` up to 0.10, `RolloutRayActor` from 0.11; vLLM's own
        `RayWorkerWrapper` with tensor parallelism): Ray's driver prints their lines into the run's output prefixed
        with the actor's name (openrlhf/trainer/ray/vllm_engine.py); the rest is the driver and the training actors."""
        engines = ("LLMRayActor", "RolloutRayActor", "RayWorkerWrapper")
        return {"trainer": Component("trainer", main_log=True, other_actors=engines,
                                     where="the run's stdout.log without the vLLM engines' lines"),
                "inference": Component("inference", ray_actors=engines,
                                       where="the vLLM engines' lines in the run's stdout.log (Ray actors "
                                             + ", ".join(engines[:2]) + ")")}

    def gpu_roles(self, recipe: Recipe) -> list[set[str]] | None:
        """Colocated (--colocate_all_models), every GPU holds an actor and an engine; else Ray's placement groups
        pick which GPU holds which: only the counts are known."""
        return super().gpu_roles(recipe) if self.colocated(recipe) else None

    # The actor's reserved beyond its allocated peak, in multiples of the step's transient memory (activations,
    # logits, reduce bucket, the step's extra), measured on OpenRLHF 0.10.4 launched by rlctl on an H100 (0.5B, ZeRO-2,
    # one actor GPU; torch's own figures inside the PolicyModelActor). fit() empties the cache before and after its
    # training phase, but inside it the micro batches (shuffled, each padded to its own longest sample) and the step
    # leave blocks of differing sizes cached; a one-phase trainer of its shape (bench/gpu_deepspeed.py) showed
    # 1.04-1.31x its whole allocated peak. Full fine-tune (docs/gpu/openrlhf-2.json): reserved - allocated 7.21, 7.10,
    # 5.29 GiB over three attempts against 3.68 GiB planned transient. LoRA (rank 16, all-linear; issue 31's fifth
    # sitting, tests/test_memory.py OPENRLHF_LORA): 1.85, 1.21, 1.85 GiB against 3.58 planned: a smaller multiple, as
    # the full fine-tune's training phase also makes a bf16 gradient per parameter (up to the 0.25 GiB embedding,
    # copied into the reduce bucket and freed) and the step's flattened fp32 cast of them (6 bytes per parameter),
    # blocks that LoRA's 8.8M adapter elements do not make. (The LoRA plan's one-phase 1.06x gave 0.2 GiB of slack:
    # the actor's GPU planned 8.2 GiB, 11.1 measured.) Measured on one shape each: preflight says so.
    ACTOR_TRANSIENT_SLACK = 1.93
    ACTOR_TRANSIENT_SLACK_LORA = 0.52

    seq_len_key = None  # no trainer sequence length: the actor trains on the rollouts (honour.py warns)

    def memory_features(self, recipe: Recipe) -> Any:
        """The base features, and how OpenRLHF places what it holds: its reference model is a Ray actor of its own
        (ReferenceModelActor), on the actor's GPU as rlctl renders it (--colocate_actor_ref); with --ds.enable_sleep
        (--deepspeed_enable_sleep) the actor's weights and optimizer states leave the GPU while vLLM generates."""
        f = super().memory_features(recipe)
        f.reference_process = True
        f.transient_slack = self.ACTOR_TRANSIENT_SLACK if recipe.lora is None else self.ACTOR_TRANSIENT_SLACK_LORA
        f.notes.append("the actor's allocator slack was measured on one shape (OpenRLHF 0.10.4, 0.5B, ZeRO-2, one "
                       f"actor GPU, {'full fine-tune' if recipe.lora is None else 'LoRA'}: docs/gpu.md)")
        extra = {k.lstrip("-") for k, v in recipe.backend.extra().items() if v}
        f.trainer_sleeps = bool(extra & {"ds.enable_sleep", "deepspeed_enable_sleep"})
        return f

    def colocation_mode(self, recipe: Recipe) -> str:
        """Colocated vLLM sleeps while training with --vllm_enable_sleep (<= 0.10.1.post2) / --vllm.enable_sleep."""
        extra = {k.lstrip("-") for k, v in recipe.backend.extra().items() if v}
        return "sleep" if extra & {"vllm_enable_sleep", "vllm.enable_sleep"} else self.colocation

    def release(self, recipe: Recipe) -> Release:
        version = self.target_version(recipe)
        assert version is not None
        return release(version)

    # ---- steps and schedule ----------------------------------------------------------------------------------
    def total_steps(self, recipe: Recipe, dataset_size: int | None) -> int | None:
        """Optimizer steps that really run (steps.py): rollouts x optimizer steps per rollout."""
        return plan_steps(recipe, dataset_size).total

    def steps_formula(self, recipe: Recipe, dataset_size: int) -> str:
        r, s = recipe, plan_steps(recipe, dataset_size)
        text = (f"{s.rollouts} rollouts ({s.prompts} prompts // {r.rollout.prompts_per_step} per rollout x "
                f"{s.episodes} episodes) x {s.per_rollout:g} optimizer steps each "
                f"({r.rollout.prompts_per_step} x {r.rollout.group_size} samples x {r.train.epochs_per_rollout} "
                f"epochs / {r.train.train_batch_size} per step)")
        if s.horizon != s.total:
            text += f"; the LR schedule is laid over {s.horizon} (OpenRLHF's max_steps)"
        return text

    def optimizer_steps_per_logged_step(self, recipe: Recipe) -> int:
        """OpenRLHF logs `global_step`, one per rollout: that many optimizer steps each (rounded when fractional)."""
        return max(1, round(plan_steps(recipe, None).per_rollout))

    def every_rollouts(self, every: int, recipe: Recipe) -> int:
        """--save_steps / --eval_steps count global steps, one a rollout (PPOTrainer: `global_step % save_steps`
        and `global_step % eval_steps`, every release); checkpoint.every / eval.every count optimizer steps. Rounded
        down, at least 1 (honour.py warns when it rounds)."""
        return max(every // self.optimizer_steps_per_logged_step(recipe), 1)

    def saved_checkpoints(self, recipe: Recipe, total_steps: int) -> int:
        """One checkpoint every --save_steps rollouts (global_step % save_steps == 0): total_steps optimizer steps
        are total_steps // per-rollout rollouts."""
        every = recipe.checkpoint.every
        if not every:
            return 1
        rollouts = total_steps // self.optimizer_steps_per_logged_step(recipe)
        return max(rollouts // self.every_rollouts(every, recipe), 1)

    def _dataset_size(self, recipe: Recipe) -> int | None:
        from rlctl.recipe.data import count_records, is_local

        try:
            return count_records(recipe.data.train) if is_local(recipe.data.train) else None
        except Exception:  # noqa: BLE001 - an unreadable dataset is reported by its own check
            return None

    def _warmup(self, recipe: Recipe, s: Steps) -> tuple[float, int | None]:
        """(the --lr_warmup_ratio to render, warmup steps it gives over the scheduler's horizon)."""
        o = recipe.optim
        if o.warmup_steps is not None:
            if not s.horizon:
                return DEFAULT_WARMUP_RATIO, None
            w = min(o.warmup_steps, s.horizon)
            return warmup_ratio_for(w, s.horizon), w
        ratio = o.warmup_ratio if o.warmup_ratio is not None else DEFAULT_WARMUP_RATIO
        return ratio, (math.ceil(s.horizon * float(_fmt(ratio))) if s.horizon is not None else None)

    def warmup_steps(self, recipe: Recipe, total: int) -> int:
        s = plan_steps(recipe, self._dataset_size(recipe))
        if s.horizon is None:  # no dataset: `total` is all there is
            s = Steps(s.episodes, None, None, total, total, None, s.per_rollout)
        return self._warmup(recipe, s)[1] or 0

    def _scheduler(self, recipe: Recipe, rel: Release) -> tuple[str, float | None]:
        """(the --lr_scheduler to render, the min_lr_ratio to render on dotted releases)."""
        o = recipe.optim
        if o.schedule == "constant":
            return "constant_with_warmup", (o.min_lr_ratio if rel.dotted else None)
        if o.schedule == "cosine" and rel.floor_kwargs == "always_min_lr_rate":
            return "cosine_with_min_lr", 0.0  # the same curve: cosine_with_min_lr with a floor of 0 is cosine
        return o.schedule, (o.min_lr_ratio if rel.dotted else None)

    def schedule(self, recipe: Recipe, dataset_size: int | None) -> list[float]:
        """The LR at each optimizer step that really runs, over the scheduler's horizon (max_steps)."""
        s = plan_steps(recipe, dataset_size)
        if not s.horizon or not s.total:
            return []
        rel = self.release(recipe)
        name, ratio = self._scheduler(recipe, rel)
        floor = 0.1 if rel.floor_kwargs == "always_min_lr" else (ratio or 0.0)
        warmup = self._warmup(recipe, s)[1] or 0
        return hf_schedule(name, recipe.optim.lr, warmup, s.horizon, floor)[: s.total]

    # ---- render ----------------------------------------------------------------------------------------------
    def concepts(self, recipe: Recipe, dataset_size: int | None) -> list[tuple[str, Any]]:
        r = recipe
        rel = self.release(r)
        s = plan_steps(r, dataset_size)
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
        ]
        if r.algorithm.name == "ppo":
            c += [("critic_num_nodes", res.nodes), ("critic_num_gpus_per_node", trainer_per_node)]
        c.append(("colocate_actor_ref", True))
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
            # with eval sets rlctl rotates (keeping the best-eval checkpoint): save_ckpt deletes the oldest while
            # `len(subdirs) >= max_num` (utils/deepspeed/deepspeed.py, 0.9.3 to 0.11.2) and no value switches that
            # off (0 would empty the directory), so a count never reached
            c.append(("max_ckpt_num", NO_ROTATION if self.rotation_by_rlctl(r) else ck.keep_last))
            if rel.best_checkpoints and r.data.eval:
                c.append(("best_metric_key", "none"))  # best_global_stepN_hf exports would pile up past keep_last
        if not ck.save_optimizer:
            c.append(("disable_ds_ckpt", True))
        if ck.every:
            c.append(("save_steps", self.every_rollouts(ck.every, r)))
        if ck.resume != "off":
            c.append(("load_checkpoint", True))
        c += [
            ("micro_train_batch_size", r.train.micro_batch_size),
            ("train_batch_size", r.train.train_batch_size),
            ("micro_rollout_batch_size", r.rollout.micro_batch_size or r.train.micro_batch_size),
            ("rollout_batch_size", r.rollout.prompts_per_step),
            ("n_samples_per_prompt", r.rollout.group_size),
            ("num_episodes", s.episodes),
            ("max_epochs", r.train.epochs_per_rollout),
        ]
        if s.max_samples is not None:
            c.append(("max_samples", s.max_samples))
        if rel.flag("prompt_max_len"):  # 0.9.3-0.9.7: vLLM's context is prompt_max_len + generate_max_len
            c += [("prompt_max_len", r.data.max_prompt_tokens), ("generate_max_len", r.rollout.max_tokens)]
        else:  # 0.9.8 on: the context is --max_len, prompts are cut to max_len - max_new_tokens
            c += [("max_len", r.data.max_prompt_tokens + r.rollout.max_tokens),
                  ("max_new_tokens", r.rollout.max_tokens)]
        c.append(("zero_stage", r.train.zero_stage))
        if r.train.gradient_checkpointing:
            c.append(("gradient_checkpointing", True))
        if r.model.dtype in PARAM_DTYPE:
            c.append(("param_dtype", PARAM_DTYPE[r.model.dtype]))
        if r.train.offload:
            c.append(("adam_offload", True))
        scheduler, min_ratio = self._scheduler(r, rel)
        c += [
            ("actor_learning_rate", r.optim.lr),
            ("lr_warmup_ratio", self._warmup(r, s)[0]),
            ("lr_scheduler", scheduler),
        ]
        if min_ratio is not None:
            c.append(("min_lr_ratio", min_ratio))
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
            c += [("lora_rank", r.lora.rank), ("lora_alpha", r.lora.alpha)]
            if r.lora.target_modules != "all-linear":  # the flag's default is the string; a list of it is a module
                c.append(("target_modules", list(r.lora.target_modules)))
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
                c.append(("eval_steps", self.every_rollouts(r.eval.every, r)))
            c += [("eval_temperature", r.eval.temperature), ("eval_n_samples_per_prompt", r.eval.n_samples)]
        c += [("temperature", r.rollout.temperature)]
        if r.rollout.top_p != 1.0:
            c.append(("top_p", r.rollout.top_p))
        c.append(("seed", r.train.seed))
        wb = r.logging.wandb
        if wb:
            c.append(("wandb_key", WANDB_FLAG_VALUE))
            c.append(("wandb_project", wb.project))
            if wb.entity:
                c.append(("wandb_org", wb.entity))
            c.append(("wandb_run_name", wb.name or r.name))
        if r.logging.tensorboard:
            c.append(("tensorboard", r.logging.tensorboard))
        return c

    def job_env(self, recipe: Recipe) -> dict[str, str]:
        """The Ray job's environment: the recipe's, W&B's mode, and secrets as `${NAME}` references (resolved from the
        launching environment at launch time, passed in the job's runtime env, never written)."""
        env = dict(recipe.env)
        facts = self.release(recipe).facts
        driver = {**facts.get("ray_init_env_fixed", {}), **facts.get("ray_init_env_from_environ", {})}
        if set(env) & set(driver):
            # train() calls ray.init(runtime_env={"env_vars": {...}}) with these names; Ray (>= 2.8, worker.py
            # _merge_runtime_env) refuses a driver runtime env that names a variable the job's already has, unless:
            env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] = "1"
        wb = recipe.logging.wandb
        if wb:
            if wb.offline:
                env["WANDB_MODE"] = "offline"
            else:
                env["WANDB_API_KEY"] = "${WANDB_API_KEY}"
        return env

    def secret_env(self, recipe: Recipe) -> list[str]:
        """The secrets the job needs in its environment (as `${NAME}` in the plan's env: rlctl's Ray executor gives
        them to the Ray head it starts; never in a job's runtime env, so a cluster rlctl did not start must have them
        on its nodes)."""
        return sorted(k for k, v in self.job_env(recipe).items() if v == f"${{{k}}}")

    def cli_args(self, recipe: Recipe, dataset_size: int | None = None,
                 extra: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
        """(train_ppo_ray's arguments, the flags they name): the recipe's concepts, then backend.openrlhf.extra
        (or `extra` in its place) appended as given (argparse takes the last of a repeated flag: an extra overrides
        what rlctl renders)."""
        rel = release(self.target_version(recipe))
        args: list[str] = []
        keys: list[str] = []
        for concept, value in self.concepts(recipe, dataset_size):
            flag = rel.flag(concept)
            if not flag:
                continue  # unhonoured() names it
            keys.append(flag)
            if value is True:
                args.append(flag)
            elif isinstance(value, list):
                args.append(flag)
                args.extend(_fmt(v) for v in value)
            else:
                args += [flag, _fmt(value)]
        for k, v in (recipe.backend.extra() if extra is None else extra).items():
            flag = k if k.startswith("--") else f"--{k}"
            keys.append(flag)
            if v is True:
                args.append(flag)
            elif v is False or v is None:
                continue  # a store_true flag cannot be turned off on a command line: unhonoured() says so
            elif isinstance(v, list):
                args.append(flag)
                args.extend(_fmt(x) for x in v)
            else:
                args += [flag, _fmt(v)]
        return args, keys

    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        version = self.target_version(recipe)
        rel = release(version)
        args, keys = self.cli_args(recipe, dataset_size)
        address = recipe.resources.ray_address or DEFAULT_RAY_ADDRESS
        env = self.job_env(recipe)
        runtime_env: dict[str, Any] = {"working_dir": "."}
        if recipe.resources.pip:
            runtime_env["pip"] = list(recipe.resources.pip)
        shown = {k: v for k, v in env.items() if not v.startswith("${")}
        argv = [
            "ray", "job", "submit", f"--address={address}",
            f"--runtime-env-json={json.dumps({**runtime_env, 'env_vars': shown}, sort_keys=True)}",
            "--", "python3", "-m", CLI_MODULE, *args,
        ]
        s = plan_steps(recipe, dataset_size)
        plan = RayJobPlan(backend=self.name, version=version, argv=argv, env=env, keys=keys, total_steps=s.total,
                          runtime_env=runtime_env, job_env=sorted(set(env) - set(self.secret_env(recipe))),
                          secrets=self.secret_env(recipe), executor=recipe.resources.executor)
        if rel.dotted and recipe.data.max_prompt_tokens:
            plan.notes.append(f"OpenRLHF {version} has no prompt limit flag: --data.max_len = prompt + response "
                              "tokens, prompts are cut to max_len - max_new_tokens")
        if s.max_samples is not None:
            plan.notes.append(f"train.steps = {recipe.train.steps}: {s.episodes} episode(s) over the first "
                              f"{s.max_samples} prompts (--max_samples) = {s.total} optimizer steps")
        if s.rollouts is not None and s.per_rollout != 1:
            plan.notes.append(f"OpenRLHF logs one global_step per rollout = {s.per_rollout:g} optimizer steps "
                              f"({s.rollouts} global steps)")
        return plan

    def prepare_launch(self, plan: LaunchPlan, run_dir: Path) -> LaunchPlan:
        """Run by rlctl's local executor, `ray job submit` itself must carry the job's environment (secrets excepted),
        built from the process environment when it runs: never from the argv rlctl writes into the run directory."""
        del run_dir  # Unused
        if not isinstance(plan, RayJobPlan) or plan.executor == "ray":
            return plan
        return LaunchPlan(plan.backend, plan.version, plan.submit_command(), plan.env, plan.files, plan.cwd,
                          plan.total_steps, plan.keys, plan.notes)

    @staticmethod
    def entrypoint(plan: LaunchPlan) -> list[str]:
        """The command after `ray job submit ... --`."""
        return plan.argv[plan.argv.index("--") + 1:] if "--" in plan.argv else plan.argv

    # ---- validation ------------------------------------------------------------------------------------------
    def definitions(self, installed: str | None, wanted: str) -> tuple[set[str], str, str]:
        """(known flags, version, where they came from): the installed source when it is the wanted version, else the
        wanted release's own snapshot (never a neighbour's)."""
        if installed and installed == wanted:
            path = package_file("openrlhf", CLI_FILE)
            if path is not None:
                return set(argparse_flags(path.read_text())), installed, f"installed {path}"
        self.require_known(wanted)
        rel = release(wanted)
        return set(rel.flags), wanted, f"snapshot of {rel.source.split(' ')[0]}"

    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        known, version, source = self.definitions(installed_version, plan.version or self.known_versions[-1])
        findings = check_keys(self.name, plan.keys, known, version, source)
        if version in self.known_versions:
            # argparse reads a unique prefix of a flag as that flag (allow_abbrev): not unknown, an abbreviation
            from rlctl.backends.openrlhf.argv import resolve

            rel = release(version)
            # the other release line's spelling of a concept: name this release's (not the closest-looking flag)
            other = {(d if not rel.dotted else f): rel.flag(c) for c, (f, d) in FLAGS.items() if rel.flag(c)}
            for f in findings:
                if other.get(f.key):
                    f.fix = f"`{f.key}` is another OpenRLHF release's spelling: write `{other[f.key]}` for {version}"
            findings = [f for f in findings if resolve(version, f.key) is None] + [
                Finding("warn", f.key, f"`{f.key}` is not a {self.name} {version} flag: argparse reads it as the "
                        f"flag it abbreviates, `{resolve(version, f.key)}`", f"write `{resolve(version, f.key)}`")
                for f in findings if resolve(version, f.key) is not None]
        if installed_version and plan.version and installed_version != plan.version:
            findings.append(Finding(
                "warn", "openrlhf",
                f"recipe is for openrlhf {plan.version} but {installed_version} is installed",
                f"pip install openrlhf=={plan.version}, or set backend.version = \"{installed_version}\"",
            ))
        return findings

    def unhonoured(self, recipe: Recipe) -> list[Finding]:
        from rlctl.backends.openrlhf.honour import unhonoured

        return unhonoured(self, recipe)

    def inert(self, recipe: Recipe) -> list[Inert]:
        """The clip keys where OpenRLHF's ratio is exactly 1 at every update (clip.py)."""
        from rlctl.backends.openrlhf.clip import inert

        return inert(self, recipe)

    def refuses_single_sample(self, recipe: Recipe) -> bool:
        """train_ppo_ray asserts n_samples_per_prompt > 1 for rloo/reinforce_baseline/group_norm, and for dr_grpo
        from 0.11.0 on."""
        from rlctl.backends.base import version_key

        return recipe.algorithm.name != "dr_grpo" or version_key(self.target_version(recipe)) >= version_key("0.11.0")

    def effective(self, recipe: Recipe) -> EffectiveRecipe:
        """backend.openrlhf.extra overrides what rlctl renders (argparse takes the last value): the recipe that
        renders the command that runs (argv.py); the recipe itself where none does (render refuses that)."""
        from rlctl.backends.openrlhf.argv import effective

        eff = effective(self, recipe)
        return EffectiveRecipe(eff.recipe, eff.lines, frozenset(eff.held))

    def complete_fix(self, recipe: Recipe, values: dict[str, Any]) -> dict[str, Any]:
        from rlctl.backends.openrlhf.argv import complete_fix

        return complete_fix(self, recipe, values)

    def placement_errors(self, recipe: Recipe) -> list[Finding]:
        from rlctl.backends.openrlhf.honour import placement_errors

        return placement_errors(self, recipe)

    # ---- metrics and checkpoints -----------------------------------------------------------------------------
    def parse(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        """A log line (or a W&B/TensorBoard row) in rlctl's unified names: see openrlhf/metrics.py."""
        from rlctl.backends.openrlhf.metrics import parse

        return parse(line)

    def in_loop_eval_run(self, recipe: Recipe) -> dict[str, Any] | None:
        """The eval OpenRLHF runs with the rendered flags (--eval_dataset, --eval_temperature,
        --eval_n_samples_per_prompt or their dotted names; an extra given twice: argparse keeps the last)."""
        from rlctl.evals.in_loop import context
        from rlctl.evals.sets import LEGACY

        rel = self.release(recipe)
        argv = self.render(recipe).argv

        def last(concept: str) -> str | None:
            flag = rel.flag(concept)
            idx = [i for i, a in enumerate(argv) if a == flag and i + 1 < len(argv)]
            return argv[idx[-1] + 1] if idx else None

        if last("eval_dataset") is None:
            return None
        t = float(last("eval_temperature") or rel.default("eval_temperature") or 0.0)
        n = int(last("eval_n_samples_per_prompt") or rel.default("eval_n_samples_per_prompt") or 1)
        return context(LEGACY, t, n)

    def name_in_loop_evals(self, rec: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
        from rlctl.backends.openrlhf.metrics import name_in_loop_evals

        return name_in_loop_evals(rec, ctx)

    def metric_bulk(self, text: str) -> dict[int, dict[str, Any]]:
        """The records of a chunk's plain metrics lines, read together (the stream's fast path): see
        openrlhf/metrics.py."""
        from rlctl.backends.openrlhf.metrics import bulk

        return bulk(text)

    def checkpoint_bytes(self, arch: Any, recipe: Recipe) -> tuple[float, str]:
        r = recipe
        P = arch.params
        T = arch.lora_params(r.lora.rank, r.lora.target_modules) if r.lora else P
        keep_opt = r.checkpoint.save_optimizer
        # the adapter as DeepSpeed's bf16 engine holds it (not PEFT's fp32 upcast): seed 001's "~91 MB" adapter is
        # gpt-oss-120b at r=64 (47.8M parameters x 2 bytes = 95.6 MB = 91.1 MiB; its "~96 MB" weight sync)
        hf = T * 2 if r.lora else P * 2
        ds = (P * 2 + T * 12) if keep_opt else 0
        what = ("HF " + ("adapter" if r.lora else "weights")) + (" + DeepSpeed states" if keep_opt else "")
        leak = P * LORA_ZERO3_LEAK_PER_PARAM if self.leaks_shards(r) else 0
        if leak:
            what += (f" + ~{leak / 1e9:.0f} GB of full-model shards LoRA + ZeRO-3 leaves next to the adapter on every "
                     "save (no patch set with the save fix)")
        return hf + ds + leak, what

    def leaks_shards(self, recipe: Recipe) -> bool:
        """Seed 001 §4: with LoRA and ZeRO-3, strategy.save_model (utils/deepspeed/deepspeed.py, the same code in every
        release rlctl knows) leaves full-model shard files (pytorch_model-*.bin, model-*.safetensors) next to the
        adapter in each global_stepN_hf export, unless the recipe's patch set declares the fix (its manifest's
        `fixes = ["disk.lora_zero3"]`: the seed's save_model.patch deletes them after the save; the bundled
        openrlhf/0.9.3 carries it as 0003-save-model-lora-zero3-shards.patch)."""
        from rlctl.backends.openrlhf.honour import patch_set_fixes

        r = recipe
        return bool(r.lora) and r.train.zero_stage == 3 and "disk.lora_zero3" not in patch_set_fixes(r)

    def lighter_checkpoints(self, recipe: Recipe) -> list[dict[str, Any]]:
        """ZeRO-2 saves a LoRA adapter without the shard leak (save_model's stage-3 path is the one that leaks); the
        bundled set for the release that declares the save fix keeps ZeRO-3 (and the trainer's memory) as it is."""
        if not self.leaks_shards(recipe):
            return []
        from rlctl.backends.openrlhf.honour import leak_fixes

        return [s for _, s in leak_fixes(self, recipe)]

    def restart_loses(self, recipe: Recipe) -> str | None:
        """--load_checkpoint resumes only from a DeepSpeed state (checkpoints.resumable; an HF export resumes
        nothing), and --disable_ds_ckpt writes none: a restart trains from step 0 again."""
        if recipe.checkpoint.save_optimizer:
            return None
        flag = self.release(recipe).flag("disable_ds_ckpt")
        return (f"checkpoint.save_optimizer = false ({flag}): OpenRLHF resumes only from a DeepSpeed state "
                "(_actor/global_stepN), which it then never writes, so a restart trains again from step 0 (the HF "
                "exports resume nothing)")

    def min_keep_last(self, recipe: Recipe) -> tuple[int, str] | None:
        """--max_ckpt_num rotates before the save: save_ckpt deletes DeepSpeed states until fewer than max_num remain,
        then writes the next (utils/deepspeed/deepspeed.py, 0.9.3-0.11.2), and a restart resumes only from a DeepSpeed
        state (checkpoints.resumable). With 1, the only one is gone while the next is written. Not where rlctl
        rotates (NO_ROTATION rendered) nor without DeepSpeed states (--disable_ds_ckpt: save_ckpt is not called)."""
        ck = recipe.checkpoint
        if not ck.every or not ck.save_optimizer or self.rotation_by_rlctl(recipe):
            return None
        return 2, ("OpenRLHF's save deletes the oldest DeepSpeed states before it writes the next "
                   "(--max_ckpt_num: save_ckpt keeps fewer than keep_last, then saves), and a restart resumes only "
                   "from a DeepSpeed state")

    def prune_during_run(self, recipe: Recipe) -> bool:
        """OpenRLHF's --max_ckpt_num rotates only the DeepSpeed states under `_actor/` (utils/deepspeed/deepspeed.py
        save_ckpt); the HF exports `global_stepN_hf` are never deleted, in any release. With HF exports on (rlctl always
        asks for them), rlctl prunes to keep_last while the run goes."""
        return bool(recipe.checkpoint.keep_last)

    def preflight(self, ctx: Any, family: str) -> list[Any]:
        from rlctl.backends.openrlhf.honour import preflight

        return preflight(self, ctx, family)

    def checkpoints(self, root: Path) -> list[Checkpoint]:
        from rlctl.backends.openrlhf.checkpoints import find

        return find(root)

    # --load_checkpoint loads the tag DeepSpeed's `_actor/latest` names, not a step rlctl renders (checkpoints.py)
    def resume_checkpoint(self, root: Path, ckpts: list[Checkpoint]) -> Checkpoint | None:
        from rlctl.backends.openrlhf.checkpoints import resumable

        done = [c for c in ckpts if resumable(root, c)]
        return done[-1] if done else None

    def point_resume(self, root: Path, ckpt: Checkpoint | None) -> list[str]:
        from rlctl.backends.openrlhf.checkpoints import point_resume

        return point_resume(root, ckpt)

    def resumes_from(self, root: Path, ckpt: Checkpoint | None) -> Checkpoint | None:
        from rlctl.backends.openrlhf.checkpoints import loads

        return loads(root)

    def recipe_start(self, recipe: Recipe, root: Path) -> str | None:
        """--load_checkpoint loads the tag `_actor/latest` names, whatever step the recipe names (honour.py says so);
        with no complete checkpoint rlctl has removed it (point_resume): the start, unless a root that is not the
        run's own still names one."""
        del recipe  # Unused
        from rlctl.backends.openrlhf.checkpoints import loads

        found = loads(root)
        return f"step {found.step} (named by _actor/latest)" if found is not None else None

    def mark_checkpoint_root(self, root: Path) -> None:
        from rlctl.backends.openrlhf.checkpoints import mark_root

        mark_root(root)
