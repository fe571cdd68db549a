"""prime-rl's cross-field validators (its pydantic `model_validator`s), re-encoded as rlctl checks on a rendered
rl.toml, plus what prime-rl cannot honour of a recipe and its preflight rules (disk, env, placement).

Each rule cites the file and line of the validator it mirrors at that tag: v0.3.0 under `src/prime_rl/`,
v0.8.0 under `packages/prime-rl-configs/src/prime_rl/`. The JSON Schema (schema.py) checks keys, types and
constraints; these are what a schema cannot say.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends.base import Finding

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe


def get(d: Any, dotted: str, default: Any = None) -> Any:
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


@dataclass
class Rule:
    versions: tuple[str, ...]
    cite: str  # file:line at the tag
    check: Callable[[dict[str, Any], dict[str, Any]], str | None]  # (rendered, with defaults) -> problem or None
    key: str
    fix: str
    level: str = "error"  # "warn": prime-rl accepts it but changes its meaning


def _gpu_count(cfg: dict, full: dict) -> str | None:
    d = full.get("deployment", {})
    if d.get("type", "single_node") != "single_node":
        return None
    total = d.get("num_train_gpus", 1) + d.get("num_infer_gpus", 1)
    if total > d.get("gpus_per_node", 8):
        return (f"prime-rl cannot share a GPU between trainer and inference: {d.get('num_train_gpus')} train + "
                f"{d.get('num_infer_gpus')} inference GPUs exceed gpus_per_node {d.get('gpus_per_node')}")
    return None


def _shared_offline(cfg: dict, full: dict) -> str | None:
    if get(cfg, "wandb.offline"):
        return "wandb.offline = true is rejected by the rl entrypoint (shared W&B mode needs the server)"
    return None


def _multi_node_slurm(cfg: dict, full: dict) -> str | None:
    if get(full, "deployment.type") == "multi_node" and not cfg.get("slurm"):
        return "a multi-node deployment needs SLURM ([slurm]); rlctl's executors do not provide it"
    return None


def _nccl_gpus_v08(cfg: dict, full: dict) -> str | None:
    d = full.get("deployment", {})
    lora = get(cfg, "trainer.model.lora") is not None
    wb = get(cfg, "weight_broadcast.type") or ("filesystem" if lora or cfg.get("inference") is None else "nccl")
    one = d.get("num_train_gpus", 1) + d.get("num_infer_gpus", 1) < 2
    if d.get("type", "single_node") == "single_node" and wb == "nccl" and one:
        return "NCCL weight broadcast (the default without LoRA) needs at least 2 GPUs"
    return None


def _lora_broadcast_v08(cfg: dict, full: dict) -> str | None:
    if get(cfg, "trainer.model.lora") is not None and get(cfg, "weight_broadcast.type", "filesystem") != "filesystem":
        return "LoRA training needs weight_broadcast.type = 'filesystem'"
    return None


def _lora_nccl_v03(cfg: dict, full: dict) -> str | None:
    if get(cfg, "trainer.model.lora") is not None and get(cfg, "weight_broadcast.type") == "nccl":
        return "NCCL weight broadcast does not support LoRA"
    return None


def _nccl_gpus_v03(cfg: dict, full: dict) -> str | None:
    gpus = set(full.get("trainer_gpu_ids", [1]) + full.get("inference_gpu_ids", [0]))
    if get(cfg, "weight_broadcast.type") == "nccl" and len(gpus) < 2:
        return "NCCL weight broadcast needs at least 2 distinct GPUs"
    return None


def _offload_exclusive(cfg: dict, full: dict) -> str | None:
    m = get(full, "trainer.model", {})
    if m.get("fsdp_cpu_offload") and m.get("optim_cpu_offload"):
        return "fsdp_cpu_offload and optim_cpu_offload (default true) cannot both be on"
    return None


def _muon_offload(cfg: dict, full: dict) -> str | None:
    if get(cfg, "trainer.optim.type") == "muon" and get(cfg, "trainer.model.fsdp_cpu_offload"):
        return "the Muon optimizer does not work with fsdp_cpu_offload"
    return None


def _seq_len(cfg: dict, full: dict) -> str | None:
    t = get(cfg, "trainer.model.seq_len") or cfg.get("seq_len")
    o = get(cfg, "orchestrator.seq_len") or cfg.get("seq_len")
    if t is not None and o is not None and t < o:
        return f"trainer.model.seq_len ({t}) must be >= orchestrator.seq_len ({o})"
    return None


# v0.8.0 utils/validation.py:67-140 propagate_shared_fields: each shared top-level field and the sub-config fields it
# fills; setting both to different values is "Shared config conflicts with matching sub-config field(s)" (:186-194)
SHARED_V08: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model.name", ("trainer.model.name", "inference.model.name", "orchestrator.model.name")),
    ("model.vlm", ("trainer.model.vlm", "inference.model.vlm", "orchestrator.model.vlm")),
    ("log.level", ("trainer.log.level", "orchestrator.log.level", "inference.log.level")),
    ("log.json_logging", ("trainer.log.json_logging", "orchestrator.log.json_logging", "inference.log.json_logging")),
    ("ckpt.output_dir", ("trainer.ckpt.output_dir",)),
    ("ckpt.interval", ("trainer.ckpt.interval", "orchestrator.ckpt.interval")),
    ("ckpt.resume_step", ("trainer.ckpt.resume_step", "orchestrator.ckpt.resume_step")),
    ("ckpt.keep_last", ("trainer.ckpt.keep_last", "orchestrator.ckpt.keep_last")),
    ("ckpt.keep_interval", ("trainer.ckpt.keep_interval", "orchestrator.ckpt.keep_interval")),
    *((f"wandb.{leaf}", (f"trainer.wandb.{leaf}", f"orchestrator.wandb.{leaf}"))
      for leaf in ("project", "entity", "name", "group", "tags", "offline")),
    ("file_monitor.filename", ("trainer.file_monitor.filename", "orchestrator.file_monitor.filename")),
    ("tokenizer.name", ("trainer.tokenizer.name", "orchestrator.tokenizer.name")),
    ("tokenizer.trust_remote_code", ("trainer.tokenizer.trust_remote_code",
                                     "orchestrator.tokenizer.trust_remote_code")),
    ("tokenizer.chat_template", ("trainer.tokenizer.chat_template", "orchestrator.tokenizer.chat_template",
                                 "inference.model.chat_template")),
    ("rollout_transport", ("trainer.rollout_transport", "orchestrator.rollout_transport")),
    ("max_steps", ("trainer.max_steps", "orchestrator.max_steps")),
    ("seq_len", ("trainer.model.seq_len", "orchestrator.seq_len")),
    ("slurm", ("inference.slurm",)),
)


def shared_conflicts(cfg: dict) -> list[tuple[str, str]]:
    """(shared field, sub-config field) pairs that prime-rl v0.8.0's loader refuses: both set, to different values."""
    out = []
    for shared, targets in SHARED_V08:
        value = get(cfg, shared)
        if value is None:
            continue
        out += [(shared, t) for t in targets if get(cfg, t) is not None and get(cfg, t) != value]
    out_dir = cfg.get("output_dir")  # :146-156: the orchestrator's is <output_dir>/run_default
    if out_dir is not None:
        for sub, want in (("trainer.output_dir", out_dir), ("orchestrator.output_dir", f"{out_dir}/run_default")):
            if get(cfg, sub) is not None and get(cfg, sub) != want:
                out.append(("output_dir", sub))
    return out


def _shared_conflict(cfg: dict, full: dict) -> str | None:
    found = shared_conflicts(cfg)
    if found:
        pairs = ", ".join(f"[{a}] = {get(cfg, a)!r} vs [{b}] = {get(cfg, b)!r}" for a, b in found)
        return f"Shared config conflicts with matching sub-config field(s): {pairs}"
    return None


def _inference_tp(cfg: dict, full: dict) -> str | None:
    if cfg.get("inference") is None:
        return None
    par = get(full, "inference.parallel", {})
    tp, dp = par.get("tp", 1), par.get("dp", 1)
    if "deployment" in full:
        n = get(full, "deployment.num_infer_gpus", 1)
        if get(full, "deployment.type", "single_node") != "single_node":
            return None
    else:
        n = len(full.get("inference_gpu_ids", [0]))
    if n != dp * tp and n % tp:
        return f"{n} inference GPU(s) are not divisible by the tensor parallel size {tp}"
    return None


def _renderer(schema: dict) -> Callable[[dict, dict], str | None]:
    models = set(schema.get("x-renderer-models", []))

    def check(cfg: dict, full: dict) -> str | None:
        name = get(cfg, "orchestrator.renderer.name", "auto")
        model = get(cfg, "orchestrator.tokenizer.name") or get(cfg, "tokenizer.name") or get(cfg, "model.name")
        if name == "auto" and models and model not in models:
            return (f"orchestrator.renderer.name = 'auto' but {model!r} is not a model the renderers package knows "
                    f"(it would fall back to the default renderer, and prime-rl refuses that)")
        return None

    return check


def _env_form(cfg: dict, full: dict) -> str | None:
    for i, src in enumerate(get(cfg, "orchestrator.train.source", []) or []):
        legacy = get(src, "legacy.id")
        v1 = get(src, "env.taskset.id") or get(src, "env.id")
        if legacy and v1:
            return f"orchestrator.train.source[{i}]: a classic env (legacy.id) cannot combine with a v1 env/taskset"
        if not legacy and not v1:
            return f"orchestrator.train.source[{i}]: no env configured (set legacy.id or env.taskset.id)"
    return None


def _ac_back_on(cfg: dict, full: dict) -> str | None:
    m = get(full, "trainer.model", {})
    if "ac" in get(cfg, "trainer.model", {}) and m.get("ac") is None and m.get("ac_offloading") is not None:
        return ("trainer.model.ac = None is overridden: activation offloading (on by default) turns activation "
                "checkpointing back on")
    return None


def _batch_divisible(cfg: dict, full: dict) -> str | None:
    o = full.get("orchestrator", {})
    group = o.get("rollouts_per_example", o.get("group_size"))
    batch = o.get("batch_size")
    if batch is None and o.get("token_batch_size") is None:
        batch = 128
    if batch is not None and group and batch % group:
        return f"orchestrator.batch_size {batch} is not a multiple of the group size {group}"
    return None


def _batching_v08(cfg: dict, full: dict) -> str | None:
    o = get(cfg, "orchestrator", {})
    if o.get("batch_size") is not None and o.get("token_batch_size") is not None:
        return "set exactly one of orchestrator.batch_size or token_batch_size"
    if o.get("token_batch_size") is not None and o.get("max_inflight_episodes") is None:
        return "token_batch_size needs max_inflight_episodes"
    return None


def _lora_rank(cfg: dict, full: dict) -> str | None:
    rank = get(cfg, "trainer.model.lora.rank")
    if rank is not None and rank > 512:  # prime-rl sets inference.max_lora_rank from it (auto_setup_lora)
        return (f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank, 512 (the rl entrypoint copies the rank into "
                f"the inference config, whose validator raises when the inference server starts)")
    return None


def _linear_scheduler(cfg: dict, full: dict) -> str | None:
    s = get(full, "trainer.scheduler", {})
    if s.get("type") != "linear":
        return None
    w, dsteps, total = s.get("warmup_steps", 10), s.get("decay_steps", 10), full.get("max_steps")
    if w <= 0 and dsteps <= 0:
        return "a linear scheduler needs warmup_steps or decay_steps > 0"
    if dsteps > 0 and total is not None and total - dsteps < w:
        return f"linear scheduler: decay starts at max_steps - decay_steps = {total - dsteps}, before warmup ends ({w})"
    return None


V03 = ("0.3.0",)
V08 = ("0.8.0",)
BOTH = V03 + V08
RULES = [
    Rule(V08, "configs/rl.py:176-184 (SingleNodeDeploymentConfig.validate_gpu_count)", _gpu_count,
         "resources", "prime-rl 0.8.0 gives trainer and inference their own GPUs: set resources.colocate = false and "
         "use at least 2 GPUs, or pin backend.version = \"0.3.0\" (which can share one GPU)"),
    Rule(V08, "configs/rl.py:84-93 (SharedWandbConfig.validate_not_offline)", _shared_offline,
         "logging.wandb.offline", "rlctl renders offline W&B per component (trainer.wandb / orchestrator.wandb); "
         "remove wandb.offline from backend.prime_rl.extra"),
    Rule(V08, "configs/rl.py:307-310 (RLConfig.validate_deployment)", _multi_node_slurm,
         "resources.nodes", "run prime-rl multi-node through its own SLURM launcher, or use one node"),
    Rule(V08, "configs/rl.py:327-334 (RLConfig.validate_enough_devices_for_nccl)", _nccl_gpus_v08,
         "weight_broadcast", "use 2 GPUs, LoRA, or weight_broadcast.type = 'filesystem' (backend.prime_rl.extra)"),
    Rule(V08, "configs/rl.py:378-395 (RLConfig.auto_setup_weight_broadcast)", _lora_broadcast_v08,
         "weight_broadcast.type", "remove weight_broadcast.type from backend.prime_rl.extra"),
    Rule(V03, "rl.py:417-420 (RLConfig.auto_setup_lora)", _lora_nccl_v03,
         "weight_broadcast.type", "use weight_broadcast.type = 'filesystem' with LoRA"),
    Rule(V03, "rl.py:457-462 (RLConfig.validate_enough_devices_for_nccl)", _nccl_gpus_v03,
         "weight_broadcast.type", "use 2 GPUs or the filesystem weight broadcast"),
    Rule(V08, "configs/trainer.py:276-279 (ModelConfig.cpu_offload_mutual_exclusion)", _offload_exclusive,
         "train.offload", "set trainer.model.optim_cpu_offload = false (rlctl does when train.offload = true)"),
    Rule(V08, "configs/trainer.py:700-704 (TrainerConfig.validate_opt_and_fsdp_offload)", _muon_offload,
         "train.offload", "use AdamW or turn train.offload off"),
    Rule(V03, "trainer/rl/config.py:251-254 (RLTrainerConfig.validate_opt_and_fsdp_offload)", _muon_offload,
         "train.offload", "use AdamW or turn train.offload off"),
    Rule(V08, "utils/validation.py:49-194 (propagate_shared_fields)", _shared_conflict,
         "backend.prime_rl.extra", "set each shared value in one place: remove it from backend.prime_rl.extra and use "
         "the recipe key rlctl renders (train.seq_len, train.steps, checkpoint.*, logging.wandb.*, model.path)"),
    Rule(V03, "rl.py:222-229 (RLConfig.auto_setup_dp)", _inference_tp,
         "rollout.tensor_parallel", "use a rollout.tensor_parallel that divides the inference GPUs "
         "(resources.inference_gpus), or give inference more GPUs"),
    Rule(V08, "configs/rl.py:600-615 (RLConfig.auto_setup_deployment)", _inference_tp,
         "rollout.tensor_parallel", "use a rollout.tensor_parallel that divides the inference GPUs "
         "(resources.inference_gpus), or give inference more GPUs"),
    Rule(V08, "utils/validation.py:286-294 (validate_shared_seq_len)", _seq_len,
         "train.seq_len", "make train.seq_len >= the orchestrator's seq_len"),
    Rule(V03, "rl.py:381-393 (RLConfig.auto_setup_seq_len)", _seq_len,
         "train.seq_len", "make train.seq_len >= the orchestrator's seq_len"),
    Rule(V08, "configs/orchestrator.py:182-204 (EnvConfig.validate_env)", _env_form,
         "reward.environment", "give reward.environment.id"),
    Rule(V03, "orchestrator/config.py:776-780 (OrchestratorConfig.validate_batch_size)", _batch_divisible,
         "train.train_batch_size", "make train.train_batch_size a multiple of rollout.group_size"),
    Rule(V08, "configs/orchestrator.py:664-683 (OrchestratorConfig.resolve_batching)", _batch_divisible,
         "train.train_batch_size", "make train.train_batch_size a multiple of rollout.group_size"),
    Rule(V08, "configs/orchestrator.py:664-679 (OrchestratorConfig.resolve_batching)", _batching_v08,
         "orchestrator.token_batch_size", "use train.train_batch_size, or set max_inflight_episodes"),
    Rule(V03, "inference/config.py:203-220 (InferenceConfig.round_up_max_lora_rank)", _lora_rank,
         "lora.rank", "use lora.rank <= 512"),
    Rule(V08, "configs/inference.py:496-511 (InferenceConfig.auto_setup_max_lora_rank)", _lora_rank,
         "lora.rank", "use lora.rank <= 512"),
    Rule(V08, "configs/trainer.py:262-267 (ModelConfig.ac_offloading_requires_ac)", _ac_back_on,
         "train.gradient_checkpointing", "also set trainer.model.ac_offloading = \"None\" (rlctl does when "
         "train.gradient_checkpointing = false)", "warn"),
    Rule(BOTH, "trainer/scheduler.py:31-48 (setup_linear_scheduler asserts), src/prime_rl at the tag",
         _linear_scheduler, "optim", "fewer warmup steps, or more optimizer steps"),
]


def check(cfg: dict[str, Any], version: str, schema: dict[str, Any]) -> list[Finding]:
    from rlctl.backends.prime_rl.schema import nulls, with_defaults

    cfg = nulls(cfg)
    full = with_defaults(schema, schema, cfg)
    rules = list(RULES)
    if version in V08:
        rules.append(Rule(V08, "configs/orchestrator.py:630-662 (OrchestratorConfig.validate_renderer_auto_resolves)",
                          _renderer(schema), "model.path",
                          "set backend.prime_rl.extra \"orchestrator.renderer.name\" = \"default\" (the model's own "
                          "chat template) or a renderer made for the model"))
    out = []
    for rule in rules:
        if version not in rule.versions:
            continue
        problem = rule.check(cfg, full)
        if problem:
            what = "rejects this" if rule.level == "error" else "changes the meaning"
            out.append(Finding(rule.level, rule.key, f"prime-rl {version} {what}: {problem} [{rule.cite}]", rule.fix))
    return out


# ---- what a recipe asks that prime-rl cannot do --------------------------------------------------------------

def unhonoured(backend: Any, recipe: Recipe) -> list[Finding]:
    from rlctl.backends.prime_rl.schema import has_key, load_schema
    from rlctl.backends.prime_rl.tags import layout

    r = recipe
    version = backend.target_version(r)
    schema = load_schema(version)
    style = layout(version)
    out: list[Finding] = []

    def no(key: str, why: str, level: str = "warn", fix: str | None = None) -> None:
        out.append(Finding(level, key, f"prime-rl {version} cannot honour {key}: {why}", fix))

    class _Defaults:
        def __init__(self, section: Any) -> None:
            self.fields = type(section).model_fields

        def __getattr__(self, key: str) -> Any:
            return self.fields[key].default

    defaults = {s: _Defaults(getattr(r, s)) for s in ("rollout", "algorithm", "train", "eval", "data", "optim")}
    if r.rollout.top_p != 1.0:
        path = "orchestrator.sampling.top_p" if style == "v0.3" else "orchestrator.train.sampling.top_p"
        if not has_key(schema, path):
            no("rollout.top_p", "its sampling config has no top_p", "error", "remove rollout.top_p")
    if r.algorithm.name != "grpo":
        no("algorithm.name", f"prime-rl trains with its own GRPO-style loss (trainer.loss); {r.algorithm.name!r} "
           "is not selectable", "error", "use algorithm.name = \"grpo\"")
    for key in ("eps_clip", "entropy_coef", "kl_estimator", "use_kl_loss"):
        if getattr(r.algorithm, key) != getattr(defaults["algorithm"], key):
            no(f"algorithm.{key}", "prime-rl's loss has masking thresholds and kl_tau, not this knob")
    if r.train.epochs_per_rollout != 1:
        no("train.epochs_per_rollout", "prime-rl takes one optimizer step per orchestrator batch", "error")
    if r.train.micro_batch_size != defaults["train"].micro_batch_size:
        no("train.micro_batch_size", "prime-rl packs samples into seq_len-long micro batches itself")
    if r.train.zero_stage != defaults["train"].zero_stage:
        no("train.zero_stage", "prime-rl shards with FSDP2, not DeepSpeed ZeRO")
    if r.train.seed != defaults["train"].seed:
        no("train.seed", "rlctl does not render prime-rl's per-component seeds")
    if r.train.episodes is not None and r.train.steps is None:
        no("train.episodes", "prime-rl has no epochs; rlctl converts episodes into max_steps from the dataset size")
    if (r.rollout.prompts_per_step * r.rollout.group_size != r.train.train_batch_size
            and "prompts_per_step" in r.rollout.model_fields_set):
        no("rollout.prompts_per_step", "prime-rl's batch is orchestrator.batch_size samples "
           f"(= train.train_batch_size {r.train.train_batch_size}); prompts per step follow from it and group_size")
    if r.rollout.max_num_batched_tokens is not None:
        no("rollout.max_num_batched_tokens", "not rendered for prime-rl's inference server")
    if r.rollout.micro_batch_size is not None:
        no("rollout.micro_batch_size", "prime-rl has no experience-making micro batch")
    if r.reward.function is not None:
        no("reward.function", "prime-rl rewards come from a verifiers environment (reward.environment)", "error",
           "package the reward as a verifiers environment and set reward.environment.id")
    if r.reward.environment is None:
        no("reward.environment", "prime-rl needs a verifiers environment to reach a reward", "error")
    if r.reward.environment is not None and r.data.train != r.reward.environment.id:
        no("data.train", "prime-rl's prompts come from the environment's dataset (reward.environment), not data.train")
    for key in ("eval", "input_key", "label_key", "apply_chat_template"):
        if getattr(r.data, key) != getattr(defaults["data"], key):
            no(f"data.{key}", "the environment defines its dataset and prompt format")
    if r.eval.every is not None:
        no("eval.every", "rlctl does not render prime-rl's eval sources ([orchestrator.eval])")
    if r.logging.tensorboard:
        no("logging.tensorboard", "prime-rl logs to W&B (and, from v0.8, a metrics.jsonl file monitor) only")
    if r.logging.wandb and r.logging.wandb.entity and style == "v0.3":
        no("logging.wandb.entity", "v0.3.0's W&B config has no entity (set WANDB_ENTITY in env)")
    if r.checkpoint.final_dir is not None:
        no("checkpoint.final_dir", "prime-rl writes its final weights to <checkpoint.dir>/weights/step_<max_steps>")
    if not r.checkpoint.save_optimizer:
        no("checkpoint.save_optimizer", "prime-rl's trainer checkpoint always holds the optimizer")
    if r.model.trust_remote_code:
        no("model.trust_remote_code", "not rendered (set it through backend.prime_rl.extra)")
    if r.model.precision != "mixed":
        no("model.precision", "prime-rl keeps fp32 master weights (FSDP2 mixed precision)")
    if r.optim.schedule != "cosine_with_min_lr" and r.optim.min_lr_ratio != defaults["optim"].min_lr_ratio:
        no("optim.min_lr_ratio", f"only cosine_with_min_lr has a floor; {r.optim.schedule!r} ends at 0 (or stays)")
    if r.train.offload and style == "v0.3":
        no("train.offload", "v0.3.0's fsdp_cpu_offload leaves the model's buffers on the CPU and the trainer dies with "
           "'Attempted to set the storage of a tensor on device \"cpu\" to a storage on different device \"cuda:0\"' "
           "(the seeds' run); fixed after the tag by commit 82a8241 (#1636, 2026-01-23)", "error",
           "turn train.offload off (use train.gradient_checkpointing), or pin backend.version = \"0.8.0\"")
    if r.resources.nodes > 1:
        no("resources.nodes", "rlctl renders single-node prime-rl only (multi-node needs its SLURM launcher)", "error")
    if style == "v0.8":
        inf_ids, trn_ids = backend.gpu_ids(r)
        n_inf = len(inf_ids)
        moved = inf_ids != list(range(n_inf)) or trn_ids != list(range(n_inf, n_inf + len(trn_ids)))
        if moved and not set(inf_ids) & set(trn_ids):
            no("resources.inference_gpus", f"v0.8.0 places inference on GPUs 0..{n_inf - 1} and the trainer on "
                   f"the next {len(trn_ids)}; GPU ids are not selectable (counts are rendered)")
        if r.rollout.engines > 1 and r.rollout.engines * r.rollout.tensor_parallel != n_inf:
            no("rollout.engines", "inference data parallelism is derived from the inference GPU count")
    if r.rollout.engines > 1 and style == "v0.3":
        no("rollout.engines", "inference data parallelism follows from inference_gpu_ids and tensor_parallel")
    return out


# ---- preflight ---------------------------------------------------------------------------------------------------

def checkout_tag(checkout: Path, version: str) -> Any:
    """The job runs the checkout's code: it must be at the tag the recipe renders for."""
    import subprocess

    from rlctl.preflight import FAIL, OK, WARN, Result

    want = f"v{version}"
    try:
        res = subprocess.run(["git", "-C", str(checkout), "describe", "--tags", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        described = res.stdout.strip() if res.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        described = None
    if described is None:
        return Result("env.prime_rl_checkout", WARN, f"prime-rl checkout {checkout}: not a git checkout, its tag is "
                      f"unknown (the recipe renders for {want})", f"check out {want} there")
    if described == want:
        return Result("env.prime_rl_checkout", OK, f"prime-rl checkout {checkout} at {want}")
    tag = described.split("-")[0]
    if tag != want:
        return Result("env.prime_rl_checkout", FAIL, f"prime-rl checkout {checkout} is at {described}, but the recipe "
                      f"renders for {want}", f"git -C {checkout} checkout {want} (and uv sync), or set "
                      f"backend.version to the checkout's tag")
    return Result("env.prime_rl_checkout", WARN, f"prime-rl checkout {checkout} is at {described} (after or beside "
                  f"{want}): rlctl checked the render against {want} only", f"git -C {checkout} checkout {want}")


def preflight(backend: Any, ctx: Any, family: str) -> list[Any]:
    from rlctl.backends.prime_rl.tags import CHECKOUT_ENV
    from rlctl.preflight import FAIL, OK, WARN, Result

    r = ctx.recipe
    out = []
    if family == "disk" and r.checkpoint.keep_last:
        out.append(Result(
            "disk.keep_last", OK,
            f"prime-rl's ckpt.keep_last = {r.checkpoint.keep_last} deletes old checkpoints/step_N and weights/step_N "
            "itself (trainer/ckpt.py maybe_clean); it never deletes run_default/checkpoints/step_N (orchestrator) nor "
            "the broadcasts it keeps at checkpoint steps",
            "rlctl launch prunes those to checkpoint.keep_last while the run goes"))
    if family == "placement":
        tbs, g = r.train.train_batch_size, r.rollout.group_size
        samples = r.rollout.prompts_per_step * g
        # only a prompts_per_step the recipe sets: its default is not rendered and prime-rl never sees it
        if tbs != samples and "prompts_per_step" in r.rollout.model_fields_set and tbs % g == 0:
            out.append(Result("placement.batch", WARN,
                              f"prime-rl's batch is train.train_batch_size = {tbs} samples = {tbs // g} prompts x "
                              f"group {g}; rollout.prompts_per_step = {r.rollout.prompts_per_step} is not rendered",
                              f"set rollout.prompts_per_step = {tbs // g} to say what runs (or train.train_batch_size "
                              f"= {samples} if {r.rollout.prompts_per_step} prompts per step is what you want)",
                              set={"rollout.prompts_per_step": tbs // g}))
    if family == "env":
        import shutil

        if shutil.which("uv") is None:
            out.append(Result("env.uv", WARN if r.resources.executor != "local" else FAIL,
                              "`uv` is not on PATH: the job runs `uv run --project <prime-rl checkout> rl`",
                              "install uv (pip install uv), as prime-rl's README asks"))
        table = r.backend.table()
        checkout = getattr(table, "checkout", None) or os.environ.get(CHECKOUT_ENV)
        if not checkout:
            out.append(Result("env.prime_rl_checkout", WARN if r.resources.executor != "local" else FAIL,
                              f"no prime-rl checkout: the job runs `uv run --project <checkout> rl`, and neither "
                              f"backend.prime_rl.checkout nor ${CHECKOUT_ENV} is set", backend.install_hint_for(r)))
        elif not (Path(checkout).expanduser() / "pyproject.toml").is_file():
            out.append(Result("env.prime_rl_checkout", FAIL,
                              f"{checkout} is not a prime-rl checkout (no pyproject.toml)",
                              backend.install_hint_for(r)))
        else:
            out.append(checkout_tag(Path(checkout).expanduser(), backend.target_version(r)))
        from rlctl.backends.prime_rl.environment import results

        out += results(backend, r, checkout)
    return out
