"""Eval sets as every part of rlctl sees them: name, data, mode, and the metric names they write.

Metric names carry the set and the mode, so two modes are never compared by accident:

    eval/<set>/<mode>                   the set's primary metric: pass@k in that mode (e.g. eval/ood/greedy_pass@1,
                                        eval/aime/sampling_pass@8)
    eval/<set>/<mode>/mean_correct      the fraction of all samples graded correct
    eval/<set>/<mode>/response_tokens   mean completion length in tokens

The mode label is the set's `mode`, else derived: temperature 0 and n = 1 -> `greedy_pass@1`; temperature 0 and
n > 1 -> `nondet_proxy_pass@k`; temperature > 0 -> `sampling_pass@k` (k = the set's k, default n).
The recipe's single-set form (`data.eval` + `[eval] every/temperature/n_samples`) is the set `default`.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

LEGACY = "default"
IN_LOOP_EVAL = "in_loop_eval.json"  # what a backend's in-loop eval ran (rlctl.evals.in_loop), in the run directory


@dataclass
class EvalSet:
    name: str
    data: str
    temperature: float = 0.0
    n: int = 1
    k: int = 1
    max_tokens: int = 1024
    mode: str = "greedy_pass@1"
    every: int | None = None
    grader: str | None = None
    threshold: float = 1.0
    limit: int | None = None
    in_loop: bool = True
    legacy: bool = False  # the single-set form (data.eval): the backend renders it as it always has

    @property
    def key(self) -> str:
        """The set's primary metric name in the stream."""
        return f"eval/{self.name}/{self.mode}"

    def keys(self) -> list[str]:
        return [self.key, f"{self.key}/mean_correct", f"{self.key}/response_tokens"]

    def due(self, step: int) -> bool:
        """Whether a checkpoint at `step` is evaluated (step 0 = the baseline, always)."""
        return step == 0 or not self.every or step % self.every == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mode_label(temperature: float, n: int, k: int) -> str:
    if temperature == 0:
        return "greedy_pass@1" if n == 1 else f"nondet_proxy_pass@{k}"
    return f"sampling_pass@{k}"


def eval_sets(recipe: Recipe) -> list[EvalSet]:
    """The recipe's eval sets, the single-set form first (as `default`), then `[eval.sets.<name>]` in order."""
    r = recipe
    out: list[EvalSet] = []
    if r.data.eval:
        n = r.eval.n_samples
        out.append(EvalSet(LEGACY, r.data.eval, r.eval.temperature, n, n, r.rollout.max_tokens,
                           mode_label(r.eval.temperature, n, n), r.eval.every, legacy=True))
    for name, s in r.eval.sets.items():
        k = min(s.k or s.n, s.n)
        out.append(EvalSet(name, s.data, s.temperature, s.n, k, s.max_tokens or r.rollout.max_tokens,
                           s.mode or mode_label(s.temperature, s.n, k), s.every, s.grader, s.threshold, s.limit,
                           s.in_loop))
    return out


def primary_set(recipe: Recipe) -> EvalSet | None:
    sets = eval_sets(recipe)
    if not sets:
        return None
    wanted = recipe.eval.primary
    return next((s for s in sets if s.name == wanted), sets[0])


def split_in_loop(recipe: Recipe, backend: Any) -> tuple[list[EvalSet], list[tuple[EvalSet, str]]]:
    """(sets the backend's release runs in-loop, [(set, why not)] for rlctl's checkpoint evaluator)."""
    sets = eval_sets(recipe)
    ask = getattr(backend, "in_loop_eval", None)
    if ask is None:
        return [], [(s, "the backend declares no in-loop eval") for s in sets]
    return ask(recipe, sets)


def checkpoint_sets(recipe: Recipe, backend: Any) -> list[EvalSet]:
    """The sets rlctl evaluates on each checkpoint: every set the backend does not run in-loop."""
    return [s for s, _ in split_in_loop(recipe, backend)[1]]


def eval_findings(recipe: Recipe, backend: Any, version: str | None) -> list[Any]:
    """render/preflight's plain findings: which sets run in-loop, which go to the checkpoint evaluator and why."""
    from rlctl.backends.base import Finding

    out = []
    inside, _ = split_in_loop(recipe, backend)
    run = getattr(backend, "in_loop_eval_run", None)
    ran = run(recipe) if run and inside else None
    for s in inside:  # an extra that changes the backend's eval flags changes its mode: its metrics say which
        if ran and ran.get("mode") != s.mode:
            out.append(Finding("warn", "data.eval", f"eval set {s.name!r} runs in-loop as {ran['mode']} (the rendered "
                               f"eval flags, extras included), not {s.mode}: its metrics are eval/{s.name}/"
                               f"{ran['mode']}", "set the eval through [eval], not backend extras"))
    for s, why in split_in_loop(recipe, backend)[1]:
        out.append(Finding("note", f"eval.sets.{s.name}" if not s.legacy else "data.eval",
                           f"eval set {s.name!r} ({s.mode}) cannot run in-loop on {backend.name} {version or ''}"
                           .rstrip() + f": {why}; evaluated by rlctl on each checkpoint instead ({s.key})"))
    if getattr(backend, "rotation_by_rlctl", lambda r: False)(recipe):
        n, own, best = recipe.checkpoint.keep_last, backend.own_rotation, primary_set(recipe)
        where = f"{backend.name}'s own rotation deletes by age, so {own}; " if own else ""
        if backend.prune_during_run(recipe):
            by = best.key if best else "the primary eval"
            copies = backend.checkpoint_copies(recipe)  # the count the disk check uses
            out.append(Finding("note", "checkpoint.keep_last",
                               f"rotation by rlctl, keeps the best-eval checkpoint: {where}rlctl prunes to the {n} "
                               f"newest complete checkpoints plus the best by {by} (and any not yet evaluated), so "
                               f"up to {copies.stay} stay on disk, {copies.words()} while the next is saved "
                               "(what disk.checkpoints counts)"))
        else:
            out.append(Finding("warn", "checkpoint.keep_last",
                               f"{backend.name} rotates checkpoints by age and rlctl cannot prune for it: the "
                               "best-eval checkpoint may be deleted", "unset checkpoint.keep_last and prune with "
                               "`rlctl ckpt prune RUN --keep-last N` (it keeps the best)"))
    if recipe.eval.evaluator == "command" and not recipe.eval.command:
        out.append(Finding("error", "eval.command", "eval.evaluator = command without eval.command"))
    return out


# ---- from a run directory (status, doctor, ckpt: no pydantic recipe needed) -------------------------------------

def run_eval_config(run_dir: Path, recipe: str = "recipe.toml") -> dict[str, Any]:
    """The run's [eval] table (and data.eval) from its resolved recipe (`recipe`, a file of the run directory), as
    plain data; {} when none."""
    if not (run_dir / recipe).is_file():  # missing, or a FIFO that would block
        return {}
    try:
        doc = tomllib.loads((run_dir / recipe).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    ev = doc.get("eval") if isinstance(doc.get("eval"), dict) else {}
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    rollout = doc.get("rollout") if isinstance(doc.get("rollout"), dict) else {}
    return {"eval": ev, "data_eval": data.get("eval"), "max_tokens": rollout.get("max_tokens", 1024),
            "run": doc.get("run") if isinstance(doc.get("run"), dict) else {}}


def sets_from_run(run_dir: Path, recipe: str = "recipe.toml") -> list[EvalSet]:
    cfg = run_eval_config(run_dir, recipe)
    if not cfg:
        return []
    ev = cfg["eval"]
    out: list[EvalSet] = []
    try:
        if cfg.get("data_eval"):
            n = int(ev.get("n_samples", 1))
            t = float(ev.get("temperature", 0.0))
            out.append(EvalSet(LEGACY, cfg["data_eval"], t, n, n, int(cfg["max_tokens"]), mode_label(t, n, n),
                               ev.get("every"), legacy=True))
        for name, s in (ev.get("sets") or {}).items():
            n = int(s.get("n", 1))
            t = float(s.get("temperature", 0.0))
            k = min(int(s.get("k") or n), n)
            out.append(EvalSet(name, s["data"], t, n, k, int(s.get("max_tokens") or cfg["max_tokens"]),
                               s.get("mode") or mode_label(t, n, k), s.get("every"), s.get("grader"),
                               float(s.get("threshold", 1.0)), s.get("limit"), bool(s.get("in_loop", True))))
    except (KeyError, TypeError, ValueError, AttributeError):
        return out
    return out


def read_context(run_dir: Path | None) -> dict[str, Any] | None:
    """The in-loop eval context kept at launch (rlctl.evals.in_loop), or None."""
    if run_dir is None or not (run_dir / IN_LOOP_EVAL).is_file():  # missing, or a FIFO that would block
        return None
    try:
        ctx = json.loads((run_dir / IN_LOOP_EVAL).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(ctx, dict) and isinstance(ctx.get("set"), str) and isinstance(ctx.get("mode"), str)
    return ctx if ok else None


def primary_key_from_run(run_dir: Path) -> str | None:
    """The primary eval metric of a run (its primary set's key), or None when the recipe declares no sets. A set the
    backend evaluates in-loop is named for the mode it really ran (rlctl.evals.in_loop, in_loop_eval.json)."""
    sets = sets_from_run(run_dir)
    if not sets:
        return None
    wanted = run_eval_config(run_dir)["eval"].get("primary")
    s = next((s for s in sets if s.name == wanted), sets[0])
    ctx = read_context(run_dir)
    scores = ctx and ctx["set"] == s.name and s.legacy and ctx.get("scores_set", True)
    return f"eval/{s.name}/{ctx['mode']}" if scores else s.key


def primary_key(recipe: Recipe, backend: Any) -> str | None:
    """The primary eval metric of a recipe on a backend: its primary set's key, in the mode the backend's in-loop eval
    really runs when that set is evaluated in-loop."""
    s = primary_set(recipe)
    if s is None:
        return None
    run = getattr(backend, "in_loop_eval_run", None)
    inside = [x.name for x in split_in_loop(recipe, backend)[0]]
    ctx = run(recipe) if run and s.name in inside else None
    return f"eval/{s.name}/{ctx['mode']}" if ctx and ctx.get("set") == s.name else s.key


def resolve_key(primary: str | None, keys: Any) -> str | None:
    """The stream key a primary eval is judged by: itself when the stream has it; else the score of the first data
    source of an in-loop eval that logs several (eval/<set>/<mode>/<source>, rlctl.evals.in_loop); else, for a run
    whose in-loop evals keep the backend's own names (no recipe: eval/default/pass1, ...), that set's first quality
    metric."""
    from rlctl.runs.health import quality_eval_key

    if not primary:
        return None
    keys = list(keys)
    if primary in keys:
        return primary
    subs = {"mean_correct", "response_tokens", "response_length_mean", "truncated_rate"}
    per_source = sorted(k for k in keys if k.startswith(primary + "/") and "/" not in k[len(primary) + 1:]
                        and k[len(primary) + 1:] not in subs)
    found = quality_eval_key(per_source, primary + "/")
    if found:
        return found
    prefix = "/".join(primary.split("/")[:2]) + "/"
    return quality_eval_key([k for k in keys if k.startswith(prefix)], prefix)

