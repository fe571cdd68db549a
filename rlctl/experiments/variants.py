"""Variants of a recipe: a grid of overrides (`--grid optim.lr=1e-6,2e-6`, or a recipe's `[sweep]` table) or two
recipes (A/B), each repeated over seeds; their recipe diffs against the base; every one preflighted before any
starts."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError

SEED_KEY = "train.seed"


@dataclass
class Arm:
    """One setting of the experiment: a recipe and the overrides that make it (without the seed)."""

    id: str
    recipe: str  # absolute path
    sets: list[str]
    label: str
    diff: dict[str, list[Any]] = field(default_factory=dict)  # key -> [base value, this arm's value]
    patches: str | None = None
    base_seed: int = 0  # the arm's own train.seed: its runs use base_seed, base_seed + 1, ...

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "recipe": self.recipe, "sets": self.sets, "label": self.label, "diff": self.diff,
                "patches": self.patches, "base_seed": self.base_seed}

    @classmethod
    def from_dict(cls, a: dict[str, Any]) -> Arm:
        return cls(a["id"], a["recipe"], list(a["sets"]), a["label"], a.get("diff") or {}, a.get("patches"),
                   int(a.get("base_seed") or 0))


@dataclass
class Variant:
    """One run to make: an arm at one seed."""

    id: str
    arm: str
    seed: int
    run_name: str

    def sets(self, arm: Arm) -> list[str]:
        return [*arm.sets, f"{SEED_KEY}={self.seed}"]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "arm": self.arm, "seed": self.seed, "run_name": self.run_name}


def parse_grid(specs: list[str], where: str = "--grid") -> list[tuple[str, list[str]]]:
    """`optim.lr=1e-6,2e-6` -> ("optim.lr", ["1e-6", "2e-6"]). Values are TOML values, as in --set; a value with a
    comma inside (a list) is written in brackets: `--grid 'resources.trainer_gpus=[0,1],[2,3]'`."""
    out: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, raw = spec.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", key) or not raw.strip():
            raise RlctlError(f"{where} {spec!r}: expected KEY=V1,V2,... with a dotted key.",
                             hint=f"e.g. {where} optim.lr=1e-6,2e-6")
        if key == SEED_KEY:
            raise RlctlError(f"{where} {spec!r}: seeds are not a grid axis.", hint="use --seeds N")
        values = _split_values(raw)
        if len(set(values)) != len(values):
            raise RlctlError(f"{where} {spec!r}: a value is repeated.")
        if any(k == key for k, _ in out):
            raise RlctlError(f"{where}: {key} is given twice.", hint="give all its values in one --grid")
        out.append((key, values))
    return out


def _split_values(raw: str) -> list[str]:
    values, depth, cur = [], 0, ""
    for ch in raw:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            values.append(cur.strip())
            cur = ""
        else:
            cur += ch
    values.append(cur.strip())
    return [v for v in values if v]


def flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        p = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            out.update(flat(v, p))
        else:
            out[p] = v
    return out


def recipe_data(recipe: str, sets: list[str], options: dict[str, str] | None = None) -> dict[str, Any]:
    """The resolved recipe (extends, --set, defaults) as flat dotted keys, without the sweep table. `options`: the
    option each grid key came from (an error about its value names it)."""
    from rlctl.recipe.loader import load

    r = load(recipe, sets, options).recipe
    data = flat(r.model_dump(mode="json", exclude_none=True))
    return {k: v for k, v in data.items() if not k.startswith("sweep.")}


def diff(base: dict[str, Any], other: dict[str, Any]) -> dict[str, list[Any]]:
    keys = sorted(set(base) | set(other))
    return {k: [base.get(k), other.get(k)] for k in keys if base.get(k) != other.get(k) and k != SEED_KEY}


def grid_arms(recipe: str, grid: list[tuple[str, list[str]]], sets: list[str], where: str = "--grid") -> list[Arm]:
    """Every combination of the grid's values, in order, as arms of one recipe (`where`: the option the grid came
    from, --grid or the recipe's [sweep] grid)."""
    from rlctl.recipe.loader import resolved_sets

    path = str(Path(recipe).resolve()) if Path(recipe).exists() else recipe
    # kept resolved: the queue replays an arm wherever it was started from (`experiment resume` elsewhere); a path
    # in the recipe's own [sweep] grid is the recipe file's, one given with --set or --grid where it was typed
    sets = resolved_sets(sets, Path.cwd())
    grid_base = Path(path).parent if where == "[sweep] grid" else Path.cwd()
    base = recipe_data(path, sets)
    arms = []
    combos = list(itertools.product(*[[(k, v) for v in vals] for k, vals in grid])) if grid else [()]
    options = {k: where for k, _ in grid}
    for i, combo in enumerate(combos):
        typed = [f"{k}={v}" for k, v in combo]
        extra = resolved_sets(typed, grid_base)
        data = recipe_data(path, [*sets, *extra], options)
        label = " ".join(typed) or "base"
        arms.append(Arm(f"a{i}", path, [*sets, *extra], label, diff(base, data), data.get("patches.set"),
                        int(data.get(SEED_KEY, 0))))
    return arms


def ab_arms(a: str, b: str, sets: list[str]) -> list[Arm]:
    """Two recipes as arms A and B; B's diff is against A."""
    from rlctl.recipe.loader import resolved_sets

    pa, pb = (str(Path(x).resolve()) if Path(x).exists() else x for x in (a, b))
    sets = resolved_sets(sets, Path.cwd())  # as grid_arms: the same paths wherever the queue runs
    da, db = recipe_data(pa, sets), recipe_data(pb, sets)
    return [Arm("A", pa, list(sets), Path(a).name, {}, da.get("patches.set"), int(da.get(SEED_KEY, 0))),
            Arm("B", pb, list(sets), Path(b).name, diff(da, db), db.get("patches.set"),
                int(db.get(SEED_KEY, 0)))]


# keys that name or describe a run, never what it trains
LABELS = ("name", "description", "logging.wandb.name")


def inert_keys(arms: list[Arm]) -> dict[str, tuple[list[Any], Any]]:
    """The recipe keys the arms differ in that cannot act in ANY arm as its backend runs it (Backend.inert, the
    mechanism of preflight's algorithm.inert; names and descriptions aside): {key: (its values across the arms, the
    Inert of the first arm)}. Empty where every differing key acts somewhere, or rlctl cannot judge an arm."""
    from rlctl.recipe.planning import prepare

    varying = sorted({k for a in arms for k in a.diff} - set(LABELS))
    if not varying:
        return {}
    per_arm = []
    for arm in arms:
        try:
            prep = prepare(arm.recipe, arm.sets)
            per_arm.append({i.key: i for i in prep.backend.inert(prep.backend.effective(prep.recipe).recipe)})
        except Exception:  # an arm rlctl cannot prepare or judge: preflight_all reports it, with its settings
            return {}
    return {k: (_values(arms, k), per_arm[0][k]) for k in varying if all(k in i for i in per_arm)}


def inert_only(arms: list[Arm]) -> dict[str, tuple[list[Any], Any]] | None:
    """Where the arms differ only in keys that cannot act (inert_keys), so that every arm would train identically:
    those keys; None where they really differ (or differ in nothing but seeds: a noise check, on purpose)."""
    varying = {k for a in arms for k in a.diff} - set(LABELS)
    found = inert_keys(arms)
    return found if varying and set(found) == varying else None


def _values(arms: list[Arm], key: str) -> list[Any]:
    """The key's value in each arm (an arm's diff holds [base value, its value]; no entry: the base's)."""
    base = next((a.diff[key][0] for a in arms if key in a.diff), None)
    return [a.diff[key][1] if key in a.diff else base for a in arms]


def _fix(found: dict[str, tuple[list[Any], Any]]) -> tuple[str, str]:
    """The inert keys' fixes in words, and the --set that applies them to every arm ("" where none is known)."""
    fixes = "; ".join(dict.fromkeys(i.fix for _, i in found.values()))
    sets = {k: v for _, i in found.values() for k, v in (i.set or {}).items()}
    return fixes, " ".join(f"--set {k}={v}" for k, v in sets.items())


def refuse_inert(arms: list[Arm], what: str, grid: list[tuple[str, list[str]]] | None = None,
                 found: dict[str, tuple[list[Any], Any]] | None = None, force: bool = False) -> list[str]:
    """Refuse (exit 2), before anything is preflighted or launched, arms that would train identically (inert_only),
    and a grid axis whose key cannot act in any combination (its values would only repeat the same trainings); `what`:
    the arms in words ("A and B", "the 2 arms of the grid"). Returns warnings for keys of an A/B diff that cannot act
    beside others that do (the result is the others' alone), and with `force` what it would have refused."""
    found = inert_keys(arms) if found is None else found
    if not found:
        return []
    fixes, how = _fix(found)
    varying = {k for a in arms for k in a.diff} - set(LABELS)
    whys = "; ".join(f"{k}: {i.why}" for k, (_, i) in found.items())
    if set(found) == varying:
        if force:
            return [f"--force: the arms differ only in {', '.join(found)}, which cannot act: they will train "
                    "identically (the manifest records it; compare says it)"]
        keys = ", ".join(f"{k} ({' vs '.join(map(str, vals))})" for k, (vals, _) in found.items())
        raise RlctlError(f"{what} differ only in {keys}, which cannot act as the backend runs these recipes: every "
                         f"arm would train identically, so nothing was launched. {whys}",
                         hint=f"{fixes}{f' (for every arm: {how})' if how else ''}; or pass --force to launch anyway")
    axes = [(k, vals) for k, vals in (grid or []) if k in found]
    if axes and force:
        return [f"--force: grid axis {', '.join(k for k, _ in axes)} cannot act in any arm: its values repeat the "
                "same trainings (the manifest records it; compare says it)"]
    if axes:
        distinct = len(arms)
        for _, vals in axes:
            distinct //= len(vals)
        names = ", ".join(f"{k} ({', '.join(vals)})" for k, vals in axes)
        drop = " ".join(f"--grid {k}" for k, _ in axes)
        raise RlctlError(f"grid axis {names} cannot act in any of the {len(arms)} arms as the backend runs them: the "
                         f"grid is only {distinct} distinct trainings, each repeated, so nothing was launched. {whys}",
                         hint=f"drop {drop}, or {fixes}{f' (for every arm: {how})' if how else ''}; or pass --force "
                              "to launch anyway")
    acting = ", ".join(sorted(varying - set(found)))
    return [f"{k} ({' vs '.join(map(str, vals))}) cannot act as the backend runs these recipes, so the result is "
            f"{acting}'s alone. {i.why}. To make it act: {i.fix}" for k, (vals, i) in found.items()]


def inert_record(arms: list[Arm], forced: bool, found: dict[str, tuple[list[Any], Any]] | None = None
                 ) -> dict[str, dict[str, Any]]:
    """What the manifest keeps of the keys that cannot act (compare says it): values, why, and whether --force
    launched arms that differ in nothing else."""
    found = inert_keys(arms) if found is None else found
    only = bool(found) and set(found) == {k for a in arms for k in a.diff} - set(LABELS)
    return {k: {"values": vals, "why": i.why, "forced": forced and only} for k, (vals, i) in found.items()}


def variants(exp: str, arms: list[Arm], n: int, first: int = 0) -> list[Variant]:
    """Seeds first..n-1 of every arm: train.seed = the arm's own seed + i (arms with the same train.seed share
    seeds, so they can be compared pair by pair)."""
    if n < 1:
        raise RlctlError(f"--seeds {n}: expected at least 1.")
    out = []
    for arm in arms:
        for i in range(first, n):
            s = arm.base_seed + i
            out.append(Variant(f"{arm.id}-s{s}", arm.id, s, f"{exp}-{arm.id}-s{s}"))
    return out


@dataclass
class PreflightProblem:
    variant: str
    settings: str
    failures: list[str]


def planned_gib(results: list[Any]) -> float | None:
    """The GPU memory one GPU of the run needs by its plan (the trainer's peak, vLLM's budget, the colocated peak:
    the largest), in GiB; None where the plan could not be made (no model config, an unknown GPU)."""
    need = 0.0
    for x in results:
        data = getattr(x, "data", None) or {}
        if not str(getattr(x, "check", "")).startswith("memory.") or not isinstance(data, dict):
            continue
        for key in ("per_gpu_bytes", "budget", "peak"):
            v = data.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v > 0:
                need = max(need, float(v) / 2**30)
    return need or None


def preflight_all(arms: list[Arm], vs: list[Variant]) -> tuple[list[PreflightProblem], dict[str, dict[str, Any]]]:
    """Preflight every variant (render + every check that needs no GPU); returns the failures and, per variant,
    what placement needs to know (GPUs, nodes, executor)."""
    from rlctl import preflight as pf
    from rlctl.errors import RlctlError as _Err
    from rlctl.recipe.planning import prepare

    by_id = {a.id: a for a in arms}
    problems: list[PreflightProblem] = []
    needs: dict[str, dict[str, Any]] = {}
    for v in vs:
        arm = by_id[v.arm]
        settings = " ".join(v.sets(arm))
        try:
            prep = prepare(arm.recipe, v.sets(arm))
            results = pf.run(prep)
        except _Err as e:
            problems.append(PreflightProblem(v.id, settings, [str(e)]))
            continue
        r = prep.recipe
        needs[v.id] = {"gpus": r.resources.gpus_per_node, "nodes": r.resources.nodes,
                       "executor": r.resources.executor, "gib": planned_gib(results)}
        if pf.failed(results):
            problems.append(PreflightProblem(v.id, settings, [f"{x.check}: {x.figure}" for x in results
                                                              if x.verdict == "fail"]))
    return problems, needs
