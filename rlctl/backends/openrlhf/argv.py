"""backend.openrlhf.extra read the way train_ppo_ray reads it: its own argparse, rebuilt from the release's snapshot.

The extras are appended after what rlctl renders, so argparse decides what they mean: a repeated flag takes the last
value (the extra wins over the recipe), a unique prefix of a flag is that flag (argparse's allow_abbrev, on in every
release), a store_true flag given a value leaves the value as an unrecognised argument, a valued flag given none,
a value of the wrong type or outside its choices, or an unknown flag is refused. rlctl says each:
- what argparse refuses: an error, with argparse's own message;
- an extra that changes a value rlctl renders from the recipe: the extra wins, and rlctl checks what runs. The
  value argparse ends up with is put back into the recipe key it was rendered from (RECIPE_KEY, in the recipe's unit),
  giving the effective recipe; render's checks (unhonoured: the release's asserts, placement, batches) and preflight's
  (Backend.effective: placement, memory, TP, LoRA) run on it. The effective recipe must render exactly the command
  that runs (argparse's namespace, compared flag by flag); a value render derives from the overridden one is pinned to
  what the command keeps (PINNED: the actor's GPUs per node, rendered from the engines x TP they leave free, as
  resources.trainer_gpus; the rollout micro batch, rendered from the trainer's).
  So: an error the checks find on the effective values is rlctl's refusal, naming the extra; otherwise a warning (the
  extra wins; set the recipe key instead). Where no recipe renders the command that runs (a concept with no recipe
  key, a value the recipe cannot hold, a flag that moves with the overridden one and cannot be pinned) rlctl cannot
  check what runs: an error naming why (NO_RECIPE_KEY lists the concepts);
- an extra `false` for a store_true flag that the recipe turns on, or one on by default: a command line cannot turn it
  off (render drops it), so the flag stays on and the run goes on with it: a warning naming the recipe key.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from rlctl.backends.base import Finding
from rlctl.backends.openrlhf.releases import FLAGS, release
from rlctl.backends.openrlhf.steps import per_rollout

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

# where a concept comes from in the recipe: the key an override's value goes back to (the effective recipe), and the
# key the warning tells the user to set instead
RECIPE_KEY = {
    "actor_num_nodes": "resources.nodes",
    "colocate_all": "resources.colocate", "vllm_num_engines": "rollout.engines",
    "vllm_tp": "rollout.tensor_parallel", "vllm_mem": "rollout.gpu_memory_utilization",
    "train_batch_size": "train.train_batch_size", "micro_train_batch_size": "train.micro_batch_size",
    "micro_rollout_batch_size": "rollout.micro_batch_size", "rollout_batch_size": "rollout.prompts_per_step",
    "n_samples_per_prompt": "rollout.group_size", "zero_stage": "train.zero_stage",
    "gradient_checkpointing": "train.gradient_checkpointing", "adam_offload": "train.offload",
    "lora_rank": "lora.rank", "lora_alpha": "lora.alpha", "target_modules": "lora.target_modules",
    "advantage_estimator": "algorithm.name", "init_kl_coef": "algorithm.kl_coef",
    "kl_estimator": "algorithm.kl_estimator", "use_kl_loss": "algorithm.use_kl_loss", "pretrain": "model.path",
    "eval_dataset": "data.eval", "prompt_data": "data.train", "lr_scheduler": "optim.schedule",
    "enforce_eager": "rollout.enforce_eager", "max_samples": "train.steps", "num_episodes": "train.episodes",
    **{c: k for c, k in (("temperature", "rollout.temperature"), ("top_p", "rollout.top_p"), ("seed", "train.seed"),
                         ("actor_learning_rate", "optim.lr"), ("eps_clip", "algorithm.eps_clip"),
                         ("entropy_loss_coef", "algorithm.entropy_coef"), ("max_norm", "optim.max_grad_norm"),
                         ("l2", "optim.weight_decay"), ("max_ckpt_num", "checkpoint.keep_last"),
                         ("save_steps", "checkpoint.every"), ("eval_steps", "eval.every"),
                         ("eval_temperature", "eval.temperature"), ("max_epochs", "train.epochs_per_rollout"),
                         ("lora_dropout", "lora.dropout"), ("input_key", "data.input_key"),
                         ("label_key", "data.label_key"), ("eval_n_samples_per_prompt", "eval.n_samples"),
                         ("lr_warmup_ratio", "optim.warmup_ratio"), ("min_lr_ratio", "optim.min_lr_ratio"),
                         ("wandb_project", "logging.wandb.project"), ("wandb_run_name", "logging.wandb.name"),
                         ("wandb_org", "logging.wandb.entity"))},
}
# concepts rendered from the recipe whose value cannot go back into one recipe key: the count of nodes is the
# cluster's, not the run's; the GPUs per node of actor, ref and critic are rendered together from resources; the
# lengths, scheduler name and sample cap are rendered from several keys or translated (train.steps -> --max_samples,
# cosine -> cosine_with_min_lr); the rest are rlctl's own plumbing (paths, the reward file, checkpoint switches).
# An override of one is an error: rlctl cannot check what would run.
NO_RECIPE_KEY = {"actor_num_nodes", "ref_num_nodes", "critic_num_nodes", "actor_num_gpus_per_node",
                 "ref_num_gpus_per_node", "critic_num_gpus_per_node", "colocate_actor_ref", "max_samples",
                 "lr_scheduler", "prompt_max_len", "generate_max_len", "max_len", "max_new_tokens", "param_dtype",
                 "save_path", "ckpt_path", "save_hf_ckpt", "disable_ds_ckpt", "load_checkpoint", "best_metric_key",
                 "remote_rm_url", "apply_chat_template", "tensorboard", "wandb_key"}
# flags render derives from an overridden value that no rlctl check reads, so the effective recipe may render them
# otherwise than the command that runs: --best_metric_key none comes with checkpoint.keep_last (best-eval HF exports
# off); an --max_ckpt_num extra leaves them on, which changes what stays on disk, not a verdict
UNREAD = {"best_metric_key"}
# algorithm.name from --advantage_estimator: gae (ppo) renders the critic too, so it never maps to or from another
# estimator
ESTIMATOR_NAME = {"group_norm": "grpo", "dr_grpo": "dr_grpo", "reinforce_baseline": "reinforce_baseline"}
# derived by render from the overridden values, pinned to what the command keeps: the actor's GPUs per node (ref and
# critic get the same count; resources.trainer_gpus, whose length per node is what render gives them: GPU ids are
# not read), and the rollout's micro batch (the trainer's when rollout.micro_batch_size is unset)
PINNED = {"actor_num_gpus_per_node": "resources.trainer_gpus", "ref_num_gpus_per_node": "resources.trainer_gpus",
          "critic_num_gpus_per_node": "resources.trainer_gpus", "micro_rollout_batch_size": "rollout.micro_batch_size"}
TYPES = {"int": int, "float": float, "str": str}


class Refused(Exception):
    """argparse's error() (it would print usage and exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # type: ignore[override]
        raise Refused(message)


@cache
def parser(version: str) -> argparse.ArgumentParser:
    """train_ppo_ray's parser as the snapshot records it: every flag with its action, type, nargs and choices."""
    p = _Parser(prog="train_ppo_ray")  # allow_abbrev and -h as in every release (a plain ArgumentParser())
    for flag, spec in release(version).flags.items():
        kw: dict[str, Any] = {}
        if spec.get("action"):
            kw["action"] = spec["action"]
        else:
            kw["type"] = TYPES.get(spec.get("type") or "str", str)
            if spec.get("nargs") is not None:
                kw["nargs"] = spec["nargs"]
            if spec.get("choices") is not None:
                kw["choices"] = spec["choices"]
        p.add_argument(flag, **kw)
    return p


def parse(version: str, args: list[str]) -> argparse.Namespace:
    return parser(version).parse_args(args)


def resolve(version: str, key: str) -> str | None:
    """The flag argparse reads `--key` as: itself, the one flag it is a unique prefix of, or None (unknown or
    ambiguous)."""
    flags = release(version).flags
    flag = key if key.startswith("--") else f"--{key}"
    if flag in flags:
        return flag
    hits = [f for f in flags if f.startswith(flag)]
    return hits[0] if len(hits) == 1 else None


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


@dataclass
class Override:
    """An extra that changes a value rlctl renders (or the release's default) for a concept."""

    key: str  # backend.openrlhf.extra.X, as written
    spelled: str  # how argparse reads it, when not as written
    flag: str
    concept: str
    old: Any
    new: Any
    was: str  # "rendered from the recipe" / "the release's default"


@dataclass
class Effective:
    """What backend.openrlhf.extra does to the recipe: the recipe that renders the command that runs (the recipe
    itself when nothing is overridden, or when no recipe can say it: then `findings` has the error), what to say, and
    one line per replaced value (preflight appends them to what it finds)."""

    recipe: Recipe
    findings: list[Finding] = field(default_factory=list)
    lines: dict[str, str] = field(default_factory=dict)  # recipe key -> what replaced its value
    held: set[str] = field(default_factory=set)  # recipe keys an extra's flag is rendered from, whatever its value

    @property
    def overridden(self) -> bool:
        return bool(self.lines)


def _read(backend: Any, recipe: Recipe) -> tuple[list[Finding], list[Override], argparse.Namespace | None,
                                                   dict[str, Any]]:
    """(what to say whatever the values, the overrides, the namespace train_ppo_ray would run with, the extras
    argparse knows)."""
    extra = recipe.backend.extra()
    version = backend.target_version(recipe)
    rel = release(version)
    out: list[Finding] = []
    where = f"(openrlhf {version} train_ppo_ray's argparse)"
    rendered, _ = backend.cli_args(recipe, extra={})
    # a flag the release lacks (unknown, or a prefix of several) is validate()'s error already: said once
    known = {k: v for k, v in extra.items() if resolve(version, k)}
    full, _ = backend.cli_args(recipe, extra=known)
    try:
        before = parse(version, rendered)
    except Refused:
        return out, [], None, known  # what rlctl renders alone is refused: the render's own findings say why
    try:
        after = parse(version, full)
    except Refused as e:
        return [Finding("error", "backend.openrlhf.extra", f"train_ppo_ray refuses the command: {e} {where}",
                        "fix or remove the backend.openrlhf.extra entry it names")], [], None, known
    concept_of = {rel.flag(c): c for c in FLAGS if rel.flag(c)}
    overrides: list[Override] = []
    for k, v in extra.items():
        flag = resolve(version, k)
        if flag is None:
            continue  # unknown or ambiguous: argparse refused it above, or validate() names it
        key = f"backend.openrlhf.extra.{k.lstrip('-')}"
        spelled = "" if flag == (k if k.startswith("--") else f"--{k}") else f" (argparse reads it as {flag})"
        concept = concept_of.get(flag)
        if concept is None:
            continue  # a flag rlctl never renders: what `extra` is for
        recipe_key = RECIPE_KEY.get(concept)
        instead = f"set {recipe_key} instead" if recipe_key else "remove it from backend.openrlhf.extra"
        if v is False or v is None:
            if rel.flags[flag].get("action") == "store_true" and getattr(before, _dest(flag)):
                why = "the recipe renders it" if flag in rendered else "it is on by default"
                # train_ppo_ray runs (render drops the false), with the flag still on: said, not refused
                out.append(Finding("warn", key, f"{key} = {str(v).lower()} cannot turn {flag} off: a command line "
                                   f"only turns a store_true flag on, and {why}: it stays on {where}", instead))
            continue
        old, new = getattr(before, _dest(flag)), getattr(after, _dest(flag))
        if old == new:
            continue  # the value rlctl renders (or the default), said again: nothing changes
        was = "rendered from the recipe" if flag in rendered else "the release's default"
        overrides.append(Override(key, spelled, flag, concept, old, new, was))
    return out, overrides, after, known


def _recipe_value(concept: str, value: Any, recipe: Recipe) -> Any:
    """The recipe key's value for the concept's parsed value (the recipe's unit), or raise KeyError: none."""
    if concept in NO_RECIPE_KEY or concept not in RECIPE_KEY:
        raise KeyError(concept)
    if concept == "advantage_estimator":
        if recipe.algorithm.name == "ppo":
            raise KeyError(concept)  # ppo renders the critic's flags, which no other algorithm.name renders
        return ESTIMATOR_NAME[value]
    if concept in ("lora_rank", "lora_alpha", "target_modules", "lora_dropout") and recipe.lora is None:
        raise KeyError(concept)  # turning LoRA on takes more than one key (rank, alpha, targets)
    if concept in ("wandb_project", "wandb_run_name", "wandb_org") and recipe.logging.wandb is None:
        raise KeyError(concept)
    if concept in ("save_steps", "eval_steps"):
        # global steps (rollouts) back into the recipe's optimizer steps; -1 (never) is no value
        return value * max(1, round(per_rollout(recipe))) if value > 0 else None
    return value


def _with(recipe: Recipe, values: dict[str, Any]) -> Recipe:
    from rlctl.recipe.schema import Recipe as RecipeModel

    data = recipe.model_dump(mode="python")
    for dotted, v in values.items():
        *path, last = dotted.split(".")
        node = data
        for p in path:
            node = node[p]
        node[last] = v
    return RecipeModel.model_validate(data)


def effective(backend: Any, recipe: Recipe) -> Effective:
    """The recipe that renders what would run (module docstring), with what to say about each extra."""
    eff = _effective(backend, recipe)
    version = backend.target_version(recipe)
    if recipe.backend.extra() and version in backend.known_versions:
        rel = release(version)
        concept_of = {rel.flag(c): c for c in FLAGS if rel.flag(c)}
        flags = {resolve(version, k) for k, v in recipe.backend.extra().items() if v is not False and v is not None}
        eff.held = {RECIPE_KEY[concept_of[f]] for f in flags if concept_of.get(f) in RECIPE_KEY}
    return eff


def _effective(backend: Any, recipe: Recipe) -> Effective:
    if not recipe.backend.extra():
        return Effective(recipe)
    version = backend.target_version(recipe)
    where = f"(openrlhf {version} train_ppo_ray's argparse)"
    said, overrides, after, known = _read(backend, recipe)
    if after is None or not overrides:
        return Effective(recipe, said)

    def refuse(why: str, fix: str) -> Effective:
        # no recipe renders the command that runs: rlctl's checks would read other values than run, so it refuses
        return Effective(recipe, said + [Finding(
            "error", o.key, f"{o.key}{o.spelled} overrides {o.flag} {o.old!r} ({o.was}) with {o.new!r}, and {why}: "
            f"rlctl cannot check what would run {where}", fix) for o in overrides])

    values: dict[str, Any] = {}
    for o in overrides:
        try:
            values[RECIPE_KEY[o.concept]] = _recipe_value(o.concept, o.new, recipe)
        except KeyError:
            return refuse(f"{o.flag} {o.new!r} has no recipe key it can be checked as", f"remove {o.key}"
                          + (f", set {RECIPE_KEY[o.concept]}" if o.concept in RECIPE_KEY else "")
                          + " (docs/backends/openrlhf.md, extra)")
    rel = release(version)
    concept_of = {_dest(rel.flag(c)): c for c in FLAGS if rel.flag(c)}
    pins: dict[str, Any] = {}
    for _ in range(3):  # set the overrides, then pin what render derives from them, until the command is the same
        try:
            eff = _with(recipe, {**values, **pins})
        except ValidationError as e:  # the recipe cannot hold the value (a bound, a rule between keys)
            msg = str(e).splitlines()
            return refuse(f"the recipe cannot hold it ({'; '.join(m.strip() for m in msg[1:3])})",
                          "remove it, or set a value the recipe accepts")
        try:
            ran = parse(version, backend.cli_args(eff, extra=known)[0])
        except Refused as e:
            return refuse(f"the recipe with it renders a command argparse refuses ({e})", "remove it")
        moved = [d for d, v in vars(after).items() if getattr(ran, d, None) != v and concept_of.get(d) not in UNREAD]
        if not moved:
            break
        unpinnable = [d for d in moved if concept_of.get(d) not in PINNED]
        if unpinnable:
            return refuse(f"a recipe with it renders {', '.join('--' + d for d in unpinnable)} otherwise",
                          f"remove it, and set {RECIPE_KEY.get(overrides[0].concept, 'the recipe keys')} instead")
        for key in {PINNED[concept_of[d]] for d in moved}:
            kept = {getattr(after, d) for d in moved if PINNED[concept_of[d]] == key}
            if len(kept) > 1:
                return refuse(f"the flags {key} renders would get different values", "remove it")
            n = kept.pop()
            pins[key] = list(range(n)) if key == "resources.trainer_gpus" else n
    else:
        return refuse("render's derived values do not settle", "remove it")
    out = list(said)
    lines: dict[str, str] = {}
    for o in overrides:
        k = RECIPE_KEY[o.concept]
        v = values[k]
        out.append(Finding("warn", o.key, f"{o.key}{o.spelled} overrides {o.flag} {o.old!r} ({o.was}) with {o.new!r}: "
                           f"argparse takes the last value, the extra wins; the checks used the extra's value, as "
                           f"{k} = {v!r} {where}", f"set {k} = {v!r} instead"))
        lines[k] = f"{o.key} = {o.new!r} in place of {k} = {_get(recipe, k)!r}"
    for k, v in pins.items():
        kept = f"the actor's {len(v)} GPU(s) per node" if k == "resources.trainer_gpus" else "its value"
        lines[k] = f"{k} = {v!r} ({kept}, which the command keeps)"
    return Effective(eff, out, lines)


def complete_fix(backend: Any, recipe: Recipe, values: dict[str, Any]) -> dict[str, Any]:
    """The fix plus the recipe key of each flag an extra would newly override once it is applied, set to the extra's
    value: an extra that repeated a value render derives (--micro_rollout_batch_size from train.micro_batch_size)
    keeps what it held, and the fix makes nothing else say more."""
    if not recipe.backend.extra():
        return values
    try:
        fixed = _with(recipe, values)
    except (KeyError, TypeError, ValidationError):
        return values  # not a recipe: the fix is said as it is
    before = {o.flag for o in _read(backend, recipe)[1]}
    out = dict(values)
    for o in _read(backend, fixed)[1]:
        key = RECIPE_KEY.get(o.concept)
        if o.flag in before or key is None or key in values:
            continue
        try:
            out[key] = _recipe_value(o.concept, o.new, fixed)
        except KeyError:
            continue
    return out


def _get(recipe: Any, dotted: str) -> Any:
    for p in dotted.split("."):
        recipe = getattr(recipe, p, None)
    return recipe


def extra_findings(backend: Any, recipe: Recipe) -> list[Finding]:
    """What backend.openrlhf.extra means to train_ppo_ray (module docstring)."""
    return effective(backend, recipe).findings
