"""From a recipe file to what a backend would launch: the shared first step of render, preflight and launch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.backends import get_backend
from rlctl.backends._static import installed_version
from rlctl.backends.base import Finding, LaunchPlan
from rlctl.recipe.data import count_records, is_local
from rlctl.recipe.loader import ResolvedRecipe, load


@dataclass
class Prepared:
    resolved: ResolvedRecipe
    backend: Any
    dataset_size: int | None
    plan: LaunchPlan
    # where `launch --resume RUN|URL` takes checkpoint.resume's step from (copied into the new run before it starts),
    # in words; None: from the recipe's checkpoint.dir (preflight checks the step is there)
    resume_source: str | None = None

    @property
    def recipe(self):
        return self.resolved.recipe

    def installed_version(self) -> str | None:
        return installed_version(self.backend.packages[0]) if self.backend.packages else None

    def validate(self) -> list[Finding]:
        from rlctl.evals.sets import eval_findings

        return (self.backend.validate(self.plan, self.installed_version()) + self.backend.unhonoured(self.recipe)
                + eval_findings(self.recipe, self.backend, self.plan.version) + other_tables(self.recipe))

    def render_findings(self) -> list[Finding]:
        """What `render` says: validate(), plus the failures of preflight's checks that read the recipe alone (no
        machine, no GPU: RENDER_CHECKS), so that a warmup longer than the run or a trainer without a GPU is said
        where the command is shown, not only at preflight. A failure validate() already says is not repeated."""
        from rlctl import preflight as pf

        found = self.validate()
        said = [f.message for f in found if f.level == "error"]
        for res in pf.run(self, list(RENDER_CHECKS)):
            if res.verdict == pf.FAIL and not any(m in res.figure for m in said):
                found.append(Finding("error", RENDER_CHECKS[res.check], f"{res.check}: {res.figure}", res.fix))
        # keys the recipe sets that cannot act as rendered (eps_clip where the PPO ratio is exactly 1): said where
        # the command is shown, as unhonoured keys are (their fixes are vetted by preflight, not here)
        for res in pf.run(self, list(RENDER_WARNINGS), vet=False):
            if res.verdict == pf.WARN:
                found.append(Finding("warn", res.data.get("key", res.check), f"{res.check}: {res.figure}", res.fix))
        return found


def other_tables(recipe: Any) -> list[Finding]:
    """`[backend.<name>]` tables of a backend the recipe does not run: nothing reads them (a recipe may keep them for a
    `--set backend.name=...` switch), so each key is said, never dropped silently."""
    out = []
    for name, table in (recipe.backend.model_extra or {}).items():
        if name == recipe.backend.name:
            continue
        for key in sorted(table.model_dump(exclude_unset=True, exclude_defaults=True)):
            value = getattr(table, key)
            keys = [f"{key}.{k}" for k in value] if isinstance(value, dict) else [key]
            out += [Finding("warn", f"backend.{name}.{k}", f"backend.{name}.{k} is not used: the recipe runs "
                            f"{recipe.backend.name}, which reads only [backend.{recipe.backend.name}]",
                            f"remove it, or set backend.{recipe.backend.name}.{k.split('.')[0]} for "
                            f"{recipe.backend.name}") for k in keys]
    return out


# preflight checks render runs too (check -> the recipe key its finding names): they read only the recipe
RENDER_CHECKS = {"schedule.warmup": "optim.warmup_ratio", "placement.gpus": "resources",
                 "lora.vllm_sync": "lora.rank"}
# and whose warnings it says too (each result names its key in data["key"])
RENDER_WARNINGS = ("algorithm.inert",)


def dataset_size(path: str) -> int | None:
    return count_records(path) if is_local(path) else None


def prepare(recipe_path: str | Path, sets: list[str] | None = None) -> Prepared:
    resolved = load(recipe_path, sets)
    backend = get_backend(resolved.recipe.backend.name)
    from rlctl.backends.base import UnknownVersion

    try:
        return _prepare(resolved, backend)
    except UnknownVersion as e:  # a pinned release rlctl does not know: say where the pin is, as for any key
        if not resolved.recipe.backend.version or e.message.startswith(str(resolved.path)):
            raise
        from rlctl.preflight.references import key_where

        raise UnknownVersion(f"{key_where(resolved, 'backend.version')}: {e.message}", hint=e.hint) from None


def _prepare(resolved: Any, backend: Any) -> Prepared:
    from rlctl.preflight.lora import refusal
    from rlctl.preflight.references import key_where

    why = refusal(resolved.recipe)  # LoRA on no module of the model: peft refuses it at start
    if why:
        from rlctl.errors import RecipeError

        raise RecipeError(f"{key_where(resolved, 'lora.target_modules')}: {why}.",
                          hint='set lora.target_modules = "all-linear", or names of the model\'s modules')
    if resolved.recipe.patches.set:  # a set that is unknown or for another release: render and preflight refuse
        from rlctl.patching import recipe_set
        from rlctl.preflight.references import key_where

        recipe_set(resolved.recipe, backend.target_version(resolved.recipe), key_where(resolved, "patches.set"))
    size = dataset_size(resolved.recipe.data.train)
    plan = backend.render(resolved.recipe, size)
    return Prepared(resolved=resolved, backend=backend, dataset_size=size, plan=plan)
