"""The recipe schema: one name per concept (DESIGN.md), validated by pydantic.

Every section forbids unknown keys; `rlctl.recipe.loader` turns pydantic's errors into messages that name the file, the
line and a did-you-mean. Units: batch sizes in `train` count *samples* (completions), `rollout.prompts_per_step`
counts prompts, so `prompts_per_step * group_size` samples are generated per rollout.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)


def _not_bool(v: Any) -> Any:
    """`group_size = true` is a mistake, not 1: pydantic would quietly take a bool as a number."""
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {str(v).lower()}")
    return v


NoBool = BeforeValidator(_not_bool)
PosInt = Annotated[int, NoBool, Field(ge=1)]
NonNegInt = Annotated[int, NoBool, Field(ge=0)]
Fraction = Annotated[float, NoBool, Field(ge=0.0, le=1.0)]
NonNegFloat = Annotated[float, NoBool, Field(ge=0.0)]

# Upper bounds: far above any real run, low enough that planning stays a few seconds and a few MB (preflight walks
# the LR schedule step by step; placement lists GPU ids). A value above one is refused naming the limit
# (docs/checks.md, "Limits").
MAX_STEPS = 1_000_000  # optimizer steps, episodes, checkpoint/eval intervals
MAX_TOKENS = 16_777_216  # a context, a completion, a prompt (16M tokens)
MAX_SAMPLES = 10_000_000  # prompts or samples per step, group sizes, batch sizes
MAX_NODES = 10_000
MAX_GPUS_PER_NODE = 1024
MAX_SECONDS = 10 * 365 * 86400.0  # ten years: any grace or timeout


def _upto(n: int, lo: int = 1) -> Any:
    return Annotated[int, NoBool, Field(ge=lo, le=n)]


Steps = _upto(MAX_STEPS)
Tokens = _upto(MAX_TOKENS)
Samples = _upto(MAX_SAMPLES)
Seconds = Annotated[float, NoBool, Field(ge=0.0, le=MAX_SECONDS)]
GpuId = _upto(MAX_GPUS_PER_NODE - 1, 0)

def _leaf_types(annotation: Any) -> set[Any]:
    """The plain types a field's annotation accepts (`Annotated[int, ...] | str | None` -> {int, str, NoneType})."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_leaf_types(a) for a in typing.get_args(annotation)))
    return {annotation}


_NUMBERS = {int, float}


def scalar_kinds(model: type[BaseModel], field: str) -> set[Any] | None:
    """The kinds a number or boolean key takes ({int}, {int, float}, {bool}), or None: a key that also takes text or
    anything else (`checkpoint.resume`: off, latest or a step), or no such key."""
    info = model.model_fields.get(field)
    if info is None:
        return None
    kinds = _leaf_types(info.annotation) - {type(None)}
    return kinds if kinds and kinds <= {int, float, bool} else None


def from_text(kinds: set[Any], text: str) -> Any:
    """The number or boolean a text means for a key of these kinds, as TOML reads it (`5e-3`, `1_000`, `true`) or else
    as a command line writes it (`True`, `.5`); None if it means none. A recipe file must write the value itself (it
    is refused, with this as its fix); a `--set` value comes as text and is read so."""
    import tomllib

    from pydantic import TypeAdapter

    try:
        v = tomllib.loads(f"v = {text.strip()}")["v"]
    except (tomllib.TOMLDecodeError, ValueError):
        v = text
    for kind in (bool, int, float):  # bool first: lax int takes neither "true" nor "yes"; bool takes "1"
        if kind in kinds and not (kind is bool and isinstance(v, int | float) and not isinstance(v, bool)):
            try:
                out = TypeAdapter(kind).validate_python(v)
            except ValueError:
                continue
            return None if isinstance(out, float) and out != out else out
    return None


def refuse_mistyped_scalar(model: type[BaseModel], value: Any, field: str | None) -> Any:
    """A recipe key typed wrong is a mistake, never a value pydantic's lax mode makes of it: `checkpoint.resume = true`
    is not step 1, `train.steps = "100"` (text) is not 100, `gradient_checkpointing = "false"` is not a boolean. One
    check for every number or boolean key, in every section, so that a key added later is covered too; it names what
    the key takes and, for text, the value written as the key takes it."""
    if field is None or field not in model.model_fields or not isinstance(value, bool | str):
        return value
    info = model.model_fields[field]
    kinds = _leaf_types(info.annotation)
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    takes = extra.get("form") or ("true or false" if bool in kinds else "a whole number" if float not in kinds
                                  else "a number")
    examples = [e for e in (info.examples or [info.default]) if isinstance(e, int | float | str)
                and (not isinstance(e, bool) or bool in kinds)]
    fix = " or ".join(f"{field} = {e!r}".replace("'", '"').replace("True", "true").replace("False", "false")
                      for e in examples) or f"{field} = {'true' if bool in kinds else 1}"
    if isinstance(value, bool):
        if bool in kinds or not kinds & _NUMBERS:
            return value
        raise ValueError(f"{str(value).lower()} is a boolean; it takes {takes}\n  fix: {fix}")
    scalars = scalar_kinds(model, field)
    if scalars is None:
        return value
    meant = from_text(scalars, value)
    if meant is not None:
        fix = f"write it without quotes: {field} = {json.dumps(meant)}"
    elif not (info.examples or isinstance(info.default, int | float)):  # no example to give: not a made-up value
        fix = f"write {takes} without quotes: {field} = <{takes}>"
    raise ValueError(f"{json.dumps(value)} is text (in quotes); it takes {takes}\n  fix: {fix}")


class Section(BaseModel):
    # inf and nan are never meaningful settings (a KL coefficient of inf, a temperature of nan): rejected everywhere
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_mistyped_scalars(cls, v: Any, info: ValidationInfo) -> Any:
        return refuse_mistyped_scalar(cls, v, info.field_name)


class TableErrors(ValueError):
    """A table validated by its own model inside a section's check (`[backend.<name>]`): its errors, each with its
    key's path, so that the loader words them (and blames them) as it does every other key's."""

    def __init__(self, prefix: tuple[str, ...], error: ValidationError) -> None:
        self.errors = [{**err, "loc": (*prefix, *err["loc"])} for err in error.errors()]
        super().__init__("; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}"
                                   for err in self.errors))


class BackendExtra(Section):
    extra: dict[str, Any] = Field(default_factory=dict, description="Raw flags/keys passed through verbatim.")


def backend_table_model(name: str) -> type[BackendExtra]:
    """What a `[backend.<name>]` table may hold: `extra`, plus the adapter's own options (its `table_model`)."""
    from rlctl.backends import get_backend

    try:
        return getattr(get_backend(name), "table_model", None) or BackendExtra
    except Exception:  # a broken plugin: its table is validated as the plain escape hatch
        return BackendExtra


class BackendSection(Section):
    # `[backend.<name>]` tables (e.g. `[backend.verl] extra = {...}`) exist for every registered backend, bundled or
    # plugged in, so they are checked against the registry rather than declared here one by one.
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: str = Field(description="Which backend runs the recipe (`rlctl backends` lists the installed ones).")
    version: str | None = Field(
        default=None, description="The backend version the recipe is written for (flags are checked against it)."
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, v: str) -> str:
        from rlctl.backends import available

        known = sorted(available())
        if v not in known:
            raise ValueError(f"unknown backend {v!r}; installed backends: {', '.join(known)}")
        return v

    @model_validator(mode="after")
    def _tables(self) -> BackendSection:
        from rlctl.backends import available

        known = available()
        for key, value in list((self.model_extra or {}).items()):
            if key not in known:
                names = ", ".join(sorted(known))
                raise ValueError(f"unknown backend table [backend.{key}]; installed backends: {names}")
            if isinstance(value, BackendExtra):
                continue
            if not isinstance(value, dict):
                raise ValueError(f"[backend.{key}] must be a table like `extra = {{...}}`")
            model = backend_table_model(key)
            try:
                self.model_extra[key] = model.model_validate(value)
            except ValidationError as e:
                raise TableErrors(("backend", key), e) from None
        return self

    def table(self, name: str | None = None) -> BackendExtra:
        """The `[backend.<name>]` table (created empty when the recipe has none), of the recipe's backend by default."""
        name = name or self.name
        extras = self.model_extra if self.model_extra is not None else {}
        if name not in extras:
            extras[name] = BackendExtra()
        return extras[name]

    def extra(self) -> dict[str, Any]:
        """The recipe's backend's raw escape hatch, `backend.<name>.extra` (a live dict)."""
        return self.table().extra


class ModelSection(Section):
    path: str = Field(description="HF model id, a local directory, or `random:<arch>?hidden=..&layers=..`.")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = Field(
        default="bfloat16", description="Compute dtype (what matmuls run in, what vLLM serves in).")
    precision: Literal["mixed", "pure"] = Field(
        default="mixed",
        description="How the trainer holds what it updates. `mixed` (default, what verl/prime-rl FSDP and DeepSpeed "
        "do): fp32 parameters, gradients and optimizer state, compute autocast to `dtype`; with LoRA the frozen base "
        "stays in `dtype` and only the adapters are fp32. `pure`: parameters and optimizer state in `dtype` itself "
        "(half the memory; an update smaller than half a bf16 step of a weight, lr below ~|w|/256, is rounded away). "
        "See docs/precision.md.")
    max_model_len: Tokens = Field(default=4096, description="Context length for rollouts (prompt + response).")
    trust_remote_code: bool = False


class LoraSection(Section):
    rank: _upto(65536)
    alpha: _upto(MAX_SAMPLES) = 16
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear", json_schema_extra={"form": '"all-linear" or a list of module names'},
        examples=["all-linear", ["q_proj", "v_proj"]])
    dropout: Fraction = 0.0

    @field_validator("target_modules")
    @classmethod
    def _all_linear(cls, v: list[str] | str) -> list[str] | str:
        # peft reads "all-linear" as every linear layer only as the string itself; inside a list it is a module name
        # that no model has (NoMatchingPeftModuleError at start): ["all-linear"] means the string
        if isinstance(v, list) and "all-linear" in v:
            if set(v) == {"all-linear"}:
                return "all-linear"
            raise ValueError('"all-linear" selects every linear layer only on its own (peft): write '
                             'target_modules = "all-linear", or list module names without it')
        # as a GPU id or a host named twice: a module listed twice is a slip (a copy-paste, a merge), never meant
        twice = sorted({m for m in v if v.count(m) > 1}) if isinstance(v, list) else []
        if twice:
            once = json.dumps(list(dict.fromkeys(v)))
            raise ValueError(f"lora.target_modules = {json.dumps(v)} names {', '.join(twice)} twice\n"
                             f"  fix: list each module once: target_modules = {once}")
        return v


class DataSection(Section):
    train: str = Field(description="Training prompts: a JSONL/JSON/Parquet file or a dataset id.")
    eval: str | None = None
    input_key: str = "input"
    label_key: str | None = "label"
    max_prompt_tokens: Tokens = 1024
    apply_chat_template: bool = False


class RolloutSection(Section):
    group_size: Samples = Field(default=8, description="Completions per prompt.")
    prompts_per_step: Samples = Field(default=16, description="Prompts per rollout.")
    max_tokens: Tokens = Field(default=1024, description="Max new tokens per completion.")
    temperature: NonNegFloat = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    engines: _upto(MAX_NODES * 64) = 1
    tensor_parallel: _upto(MAX_GPUS_PER_NODE) = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] = 0.9
    enforce_eager: bool = False
    max_num_batched_tokens: _upto(MAX_TOKENS * 64) | None = None
    micro_batch_size: Samples | None = Field(default=None, description="Samples per forward pass in experience making.")


class AlgorithmSection(Section):
    name: Literal["grpo", "dr_grpo", "reinforce_baseline", "ppo"] = "grpo"
    kl_coef: NonNegFloat = 0.0
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl"] = "k3"
    use_kl_loss: bool = True
    eps_clip: Annotated[float, Field(gt=0.0, le=1.0)] = 0.2
    entropy_coef: NonNegFloat = 0.0


class OptimSection(Section):
    lr: Annotated[float, Field(gt=0.0, lt=1.0)] = 1e-6
    schedule: Literal["constant", "cosine", "cosine_with_min_lr", "linear"] = "cosine_with_min_lr"
    warmup_ratio: Fraction | None = None
    warmup_steps: _upto(MAX_STEPS, 0) | None = None
    min_lr_ratio: Fraction = 0.1
    max_grad_norm: Annotated[float, Field(gt=0.0)] = 1.0
    weight_decay: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _one_warmup(self) -> OptimSection:
        if self.warmup_ratio is not None and self.warmup_steps is not None:
            raise ValueError("set either optim.warmup_ratio or optim.warmup_steps, not both")
        return self


class TrainSection(Section):
    episodes: Steps | None = Field(default=None, description="Passes over the prompt set.")
    steps: Steps | None = Field(default=None, description="Optimizer steps; overrides episodes when both are set.")
    epochs_per_rollout: _upto(10_000) = Field(default=1, description="PPO epochs over each rollout batch.")
    seq_len: Tokens | None = Field(
        default=None, description="Trainer sequence length (prompt + response); defaults to model.max_model_len."
    )
    train_batch_size: Samples = Field(default=128, description="Samples per optimizer step (global).")
    micro_batch_size: Samples = Field(default=1, description="Samples per GPU per forward/backward.")
    gradient_checkpointing: bool = True
    zero_stage: Literal[0, 1, 2, 3] = 2
    offload: bool = False
    seed: _upto(2**32 - 1, 0) = Field(default=42, description="Random seed (0 to 2**32-1, what numpy accepts).")


class ResourcesSection(Section):
    nodes: _upto(MAX_NODES) = 1
    gpus_per_node: _upto(MAX_GPUS_PER_NODE, 0) = 1
    gpu: str = "H100-80GB"
    colocate: bool = Field(default=False, description="Trainer and inference share the same GPUs (with both "
                           "trainer_gpus and inference_gpus given, they must share at least one; colocate = "
                           "false, written, beside lists that share one is refused too).")
    trainer_gpus: list[GpuId] | None = Field(default=None, description="GPU ids of the trainer (per node).")
    inference_gpus: list[GpuId] | None = Field(default=None, description="GPU ids of the inference engines.")
    executor: str = Field(default="local", description="Where the run's processes live: local, ray, ssh, "
                          "slurm (or a plugin).")
    ray_address: str | None = Field(default=None, description="Ray dashboard address, e.g. http://head:8265.")
    pip: list[str] | None = Field(default=None, description="pip requirements for the Ray job's runtime env.")

    @field_validator("trainer_gpus", "inference_gpus")
    @classmethod
    def _each_once(cls, ids: list[int] | None, info: ValidationInfo) -> list[int] | None:
        # [0, 0] is one GPU, not two: counting it twice plans two trainer ranks on one card (and renders it so)
        twice = sorted({i for i in ids or [] if ids.count(i) > 1})
        if twice:
            once = list(dict.fromkeys(ids or []))
            raise ValueError(f"resources.{info.field_name} = {ids} names GPU {', '.join(map(str, twice))} twice; "
                             f"each id is one GPU\n  fix: list each GPU once: {info.field_name} = {once}")
        return ids

    @model_validator(mode="after")
    def _colocate_or_apart(self) -> ResourcesSection:
        # colocate = true says trainer and inference share GPUs; two lists with no id in common say they share none
        # (and colocate = false, written, beside lists that share one says the reverse). Placement, the memory checks
        # and the GPU plan each believed one of the two: refused, not guessed. The message names all three keys: the
        # loader points at the one a --set gave, else the file line of colocate.
        trn, inf = self.trainer_gpus, self.inference_gpus
        if not (trn and inf):
            return self
        shared = sorted(set(trn) & set(inf))
        if self.colocate and not shared:
            raise ValueError(
                f"resources.colocate = true (trainer and inference share GPUs) contradicts resources.trainer_gpus = "
                f"{trn} and resources.inference_gpus = {inf}, which share none\n  fix: set resources.colocate = "
                "false to keep them apart, or drop trainer_gpus and inference_gpus (colocated, both use every GPU)")
        if not self.colocate and "colocate" in self.model_fields_set and shared:
            raise ValueError(
                f"resources.colocate = false (trainer and inference on separate GPUs) contradicts "
                f"resources.trainer_gpus = {trn} and resources.inference_gpus = {inf}, which share GPU(s) {shared}"
                "\n  fix: set resources.colocate = true to share them, or give inference_gpus GPUs the trainer "
                "does not use")
        return self

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, v: str) -> str:
        from rlctl.executors import available

        if v not in available():
            raise ValueError(f"unknown executor {v!r}; known: {', '.join(available())}")
        return v


def executor_table_model(name: str) -> type[BaseModel] | None:
    """What an `[executor.<name>]` table may hold: the executor's own `table_model` (None: it declares none)."""
    from rlctl import executors

    try:
        return getattr(executors.executor_class(name), "table_model", None)
    except Exception:  # a broken plugin: it has no table
        return None


class ExecutorSection(Section):
    """`[executor.<name>]` tables: each executor declares its own (e.g. `[executor.slurm]` partition, time, setup),
    as backends declare `[backend.<name>]`; checked against the executor registry."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    @model_validator(mode="after")
    def _tables(self) -> ExecutorSection:
        from rlctl.executors import available

        known = available()
        for key, value in list((self.model_extra or {}).items()):
            model = executor_table_model(key) if key in known else None
            if model is None:
                with_tables = [n for n in known if executor_table_model(n) is not None]
                raise ValueError(f"unknown executor table [executor.{key}]; executors with a table: "
                                 f"{', '.join(with_tables) or 'none'}")
            if isinstance(value, model):
                continue
            if not isinstance(value, dict):
                raise ValueError(f"[executor.{key}] must be a table of keys")
            try:
                self.model_extra[key] = model.model_validate(value)
            except ValidationError as e:
                problems = "; ".join(f"executor.{key}.{'.'.join(map(str, err['loc']))}: "
                                     f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors())
                raise ValueError(problems) from None
        return self

    def place(self, name: str, key: str, value: Any, flag: str) -> None:
        """Set one key of `[executor.<name>]` from a command-line option (`--partition P`), checked as in a recipe."""
        from rlctl.errors import RlctlError

        model = executor_table_model(name)
        if model is None or key not in model.model_fields:
            raise RlctlError(f"{flag}: the {name} executor takes no such option.",
                             hint=f"{flag} goes with an executor that has it, e.g. --executor slurm")
        table = self.table(name)
        try:
            setattr(table, key, value)
        except ValidationError as e:
            raise RlctlError(f"{flag} {value!r}: {e.errors()[0]['msg']} (executor.{name}.{key}).") from None
        if self.model_extra is not None:
            self.model_extra[name] = table

    def table(self, name: str) -> Any:
        """The `[executor.<name>]` table as its model (defaults when the recipe has none), or None."""
        extras = self.model_extra if self.model_extra is not None else {}
        if name in extras:
            return extras[name]
        model = executor_table_model(name)
        return model() if model is not None else None


class RewardEnvironment(Section):
    id: str
    args: dict[str, Any] = Field(default_factory=dict)


class RewardSection(Section):
    function: str | None = Field(default=None, description="A Python file with the reward function.")
    function_name: str = "reward_func"
    environment: RewardEnvironment | None = None

    @model_validator(mode="after")
    def _one_source(self) -> RewardSection:
        if self.function and self.environment:
            raise ValueError("set either reward.function or reward.environment, not both")
        return self


class CheckpointSection(Section):
    dir: str = "checkpoints"
    final_dir: str | None = Field(default=None, description="Where the final model goes; defaults to <dir>/final.")
    every: Steps | None = Field(default=None, description="Save a checkpoint every this many optimizer steps; unset: "
                                "none during the run, only the final model.")
    keep_last: Steps | None = Field(default=None, description="How many of the newest complete checkpoints stay on "
                                    "disk (with eval sets the best-eval one is kept besides); unset: every checkpoint "
                                    "the run saves stays.")
    resume: str | int = Field(default="off", json_schema_extra={"form": "off, latest or a step number"},
                              examples=["latest", 100])
    save_optimizer: bool = Field(default=True, description="Keep optimizer/DeepSpeed state (needed to resume).")
    sync: str | None = Field(default=None, description="Upload complete checkpoints here (an fsspec URL, "
                             "e.g. s3://bucket/prefix); a `latest` pointer is written last.")
    min_free_gb: Annotated[float, NoBool, Field(ge=0.0, le=1e6)] | None = Field(
        default=None, description="Keep this much disk free beside the next checkpoint: before one would not fit, "
        "rlctl prunes beyond keep_last (never the best or the newest synced), then stops the run after its last "
        "complete checkpoint (docs/resilience.md).")

    @field_validator("resume")
    @classmethod
    def _resume(cls, v: str | int) -> str | int:
        if isinstance(v, str) and v.isascii() and v.isdigit():
            v = int(v)
        if isinstance(v, int):
            if not 0 <= v <= MAX_STEPS:
                raise ValueError(f"checkpoint.resume must be off, latest, or a step number from 0 to {MAX_STEPS}")
            return v
        if v in ("off", "latest"):
            return v
        raise ValueError("checkpoint.resume must be off, latest, or a step number")


class StallSection(Section):
    k: Annotated[float, Field(gt=0.0)] = Field(default=5.0, description="Stalled after k x the median step time.")
    floor_s: Seconds = Field(default=600.0, description="Never stalled sooner than this without a new step. Rollouts "
                             "that fail (the backend's lines for them, e.g. prime-rl's `Rollout task failed`) with no "
                             "step for this long are a stall, restarted under restart = on-failure too "
                             "(docs/supervision.md).")
    first_step_s: Seconds = Field(default=1800.0, description="Grace for the first step (loading, warm-up).")
    slow_step_s: Seconds = Field(default=1800.0, description="Grace for a step with an eval or a save.")
    inference_idle_s: Seconds = Field(
        default=600.0, description="Stalled after this long without a step while the inference engine is gone (its "
        "GPU's memory at ~0 or its process gone) or its GPU and the trainer's both idle (docs/supervision.md).")
    engine_failed_s: Seconds = Field(
        default=300.0, description="Stalled after this long without a step once vLLM's own log says its engine failed "
        "(EngineCore encountered a fatal error, Worker failed with error, ...), whatever the first step's grace; "
        "restarted under restart = on-failure, on-stall or always (docs/supervision.md).")


# The doctor's rule names, which [run] stop_when may name (tests/test_evals.py keeps this equal to
# rlctl.runs.doctor.RULES; the schema cannot import the doctor, which reads recipes).
RULES = ("entropy_collapse", "eval_below_baseline", "eval_divergence", "flat_learning", "frozen_weights",
         "high_truncation", "instability", "length_collapse", "loss_grad_spikes", "non_finite", "reward_hacking",
         "saturated", "zero_variance_groups")


class RunSection(Section):
    """Supervision: what rlctl does when the training process dies or stalls (docs/supervision.md)."""

    restart: Literal["never", "on-failure", "on-stall", "always"] = Field(
        default="never", description="Restart from the latest complete checkpoint on a failure, a stall, or both.")
    max_restarts: _upto(100_000, 0) = Field(default=3, description="Give up (status failed) after this many restarts.")
    stall: StallSection = Field(default_factory=StallSection)
    on: str | list[str] | None = Field(
        default=None, json_schema_extra={"form": "a host name or a list of host names"},
        examples=["box1", ["box1", "box2"]],
        description="An SSH host (rlctl hosts add) to run on, as `launch --on HOST`; a list is a pool: "
        "launch picks the first whose GPUs and disk fit the plan, and `rlctl watch` moves the run to another when its "
        "host is gone (docs/resilience.md).")
    failover_after_s: Annotated[float, NoBool, Field(ge=1.0, le=MAX_SECONDS)] = Field(
        default=300.0, description="A pool run's host unreachable this long is gone: the run fails over to another "
        "host of the pool (a host that answers without the run's processes is gone at once).")
    on_event: str | None = Field(
        default=None, description="A command `rlctl watch` runs on a pool run's failover, death and finish, the event "
        "in its environment (RLCTL_EVENT, RLCTL_RUN, RLCTL_HOST, ...); split like a shell would, never run by one.")
    stop_when: list[str] = Field(
        default_factory=list, description="Doctor findings that stop the run cleanly, e.g. [\"eval_divergence:2\", "
        "\"entropy_collapse\"] (`rule:N` sets the rule's count); the best checkpoint by the primary eval is marked.")

    @field_validator("on")
    @classmethod
    def _hosts(cls, v: str | list[str] | None) -> str | list[str] | None:
        names = [v] if isinstance(v, str) else v or []
        for n in names:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n):
                parts = [p.strip() for p in n.split(",")]
                if isinstance(v, str) and len(parts) > 1 and all(parts):  # a pool written as --on writes it
                    listed = ", ".join(f'"{p}"' for p in parts)
                    raise ValueError(f"run.on {n!r}: not a host name; a pool is a list of host names\n"
                                     f"  fix: on = [{listed}]")
                raise ValueError(f"run.on {n!r}: not a host name (rlctl hosts list shows yours)\n"
                                 '  fix: on = "HOST", or a pool: on = ["HOST1", "HOST2"] (names of rlctl hosts list)')
        twice = sorted({n for n in v if v.count(n) > 1}) if isinstance(v, list) else []
        if twice:  # a pool of box1 twice is not two hosts (as --on box1,box1 and a GPU id named twice)
            raise ValueError(f"run.on = {json.dumps(v)} names {', '.join(twice)} twice; each host is one place to "
                             f"run\n  fix: name each host once: on = {json.dumps(list(dict.fromkeys(v)))}")
        if isinstance(v, list) and not v:
            raise ValueError("run.on = []: name at least one host, or leave the key out to run here")
        return v

    @field_validator("on_event")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        import shlex

        if v is not None:
            try:
                argv = shlex.split(v)
            except ValueError as e:
                raise ValueError(f"run.on_event: {e} (it is split like a shell would)") from None
            if not argv:
                raise ValueError("run.on_event is empty: name a command, or leave the key out")
        return v

    @field_validator("stop_when")
    @classmethod
    def _rules(cls, v: list[str]) -> list[str]:
        for item in v:
            name, _, n = item.partition(":")
            if name not in RULES:
                raise ValueError(f"run.stop_when {item!r}: unknown doctor rule; known: {', '.join(sorted(RULES))}")
            if n and not n.isdigit():
                raise ValueError(f"run.stop_when {item!r}: the count after ':' must be a whole number")
        return v


class WandbSection(Section):
    project: str
    name: str | None = None
    entity: str | None = None
    offline: bool = False


class LoggingSection(Section):
    wandb: WandbSection | None = None
    tensorboard: str | None = None
    rlctl_sinks: list[Literal["wandb", "tensorboard"]] = Field(
        default_factory=list, description="rlctl itself forwards the unified stream to these (besides metrics.jsonl).")


class EvalSetSection(Section):
    """One named held-out set and the mode it is evaluated in (docs/eval.md)."""

    data: str = Field(description="Prompts with labels: a JSONL/JSON/Parquet file or a dataset id.")
    temperature: NonNegFloat = Field(default=0.0, description="0 = greedy.")
    n: PosInt = Field(default=1, description="Samples per prompt.")
    k: PosInt | None = Field(default=None, description="pass@k reported (unbiased estimator); defaults to n.")
    max_tokens: PosInt | None = Field(default=None, description="Max new tokens; defaults to rollout.max_tokens.")
    mode: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.@-]+$",
                             description="The mode's label in metric names (greedy_pass@1, sampling_pass@8, ...); "
                             "derived from temperature, n and k when unset.")
    every: PosInt | None = Field(default=None, description="Evaluate every N steps (at the checkpoints of those "
                                 "steps); default: every complete checkpoint.")
    grader: str | None = Field(default=None, description="exact_match | math | reward (the recipe's reward "
                               "function, correct when >= 1); default: math when the set has labels, else reward.")
    threshold: float = Field(default=1.0, description="grader = reward: a sample is correct when its reward "
                             "reaches this.")
    limit: PosInt | None = Field(default=None, description="Only the first N prompts.")
    in_loop: bool = Field(default=True, description="Let the backend evaluate it in-loop when its release can; "
                          "false: always rlctl's checkpoint evaluator.")


class EvalSection(Section):
    every: Steps | None = None
    temperature: NonNegFloat = 0.0
    n_samples: Samples = 1
    sets: dict[str, EvalSetSection] = Field(
        default_factory=dict, description="Named eval sets, `[eval.sets.<name>]`; `data.eval` with this section's "
        "every/temperature/n_samples is the set `default`.")
    primary: str | None = Field(default=None, description="The set whose metric selects the best checkpoint and "
                                "that stop_when watches; default: the first set.")
    baseline: bool = Field(default=True, description="Evaluate the base model (step 0) before training starts.")
    evaluator: Literal["rlctl", "command"] = Field(
        default="rlctl", description="Who evaluates checkpoints: rlctl's own (vLLM, else transformers) or `command`.")
    command: str | None = Field(default=None, description="The command evaluator's template: {checkpoint} {step} "
                                "{output} {set} {data} {temperature} {n} {k} {max_tokens} {base_model} {run_dir}; "
                                "it writes JSON metrics to {output}.")
    gpu: str | None = Field(default=None, description="CUDA_VISIBLE_DEVICES for checkpoint evals (e.g. \"7\").")
    timeout_s: Annotated[float, Field(gt=0.0)] = Field(default=3600.0, description="An eval job running longer "
                                                       "is killed and recorded as failed.")

    @field_validator("gpu")
    @classmethod
    def _gpu_list(cls, v: str | None) -> str | None:
        from rlctl.core.gpus import check_gpu_list
        from rlctl.errors import RlctlError

        if v is not None:
            try:
                check_gpu_list(v, "eval.gpu", lambda g: f'gpu = "{g}"')
            except RlctlError as e:  # the loader names the file and line
                raise ValueError(e.message.removesuffix(".") + (f"\n  fix: {e.hint}" if e.hint else "")) from None
        return v

    @field_validator("sets")
    @classmethod
    def _set_names(cls, v: dict[str, EvalSetSection]) -> dict[str, EvalSetSection]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                raise ValueError(f"eval set name {name!r}: use letters, digits, '.', '_' and '-'")
        return v

    @model_validator(mode="after")
    def _command(self) -> EvalSection:
        if self.evaluator == "command" and not self.command:
            raise ValueError("eval.evaluator = \"command\" needs eval.command (a template writing JSON to {output})")
        if self.primary is not None and self.sets and self.primary not in self.sets and self.primary != "default":
            raise ValueError(f"eval.primary {self.primary!r} is not a set; sets: {', '.join(self.sets)}")
        return self


class PreflightSection(Section):
    lr_check_step: Steps = Field(default=20, description="By this step the LR must have reached "
                                 "lr_check_min_fraction of the target.")
    lr_check_min_fraction: Fraction = 0.3
    disk_headroom: Fraction = Field(default=0.1, description="Free-space fraction to keep after checkpoints.")
    max_truncated_prompts: Fraction = 0.01
    min_open_files: _upto(2**31 - 1) = 65536


class PatchesSection(Section):
    set: str | None = Field(default=None, description="Patch set name, e.g. `openrlhf/0.9.3`.")
    dir: str | None = None


class DoctorSection(Section):
    model_config = ConfigDict(extra="allow")


class SweepSection(Section):
    """`rlctl sweep RECIPE` reads its variants from here when no --grid is given (docs/experiments.md)."""

    grid: dict[str, list[Any]] = Field(default_factory=dict, description="Dotted key -> the values to try, e.g. "
                                       "`\"optim.lr\" = [1e-6, 2e-6]`; every combination is one arm.")
    seeds: PosInt = Field(default=1, description="Runs per arm, seeded train.seed, train.seed + 1, ...")
    parallel: PosInt | None = Field(default=None, description="Runs at once (default: what the GPUs allow, or 1).")


class Recipe(Section):
    name: str = Field(default="run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100)  # a directory name
    description: str = ""
    backend: BackendSection
    model: ModelSection
    lora: LoraSection | None = None
    data: DataSection
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    train: TrainSection = Field(default_factory=TrainSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    executor: ExecutorSection = Field(default_factory=ExecutorSection)
    reward: RewardSection = Field(default_factory=RewardSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    run: RunSection = Field(default_factory=RunSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    env: dict[str, str] = Field(default_factory=dict)
    preflight: PreflightSection = Field(default_factory=PreflightSection)
    patches: PatchesSection = Field(default_factory=PatchesSection)
    doctor: DoctorSection = Field(default_factory=DoctorSection)
    sweep: SweepSection | None = None

    @model_validator(mode="after")
    def _length(self) -> Recipe:
        if self.train.episodes is None and self.train.steps is None:
            self.train.episodes = 1
        return self

    # -- derived quantities shared by backends and checks --------------------------------------------------------
    @property
    def samples_per_rollout(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.group_size

    @property
    def uses_vllm(self) -> bool:
        """Whether rollouts are generated by vLLM engines (the adapter knows)."""
        from rlctl.backends import get_backend

        return get_backend(self.backend.name).uses_vllm(self)

    @property
    def train_seq_len(self) -> int:
        return self.train.seq_len or self.model.max_model_len

    @property
    def total_gpus(self) -> int:
        return self.resources.nodes * self.resources.gpus_per_node

    @property
    def inference_gpu_count(self) -> int:
        return self.rollout.engines * self.rollout.tensor_parallel

    @property
    def trainer_gpu_count(self) -> int:
        """GPUs running the trainer across all nodes. A backend with no inference engine (`uses_vllm` false: it
        generates in its own processes, or it is a command rlctl cannot see into) leaves no GPU to one; one whose
        engines share the trainer's GPUs as it runs the recipe (Backend.colocated: e.g. TRL's default vllm_mode,
        verl's hybrid engine) trains on all of them, `resources.colocate` or not."""
        if self.resources.trainer_gpus is not None:
            return len(self.resources.trainer_gpus) * self.resources.nodes
        if self.resources.colocate or not self.uses_vllm:
            return self.total_gpus
        from rlctl.backends import get_backend

        if get_backend(self.backend.name).colocated(self):
            return self.total_gpus
        return max(self.total_gpus - self.inference_gpu_count, 0)


# Names users bring from the backends (or from habit), mapped to rlctl's one name for the concept.
ALIASES: dict[str, str] = {
    "n": "rollout.group_size",
    "n_samples_per_prompt": "rollout.group_size",
    "rollouts_per_example": "rollout.group_size",
    "num_generations": "rollout.group_size",
    "group": "rollout.group_size",
    "rollout_batch_size": "rollout.prompts_per_step",
    "batch_size": "rollout.prompts_per_step",
    "generate_max_len": "rollout.max_tokens",
    "max_new_tokens": "rollout.max_tokens",
    "max_response_length": "rollout.max_tokens",
    "max_completion_length": "rollout.max_tokens",
    "prompt_max_len": "data.max_prompt_tokens",
    "max_prompt_length": "data.max_prompt_tokens",
    "seq_len": "model.max_model_len",
    "max_len": "model.max_model_len",
    "vllm_gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "vllm_num_engines": "rollout.engines",
    "vllm_tensor_parallel_size": "rollout.tensor_parallel",
    "tp": "rollout.tensor_parallel",
    "learning_rate": "optim.lr",
    "actor_learning_rate": "optim.lr",
    "lr_warmup_ratio": "optim.warmup_ratio",
    "lr_scheduler": "optim.schedule",
    "max_norm": "optim.max_grad_norm",
    "clip_grad": "optim.max_grad_norm",
    "init_kl_coef": "algorithm.kl_coef",
    "kl_loss_coef": "algorithm.kl_coef",
    "beta": "algorithm.kl_coef",
    "num_episodes": "train.episodes",
    "max_steps": "train.steps",
    "total_training_steps": "train.steps",
    "micro_train_batch_size": "train.micro_batch_size",
    "pretrain": "model.path",
    "prompt_data": "data.train",
    "max_ckpt_num": "checkpoint.keep_last",
    "save_steps": "checkpoint.every",
    "save_freq": "checkpoint.every",
    "eval_steps": "eval.every",
    "test_freq": "eval.every",
    "lora_rank": "lora.rank",
    "lora_alpha": "lora.alpha",
    "advantage_estimator": "algorithm.name",
    "adv_estimator": "algorithm.name",
}


def _section_models() -> dict[str, type[BaseModel]]:
    out: dict[str, type[BaseModel]] = {}

    def walk(prefix: str, model: type[BaseModel]) -> None:
        out[prefix] = model
        for name, field in model.model_fields.items():
            sub = submodel(field.annotation)
            if sub is not None and sub is not DoctorSection:
                walk(f"{prefix}.{name}" if prefix else name, sub)

    walk("", Recipe)
    return out


def submodel(annotation: Any) -> type[BaseModel] | None:
    """The section model an annotation holds (`LoraSection | None` -> LoraSection), else None."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = submodel(arg)
        if found is not None:
            return found
    return None


SECTIONS: dict[str, type[BaseModel]] = _section_models()


def all_key_paths() -> list[str]:
    """Every leaf key of the schema as a dotted path (sections themselves included)."""
    paths: list[str] = []
    for prefix, model in SECTIONS.items():
        for name in model.model_fields:
            paths.append(f"{prefix}.{name}" if prefix else name)
    return paths
