"""prime-rl: one `rl` TOML (trainer, orchestrator, inference) run as `uv run --project <checkout> rl @ rl.toml`.

prime-rl is not on PyPI and its schema moved between releases; rlctl knows exactly the tags in `known_versions`:
- v0.3.0 (the seeds' layout): `inference_gpu_ids`/`trainer_gpu_ids`, `orchestrator.rollouts_per_example`,
  `[orchestrator.sampling] max_tokens`, `[[orchestrator.env]] id/args`, `trainer.loss.kl_tau` defaulting to 0.
- v0.8.0: `[deployment]` GPU counts (no GPU sharing), `orchestrator.group_size`,
  `[orchestrator.train.sampling] max_completion_tokens`, `[[orchestrator.train.source]]` with a v1 `env.taskset` or
  a classic (v0) `legacy = {id, args}` environment, `kl_tau` defaulting to 1e-3, no shared offline W&B.
Each render is validated against the JSON Schema of that tag's `RLConfig` (schemas/<version>.json, generated from
the real sources by scripts/prime_rl_schema.py) and against its cross-field validators, re-encoded in rules.py.
docs/backends/prime_rl.md maps every recipe concept per tag.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends.base import NCCL_VLLM_STALL_SIGNS, Backend, Finding, Inert, LaunchPlan, LazyTable
from rlctl.backends.prime_rl.tags import CHECKOUT_ENV, NEW_LAYOUT_SINCE, layout  # noqa: F401 (re-exported)
from rlctl.core.components import Component

if TYPE_CHECKING:
    from rlctl.backends.layout import Checkpoint
    from rlctl.recipe.schema import Recipe

CONFIG_FILE = "rl.toml"
NONE = "None"  # TOML has no null: prime-rl's BaseConfig reads the string "None" as None (both tags)


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


def deep_merge(base: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` (dotted or not) in `base`; a table merges into the table already there, key by key, instead of
    replacing it (`extra = {inference = {model = {x = 1}}}` keeps the rendered inference.model keys)."""
    keys = key.split(".")
    d = base
    for k in keys[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    last = keys[-1]
    if isinstance(value, dict) and isinstance(d.get(last), dict):
        for k, v in value.items():
            deep_merge(d[last], k, v)
    else:
        d[last] = copy.deepcopy(value)


# pyproject versions that several tags share: an installed prime-rl reporting one of them does not say which tag it is
AMBIGUOUS = {"0.1.0": ("v0.2", "v0.3.0", "v0.4.0")}


class PrimeRLBackend(Backend):
    name = "prime_rl"
    checks = {"env": ("env.prime_rl_checkout", "env.uv", "env.flash_attn", "env.vllm_router"),  # rules.py preflight
              "disk": ("disk.keep_last",)}
    own_rotation = "ckpt.keep_last is not rendered (null: never cleans)"
    sharding = "fsdp"  # memory engine: FSDP2, fp32 sharded master parameters
    lora_base_master = True  # the FSDP trainer loads the whole model in fp32, frozen base included
    packages = ("prime-rl", "prime_rl")
    on_pypi = False
    honours_micro_batch = False  # it packs samples into seq_len-long micro batches itself
    refuses_single_sample_groups = False  # rollouts_per_example = 1 passes its validators
    known_versions = ("0.3.0", "0.8.0")
    metric_needles = ("Step ", "╰─")  # as in prime_rl/metrics.py NEEDLES
    table_model = LazyTable("rlctl.backends.prime_rl.table:PrimeRLTable")  # pydantic: only for recipes
    table_paths = ("checkout",)  # a checkout named in a recipe is found next to the recipe, as its data is
    install_hint = ("prime-rl is not on PyPI: git clone https://github.com/PrimeIntellect-ai/prime-rl, check out the "
                    "tag of the release the recipe renders for (backend.version, e.g. v0.8.0), `uv sync`, and set "
                    "backend.prime_rl.checkout (or $PRIME_RL_DIR) to it")

    def install_hint_for(self, recipe: Recipe) -> str:
        """The checkout's tag is the release the recipe renders for (checkout_tag checks it), not the newest."""
        return (f"prime-rl is not on PyPI: git clone https://github.com/PrimeIntellect-ai/prime-rl, check out the tag "
                f"v{self.target_version(recipe)} (the release the recipe renders for), `uv sync`, and set "
                "backend.prime_rl.checkout (or $PRIME_RL_DIR) to it")

    def stall_patterns(self) -> list[str]:
        """Log lines that mean the run is stuck or a component it needs died (rlctl.runs.stall)."""
        return [
            *NCCL_VLLM_STALL_SIGNS,
            r"(ConnectError|APIConnectionError|Connection refused).*[Rr]etry",
            r"[Rr]etrying.*(ConnectError|Connection refused)",
            r"[Ii]nference server .*(died|not reachable|unreachable|exited)",
        ]

    def rollout_failure(self, line: str) -> str | None:
        """The orchestrator's line for a rollout that failed, with its error (prime_rl/rollouts.py)."""
        from rlctl.backends.prime_rl.rollouts import failure

        return failure(line)

    def log_components(self, recipe: Recipe) -> dict[str, Component]:
        """`rl` starts inference, orchestrator and trainer as processes of their own, each writing to a file under
        <output_dir>/logs (rlctl renders output_dir = checkpoint.dir): `<name>.log` from v0.8.0 on, `<name>.stdout`
        at v0.3.0 (src/prime_rl/rl.py, entrypoints/rl.py; pathing.get_log_dir); the run's stdout.log follows the
        trainer's (v0.3.0) or the orchestrator's (v0.8.0) with `tail -F`. The inference process is `inference @ ...`
        (`uv run inference @ ...` at v0.3.0)."""
        ext = ".stdout" if layout(self.target_version(recipe)) == "v0.3" else ".log"
        logs = f"{recipe.checkpoint.dir.rstrip('/')}/logs"
        return {
            "trainer": Component("trainer", files=(f"{logs}/trainer{ext}",), where=f"{logs}/trainer{ext}"),
            "inference": Component("inference", files=(f"{logs}/inference{ext}",), process=r"(^|[\s/])inference @ ",
                                   where=f"{logs}/inference{ext} (the vLLM server)"),
            "orchestrator": Component("orchestrator", files=(f"{logs}/orchestrator{ext}",),
                                      where=f"{logs}/orchestrator{ext}"),
        }

    def target_version(self, recipe: Recipe) -> str | None:
        """backend.version, else the installed prime-rl's version (never guessed: v0.2 to v0.4.0 all call themselves
        0.1.0 in pyproject.toml), else the newest known tag."""
        from rlctl.backends._static import installed_version
        from rlctl.backends.base import UnknownVersion

        if recipe.backend.version is None:
            installed = installed_version(self.packages[0])
            if installed in AMBIGUOUS:
                raise UnknownVersion(
                    f"the installed prime-rl calls itself {installed}, as tags {', '.join(AMBIGUOUS[installed])} all "
                    f"do: rlctl cannot tell which. Set backend.version (known: {', '.join(self.known_versions)}).")
        return super().target_version(recipe)

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

    def scheduler(self, recipe: Recipe, total: int) -> tuple[str, dict[str, Any]]:
        """prime-rl's `trainer.scheduler` table for the recipe's schedule (trainer/scheduler.py, same at both tags)."""
        warm = self.warmup_steps(recipe, total)
        # the recipe's `cosine` and `linear` decay to 0 (as transformers' do); only `cosine_with_min_lr` has a floor
        floor = recipe.optim.min_lr_ratio if recipe.optim.schedule == "cosine_with_min_lr" else 0.0
        min_lr = recipe.optim.lr * floor
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
        from rlctl.backends.prime_rl.schedule import prime_rl_schedule

        kind, kw = self.scheduler(recipe, total)
        return prime_rl_schedule(kind, recipe.optim.lr, kw.get("warmup_steps", 0), total, kw.get("min_lr", 0.0),
                                 kw.get("decay_steps", 0))

    # ---- placement -------------------------------------------------------------------------------------------
    def gpu_ids(self, recipe: Recipe) -> tuple[list[int], list[int]]:
        res = recipe.resources
        inf_ids = res.inference_gpus if res.inference_gpus is not None else list(range(recipe.inference_gpu_count))
        if res.trainer_gpus is not None:
            trn_ids = res.trainer_gpus
        elif res.colocate:
            trn_ids = list(inf_ids)
        else:
            trn_ids = [g for g in range(res.gpus_per_node) if g not in inf_ids]
        return inf_ids, trn_ids

    def gpu_roles(self, recipe: Recipe) -> list[set[str]] | None:
        """As rendered: inference_gpu_ids / trainer_gpu_ids (v0.3), num_infer_gpus first then num_train_gpus (v0.8)."""
        inf_ids, trn_ids = self.gpu_ids(recipe)
        return [{role for role, ids in (("trainer", trn_ids), ("vllm", inf_ids)) if i in ids}
                for i in range(recipe.resources.gpus_per_node)]

    # ---- render ----------------------------------------------------------------------------------------------
    def config(self, recipe: Recipe, dataset_size: int | None, version: str | None = None) -> dict[str, Any]:
        r = recipe
        style = layout(version or self.target_version(r))
        cfg: dict[str, Any] = {}
        total = self.total_steps(r, dataset_size)
        inf_ids, trn_ids = self.gpu_ids(r)
        if style == "v0.3":
            cfg["inference_gpu_ids"] = inf_ids
            cfg["trainer_gpu_ids"] = trn_ids
        if total:
            cfg["max_steps"] = total
        # everything prime-rl writes (checkpoints/, weights/, run_default/ with the orchestrator's checkpoints and
        # broadcasts, logs) lives under output_dir: it is the recipe's checkpoint.dir
        cfg["output_dir"] = r.checkpoint.dir
        if style == "v0.8":
            cfg["deployment"] = {"type": "single_node", "num_train_gpus": len(trn_ids),
                                 "num_infer_gpus": len(inf_ids), "gpus_per_node": r.resources.gpus_per_node}
        cfg["model"] = {"name": r.model.path}
        wb = r.logging.wandb
        if wb:
            table: dict[str, Any] = {"project": wb.project, "name": wb.name or r.name}
            if wb.entity and style == "v0.8":
                table["entity"] = wb.entity
            if wb.offline and style == "v0.8":
                # v0.8.0 rejects a shared offline W&B (configs/rl.py:84-93): offline goes to each component
                table["offline"] = True
                cfg.setdefault("trainer", {})["wandb"] = dict(table)
                cfg.setdefault("orchestrator", {})["wandb"] = dict(table)
            else:
                if wb.offline:
                    table["offline"] = True
                cfg["wandb"] = table
        ck = r.checkpoint
        if ck.every or ck.resume != "off" or ck.keep_last:
            ckpt: dict[str, Any] = {}
            if ck.every:
                ckpt["interval"] = ck.every
            if ck.keep_last and not self.rotation_by_rlctl(r):
                # with eval sets rlctl rotates, keeping the best-eval checkpoint: left at prime-rl's null, which
                # never cleans by recency (CheckpointConfig.keep_last, v0.3.0 and v0.8.0)
                ckpt["keep_last"] = ck.keep_last
            if isinstance(ck.resume, int):  # "latest" is resolved to a step number by `rlctl launch`
                ckpt["resume_step"] = ck.resume
            cfg["ckpt"] = ckpt
        # trainer
        kind, kw = self.scheduler(r, total or 0)
        trainer = cfg.setdefault("trainer", {})
        trainer["optim"] = {"type": "adamw", "lr": r.optim.lr, "max_norm": r.optim.max_grad_norm,
                            "weight_decay": r.optim.weight_decay}
        trainer["model"] = {"seq_len": r.train_seq_len}
        trainer["scheduler"] = {"type": kind, **kw}
        if r.train.gradient_checkpointing:
            trainer["model"]["ac"] = {"freq": 1}
        elif style == "v0.8":
            # v0.8.0 turns full activation checkpointing on by default (configs/trainer.py:163), and turns it back on
            # while activation offloading (on by default, :166) is on (ac_offloading_requires_ac, :262-267)
            trainer["model"]["ac"] = NONE
            trainer["model"]["ac_offloading"] = NONE
        if r.train.offload:
            trainer["model"]["fsdp_cpu_offload"] = True
            if style == "v0.8":  # optim_cpu_offload defaults to true and excludes fsdp_cpu_offload (trainer.py:277)
                trainer["model"]["optim_cpu_offload"] = False
        if r.lora:
            lora: dict[str, Any] = {"rank": r.lora.rank, "alpha": r.lora.alpha, "dropout": r.lora.dropout}
            if isinstance(r.lora.target_modules, list):
                lora["target_modules"] = r.lora.target_modules
            trainer["model"]["lora"] = lora
        # KL: v0.3.0 defaults kl_tau to 0, v0.8.0 to 1e-3 (configs/trainer.py:468): always say it
        trainer["loss"] = {"kl_tau": r.algorithm.kl_coef}
        if style == "v0.8":
            trainer["loss"] = {"type": "default", **trainer["loss"]}
        # orchestrator
        orch = cfg.setdefault("orchestrator", {})
        orch.update({"batch_size": r.train.train_batch_size, "seq_len": r.train_seq_len})
        sampling: dict[str, Any] = {"temperature": r.rollout.temperature}
        env = r.reward.environment
        if style == "v0.3":
            orch["rollouts_per_example"] = r.rollout.group_size
            sampling["max_tokens"] = r.rollout.max_tokens
            orch["sampling"] = sampling
            if env:
                entry: dict[str, Any] = {"id": env.id}
                if env.args:
                    entry["args"] = dict(env.args)
                orch["env"] = [entry]
        else:
            orch["group_size"] = r.rollout.group_size
            sampling["max_completion_tokens"] = r.rollout.max_tokens
            orch["train"] = {"sampling": sampling}
            if env:
                # a verifiers environment with load_environment(**args) (the seeds' kind) is a classic (v0) env:
                # v0.8 runs it through `legacy`; a v1 taskset has no `args` (verifiers configs/taskset.py)
                legacy: dict[str, Any] = {"id": env.id}
                if env.args:
                    legacy["args"] = dict(env.args)
                orch["train"]["source"] = [{"legacy": legacy}]
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
        cfg["inference"] = inference
        for k, v in r.backend.extra().items():
            deep_merge(cfg, k, v)
        return cfg

    def checkout(self, recipe: Recipe) -> str:
        """The prime-rl checkout the job runs in: backend.prime_rl.checkout, else `${PRIME_RL_DIR}` (filled in from
        the environment by prepare_launch)."""
        table = recipe.backend.table()
        return getattr(table, "checkout", None) or f"${{{CHECKOUT_ENV}}}"

    def prepare_launch(self, plan: LaunchPlan, run_dir: Path) -> LaunchPlan:
        import os

        where = os.environ.get(CHECKOUT_ENV)
        if where:
            plan.argv = [where if a == f"${{{CHECKOUT_ENV}}}" else a for a in plan.argv]
        return plan

    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        from rlctl.recipe.loader import dump_toml

        version = self.target_version(recipe)
        cfg = self.config(recipe, dataset_size, version)
        env = dict(recipe.env)
        wb = recipe.logging.wandb
        if wb and not wb.offline:
            env["WANDB_API_KEY"] = "${WANDB_API_KEY}"
        checkout = self.checkout(recipe)
        # `uv run --project` runs prime-rl's own environment from any directory; the cwd (the run directory) stays,
        # so rl.toml and the relative output_dir resolve there
        argv = ["uv", "run", "--project", checkout, "rl", "@", CONFIG_FILE]
        plan = LaunchPlan(
            backend=self.name, version=version, argv=argv, env=env,
            files={CONFIG_FILE: dump_toml(cfg)}, keys=flatten(cfg), total_steps=self.total_steps(recipe, dataset_size),
            required_env={CHECKOUT_ENV: f"export {CHECKOUT_ENV}=/path/to/prime-rl (a checkout of "
                                        f"{f'tag v{version}' if version else 'the release tag'}, after `uv sync` "
                                        "there), or set backend.prime_rl.checkout in the recipe"},
        )
        if recipe.checkpoint.resume == "latest":
            plan.notes.append("checkpoint.resume = latest: ckpt.resume_step is set to the newest complete step by "
                              "`rlctl launch --resume RUN` and by restarts; a fresh run has nothing to resume")
        if recipe.checkpoint.keep_last and self.rotation_by_rlctl(recipe):
            plan.notes.append(f"ckpt.keep_last is not rendered: rlctl prunes checkpoints/, weights/ and run_default/ "
                              f"to {recipe.checkpoint.keep_last} plus the best-eval checkpoint")
        elif recipe.checkpoint.keep_last:
            plan.notes.append(f"prime-rl's ckpt.keep_last prunes checkpoints/ and weights/ itself; rlctl prunes the "
                              f"orchestrator checkpoints and kept broadcasts (run_default/) to "
                              f"{recipe.checkpoint.keep_last}")
        return plan

    # ---- memory ------------------------------------------------------------------------------------------------
    def memory_features(self, recipe: Recipe) -> Any:
        """Checkpointing, offloading and the fused LM head as the rendered rl.toml resolves them (memory.py)."""
        from rlctl.backends.base import UnknownVersion
        from rlctl.backends.prime_rl import memory
        from rlctl.backends.prime_rl.schema import resolved

        try:
            version = self.target_version(recipe)
            self.require_known(version)
            model = resolved(self.config(recipe, None, version), version).get("trainer", {}).get("model", {})
        except UnknownVersion:
            return super().memory_features(recipe)
        return memory.features(recipe, model, layout(version),
                               self.micro_tokens(recipe, recipe.train.micro_batch_size))

    # ---- validation ------------------------------------------------------------------------------------------
    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        from rlctl.backends.prime_rl import rules
        from rlctl.backends.prime_rl.schema import check_config, load_schema

        version = plan.version or self.known_versions[-1]
        self.require_known(version)
        schema = load_schema(version)
        import tomllib

        cfg = tomllib.loads(plan.files[CONFIG_FILE])
        findings = check_config(cfg, schema, version)
        findings += rules.check(cfg, version, schema)
        same = installed_version == version or f"v{version}" in AMBIGUOUS.get(installed_version or "", ())
        if installed_version and not same:
            findings.append(Finding("warn", "backend.version",
                                    f"prime-rl {installed_version} is installed here but the recipe renders for "
                                    f"{version}", "install the pinned tag or set backend.version to the installed one"))
        return findings

    def samples_per_step(self, recipe: Recipe) -> int:
        """orchestrator.batch_size = train.train_batch_size samples: prompts per step follow from it (rollout.
        prompts_per_step is not rendered)."""
        return recipe.train.train_batch_size

    def inert(self, recipe: Recipe) -> list[Inert]:
        """The algorithm keys prime-rl's loss has no knob for: never rendered, whatever their value (unhonoured()
        says so where one is set). Its own trust region acts: the loss (trainer/rl/loss.py) masks tokens whose
        probability moved past its thresholds between the inference server's log-probs and the trainer's, which
        rollouts generated while the weights move (asynchronous, off-policy by design) make differ."""
        del recipe  # Unused: true of every recipe
        why = ("not rendered: prime-rl's loss has no PPO clip range, entropy bonus or KL estimator choice; it masks "
               "tokens whose probability moved too far between the inference server's log-probs and the trainer's "
               "(v0.8.0 trainer.loss dppo_mask_low / dppo_mask_high; v0.3.0 its importance-ratio masks) and adds "
               "kl_tau x the squared log-ratio")
        fix = ("set prime-rl's own thresholds through backend.prime_rl.extra (v0.8.0: \"trainer.loss.dppo_mask_high\" "
               "and \"trainer.loss.dppo_mask_low\"); algorithm.kl_coef renders kl_tau")
        return [Inert(f"algorithm.{k}", why, fix, rendered=False)
                for k in ("eps_clip", "entropy_coef", "kl_estimator", "use_kl_loss")]

    def unhonoured(self, recipe: Recipe) -> list[Finding]:
        from rlctl.backends.prime_rl.rules import unhonoured

        return unhonoured(self, recipe)

    def parse(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        """A log line (or a W&B/TensorBoard row) in rlctl's unified names: see prime_rl/metrics.py."""
        from rlctl.backends.prime_rl.metrics import parse

        return parse(line)

    def metric_bulk(self, text: str) -> dict[int, dict[str, Any]]:
        """The records of a chunk's plain metrics lines, read together (the stream's fast path): see
        prime_rl/metrics.py."""
        from rlctl.backends.prime_rl.metrics import bulk

        return bulk(text)

    # ---- checkpoints and disk --------------------------------------------------------------------------------
    def prune_during_run(self, recipe: Recipe) -> bool:
        """prime-rl prunes checkpoints/step_N and weights/step_N to keep_last itself (trainer/ckpt.py maybe_clean),
        but never the orchestrator's run_default/checkpoints/step_N nor the broadcasts it keeps at checkpoint steps:
        rlctl prunes those while the run goes."""
        return bool(recipe.checkpoint.keep_last)

    def checkpoint_bytes(self, arch: Any, recipe: Recipe) -> tuple[float, str]:
        r = recipe
        P = arch.params
        T = arch.lora_params(r.lora.rank, r.lora.target_modules) if r.lora else P
        # trainer: fp32 FSDP shards + optimizer; plus bf16 weights/ (and, with the filesystem weight broadcast, the
        # broadcast kept at each checkpoint step: bf16 weights, or the adapter with LoRA). v0.3.0 broadcasts through
        # the filesystem by default; v0.8.0 only with LoRA (else NCCL, configs/rl.py:378-389)
        default = "filesystem" if layout(self.target_version(r)) == "v0.3" or r.lora else "nccl"
        kind = r.backend.extra().get("weight_broadcast.type", default)
        broadcast = T * 2 if kind == "filesystem" else 0
        what = "fp32 model shards + optimizer + bf16 weights/" + (" + kept broadcast" if broadcast else "")
        return P * 4 + (T * 8 if r.checkpoint.save_optimizer else 0) + P * 2 + broadcast, what

    def preflight(self, ctx: Any, family: str) -> list[Any]:
        from rlctl.backends.prime_rl.rules import preflight

        return preflight(self, ctx, family)

    def checkpoints(self, root: Path) -> list[Checkpoint]:
        from rlctl.backends.prime_rl.checkpoints import find

        return find(root)
