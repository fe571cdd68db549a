"""The names of a backend's own (in-loop) eval metrics: the same `eval/<set>/<mode>` as rlctl's checkpoint evaluator.

A backend logs its in-loop eval under its own names, per data source (`eval_<datasource>_pass1`,
`val-core/<data_source>/acc/mean@1`, ...); its adapter's parser reads them as `eval/<source>/<backend metric>`.
At launch the adapter says what its in-loop eval really runs, read from what it rendered (`in_loop_eval_run`: the set,
temperature, samples per prompt, greedy or not), and rlctl keeps it in the run directory (IN_LOOP_EVAL). Every record
the stream reads from the backend's logs is then renamed by the adapter's `name_in_loop_evals(record, ctx)`:

    the mode's score                    eval/<set>/<mode>                 (e.g. eval/default/greedy_pass@1)
    the fraction of samples correct     eval/<set>/<mode>/mean_correct
    any other eval metric it logs       eval/<set>/<mode>/<backend metric> (response_length_mean, truncated_rate, ...)

When the eval data holds several data sources (one record logs them all), the source goes after the mode:
`eval/<set>/<mode>/<source>` (and `eval/<set>/<mode>/<source>/mean_correct`, ...).

Without that file (a run rlctl did not launch, `rlctl attach` without `--recipe`), rlctl cannot know the mode and
keeps the backend's names as the parser reads them, `eval/<source>/<backend metric>` (e.g. `eval/default/pass1`):
never a mode label, so never compared with one by accident.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.evals.sets import IN_LOOP_EVAL, mode_label, read_context

__all__ = ["IN_LOOP_EVAL", "context", "named", "read_context", "renamer", "write_context"]


def context(set_name: str, temperature: float, n: int, greedy: bool | None = None, **extra: Any) -> dict[str, Any]:
    """What a backend's in-loop eval runs, as rendered: the set, its samples per prompt and temperature, and the
    mode label they make (sets.mode_label's vocabulary; `greedy` = sampling switched off, whatever the temperature)."""
    t = 0.0 if greedy else float(temperature)
    return {"set": set_name, "temperature": t, "n": int(n), "k": int(n), "mode": mode_label(t, int(n), int(n)),
            **extra}


def write_context(run_dir: Path, ctx: dict[str, Any] | None) -> None:
    if ctx:
        (run_dir / IN_LOOP_EVAL).write_text(json.dumps(ctx, indent=2) + "\n")


def renamer(adapter: Any, run_dir: Path | None) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """The function that renames one parsed record's in-loop eval keys, or None (no context, or an adapter that
    names none)."""
    ctx = read_context(run_dir)
    name = getattr(adapter, "name_in_loop_evals", None)
    if ctx is None or name is None:
        return None

    def rename(rec: dict[str, Any]) -> dict[str, Any]:
        if not any(k.startswith("eval/") for k in rec):
            return rec
        return name(rec, ctx)

    return rename


def named(ctx: dict[str, Any], sources: list[str], source: str, leaf: str | None) -> str:
    """The stream name of one in-loop eval metric: `leaf` None is the mode's score, else a sub-metric's name."""
    base = f"eval/{ctx['set']}/{ctx['mode']}"
    if len(set(sources)) > 1:
        base += f"/{source}"
    return base if leaf is None else f"{base}/{leaf}"
