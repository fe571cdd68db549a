"""backend.verl.extra as the Hydra keys it sets: one reading for the render, the checks and the mapping, whatever
route wrote a key (a quoted dotted key, a bare dotted key, a sub-table, `--set`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe


def leaves(key: str, value: Any) -> list[tuple[str, Any]]:
    """An override as the dotted keys it sets (`+` dropped): a table value sets its leaves (Hydra merges a dict
    override into the node it names)."""
    if isinstance(value, dict) and value:
        return [kv for k, x in value.items() for kv in leaves(f"{key.lstrip('+')}.{k}", x)]
    return [(key.lstrip("+"), value)]


def extra_leaves(recipe: Recipe) -> dict[str, Any]:
    """backend.verl.extra as the Hydra keys it sets, whatever route wrote it: a quoted dotted key, a bare dotted key
    or sub-table (nested tables), `+`-prefixed keys."""
    return dict(kv for k, v in recipe.backend.extra().items() for kv in leaves(k, v))
