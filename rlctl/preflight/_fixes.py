"""Computed fixes in machine-readable form (`Result.set`): apply one to a recipe, and ask whether the backend can
honour the keys it names (a fix that names a key the backend ignores or refuses is no fix)."""

from __future__ import annotations

from typing import Any


def apply(recipe: Any, sets: dict[str, Any]) -> Any:
    """A copy of the recipe with `section.key = value` assigned for each entry (no file, no re-validation)."""
    new = recipe.model_copy(deep=True)
    for dotted, value in sets.items():
        *parents, leaf = dotted.split(".")
        obj = new
        for part in parents:
            obj = getattr(obj, part)
        setattr(obj, leaf, value)
    return new


def honoured(backend: Any, recipe: Any, sets: dict[str, Any]) -> bool:
    """True when the backend honours every key of the fix: after applying it, no finding of what the backend cannot
    honour names one of them."""
    try:
        after = backend.unhonoured(apply(recipe, sets))
    except Exception:  # a fix the adapter cannot even read is not one to propose
        return False
    return not any(f.key in sets for f in after)
