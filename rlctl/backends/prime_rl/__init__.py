"""prime-rl: one combined `rl` TOML (trainer, orchestrator, inference) run with `uv run rl @ rl.toml`.

prime-rl is not on PyPI and its schema moved: the seeds ran the early-2026 layout (v0.3: `inference_gpu_ids`,
`orchestrator.rollouts_per_example`, `[orchestrator.sampling] max_tokens`, `[[orchestrator.env]]`); from v0.8 it is
`[deployment]`, `orchestrator.group_size`, `[orchestrator.train.sampling] max_completion_tokens` and
`[[orchestrator.train.source]]`. Both are rendered; keys are checked against the pydantic config of that version.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends._static import installed_version, package_file, pydantic_key_paths
from rlctl.backends.base import Backend, Finding, LaunchPlan, load_snapshot, nearest_snapshot, version_key
from rlctl.estimate.schedules import prime_rl_schedule
from rlctl.recipe.loader import dump_toml

if TYPE_CHECKING:
    from rlctl.backends.layout import Checkpoint
    from rlctl.recipe.schema import Recipe

NEW_LAYOUT_SINCE = "0.8.0"
CONFIG_FILE = "rl.toml"


def layout(version: str | None) -> str:
    if version is None:
        return "v0.8"
    return "v0.8" if version_key(version) >= version_key(NEW_LAYOUT_SINCE) else "v0.3"


def flatten(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of every key set in a TOML mapping (arrays of tables flattened into their path)."""
    out = []
    for k, v in data.items():
        p = f"{prefix}.{k}" if prefix else k
        out.append(p)
        if isinstance(v, dict):
            out.extend(flatten(v, p))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for x in v:
                out.extend(flatten(x, p))
    return list(dict.fromkeys(out))


def _set(d: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


class PrimeRLBackend(Backend):
    name = "prime_rl"
    sharding = "fsdp"  # memory engine: FSDP2, fp32 sharded master parameters
    packages = ("prime-rl", "prime_rl")
    known_versions = ("0.3.0", "0.8.0")
    metric_needles = ("Step ",)  # as in prime_rl/metrics.py NEEDLES

    def target_version(self, recipe: Recipe) -> str:
        return recipe.backend.version or installed_version("prime-rl") or self.known_versions[-1]

    # ---- steps and schedule ----------------------------------------------------------------------------------
    def total_steps(self, recipe: Recipe, dataset_size: int | None) -> int | None:
        """One optimizer step per orchestrator batch; prime-rl runs `max_steps` steps (it has no epochs)."""
        if recipe.train.steps is not None:
            return recipe.train.steps
        if dataset_size is None:
            return None
        return dataset_size * recipe.rollout.group_size // recipe.train.train_batch_size * (recipe.train.episodes or 1)

    def warmup_steps(self, recipe: Recipe, total: int) -> int:
        if recipe.optim.warmup_steps is not None:
            return recipe.optim.warmup_steps
        if recipe.optim.warmup_ratio is not None:
            return int(recipe.optim.warmup_ratio * total)
        return 0

    def _scheduler(self, recipe: Recipe, total: int) -> tuple[str, dict[str, Any]]:
        warm = self.warmup_steps(recipe, total)
        min_lr = recipe.optim.lr * recipe.optim.min_lr_ratio
        if recipe.optim.schedule in ("cosine", "cosine_with_min_lr"):
            return "cosine", {"warmup_steps": warm, "min_lr": min_lr}
        if recipe.optim.schedule == "linear":
            return "linear", {"warmup_steps": warm, "decay_steps": max(total - warm, 0), "min_lr": min_lr}
        if warm > 0:  # prime-rl's constant has no warmup: linear with no decay is warmup-then-constant
            return "linear", {"warmup_steps": warm, "decay_steps": 0, "min_lr": 0.0}
        return "constant", {}

    def schedule(self, recipe: Recipe, dataset_size: int | None) -> list[float]:
        total = self.total_steps(recipe, dataset_size)
        if not total:
            return []
        kind, kw = self._scheduler(recipe, total)
        return prime_rl_schedule(kind, recipe.optim.lr, kw.get("warmup_steps", 0), total, kw.get("min_lr", 0.0),
                                 kw.get("decay_steps", 0))

    # ---- render ----------------------------------------------------------------------------------------------
    def config(self, recipe: Recipe, dataset_size: int | None) -> dict[str, Any]:
        r = recipe
        style = layout(self.target_version(r))
        cfg: dict[str, Any] = {}
        total = self.total_steps(r, dataset_size)
        res = r.resources
        n_inf = r.inference_gpu_count
        inf_ids = res.inference_gpus if res.inference_gpus is not None else list(range(n_inf))
        if res.trainer_gpus is not None:
            trn_ids = res.trainer_gpus
        elif res.colocate:
            trn_ids = list(inf_ids)
        else:
            trn_ids = [g for g in range(res.gpus_per_node) if g not in inf_ids]
        if style == "v0.3":
            cfg["inference_gpu_ids"] = inf_ids
            cfg["trainer_gpu_ids"] = trn_ids
        if total:
            cfg["max_steps"] = total
        if style == "v0.8":
            cfg["deployment"] = {"num_train_gpus": len(trn_ids), "num_infer_gpus": n_inf,
                                 "gpus_per_node": res.gpus_per_node}
        cfg["model"] = {"name": r.model.path}
        if r.logging.wandb:
            wb: dict[str, Any] = {"project": r.logging.wandb.project, "name": r.logging.wandb.name or r.name}
            if r.logging.wandb.offline:
                wb["offline"] = True
            cfg["wandb"] = wb
        ck = r.checkpoint
        if ck.every or ck.resume != "off" or ck.keep_last:
            ckpt: dict[str, Any] = {}
            if ck.every:
                ckpt["interval"] = ck.every
            if ck.keep_last:
                ckpt["keep_last"] = ck.keep_last
            if isinstance(ck.resume, int):  # "latest" is resolved to a step number by `rlctl launch`
                ckpt["resume_step"] = ck.resume
            cfg["ckpt"] = ckpt
        # trainer
        kind, kw = self._scheduler(r, total or 0)
        trainer: dict[str, Any] = {
            "optim": {"lr": r.optim.lr, "max_norm": r.optim.max_grad_norm, "weight_decay": r.optim.weight_decay},
            "model": {"seq_len": r.train_seq_len},
        }
        if kind != "constant":
            trainer["scheduler"] = {"type": kind, **kw}
        if r.train.gradient_checkpointing:
            trainer["model"]["ac"] = {"freq": 1}
        if r.train.offload:
            trainer["model"]["fsdp_cpu_offload"] = True
        if r.lora:
            lora: dict[str, Any] = {"rank": r.lora.rank, "alpha": r.lora.alpha}
            if r.lora.dropout:
                lora["dropout"] = r.lora.dropout
            if isinstance(r.lora.target_modules, list):
                lora["target_modules"] = r.lora.target_modules
            trainer["model"]["lora"] = lora
        if r.algorithm.kl_coef:
            trainer["loss"] = {"kl_tau": r.algorithm.kl_coef}
        cfg["trainer"] = trainer
        # orchestrator
        orch: dict[str, Any] = {"batch_size": r.train.train_batch_size, "seq_len": r.train_seq_len}
        sampling: dict[str, Any] = {"temperature": r.rollout.temperature}
        env_entry: dict[str, Any] | None = None
        if r.reward.environment:
            env_entry = {"id": r.reward.environment.id}
            if r.reward.environment.args:
                env_entry["args"] = dict(r.reward.environment.args)
        if style == "v0.3":
            orch["rollouts_per_example"] = r.rollout.group_size
            sampling["max_tokens"] = r.rollout.max_tokens
            orch["sampling"] = sampling
            if env_entry:
                orch["env"] = [env_entry]
        else:
            orch["group_size"] = r.rollout.group_size
            sampling["max_completion_tokens"] = r.rollout.max_tokens
            orch["train"] = {"sampling": sampling}
            if env_entry:
                src: dict[str, Any] = {"name": env_entry["id"], "env": {"taskset": {"id": env_entry["id"]}}}
                if "args" in env_entry:
                    src["env"]["taskset"]["args"] = env_entry["args"]
                orch["train"]["source"] = [src]
        cfg["orchestrator"] = orch
        # inference
        inference: dict[str, Any] = {"gpu_memory_utilization": r.rollout.gpu_memory_utilization}
        model: dict[str, Any] = {"max_model_len": r.model.max_model_len}
        if r.rollout.enforce_eager:
            model["enforce_eager"] = True
        if r.model.dtype != "auto":
            model["dtype"] = r.model.dtype
        inference["model"] = model
        if r.rollout.tensor_parallel > 1:
            inference["parallel"] = {"tp": r.rollout.tensor_parallel}
        if r.lora:
            inference["enable_lora"] = True
            inference["max_lora_rank"] = r.lora.rank
        cfg["inference"] = inference
        for k, v in r.backend.extra().items():
            _set(cfg, k, v)
        return cfg

    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        version = self.target_version(recipe)
        cfg = self.config(recipe, dataset_size)
        env = dict(recipe.env)
        if recipe.logging.wandb and not recipe.logging.wandb.offline:
            env["WANDB_API_KEY"] = "${WANDB_API_KEY}"
        plan = LaunchPlan(
            backend=self.name, version=version, argv=["uv", "run", "rl", "@", CONFIG_FILE], env=env,
            files={CONFIG_FILE: dump_toml(cfg)}, keys=flatten(cfg), total_steps=self.total_steps(recipe, dataset_size),
        )
        if recipe.checkpoint.resume == "latest":
            plan.notes.append("checkpoint.resume = latest: rlctl launch sets ckpt.resume_step to the newest "
                              "complete step")
        if recipe.checkpoint.keep_last:
            plan.notes.append("prime-rl's ckpt.keep_last does not delete old checkpoints; rlctl prunes them itself")
        return plan

    # ---- validation ------------------------------------------------------------------------------------------
    def definitions(self, installed: str | None, wanted: str) -> tuple[dict[str, str], str, str]:
        if installed and installed == wanted:
            root = package_file("prime_rl", "rl.py")
            if root is not None:
                base = root.parent.parent
                sources = {}
                for f in base.rglob("*.py"):
                    if f.name.endswith("config.py") or f.name == "rl.py" or "configs" in f.parts:
                        mod = ".".join(f.relative_to(base).with_suffix("").parts).removesuffix(".__init__")
                        sources[mod] = f.read_text()
                return pydantic_key_paths(sources, "RLConfig"), installed, f"installed {base}"
        snap_version = nearest_snapshot(self.name, wanted)
        snap = load_snapshot(self.name, snap_version) if snap_version else None
        if snap is None:
            return {}, wanted, "no snapshot"
        exact = "" if snap_version == wanted else f", nearest to {wanted}"
        return snap["keys"], snap_version, f"snapshot of {snap['source']}{exact}"

    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        import difflib

        known, version, source = self.definitions(installed_version, plan.version or self.known_versions[-1])
        if not known:
            return [Finding("warn", "prime_rl", f"no config definitions for prime-rl {version}; keys not checked")]
        findings = []
        for key in plan.keys:
            if key in known:
                continue
            # below a key typed as a plain value (dict/list/any) everything is accepted
            parts = key.split(".")
            if any(known.get(".".join(parts[:i])) == "value" for i in range(1, len(parts))):
                continue
            leaf = parts[-1]
            elsewhere = [k for k in known if k.split(".")[-1] == leaf]
            close = elsewhere or difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
            findings.append(Finding(
                "error", key, f"key `{key}` does not exist in prime-rl {version} ({source})",
                f"did you mean `{close[0]}`?" if close else "remove it",
            ))
        return findings

    def parse(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        """A log line (or a W&B/TensorBoard row) in rlctl's unified names: see prime_rl/metrics.py."""
        from rlctl.backends.prime_rl.metrics import parse

        return parse(line)

    def prune_during_run(self, recipe: Recipe) -> bool:
        return True

    def checkpoint_bytes(self, arch: Any, recipe: Recipe) -> tuple[float, str]:
        r = recipe
        P = arch.params
        T = arch.lora_params(r.lora.rank, r.lora.target_modules) if r.lora else P
        # trainer: fp32 FSDP shards + optimizer; plus bf16 weights for inference
        return P * 4 + (T * 8 if r.checkpoint.save_optimizer else 0) + P * 2, \
            "fp32 model shards + optimizer + bf16 weights/"

    def preflight(self, ctx: Any, family: str) -> list[Any]:
        from rlctl.preflight import WARN, Result

        r = ctx.recipe
        out = []
        if family == "disk" and r.checkpoint.keep_last:
            out.append(Result("disk.keep_last", WARN,
                              "prime-rl's ckpt.keep_last does not delete old checkpoints (seen in the seeds)",
                              "rlctl launch prunes to checkpoint.keep_last itself while the run goes"))
        if family == "placement":
            tbs, samples = r.train.train_batch_size, r.rollout.prompts_per_step * r.rollout.group_size
            if tbs != samples:
                out.append(Result("placement.batch", WARN,
                                  f"prime-rl trains once per orchestrator batch: train_batch_size {tbs} != prompts x "
                                  f"group {samples}", f"set train.train_batch_size = {samples}"))
        return out

    def checkpoints(self, root: Path) -> list[Checkpoint]:
        from rlctl.backends.prime_rl.checkpoints import find

        return find(root)
