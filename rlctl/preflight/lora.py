"""LoRA: the target modules exist in the model (peft refuses a list that matches none: NoMatchingPeftModuleError), and
the backend's weight sync can give a LoRA actor's weights to its inference engines (the adapter knows)."""

from __future__ import annotations

from typing import Any

from rlctl.errors import RlctlError
from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check
from rlctl.recipe.models import resolve_arch


def modules(model_path: str, arch: Any) -> tuple[tuple[str, ...] | None, str]:
    """The model's module names and where they were read from: the weight index of a local model, else its
    architecture (config.json's model_type, or rlctl's table of known models); (None, why) where neither says."""
    from rlctl.recipe.models import weight_modules

    names = weight_modules(model_path)
    if names:
        return names, f"{model_path}'s weight index"
    if arch.lora_modules is not None:
        return arch.lora_modules, f"its architecture{f' ({arch.model_type})' if arch.model_type else ''}"
    return None, (f"{arch.name} is a mixture of experts of a family rlctl does not know "
                  f"({arch.model_type or 'no model_type in config.json'}) and no weight index is here to read its "
                  "module names from")


def _matches(target: str, names: tuple[str, ...]) -> bool:
    return target.rsplit(".", 1)[-1] in names  # peft: a module whose name ends in the target


def refusal(recipe: Any) -> str | None:
    """Why peft would refuse the recipe's lora.target_modules at start (NoMatchingPeftModuleError: none matches a
    module of the model), or None: an empty list always; a list where the model's module names can be read here.
    render, preflight and launch refuse it (recipe.planning.prepare)."""
    lora = recipe.lora
    if lora is None or lora.target_modules == "all-linear":
        return None
    wanted = list(lora.target_modules)
    try:
        arch = resolve_arch(recipe.model.path)
    except RlctlError:
        names, where = None, ""
    else:
        names, where = modules(recipe.model.path, arch)
    listed = f" (the model's modules, from {where}: {', '.join(names)})" if names else ""
    if not wanted:
        return f"lora.target_modules = [] adapts no module: peft refuses it at start{listed}"
    if names is not None and not any(_matches(t, names) for t in wanted):
        norms = [t for t in wanted if "norm" in t.lower()]
        if norms:  # the module exists; peft cannot adapt it (weight_modules leaves normalization layers out)
            return (f"lora.target_modules {wanted}: {', '.join(norms)} is a normalization layer, which LoRA cannot "
                    f"adapt (peft takes Linear, Embedding and Conv layers and refuses it at start: ValueError)"
                    f"{listed}")
        return (f"lora.target_modules {wanted}: no module of {arch.name} has that name{listed}; peft refuses it at "
                "start (NoMatchingPeftModuleError)")
    return None


@check("lora.targets")
def targets(ctx: Context) -> Result | None:
    r = ctx.recipe
    if r.lora is None:
        return None
    arch = ctx.arch
    if isinstance(arch, Exception):
        return Result("lora.targets", SKIP, f"could not run: {arch.message}", arch.hint)
    if r.lora.target_modules == "all-linear":
        linear = arch.linear_modules
        covers = f": {', '.join(linear)}" if linear else " (module names not known here)"
        return Result("lora.targets", OK, f'"all-linear": peft adapts every linear layer of {arch.name} but the '
                      f"output layer (lm_head){covers}")
    names, where = modules(r.model.path, arch)
    if names is None:
        return Result("lora.targets", SKIP, f"could not run: {where}",
                      "peft refuses at start a list that matches no module: check the names against the model")
    wanted = list(r.lora.target_modules)
    found = [t for t in wanted if _matches(t, names)]
    missing = [t for t in wanted if not _matches(t, names)]
    if not found:
        return Result("lora.targets", FAIL, f"lora.target_modules {wanted}: no such module in {arch.name} "
                      f"(its modules, from {where}: {', '.join(names)}); peft refuses it at start "
                      "(NoMatchingPeftModuleError)", 'set lora.target_modules = "all-linear" (or name its layers)',
                      set={"lora.target_modules": "all-linear"})
    if missing:
        return Result("lora.targets", WARN, f"lora.target_modules {missing}: no such module in {arch.name}; peft "
                      f"adapts only {found}", f"drop {missing}", set={"lora.target_modules": found})
    return Result("lora.targets", OK, f"{len(set(found))} of {arch.name}'s module kinds adapted "
                  f"({', '.join(dict.fromkeys(found))}; from {where})")


@check("lora.vllm_sync", hosts="lora")
def vllm_sync(ctx: Context) -> list[Result]:
    r = ctx.recipe
    if r.lora is None or not r.uses_vllm:
        return []
    return ctx.backend.preflight(ctx, "lora")
