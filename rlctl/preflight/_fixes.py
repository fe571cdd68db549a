"""Computed fixes in machine-readable form (`Result.set`): apply one to a recipe, and ask whether the backend can
honour the keys it names (a fix that names a key the backend ignores or refuses is no fix)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from rlctl.errors import RlctlError

# checks a fix is not vetted against (not run again): they ask other machines (a Ray cluster, a store) or read every
# prompt, and no recipe key a computed fix sets changes what they say
UNVETTED = frozenset({"env.executor", "checkpoint.sync", "context.prompt_lengths"})


def apply(recipe: Any, sets: dict[str, Any]) -> Any:
    """A copy of the recipe with `section.key = value` assigned for each entry (no file, no re-validation)."""
    from rlctl.recipe.loader import split_key

    new = recipe.model_copy(deep=True)
    for dotted, value in sets.items():
        *parents, leaf = split_key(dotted)  # a backend's extra key is one key, dots and all
        obj = new
        for part in parents:  # a table of names (eval.sets.NAME) is a dict: its entries are keys, not attributes
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
        if isinstance(obj, dict):
            obj[leaf] = value
        else:
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


def prepared_with(prepared: Any, sets: dict[str, Any]) -> Any:
    """The prepared recipe with the fix applied (to the recipe that would run: launch's own changes, such as
    --executor or a --resume step, kept) and rendered again; a fix the backend cannot render raises RlctlError."""
    from dataclasses import replace

    recipe = apply(prepared.recipe, sets)
    resolved = replace(prepared.resolved, recipe=recipe)
    return replace(prepared, resolved=resolved, plan=prepared.backend.render(recipe, prepared.dataset_size))




def _keys(sets: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {json.dumps(v)}" for k, v in sets.items())


def vet(prepared: Any, results: list[Any], rerun: Callable[[Any], list[Any]], fail: str, warn: str) -> None:
    """Each failing or warning result's computed fix (its `set`, then its `other_fixes` in order) is applied and
    every check run again: the first that closes the result's check without another check newly failing or warning
    is offered (`set`, and its text as `fix`); one that does not is named in the fix with what it would break, never
    offered in `set`. (A fix may turn its own check's FAIL into a WARN.) `rerun`: the checks, but UNVETTED, on a
    prepared recipe, unvetted; `fail`, `warn`: the verdicts that count."""
    FAIL, WARN = fail, warn  # noqa: N806 - preflight's verdicts, given (preflight imports this module)

    def said(prep: Any) -> tuple[Counter, dict]:
        out = rerun(prep)
        return (Counter((r.check, r.verdict) for r in out if r.verdict in (FAIL, WARN)),
                {(r.check, r.verdict): r.figure for r in out})

    base: Counter | None = None
    cache: dict[str, tuple[Counter, dict] | str] = {}

    def problems(check: str, verdict: str, sets: dict[str, Any]) -> list[str]:
        nonlocal base
        if base is None:
            base = said(prepared)[0]
        key = json.dumps(sets, sort_keys=True)
        if key not in cache:
            try:
                cache[key] = said(prepared_with(prepared, sets))
            except RlctlError as e:
                cache[key] = f"it is no valid recipe: {e.message}"
            except Exception as e:  # a fix the adapter cannot even render is not one to offer (nor a traceback)
                cache[key] = f"it cannot be rendered: {type(e).__name__}: {e}"
        got = cache[key]
        if isinstance(got, str):
            return [got]
        now, figures = got
        new = [(c, v) for c, v in now if now[(c, v)] > base[(c, v)] and not (c == check and v == WARN)]
        out = [f"it makes {', '.join(f'{c} {v}' for c, v in new)} ({figures[new[0]].split(' (')[0]})"] if new else []
        if now[(check, verdict)] >= base[(check, verdict)]:
            out.append(f"{check} still says {verdict}")
        return out

    for r in results:
        if r.verdict not in (FAIL, WARN) or not r.set:
            continue
        first = r.set
        candidates = [(r.fix or "", first)] + [(t, prepared.backend.complete_fix(prepared.recipe, s))
                                               for t, s in r.other_fixes]
        why: list[str] = []
        for text, sets in candidates:
            found = problems(r.check, r.verdict, sets)
            if not found:
                if sets is not first:
                    r.fix, r.set = f"{text} ({'; '.join(why)})", sets
                break
            why.append(f"not {_keys(sets)} alone: {'; '.join(found)}")
        else:
            r.set = None
            r.fix = f"{r.fix or ''} ({'; '.join(why)}: apply that check's fix with it)".strip()
