"""What every backend adapter provides (DESIGN.md, "The Backend protocol") and the pieces they share."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rlctl.errors import RlctlError

if TYPE_CHECKING:
    from rlctl.core.checkpoint import Checkpoint
    from rlctl.recipe.schema import Recipe

from rlctl.core.components import Component  # noqa: E402
from rlctl.core.secrets import NOT_SECRET, SECRET_PATTERN, is_secret_name  # noqa: E402,F401  (re-exported)

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
# In a run directory made by `rlctl attach`: how to read the run's logs (a metrics map, a step key, log patterns),
# for an adapter that reads any trainer's logs (Backend.reads_any_log)
PARSER_OPTIONS = "log_parser.json"

@dataclass
class Finding:
    """One result of validating a rendered plan against the backend's definitions."""

    level: str  # "error" | "warn" | "note" (how the recipe runs: said by render and preflight, nothing to fix)
    key: str
    message: str
    fix: str | None = None
    set: dict[str, Any] | None = None  # the fix as recipe keys -> values, where computed (preflight vets it)


@dataclass
class Inert:
    """A recipe key whose value cannot change what trains, as the backend runs the recipe (Backend.inert): the PPO
    clip range where the ratio pi/pi_old is exactly 1 at every update, a key an extra overrides. Two runs that differ
    only in such keys train identically."""

    key: str  # the recipe key, dotted: "algorithm.eps_clip", "backend.trl.extra.epsilon_high"
    why: str  # in the backend's own terms (its config keys and values as rendered)
    fix: str  # what makes it act, in words
    set: dict[str, Any] | None = None  # that fix as recipe keys, where one exists
    # False: the key is not rendered at all, and unhonoured() already says so (render, env.flags): preflight's
    # algorithm.inert does not say it again
    rendered: bool = True


@dataclass(frozen=True)
class CheckpointCopies:
    """Checkpoints on disk at once, at most (Backend.checkpoint_copies): `kept` (keep_last, or every one the run
    saves; None when that count is unknown), `best` (1: the best-eval checkpoint rlctl keeps besides), `writing` (1:
    the next one, written before the oldest goes)."""

    kept: int | None
    best: int
    writing: int
    why: str  # what `kept` is, in words

    @property
    def stay(self) -> int | None:
        return None if self.kept is None else self.kept + self.best

    @property
    def total(self) -> int | None:
        return None if self.kept is None else self.kept + self.best + self.writing

    def words(self) -> str:
        """`keep_last 3 + the best-eval checkpoint + the one being written = 5`."""
        parts = [self.why] + (["the best-eval checkpoint"] if self.best else []) + \
            (["the one being written"] if self.writing else [])
        return " + ".join(parts) + (f" = {self.total}" if len(parts) > 1 and self.total is not None else "")


@dataclass
class LaunchPlan:
    backend: str
    version: str | None
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # path relative to the run directory -> content
    cwd: str = "."
    total_steps: int | None = None
    keys: list[str] = field(default_factory=list)  # backend-native flags/keys set, for validation
    notes: list[str] = field(default_factory=list)
    # variables the argv refers to as ${NAME} and what to set them to: launch.sh checks them before anything runs
    required_env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The backend and its release as people read them: `trl 1.16.0`, `command (any version)`, never `None`."""
        return f"{self.backend} {self.version or '(any version)'}"

    def masked_env(self) -> dict[str, str]:
        return {k: (f"${{{k}}}" if is_secret_name(k) else v) for k, v in self.env.items()}

    def script(self) -> str:
        """A launch.sh a person could run by hand from the run directory. Secrets stay references."""
        lines = ["#!/usr/bin/env bash", f"# rendered by rlctl for {self.backend} {self.version or ''}".rstrip(),
                 "set -euo pipefail", 'cd "$(dirname "$0")"']
        if self.cwd != ".":
            lines.append(f"cd {shlex.quote(self.cwd)}")
        for k, v in self.masked_env().items():
            if v == f"${{{k}}}":
                lines.append(f': "${{{k}:?{k} must be set in the environment}}"')
                lines.append(f"export {k}")
            else:
                lines.append(f"export {k}={shlex.quote(v)}")
        for k, what in self.required_env.items():
            if any(f"${{{k}}}" in a for a in self.argv):
                msg = shlex.quote(f"launch.sh: {k} is not set; {what}")
                lines += [f'if [ -z "${{{k}:-}}" ]; then', f"  echo {msg} >&2", "  exit 2", "fi"]
        lines.append(" \\\n  ".join(" ".join(_quote_arg(a) for a in group) for group in _arg_lines(self.argv)))
        return "\n".join(lines) + "\n"

    def render_text(self) -> str:
        parts = [f"# backend: {self.label}"]
        if self.total_steps is not None:
            parts.append(f"# optimizer steps: {self.total_steps}")
        parts += [f"# note: {n}" for n in self.notes]
        parts.append("## launch.sh")
        parts.append(self.script())
        for name, content in self.files.items():
            parts.append(f"## {name}")
            parts.append(content if content.endswith("\n") else content + "\n")
        return "\n".join(parts)

    def write(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name, content in self.files.items():
            p = out / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)
            written.append(p)
        script = out / "launch.sh"
        script.write_text(self.script())
        script.chmod(0o755)
        written.append(script)
        return written


def _arg_lines(argv: list[str]) -> list[list[str]]:
    """Group a command line for display: the program, then one line per flag with its values."""
    groups: list[list[str]] = []
    for a in argv:
        if not groups or (a.startswith("-") and a != "-") or groups[-1] == ["--"]:
            groups.append([a])
        else:
            groups[-1].append(a)
    return groups


def _quote_arg(a: str) -> str:
    # keep ${VAR} references expandable in the script while quoting everything else
    if re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", a):
        return f'"{a}"'
    return shlex.quote(a)


@dataclass
class MemoryFeatures:
    """What a backend's trainer does with memory beyond the recipe's plain fields, as the backend resolves it (its
    defaults for the version, the recipe, and passthrough keys). rlctl.estimate.memory turns it into bytes."""

    checkpoint_every: int | None = 1  # activation checkpointing of every N-th decoder layer; None: off
    activation_offload: int | None = None  # saved activations go to CPU, this many kept on the GPU; None: off
    optimizer: str = "gpu"  # Adam states: gpu | step (on the GPU for the optimizer step only) | cpu
    logits_chunk: int | None = None  # elements (tokens x vocab) of a fused chunked log-prob head; None: materialized
    token_budget: tuple[str, int] | None = None  # dynamic batching: (the key, tokens per micro batch per GPU)
    logit_bytes: float | None = None  # bytes per token x vocab of materialised logits, when it depends on the recipe
    reference_on_gpu: bool = True  # False: the reference model's weights stay on the CPU (forward-only offload)
    unsharded_grad_bytes: float = 0.0  # per trainable parameter, held unsharded on every GPU while micro batches
    # accumulate (FSDP no_sync): not divided by the GPUs
    reference_process: bool = False  # the reference model is its own process on the trainer's GPU (its weights and
    # its own CUDA context beside the trainer's, outside the trainer's allocator)
    transient_slack: float | None = None  # reserved beyond the allocated peak, in multiples of the step's transient
    # terms (activations, logits, reduce bucket, the step's extra), measured for this trainer; None: the engine's ratio
    trainer_sleeps: bool = False  # colocated: the trainer's weights and optimizer states leave the GPU while the
    # engine generates (OpenRLHF --ds.enable_sleep)
    notes: list[str] = field(default_factory=list)


class UnknownVersion(RlctlError):
    """A backend release rlctl has no dialect for: never guessed from a neighbour."""



@dataclass
class EffectiveRecipe:
    """What would run, as a recipe (Backend.effective)."""

    recipe: Any
    # recipe key -> what replaced its value (one line, said with every check that could read it)
    replaced: dict[str, str] = field(default_factory=dict)
    # recipe keys a pass-through option sets, whatever the value: setting them in the recipe changes nothing that
    # runs, so a computed fix must not set them
    held: frozenset[str] = frozenset()


class LazyTable:
    """A `table_model` named "module:Class", imported when first asked for: an adapter whose `[backend.<name>]` table
    is a pydantic model keeps pydantic's import (~0.1 s) out of the commands that only read its logs (attach,
    status), which load the adapter and never look at the table."""

    def __init__(self, path: str):
        self.path = path

    def __get__(self, obj: Any, owner: Any = None) -> type:
        import importlib

        module, _, name = self.path.partition(":")
        return getattr(importlib.import_module(module), name)

class Backend:
    """One RL framework, as rlctl knows it. Stateless and cheap; never imports the backend's runtime.

    Everything rlctl knows about a backend lives in its adapter (a subclass of this): the core asks, and never names
    a backend. Class attributes declare facts; methods give per-recipe answers. Defaults here are the neutral answer.
    """

    name: ClassVar[str]
    packages: ClassVar[tuple[str, ...]] = ()  # distributions whose version decides the dialect (first = the backend)
    known_versions: ClassVar[tuple[str, ...]] = ()  # every release rendered and checked exactly
    recorded_packages: ClassVar[tuple[str, ...]] = ()  # versions worth recording in env.json besides the common ones
    needs_local_install: ClassVar[bool] = False  # True: the runtime must be importable where rlctl launches
    runs_on_cpu: ClassVar[bool] = False  # True: a run needs no GPU (resources.gpus_per_node = 0 is fine)
    install_hint: ClassVar[str] = ""  # how to get the runtime, besides `pip install <package>`
    on_pypi: ClassVar[bool] = True  # False: `pip install <package>` cannot work, install_hint is the only way
    honours_micro_batch: ClassVar[bool] = True  # False: the trainer forms its own micro batches (packing)
    # True: the trainer's optimizer steps count micro batches across rollouts (DeepSpeed's accumulation), so a rollout
    # need not split into whole train batches (the adapter warns that updates straddle rollouts)
    updates_straddle_rollouts: ClassVar[bool] = False
    # True: an inference engine's tensor parallel group may span nodes (its workers are placed by Ray wherever GPUs
    # are free), so TP > gpus_per_node runs, slowly, over the network: a warning, not a failure
    tp_spans_nodes: ClassVar[bool] = False
    # True: a train batch that is not a multiple of micro batch x GPUs still runs (TRL rounds the accumulation, verl
    # makes the last micro batch smaller) rather than being refused; the adapter says what runs
    train_batch_rounds: ClassVar[bool] = False
    # True: the backend's own code refuses a group-normalised algorithm with one sample per prompt (False: it runs it,
    # learning nothing; preflight warns)
    refuses_single_sample_groups: ClassVar[bool] = True
    sharding: ClassVar[str] = "plain"  # memory engine of the trainer: plain | fsdp (FSDP2) | fsdp1 | deepspeed
    # the optimizer step's temporaries: torch's AdamW (foreach, its default on CUDA) makes one tensor the size of the
    # trainable parameters (sqrt of exp_avg_sq); fused implementations (torch fused, DeepSpeed FusedAdam) none
    foreach_adam: ClassVar[bool] = True
    table_model: ClassVar[type | None] = None  # pydantic model of `[backend.<name>]` (a BackendExtra subclass)
    # keys of that table that name local files or directories: resolved like every recipe path (rlctl.recipe.paths)
    table_paths: ClassVar[tuple[str, ...]] = ()
    # what the backend needs across several nodes: "ray" (a Ray cluster it joins through RAY_ADDRESS), "torchrun"
    # (one launcher per node, rendezvous on the first) or None (one node only); a batch executor brings it up
    multi_node_launcher: ClassVar[str | None] = None
    metric_needles: ClassVar[tuple[str, ...]] = ()  # cheap substrings a metrics line contains (a pre-filter)

    def multi_node(self, recipe: Recipe) -> str | None:
        """"ray", "torchrun" or None: how this recipe's processes span nodes (see multi_node_launcher)."""
        del recipe  # Unused: the class declares it
        return self.multi_node_launcher

    # ---- version ---------------------------------------------------------------------------------------------
    def install_hint_for(self, recipe: Recipe) -> str:
        """How to get the runtime this recipe renders for (a checkout names its release's tag); install_hint by
        default."""
        return self.install_hint

    def target_version(self, recipe: Recipe) -> str | None:
        """The release the recipe renders for: pinned, else installed, else the newest known."""
        from rlctl.backends._static import installed_version

        version = recipe.backend.version or (installed_version(self.packages[0]) if self.packages else None)
        if version is None:
            return self.known_versions[-1] if self.known_versions else None
        self.require_known(version)
        return version

    def require_known(self, version: str) -> None:
        if self.known_versions and version not in self.known_versions:
            raise UnknownVersion(
                f"{self.name} {version} is not known to rlctl; known: {', '.join(self.known_versions)}. "
                f"Set backend.version to one of them (and install it), or add the release to rlctl's "
                f"{self.name} adapter."
            )

    # ---- plan ------------------------------------------------------------------------------------------------
    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        raise NotImplementedError

    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        return []

    def unhonoured(self, recipe: Recipe) -> list[Finding]:
        """Recipe keys this backend/release cannot honour: each one is said, never dropped silently."""
        return []

    def honours(self, recipe: Recipe, key: str) -> bool | None:
        """Whether this backend/release has a knob for the recipe key `key` (dotted: "algorithm.eps_clip"), so that
        advice (doctor's actions) may name it. None: cannot tell. Default: move the key off its value in a copy of
        the recipe and ask unhonoured() whether it would be ignored."""
        if key == "model.precision":  # a knob only where the adapter renders more than one precision
            return len(self.precisions) > 1
        section, _, field_name = key.partition(".")
        part = getattr(recipe, section, None)
        value = getattr(part, field_name, None) if part is not None else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if isinstance(value, int):
            moved: float = value * 2 if value else 1
        else:
            moved = value / 2 if value else 0.1
        try:
            probe = recipe.model_copy(update={section: part.model_copy(update={field_name: moved})})
            return not any(f.key == key for f in self.unhonoured(probe))
        except Exception:  # an adapter that cannot judge this recipe (unknown release, ...): unknown
            return None

    def inert(self, recipe: Recipe) -> list[Inert]:
        """Recipe keys whose value cannot change what trains under this recipe's rendered settings, each with why in
        the backend's own terms and what makes it act (Inert): e.g. the PPO clip range where each rollout batch gets
        one optimizer step, so the ratio pi/pi_old is exactly 1 at its only update and the clip never binds. Every
        key the adapter knows to be so, set or not: preflight's algorithm.inert warns for those the recipe sets, and
        `rlctl ab`/`sweep` refuse arms that differ only in them (rlctl.experiments.variants.inert_only). Default:
        none known (never a guess)."""
        del recipe  # Unused
        return []

    def uses_vllm(self, recipe: Recipe) -> bool:
        return True

    # ---- held-out evaluation (rlctl.evals) -----------------------------------------------------------------------
    # what the adapter renders into the backend's own in-loop eval: the single `data.eval` set (with eval.every,
    # eval.temperature, eval.n_samples), or nothing; every other set goes to rlctl's checkpoint evaluator
    in_loop_eval_single: ClassVar[bool] = False

    def in_loop_eval(self, recipe: Recipe, sets: list[Any]) -> tuple[list[Any], list[tuple[Any, str]]]:
        """(eval sets this release evaluates in-loop as rendered, [(set, why not)]): what it cannot run is handed to
        rlctl's checkpoint evaluator, never dropped. Default: the single `data.eval` set when the adapter renders it
        (`in_loop_eval_single`), named sets never (one in-loop eval slot, and rlctl keeps it for `data.eval`)."""
        inside, outside = [], []
        for s in sets:
            if s.legacy and self.in_loop_eval_single:
                inside.append(s)
            elif not s.in_loop:
                outside.append((s, "in_loop = false"))
            elif self.in_loop_eval_single:
                outside.append((s, "its one in-loop eval slot holds data.eval (named sets are not rendered in-loop)"))
            else:
                outside.append((s, "rlctl renders no in-loop eval for it"))
        return inside, outside

    def in_loop_eval_run(self, recipe: Recipe) -> dict[str, Any] | None:
        """What the backend's own in-loop eval runs, read from what this adapter renders (extras included): an
        rlctl.evals.in_loop.context(set, temperature, n, greedy), kept in the run directory at launch so that its
        metrics are named `eval/<set>/<mode>` (docs/eval.md). None: no in-loop eval rendered."""
        del recipe  # Unused
        return None

    # An adapter whose parser reads in-loop eval metrics defines `name_in_loop_evals(record, ctx) -> record`: the
    # record with its `eval/<source>/<backend metric>` keys renamed for the context above (rlctl.evals.in_loop).

    def prompt_limit(self, recipe: Recipe) -> str | None:
        """How this backend (release) holds prompts to data.max_prompt_tokens, in words (it truncates them, drops
        them, fails on them); None: it does not, so a longer prompt reaches the inference engine as it is and a
        context budget computed from data.max_prompt_tokens is an assumption, not a fact."""
        del recipe  # Unused
        return None

    def enforces_prompt_limit(self, recipe: Recipe) -> bool:
        return self.prompt_limit(recipe) is not None

    def engine_context(self, recipe: Recipe) -> tuple[int, str]:
        """(the context length the backend gives its inference engine (vLLM's max_model_len), how it is set).
        Default: model.max_model_len, rendered as it is; an adapter that sizes vLLM otherwise says so."""
        return recipe.model.max_model_len, "max_model_len"

    def overlong_request(self, recipe: Recipe) -> str:
        """What a rollout longer than engine_context() does as this backend runs the recipe: vLLM rejects the request
        (the rollout hangs); a trainer generating with its own model (no vLLM) is held to no context at all."""
        if self.uses_vllm(recipe):
            return "vLLM rejects such requests: rollouts hang with no error in the main log"
        return (f"{self.name} generates with the trainer's own model, no inference engine: nothing enforces "
                "model.max_model_len, so samples run to prompt + max_tokens, past the context the recipe and rlctl's "
                "memory plan assume")

    def refuses_single_sample(self, recipe: Recipe) -> bool:
        """Whether this backend's own code refuses the recipe's group-normalised algorithm with group_size 1."""
        return self.refuses_single_sample_groups

    def colocated(self, recipe: Recipe) -> bool:
        """Whether trainer and engines share GPUs as this backend runs the recipe (verl's hybrid engine always)."""
        return recipe.resources.colocate

    def gpu_roles(self, recipe: Recipe) -> list[set[str]] | None:
        """What each GPU of a node holds as this backend places the run, by the run's local GPU index: "trainer",
        "vllm" (the rollout engines) or both (the memory plan adds them up per GPU); None where the backend's
        scheduler picks which GPU holds what (Ray placement groups): only the counts are known then. Default: the
        recipe's trainer_gpus / inference_gpus; colocated, every GPU holds both; else the engines on the first
        GPUs and the trainer on the rest."""
        r, res = recipe, recipe.resources
        n = res.gpus_per_node
        if not self.uses_vllm(r):
            return [{"trainer"} for _ in range(n)]
        both = self.colocated(r)
        n_inf = r.inference_gpu_count // max(res.nodes, 1)
        inf = set(res.inference_gpus) if res.inference_gpus is not None else \
            set(range(n)) if both else set(range(min(n_inf, n)))
        trn = set(res.trainer_gpus) if res.trainer_gpus is not None else \
            set(range(n)) if both else set(range(n)) - inf
        return [{role for role, ids in (("trainer", trn), ("vllm", inf)) if i in ids} for i in range(n)]

    def trainer_gpus(self, recipe: Recipe) -> int:
        """GPUs the trainer runs on as this backend places it (its data-parallel size)."""
        return recipe.total_gpus if self.colocated(recipe) and recipe.resources.trainer_gpus is None \
            else recipe.trainer_gpu_count

    def samples_per_step(self, recipe: Recipe) -> int:
        """Samples one rollout generates as this backend counts them (default: prompts_per_step x group_size)."""
        return recipe.samples_per_rollout

    def effective(self, recipe: Recipe) -> EffectiveRecipe:
        """The recipe with the values the rendered command really runs with (EffectiveRecipe). A backend whose
        pass-through options can override what it renders from the recipe returns the recipe those options amount
        to, so that preflight checks what would run, not what the recipe says; by default the recipe is what runs."""
        return EffectiveRecipe(recipe)

    def complete_fix(self, recipe: Recipe, values: dict[str, Any]) -> dict[str, Any]:
        """A computed fix (recipe keys -> values) with whatever else it needs so that the backend's pass-through
        options do not newly override what the fixed recipe renders (an option that repeated a derived value would
        otherwise start overriding it); by default the fix as it is."""
        return values

    def placement_errors(self, recipe: Recipe) -> list[Finding]:
        """Placements of GPUs, engines and TP that this backend's own code refuses beyond rlctl's shared arithmetic
        (e.g. a colocation that must be exactly engines x TP). unhonoured() reports them (render refuses) and
        preflight's placement.gpus FAILs with them: the two say the same."""
        return []

    # ---- steps and schedule ------------------------------------------------------------------------------------
    def total_steps(self, recipe: Recipe, dataset_size: int | None) -> int | None:
        return recipe.train.steps

    def warmup_steps(self, recipe: Recipe, total: int) -> int:
        return 0

    def steps_formula(self, recipe: Recipe, dataset_size: int) -> str:
        """How total_steps() counts optimizer steps from the dataset, for people to check."""
        r = recipe
        return (f"{dataset_size} prompts x {r.rollout.group_size} samples // {r.train.train_batch_size} per step "
                f"x {r.train.episodes} episodes")

    def schedule(self, recipe: Recipe, dataset_size: int | None) -> list[float]:
        return []

    def optimizer_steps_per_logged_step(self, recipe: Recipe) -> int:
        """How many optimizer steps one `step` of the backend's own log stands for (progress and ETA)."""
        return 1

    # ---- metrics -----------------------------------------------------------------------------------------------
    # True: the adapter reads any trainer's JSON lines (and log patterns) given a metrics map; `attach --backend auto`
    # falls back to it, saying so, when no adapter recognises a log, and never counts it as recognising one
    reads_any_log: ClassVar[bool] = False

    def parse(self, line: str) -> dict[str, Any] | None:
        """One log line -> a record in rlctl's unified names (with `step`), or None."""
        return None

    def parser_options(self, recipe: Recipe | None, metrics_map: dict[str, str] | None) -> dict[str, Any] | None:
        """How to read a run rlctl did not launch (`attach --recipe/--metrics-map`): the recipe's metrics declarations
        with the explicit map on top, as JSON-able options for `options_parser`. None: this backend's log format is
        fixed and takes no options."""
        del recipe, metrics_map  # Unused
        return None

    def options_parser(self, options: dict[str, Any] | None) -> Any:
        """A parser (line or row -> record) for parser options; its `metric_needles` attribute, when it has one,
        replaces the adapter's pre-filter. Default: `parse`."""
        del options  # Unused
        return self.parse

    def log_parser(self, run_dir: Path | None) -> Any:
        """The parser of one run's logs: `options_parser` of the options attach left in the run directory, if any."""
        if run_dir is not None and (run_dir / PARSER_OPTIONS).is_file():
            try:
                return self.options_parser(json.loads((run_dir / PARSER_OPTIONS).read_text()))
            except (OSError, ValueError):
                pass
        return self.parse

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def checkpoints(self, root: Path) -> list[Checkpoint]:
        """The checkpoints under a checkpoint root, oldest first, each marked complete or not."""
        return []

    # a restart resumes from one checkpoint, and the attempt record, the stream's step and the backend must agree on
    # it (rlctl.runs.resume): which one, what the backend's own resume reads, and what it will really load
    def resume_checkpoint(self, root: Path, ckpts: list[Checkpoint]) -> Checkpoint | None:
        """The checkpoint a restart resumes from: the newest complete one whose state the backend's resume can load.
        Default: the newest complete one."""
        del root  # Unused
        done = [c for c in ckpts if c.complete]
        return done[-1] if done else None

    def point_resume(self, root: Path, ckpt: Checkpoint | None) -> list[str]:
        """Before a restart from `ckpt` (None: from the start), in the run's own checkpoint root: make what the
        backend's resume reads there name `ckpt`; returns what was changed, in words (the attempt record keeps them).
        Default: nothing to change, the rendered command names the step (checkpoint.resume)."""
        del root, ckpt  # Unused
        return []

    def resumes_from(self, root: Path, ckpt: Checkpoint | None) -> Checkpoint | None:
        """The checkpoint the backend will load, rendered to resume from `ckpt`, with root as it is now. Default:
        `ckpt` (the rendered command names its step)."""
        del root  # Unused
        return ckpt

    def recipe_start(self, recipe: Recipe, root: Path) -> str | None:
        """Where the backend starts when a restart has no complete checkpoint to resume from and renders the recipe's
        own checkpoint.resume again (its own starting point), in words for the run's log, events and status; None:
        from the start (the recipe's model). Default: the step the recipe names, which the rendered command asks for
        (`latest` finds nothing complete: the start)."""
        del root  # Unused
        resume = recipe.checkpoint.resume
        return f"checkpoint.resume = {resume}" if isinstance(resume, int) else None

    def mark_checkpoint_root(self, root: Path) -> None:
        """Before each attempt rlctl starts (where the run lives): leave under root what `checkpoints(root)` must know
        of rlctl's rendering before the first save (OpenRLHF: every checkpoint has an HF export). Default: nothing."""
        del root  # Unused

    def evaluable_fix(self, ckpt: Checkpoint) -> str | None:
        """How to give an evaluator a model from a checkpoint that holds none it can load (None: nothing known)."""
        del ckpt  # Unused
        return None

    def eval_label_key(self, recipe: Recipe) -> str | None:
        """Where rlctl's evaluator finds an eval row's label (a dotted path into nested columns is allowed): where
        the backend's own reward reads it."""
        return recipe.data.label_key

    def export_for_eval(self, ckpt: Checkpoint) -> list[str] | None:
        """The backend's own command (argv after the Python interpreter) that writes an HF model where the evaluator
        looks for it (Checkpoint.model_paths), for a checkpoint that holds none; None: the backend has none."""
        del ckpt  # Unused
        return None

    def describe_checkpoints(self, recipe: Recipe, root: Path) -> None:
        """A run rlctl did not start (`attach --recipe`): leave under `root` what `checkpoints(root)` needs to read the
        recipe's checkpoint layout, as a launch would. Nothing for a backend whose layout is its own."""
        del recipe, root  # Unused

    def checkpoint_bytes(self, arch: Any, recipe: Recipe) -> tuple[float, str]:
        """(bytes one checkpoint takes on disk, what it holds). Default: an HF model (or adapter) + fp32 Adam. A PEFT
        adapter is saved in the dtype it trains in (param_dtype): fp32 under mixed precision, because get_peft_model
        upcasts bf16/fp16 adapters (autocast_adapter_dtype=True), not the base model's dtype."""
        r = recipe
        P = arch.params
        T = arch.lora_params(r.lora.rank, r.lora.target_modules) if r.lora else P
        w = 2 if r.model.dtype in ("bfloat16", "float16") else 4
        adapter = 2 if self.param_dtype(r) in ("bfloat16", "float16") else 4
        return (T * adapter if r.lora else P * w) + (T * 2 * 4 if r.checkpoint.save_optimizer else 0), \
            "HF model + optimizer"

    def lighter_checkpoints(self, recipe: Recipe) -> list[dict[str, Any]]:
        """Recipe changes (keys -> values) that make this backend's checkpoints smaller, beyond not saving the
        optimizer: candidates for the disk check's computed fix. Default: none."""
        del recipe  # Unused
        return []

    def saved_checkpoints(self, recipe: Recipe, total_steps: int) -> int:
        """How many checkpoints a whole run writes (before any pruning): one every checkpoint.every steps."""
        every = recipe.checkpoint.every
        return max(total_steps // every, 1) if every else 1

    def checkpoint_copies(self, recipe: Recipe, total_steps: int | None = None) -> CheckpointCopies:
        """How many checkpoints are on disk at once, at most: the one function the disk check, render/preflight's
        rotation note and docs/eval.md count with. keep_last when set, plus the best-eval checkpoint where rlctl
        rotates (rotation_by_rlctl, and it prunes during the run), plus the next one, written before the oldest goes;
        without keep_last every checkpoint the run saves (saved_checkpoints; unknown without a step count)."""
        r = recipe
        if not r.checkpoint.every:
            return CheckpointCopies(1, 0, 0, "the final checkpoint")
        keep = r.checkpoint.keep_last
        if keep:
            return CheckpointCopies(keep, self._keeps_best_besides(r), 1, f"keep_last {keep}")
        if total_steps:
            n = self.saved_checkpoints(r, total_steps)
            return CheckpointCopies(n, 0, 0, f"every checkpoint of the run ({n}: no keep_last)")
        return CheckpointCopies(None, 0, 0, "every checkpoint of the run (no keep_last; the step count is unknown)")

    def kept_checkpoints(self, recipe: Recipe) -> int | None:
        """How many checkpoints stay on disk after the backend's and rlctl's pruning (None = all): keep_last + the
        best-eval checkpoint where rlctl keeps it besides (checkpoint_copies without the one being written)."""
        keep = recipe.checkpoint.keep_last
        return keep + self._keeps_best_besides(recipe) if keep else None

    def _keeps_best_besides(self, recipe: Recipe) -> int:
        """1 where rlctl rotates (rotation_by_rlctl) and prunes during the run, keeping the best-eval checkpoint
        besides the keep_last newest (rlctl.runs.checkpoints.prune_during_run, keep_best=True)."""
        return 1 if self.rotation_by_rlctl(recipe) and self.prune_during_run(recipe) else 0

    def prune_during_run(self, recipe: Recipe) -> bool:
        """True when rlctl must prune to keep_last while the run goes (the backend keeps more on its own)."""
        return False

    def restart_loses(self, recipe: Recipe) -> str | None:
        """What a restart from this recipe's checkpoints starts without, in words (preflight's run.restart warns with
        it); None: it resumes all of the training state, or the adapter does not say (the default)."""
        del recipe  # Unused
        return None

    def min_keep_last(self, recipe: Recipe) -> tuple[int, str] | None:
        """The smallest checkpoint.keep_last that leaves a complete checkpoint on disk while the next one is written,
        and why (preflight's run.keep_last, and the keep_last the disk check may propose), where the backend's own
        rotation deletes before it saves. None: any keep_last does (a rotation that deletes after the save, or
        rlctl's, which never deletes the newest complete checkpoint)."""
        del recipe  # Unused
        return None

    # what becomes of the backend's own checkpoint rotation when rlctl rotates instead (render/preflight's note)
    own_rotation: ClassVar[str | None] = None

    def rotation_by_rlctl(self, recipe: Recipe) -> bool:
        """keep_last with eval sets: a backend's rotation deletes by age, the best-eval checkpoint included, so the
        adapter renders its own rotation (`own_rotation`) off and rlctl's supervisor prunes to keep_last, never the
        checkpoint marked best (nor one still to be evaluated): rlctl.runs.checkpoints.prune_during_run."""
        has_sets = bool(recipe.data.eval or recipe.eval.sets)  # what rlctl.evals.sets.eval_sets reads
        return bool(recipe.checkpoint.keep_last) and has_sets

    # ---- checks ------------------------------------------------------------------------------------------------
    # the checks of this backend's rules that consult a patch set's manifest `fixes` (only those can go silent):
    # what a manifest may name there (rlctl.patching.fixable_checks)
    patch_fixable: tuple[str, ...] = ()
    # the checks preflight(ctx, family) below may emit that are not registered checks, by family: what
    # `rlctl preflight --only NAME` accepts and runs (inside the registered check that asks for that family)
    checks: ClassVar[dict[str, tuple[str, ...]]] = {}

    def preflight(self, ctx: Any, family: str) -> list[Any]:
        """This backend's own rules for one check family ("disk", "placement", "env", ...), as preflight Results.
        `ctx` is the preflight Context (recipe, arch, dataset size, total steps)."""
        return []

    # ---- launching -----------------------------------------------------------------------------------------------
    def prepare_launch(self, plan: LaunchPlan, run_dir: Path) -> LaunchPlan:
        """Adjust a plan for launching from run_dir (e.g. which interpreter runs it). Default: as rendered."""
        return plan

    def patch_locally(self, recipe: Recipe) -> bool:
        """Whether patches apply to this machine's site-packages (not when the backend runs on a remote cluster)."""
        from rlctl.executors import get

        return not get(recipe.resources.executor).remote

    def stall_patterns(self) -> list[str]:
        """Regexes of log lines that mean the run is stuck or a component it needs died."""
        return []

    def rollout_failure(self, line: str) -> str | None:
        """The error of a rollout that failed, where this line of the run's output says one did; else None. For a
        backend that logs each failed rollout and goes on: while every rollout fails no step completes and nothing
        exits, so the supervisor counts them (rlctl.runs.stall) and names the cause."""
        del line  # Unused: a backend that says nothing of its rollouts
        return None

    def log_components(self, recipe: Recipe) -> dict[str, Component]:
        """Where each component of a run of this recipe writes its own log (`rlctl logs RUN --component`; the causes
        of death read the inference engine's). Default: the trainer's output is the run's stdout.log."""
        return {"trainer": Component("trainer", main_log=True, where="the run's stdout.log")}

    # ---- memory engine and precision (rlctl.estimate.memory, rlctl.preflight.precision) --------------------------
    logits_scope: ClassVar[str] = "sequence"  # log-probs over: sequence (prompt + response) | completion only
    colocation: ClassVar[str] = "resident"  # a colocated vLLM engine: resident | sleep (frees memory while training)
    sleep_switch: ClassVar[str | None] = None  # a backend extra that turns the engine's sleep mode on

    precisions: ClassVar[tuple[str, ...]] = ("mixed",)  # model.precision values the adapter renders

    def param_dtype(self, recipe: Recipe) -> str:
        """The dtype of what the optimizer updates (master parameters, gradients, Adam states). model.precision
        `mixed` (the default): float32; `pure` (where the adapter renders it): model.dtype itself."""
        if recipe.model.precision == "pure" and "pure" in self.precisions:
            return "bfloat16" if recipe.model.dtype == "auto" else recipe.model.dtype
        return "float32"

    def colocation_mode(self, recipe: Recipe) -> str:
        if self.sleep_switch and recipe.backend.extra().get(self.sleep_switch):
            return "sleep"
        return self.colocation

    lora_base_master: ClassVar[bool] = False  # True: with LoRA the frozen base is held like master weights (FSDP)
    # bytes per (token x vocab) of the log-prob computation at its peak, bf16 compute: fp32 logits + fp32
    # log-softmax kept for backward + the bf16 logits (14.5 measured on an FSDP2 trainer shaped like prime-rl/verl)
    logit_bytes: ClassVar[float] = 14.5

    def memory_engine(self, recipe: Recipe) -> str:
        """The trainer's memory engine for this recipe (a backend with several picks it from the recipe)."""
        return self.sharding

    def memory_features(self, recipe: Recipe) -> MemoryFeatures:
        """Checkpointing, offloading, fused log-prob heads and dynamic batching as this backend really runs them.
        Default: the recipe's gradient checkpointing of every layer, everything else plain."""
        return MemoryFeatures(checkpoint_every=1 if recipe.train.gradient_checkpointing else None,
                              optimizer="cpu" if recipe.train.offload else "gpu")

    # the recipe key that sets the trainer's sequence length; None where the trainer has none (it trains on the
    # rollouts, prompt + response): a fix then names the lengths that really bound it
    seq_len_key: ClassVar[str | None] = "train.seq_len"

    def trainer_seq_len(self, recipe: Recipe) -> int:
        """The longest sequence the trainer trains on: train.seq_len (else model.max_model_len); a backend with no
        trainer sequence length: prompt + response."""
        if self.seq_len_key is None:
            return recipe.data.max_prompt_tokens + recipe.rollout.max_tokens
        return recipe.train_seq_len

    def micro_tokens(self, recipe: Recipe, micro_batch: int) -> int:
        """Tokens in one micro batch's forward/backward: micro batch x the trainer sequence length (padded or packed
        to it)."""
        return micro_batch * self.trainer_seq_len(recipe)


# ---------------------------------------------------------------------------------------------------------------
# snapshots of backend definitions (generated by scripts/snapshot_backends.py from the released sources)


def snapshot_path(backend: str, version: str) -> Path:
    return SNAPSHOTS / f"{backend}-{version}.json"


def load_snapshot(backend: str, version: str) -> dict[str, Any] | None:
    p = snapshot_path(backend, version)
    if not p.is_file():
        return None
    return json.loads(p.read_text())


def snapshot_versions(backend: str) -> list[str]:
    out = []
    for p in SNAPSHOTS.glob(f"{backend}-*.json"):
        out.append(p.stem[len(backend) + 1:])
    return sorted(out, key=version_key)


def version_key(v: str) -> tuple:
    parts = []
    for piece in re.split(r"[.+-]", v):
        parts.append((0, int(piece), "") if piece.isdigit() else (1, 0, piece))
    return tuple(parts)


def check_keys(
    backend: str, keys: list[str], known: set[str], version: str, source: str, kind: str = "flag"
) -> list[Finding]:
    import difflib

    findings = []
    for k in keys:
        if k not in known:
            close = difflib.get_close_matches(k, sorted(known), n=1, cutoff=0.6)
            findings.append(
                Finding(
                    "error",
                    k,
                    f"{kind} `{k}` does not exist in {backend} {version} ({source})",
                    f"did you mean `{close[0]}`?" if close else f"remove it or pin a {backend} version that has it",
                )
            )
    return findings


# Signs of a stuck run shared by the backends that train with NCCL and generate with vLLM: a collective that timed
# out, a process out of file descriptors, a dead vLLM engine. Adapters add their own (rlctl.runs.stall reads them).
NCCL_VLLM_STALL_SIGNS = (
    r"Watchdog caught collective operation timeout",
    r"NCCL.*(timed out|[Tt]imeout)",
    r"Too many open files",
    r"(Async)?EngineDeadError|Engine loop has died",
)
