"""backend.openrlhf.extra read the way train_ppo_ray reads it: its own argparse, rebuilt from the release's snapshot.

The extras are appended after what rlctl renders, so argparse decides what they mean: a repeated flag takes the last
value (the extra wins over the recipe), a unique prefix of a flag is that flag (argparse's allow_abbrev, on in every
release), a store_true flag given a value leaves the value as an unrecognised argument, a valued flag given none,
a value of the wrong type or outside its choices, or an unknown flag is refused. rlctl says each:
- what argparse refuses: an error, with argparse's own message;
- an extra that changes a value rlctl renders from the recipe: a warning where nothing rlctl checks reads it (the
  extra wins), an error where rlctl's checks (placement, batch sizes, LoRA, the release's own asserts) are computed
  from the recipe value it overrides: set the recipe key instead, so that what is checked is what runs;
- an extra `false` for a store_true flag that the recipe turns on, or one on by default: a command line cannot turn it
  off (render drops it), so the flag stays on and the run goes on with it: a warning naming the recipe key.
"""

from __future__ import annotations

import argparse
from functools import cache
from typing import TYPE_CHECKING, Any

from rlctl.backends.base import Finding
from rlctl.backends.openrlhf.releases import FLAGS, release

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

# concepts no rlctl check reads and no train_ppo_ray assert involves: an override changes the run, not the verdict
FREE = {"temperature", "top_p", "seed", "actor_learning_rate", "eps_clip", "entropy_loss_coef", "max_norm", "l2",
        "max_ckpt_num", "save_steps", "eval_steps", "eval_temperature", "wandb_project", "wandb_run_name", "wandb_org"}
# where a concept comes from in the recipe (the fix for an override rlctl refuses)
RECIPE_KEY = {
    "actor_num_nodes": "resources.nodes", "actor_num_gpus_per_node": "resources.trainer_gpus",
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
                         ("eval_temperature", "eval.temperature"))},
}
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


def extra_findings(backend: Any, recipe: Recipe) -> list[Finding]:
    """What backend.openrlhf.extra means to train_ppo_ray (module docstring)."""
    extra = recipe.backend.extra()
    if not extra:
        return []
    version = backend.target_version(recipe)
    rel = release(version)
    out: list[Finding] = []
    where = f"(openrlhf {version} train_ppo_ray's argparse)"
    rendered, _ = backend.cli_args(recipe, extra={})
    # a flag the release lacks (unknown, or a prefix of several) is validate()'s error already: said once
    full, _ = backend.cli_args(recipe, extra={k: v for k, v in extra.items() if resolve(version, k)})
    try:
        before = parse(version, rendered)
    except Refused:
        return out  # what rlctl renders alone is refused: the render's own findings say why
    try:
        after = parse(version, full)
    except Refused as e:
        return [Finding("error", "backend.openrlhf.extra", f"train_ppo_ray refuses the command: {e} {where}",
                        "fix or remove the backend.openrlhf.extra entry it names")]
    concept_of = {rel.flag(c): c for c in FLAGS if rel.flag(c)}
    for k, v in extra.items():
        flag = resolve(version, k)
        if flag is None:
            continue  # unknown or ambiguous: argparse refused it above, or validate() names it
        key = f"backend.openrlhf.extra.{k.lstrip('-')}"
        spelled = "" if flag == (k if k.startswith("--") else f"--{k}") else f" (argparse reads it as {flag})"
        concept = concept_of.get(flag)
        recipe_key = RECIPE_KEY.get(concept or "")
        instead = f"set {recipe_key} instead" if recipe_key else "remove it from backend.openrlhf.extra"
        if concept is None:
            continue  # a flag rlctl never renders: what `extra` is for
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
        if concept in FREE:
            out.append(Finding("warn", key, f"{key}{spelled} overrides {flag} {old!r} ({was}) with {new!r}: argparse "
                               f"takes the last value, the extra wins {where}", instead))
        else:
            out.append(Finding("error", key, f"{key}{spelled} overrides {flag} {old!r} ({was}) with {new!r}, and "
                               "rlctl's checks (placement, batch sizes, LoRA, the release's asserts) are computed from "
                               f"the recipe's value: what would run is not what was checked {where}", instead))
    return out
