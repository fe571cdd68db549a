"""Algorithm checks: recipe keys set that cannot act under the rendered settings (Backend.inert), such as the PPO
clip range where each rollout batch gets one optimizer step (the ratio pi/pi_old is exactly 1 at its only update, so
the clip never binds and eps_clip 0.1 trains exactly as 0.2 does)."""

from __future__ import annotations

from typing import Any

from rlctl.preflight import WARN, Context, Result, check

EXTRA = ".extra."


def written(recipe: Any, key: str) -> tuple[bool, Any]:
    """(whether the recipe sets `key` itself, in a file of its extends chain or with --set; its value). A key left at
    its default is not the recipe's choice: nothing to say about it."""
    if EXTRA in key and key.startswith("backend."):
        name = key.split(".", 2)[1]
        if name != recipe.backend.name:
            return False, None
        extra = _leaves(recipe.backend.extra())
        leaf = key.split(EXTRA, 1)[1]
        return leaf in extra, extra.get(leaf)
    section, _, field = key.partition(".")
    part = getattr(recipe, section, None)
    if part is None or field not in getattr(part, "model_fields_set", set()):
        return False, None
    return True, getattr(part, field)


def _leaves(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """An extras table as dotted keys, whichever way it was written (a quoted dotted key, nested sub-tables)."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k.lstrip('+-')}"
        out[key] = v
        if isinstance(v, dict):
            out.update(_leaves(v, key + "."))
    return out


@check("algorithm.inert", silent="the recipe sets no key that cannot act as the backend runs it (keys it does not "
       "render at all are env.flags' findings)")
def inert(ctx: Context) -> list[Result]:
    out = []
    for i in ctx.backend.inert(ctx.recipe):
        is_set, value = written(ctx.prepared.recipe, i.key)
        if not is_set or not i.rendered:  # a key not rendered at all: render and env.flags say it (unhonoured)
            continue
        out.append(Result("algorithm.inert", WARN, f"{i.key} = {value} cannot act: {i.why}", i.fix,
                          data={"key": i.key}, set=i.set))
    return out
