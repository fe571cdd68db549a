"""`rlctl compare`: per arm, a metric over each run's final window, its mean and 95% t-interval across seeds; each
arm against the first with the difference, its interval and a test (paired by seed where the arms share seeds and
data order, else Welch's); "no significant difference at this n" said plainly, with the seeds that would show the
observed effect at 80% power. Runs that have not finished are left out, by name, unless asked for; a metric no
run logs is an error that lists those they do; a test at zero variance is said to be degenerate, in words. Also the
arm-mean plot with bands and the research-log entry (markdown)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError
from rlctl.experiments import stats

DEFAULT_METRIC = "reward/mean"
# what changes the order prompts are drawn in besides the seed: arms differing here are not paired
DATA_ORDER_KEYS = ("data.", "rollout.prompts_per_step", "backend.name")
# keys that change how a run is named, supervised, kept or scheduled for evals, never what it trains: runs that
# differ only here (and in train.seed) are seeds of one arm. `run.*`: restarts, stall limits, failover, on_event;
# checkpoint.*: where and how many saves are kept and synced (not checkpoint.save_optimizer's resume state, which
# is not training either, nor checkpoint.every, which sets where a restart resumes and stays a difference); eval.*
# scheduling: when and where checkpoint evals run, not the sets or how they are sampled; logging, preflight and
# doctor settings. A prefix ends with "."; "*" stands for one dotted part.
NOT_TRAINING_KEYS = ("name", "description", "run.", "checkpoint.keep_last", "checkpoint.dir", "checkpoint.final_dir",
                     "checkpoint.sync", "checkpoint.min_free_gb", "checkpoint.resume", "checkpoint.save_optimizer",
                     "eval.every", "eval.baseline", "eval.gpu", "eval.timeout_s", "eval.sets.*.every",
                     "eval.sets.*.in_loop", "logging.", "preflight.", "doctor.")


def trains(key: str) -> bool:
    """Does a difference at this flat recipe key change what is trained? (NOT_TRAINING_KEYS says what does not.)"""
    parts = key.split(".")
    for pat in NOT_TRAINING_KEYS:
        want = pat.rstrip(".").split(".")
        if len(parts) < len(want) or (not pat.endswith(".") and len(parts) != len(want)):
            continue
        if all(w in ("*", p) for w, p in zip(want, parts, strict=False)):
            return False
    return True


@dataclass
class RunValue:
    run: str
    seed: int | None
    value: float | None
    points: int
    curve: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class ArmResult:
    id: str
    label: str
    runs: list[RunValue]
    interval: stats.Interval | None = None

    @property
    def per_seed(self) -> list[tuple[int | None, float, list[str]]]:
        """One value per distinct seed: runs of one seed are replicas, not independent draws, so they count once
        (their mean). A run whose seed is unknown counts as a seed of its own."""
        groups: dict[Any, list[RunValue]] = {}
        for r in self.runs:
            if r.value is not None:
                groups.setdefault(r.seed if r.seed is not None else ("run", r.run), []).append(r)
        return [(rs[0].seed, math.fsum(r.value for r in rs if r.value is not None) / len(rs), [r.run for r in rs])
                for rs in groups.values()]

    @property
    def values(self) -> list[float]:
        return [v for _, v, _ in self.per_seed]


@dataclass
class Unfinished:
    """A run that has not reached its end (or a variant not started yet): its status and how far it got."""
    run: str
    arm: str
    status: str  # running | starting | restarting | stopping | stalled | stopped | failed | lost | queued | ...
    step: int | None = None
    total: int | None = None

    def words(self) -> str:
        at = f" at step {self.step}" + (f" of {self.total}" if self.total else "") if self.step is not None else ""
        return f"{self.run} ({self.arm}): {self.status}{at}"


@dataclass
class Comparison:
    metric: str
    window: int
    arms: list[ArmResult]
    tests: list[tuple[str, str, stats.TestResult | None, stats.TestResult | None, str]]  # base, other, main, welch, why
    paired_reason: str
    notes: list[str] = field(default_factory=list)
    left_out: list[Unfinished] = field(default_factory=list)  # unfinished runs not compared
    included_unfinished: list[Unfinished] = field(default_factory=list)  # with --include-running


# what a metrics record holds besides metrics
_NOT_METRICS = ("step", "time")


def run_metrics(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The run's whole metrics stream, merged by step."""
    from rlctl.metrics.stream import METRICS, by_step, iter_metrics

    return by_step(list(iter_metrics(run_dir / METRICS)))


def _numeric_keys(merged: dict[int, dict[str, Any]]) -> set[str]:
    return {k for r in merged.values() for k, v in r.items()
            if k not in _NOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)}


def unfinished(run_dir: Path) -> Unfinished | None:
    """None when the run has reached its end: finished (all its steps, or the trainer's own early end), stopped by
    its recipe's `stop_when` rule, or attached from a log nobody follows. Else its true status (asked of its
    executor, as `rlctl status` does) and its last step: running, stalled, stopped by hand, failed, lost."""
    from rlctl.runs.state import read_state, settled_status

    state = read_state(run_dir)
    status = settled_status(run_dir, state)
    if status != state.get("status"):
        state = read_state(run_dir)  # the executor settled it (e.g. the job ended): stopped_by and steps are new
    if status in ("finished", "attached") or (status == "stopped" and state.get("stopped_by")):
        return None
    from rlctl.metrics.stream import METRICS, tail_records

    steps = [r["step"] for r in tail_records(run_dir / METRICS, 1 << 16)]
    total = state.get("total_steps")
    return Unfinished(run_dir.name, "", status, max(steps, default=None), total if isinstance(total, int) else None)


def available_metrics(run_dirs: list[Path]) -> set[str]:
    from rlctl.metrics.stream import METRICS, tail_records

    keys: set[str] | None = None
    for d in run_dirs:
        ks = {k for r in tail_records(d / METRICS, 1 << 20) for k, v in r.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
        keys = ks if keys is None else keys & ks
    return keys or set()


def default_metric(run_dirs: list[Path]) -> str:
    """The primary eval (`eval/<set>/<metric>`) every run has, else reward/mean."""
    from rlctl.runs.health import _NOT_QUALITY, _QUALITY

    evals = sorted(k for k in available_metrics(run_dirs) if k.startswith("eval/"))
    quality = [k for k in evals if any(q in k.split("/")[-1] for q in _QUALITY)
               and not any(n in k.split("/")[-1] for n in _NOT_QUALITY)]
    return (quality or evals or [DEFAULT_METRIC])[0]


def trained_curve(curve: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """A run's curve without its step-0 value, the base model's baseline (an eval set's `baseline`): it is no value
    of the trained run, and in a short run's window it pulled the arm's mean toward the untrained model."""
    later = [p for p in curve if p[0] > 0]
    return later or curve


def final_value(curve: list[tuple[int, float]], window: int) -> float | None:
    tail = [v for _, v in curve[-window:] if math.isfinite(v)]
    return stats.mean(tail) if tail else None


def arms_of_experiment(d: Path) -> tuple[list[dict[str, Any]], dict[str, list[tuple[Path, int | None]]],
                                         list[Unfinished]]:
    """The arms, each arm's runs (with their seeds), and the variants that have no run yet (queued)."""
    from rlctl.experiments.manifest import read_manifest, read_queue

    m, q = read_manifest(d), read_queue(d)
    runs: dict[str, list[tuple[Path, int | None]]] = {a["id"]: [] for a in m["arms"]}
    queued = []
    for v in m["variants"]:
        rd = q["variants"].get(v["id"], {}).get("run_dir")
        if rd and Path(rd).is_dir():
            runs[v["arm"]].append((Path(rd), v["seed"]))
        else:
            queued.append(Unfinished(v["id"], v["arm"], q["variants"].get(v["id"], {}).get("state") or "queued"))
    return m["arms"], runs, queued


def arms_of_runs(refs: list[str]) -> tuple[list[dict[str, Any]], dict[str, list[tuple[Path, int | None]]]]:
    """Runs given by name: those whose resolved recipes are equal but for the seed form one arm. An attached run
    (`rlctl attach`) records no settings, so it is an arm of its own: two attached runs are never taken for two
    seeds of one recipe."""
    from rlctl.experiments.variants import SEED_KEY, diff, flat
    from rlctl.runs.state import find_run, read_state

    if len(refs) == 1:  # one run is one arm of one seed: no interval, no test, nothing to set it against
        rd = find_run(refs[0])
        raise RlctlError(f"{rd.name} is one run: there is nothing to compare it against (compare takes an experiment, "
                         "or two or more runs: runs that differ only in train.seed form one arm).",
                         hint=f"rlctl compare {refs[0]} RUN2 [RUN3 ...] (a run of another recipe, or more seeds of "
                              f"this one), or rlctl compare EXP; rlctl status {refs[0]} shows this run alone")
    dirs = [find_run(ref) for ref in refs]
    seen: dict[Path, str] = {}
    for ref, rd in zip(refs, dirs, strict=True):  # one run named twice is not two seeds (a variance of zero)
        if rd.resolve() in seen:
            first = seen[rd.resolve()]
            rest = [r for r, d in zip(refs, dirs, strict=True) if d.resolve() != rd.resolve()]
            names = f"{first!r} and {ref!r}" if first != ref else f"{ref!r}"
            raise RlctlError(f"run {rd.name} is named twice ({names}): one run is one seed, never two.",
                             hint=f"rlctl compare {' '.join([first, *rest]) if rest else first + ' RUN2'} "
                                  "(each run once; more seeds are more runs of the recipe)")
        seen[rd.resolve()] = ref
    groups: list[tuple[dict[str, Any], list[tuple[Path, int | None]]]] = []
    attached: set[Path] = set()
    recipes: dict[Path, dict[str, Any]] = {}
    for rd in dirs:
        data = _run_recipe(rd)
        seed = data.get(SEED_KEY)
        key = {k: v for k, v in data.items() if k != SEED_KEY and trains(k)}
        if read_state(rd).get("attached_from"):
            key, seed = {"attached run": rd.name}, None
            attached.add(rd)
        recipes[rd] = data
        for g, members in groups:
            if g == key:
                members.append((rd, seed if isinstance(seed, int) else None))
                break
        else:
            groups.append((key, [(rd, seed if isinstance(seed, int) else None)]))
    del flat  # Unused
    base = groups[0][0] if groups else {}
    arms, runs = [], {}
    for i, (g, members) in enumerate(groups):
        d = diff(base, g)
        label = " ".join(f"{k}={v[1]}" for k, v in d.items() if not k.startswith("name")) or members[0][0].name
        if members[0][0] in attached:
            label = members[0][0].name
        # keys in which this arm's runs differ but that were set aside as not training: said, never silent
        first = recipes.get(members[0][0], {})
        ignored = sorted({k for rd, _ in members[1:] for k in diff(first, recipes.get(rd, {}))
                          if k != SEED_KEY and k not in ("name", "description") and not trains(k)})
        arms.append({"id": f"a{i}", "label": label, "diff": d, "ignored": ignored})
        runs[f"a{i}"] = members
    return arms, runs


def _run_recipe(run_dir: Path) -> dict[str, Any]:
    import tomllib

    from rlctl.experiments.variants import flat

    try:
        return flat(tomllib.loads((run_dir / settings_file(run_dir)).read_text()))
    except (OSError, ValueError):
        return {}


def settings_file(run_dir: Path) -> str:
    """The run's resolved recipe as this machine sees it (rlctl.core.state.HERE_RECIPE when it ran elsewhere)."""
    from rlctl.core.state import HERE_RECIPE

    return HERE_RECIPE if (run_dir / HERE_RECIPE).is_file() else "recipe.toml"


def compare(arms: list[dict[str, Any]], runs: dict[str, list[tuple[Path, int | None]]], metric: str | None,
            window: int, include_running: bool = False, queued: list[Unfinished] | None = None) -> Comparison:
    """Each arm's runs at their final window. Runs that have not finished are left out (a run at step 40 of 200
    is not yet what its arm measures) unless `include_running`, and said by name either way."""
    if window < 1:
        raise RlctlError(f"--window {window}: expected at least 1 logged step.")
    every = [rd for members in runs.values() for rd, _ in members]
    if not every:
        raise RlctlError("no runs to compare yet (none of the variants has a run directory).",
                         hint="rlctl experiment show EXP tells where the queue is")
    from rlctl.runs.health import series

    left_out, included = list(queued or []), []
    kept: dict[str, list[tuple[Path, int | None]]] = {}
    for a in arms:
        for rd, seed in runs.get(a["id"], []):
            u = unfinished(rd)
            if u is not None:
                u.arm = a["id"]
                (included if include_running else left_out).append(u)
                if not include_running:
                    continue
            kept.setdefault(a["id"], []).append((rd, seed))
    all_dirs = [rd for members in kept.values() for rd, _ in members]
    if not all_dirs:
        raise RlctlError(f"no finished run to compare yet: {_count(left_out)} "
                         f"({'; '.join(u.words() for u in left_out[:6])}{' ...' if len(left_out) > 6 else ''}).",
                         hint="wait for them (rlctl status), or compare them on their values so far with "
                              "--include-running")
    streams = {rd: run_metrics(rd) for rd in all_dirs}
    metric = metric or default_metric(all_dirs)
    _known_metric(metric, all_dirs, streams, [rd for rd in every if rd.name in {u.run for u in left_out}])
    results = []
    notes = []
    for a in arms:
        rvs = []
        for rd, seed in kept.get(a["id"], []):
            curve = trained_curve(sorted(series(streams[rd], metric)))
            rvs.append(RunValue(rd.name, seed, final_value(curve, window), len(curve), curve))
            if not curve:
                notes.append(f"{rd.name} has no {metric} values (left out)")
        ar = ArmResult(a["id"], a.get("label", a["id"]), rvs)
        if a.get("ignored"):
            notes.append(f"{ar.id}: its runs differ in {', '.join(a['ignored'])}, treated as not affecting training "
                         "(NOT_TRAINING_KEYS in rlctl/experiments/report.py), so they are one arm")
        for seed, _, names in ar.per_seed:
            if len(names) > 1:
                notes.append(f"{ar.id}: runs {', '.join(names)} share train.seed {seed}: replicas of one seed, not "
                             f"independent seeds, so they count once (their mean); the arm has {len(ar.values)} "
                             f"distinct seed{'s' if len(ar.values) != 1 else ''}")
        if ar.values:
            ar.interval = stats.t_interval(ar.values)
            if len(ar.values) >= 2 and stats.no_spread(ar.values, ar.interval.sd):
                notes.append(f"{ar.id}: every run gave the same value ({fmt(ar.values[0])}): zero variance across "
                             f"its {len(ar.values)} seeds, so its interval is a point")
        results.append(ar)
    mismatch = eval_mismatch(metric, all_dirs)
    if mismatch:
        notes.append(mismatch)
    paired_ok, why = _pairable(arms, results)
    tests = []
    base = results[0]
    for other in results[1:]:
        main = welch = None
        reason = ""
        if len(base.values) >= 2 and len(other.values) >= 2:
            welch = stats.welch(base.values, other.values)
            if paired_ok:
                a_vals, b_vals = _by_seed(base, other)
                main = stats.paired(a_vals, b_vals) if len(a_vals) >= 2 else welch
            else:
                main = welch
        else:
            reason = "fewer than 2 seeds with values in an arm: no interval, no test"
        tests.append((base.id, other.id, main, welch, reason))
    if len(tests) > 1:
        notes.append(f"{len(tests)} comparisons against {base.id}: with Bonferroni, call p < {0.05 / len(tests):.3g} "
                     "significant")
    return Comparison(metric, window, results, tests, why, notes, left_out, included)


def _count(us: list[Unfinished]) -> str:
    return f"{len(us)} unfinished run{'s' if len(us) != 1 else ''}"


def _known_metric(metric: str, run_dirs: list[Path], streams: dict[Path, dict[int, dict[str, Any]]],
                  left_out: list[Path]) -> None:
    """A metric none of the runs logs is a typo or a name from elsewhere: say so with the names they do log."""
    import difflib

    keys = set().union(*(_numeric_keys(streams[rd]) for rd in run_dirs))
    if metric in keys:
        return
    only = [rd.name for rd in left_out if metric in _numeric_keys(run_metrics(rd))]
    if only:
        raise RlctlError(f"--metric {metric}: only unfinished runs log it so far ({', '.join(only[:6])}).",
                         hint="wait for them (rlctl status), or compare them on their values so far with "
                              "--include-running")
    near = difflib.get_close_matches(metric, sorted(keys), n=1, cutoff=0.5)
    evals = sorted(k for k in keys if k.startswith("eval/"))
    shown = evals + sorted(k for k in keys if not k.startswith("eval/"))
    listing = ", ".join(shown[:40]) + (f" ... ({len(shown)} in all)" if len(shown) > 40 else "")
    raise RlctlError(
        f"--metric {metric}: none of the {len(run_dirs)} runs logs it."
        + (f" Did you mean {near[0]}?" if near else ""),
        hint=(f"the metrics these runs log: {listing}" if keys else "these runs have logged no metrics yet")
        + ("; eval metrics are named eval/<set>/<mode> (docs/eval.md)" if metric.startswith("eval/") else ""))


# what makes two evals of one set the same measurement: a name shared by two modes or two temperatures is not
_MEASUREMENT = ("data", "temperature", "n", "k", "max_tokens", "grader", "threshold", "limit")


def eval_mismatch(metric: str, run_dirs: list[Path]) -> str | None:
    """A note when the runs measured an eval metric differently (its set's data, temperature, samples, k, max tokens,
    grader or limit differ between them): their numbers share a name, not a measurement."""
    from rlctl.evals.sets import sets_from_run

    parts = metric.split("/")
    if len(parts) < 3 or parts[0] != "eval":
        return None
    seen: dict[tuple[Any, ...], list[str]] = {}
    for rd in run_dirs:
        s = next((x for x in sets_from_run(rd, settings_file(rd)) if x.name == parts[1]), None)
        if s is not None:
            seen.setdefault(tuple(getattr(s, f) for f in _MEASUREMENT), []).append(rd.name)
    if len(seen) < 2:
        return None
    sigs = list(seen)
    differ = [f for i, f in enumerate(_MEASUREMENT) if len({sig[i] for sig in sigs}) > 1]
    each = "; ".join(f"{', '.join(runs[:3])}{' ...' if len(runs) > 3 else ''}: "
                     + ", ".join(f"{f}={sig[_MEASUREMENT.index(f)]}" for f in differ) for sig, runs in seen.items())
    return (f"WARNING: eval set {parts[1]!r} is not measured the same way in every run ({', '.join(differ)} differ: "
            f"{each}); {metric} compares different measurements")


def inert_notes(manifest: dict[str, Any]) -> list[str]:
    """What the experiment's manifest recorded of keys that could not act (rlctl.experiments.variants.inert_record):
    arms launched with --force although they train identically, or a part of the diff without effect."""
    out = []
    for key, rec in (manifest.get("inert") or {}).items():
        vals = " vs ".join(map(str, rec.get("values") or []))
        if rec.get("forced"):
            out.append(f"launched with --force although the arms differ only in {key} ({vals}), which cannot act as "
                       f"the backend ran them: they trained identically, so any difference is noise. {rec.get('why')}")
        else:
            out.append(f"{key} ({vals}) could not act as the backend ran these arms: the differences are the rest of "
                       f"the diff's alone. {rec.get('why')}")
    return out


def _by_seed(a: ArmResult, b: ArmResult) -> tuple[list[float], list[float]]:
    bs = {seed: v for seed, v, _ in b.per_seed if seed is not None}
    pairs = [(v, bs[seed]) for seed, v, _ in a.per_seed if seed in bs]
    return [x for x, _ in pairs], [y for _, y in pairs]


def _pairable(arms: list[dict[str, Any]], results: list[ArmResult]) -> tuple[bool, str]:
    if len(results) < 2:
        return False, ("none: one arm (every run has the same recipe but for train.seed), so there is nothing to "
                       "compare it against; give runs of another recipe too (rlctl compare RUN... RUN_B...), or an "
                       "experiment of two or more arms (rlctl ab, rlctl sweep)")
    empty = [ar.id for ar in results if not any(r.value is not None for r in ar.runs)]
    if empty:  # not a seed mismatch: there is nothing of that arm to test (the trial's lost B, both at seed 42)
        what = "no finished runs" if not any(ar.runs for ar in results if ar.id in empty) else "no runs with values"
        return False, (f"none: arm{'s' if len(empty) > 1 else ''} {', '.join(empty)} "
                       f"{'have' if len(empty) > 1 else 'has'} {what} (a paired or Welch's test needs runs in both "
                       "arms)")
    seeds = [{r.seed for r in ar.runs if r.value is not None} for ar in results]
    if any(None in s for s in seeds) or len({frozenset(s) for s in seeds}) != 1:
        return False, "Welch's t-test (the arms do not share the same seeds)"
    for a in arms:
        touched = [k for k in (a.get("diff") or {}) if k.startswith(DATA_ORDER_KEYS)]
        if touched:
            return False, f"Welch's t-test (arm {a['id']} changes {touched[0]}, so data order differs)"
    return True, "paired t-test by seed (same seeds and data order in every arm)"


# -- text --------------------------------------------------------------------------------------------------------

def fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}g}"


def verdict(c: Comparison, base: str, other: str, t: stats.TestResult | None, reason: str) -> str:
    if t is None:
        return f"{other} vs {base}: {reason}."
    n = min(len(next(a for a in c.arms if a.id == base).values), len(next(a for a in c.arms if a.id == other).values))
    kind = "paired" if t.kind == "paired" else "Welch"
    if t.degenerate:
        return degenerate_words(base, other, t, kind, n)
    head = (f"{other} - {base} = {t.diff:+.4g} [{t.low:+.4g}, {t.high:+.4g}] ({kind} t = {t.t:.3g}, "
            f"df = {t.df:.3g}, p = {t.p:.3g})")
    if t.significant:
        return f"{head}: significant at alpha 0.05 with {n} seeds per arm."
    need = (f"{t.seeds_needed} seeds per arm would show an effect this size (d = {t.effect:.2g}) with 80% power"
            if t.seeds_needed else "the observed effect is zero: no number of seeds would show it")
    return f"{head}: no significant difference at this n ({n} seeds per arm); {need}."


def degenerate_words(base: str, other: str, t: stats.TestResult, kind: str, n: int) -> str:
    """A test at zero variance in words: its t and p (as scipy gives them) measure no noise, so they are named for
    what they are, never called significant."""
    test = "the paired t-test" if kind == "paired" else "Welch's t-test"
    if t.kind == "paired":
        what = (f"{other} - {base} = {t.diff:+.4g}, identical in every seed ({n} seeds): the paired differences have "
                "zero variance")
    else:
        what = (f"{other} - {base} = {t.diff:+.4g}: every run of each arm gave the same value ({n} seeds per arm): "
                "zero variance in both arms")
    if t.diff == 0:
        return (f"{what}, so {test} is undefined (t and p are nan, as scipy gives them): no difference at all in "
                "these seeds, and no spread to say how sure that is.")
    return (f"{what}, so {test} is degenerate (t = {t.t:.3g}, p = {t.p:.3g}, as scipy gives them): no p-value or "
            "interval measures chance here; the difference is the same however the seed falls, as far as these "
            "seeds show (is the metric independent of the seed?).")


def unfinished_lines(c: Comparison) -> list[str]:
    """Which runs the table leaves out (or takes in on their values so far), by name."""
    out = []
    if c.left_out:
        started = "the started ones" if any(u.status == "queued" for u in c.left_out) else "them"
        out.append(f"left out: {_count(c.left_out)} (--include-running compares {started} on their values so far):")
        out += [f"  {u.words()}" for u in c.left_out]
    if c.included_unfinished:
        out.append(f"included on their values so far (--include-running): {_count(c.included_unfinished)}:")
        out += [f"  {u.words()}" for u in c.included_unfinished]
    return out


def text(c: Comparison) -> str:
    lines = [f"metric {c.metric}, mean of the last {c.window} logged values of each run", ""]
    head = ("arm", "seeds", "mean", "95% CI", "sd", "settings")
    rows = []
    for a in c.arms:
        iv = a.interval
        ci = f"[{fmt(iv.low)}, {fmt(iv.high)}]" if iv and iv.n >= 2 else "-"
        rows.append((a.id, str(len(a.values)), fmt(iv.mean if iv else None), ci, fmt(iv.sd if iv else None), a.label))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)) for r in rows]
    lines += unfinished_lines(c)
    lines += ["", f"test: {c.paired_reason}"]
    lines += [verdict(c, b, o, t, why) for b, o, t, _, why in c.tests]
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def to_json(c: Comparison) -> dict[str, Any]:
    def test(t: stats.TestResult | None) -> dict[str, Any] | None:
        return None if t is None else {**t.__dict__, "significant": None if t.degenerate else t.significant}

    def runs(us: list[Unfinished]) -> list[dict[str, Any]]:
        return [u.__dict__ for u in us]

    return {
        "metric": c.metric, "window": c.window, "test": c.paired_reason, "notes": c.notes,
        "left_out": runs(c.left_out), "included_unfinished": runs(c.included_unfinished),
        "arms": [{"id": a.id, "label": a.label, "values": {r.run: r.value for r in a.runs},
                  "seeds": len(a.values),  # distinct seeds: replicas of one seed count once
                  "mean": a.interval.mean if a.interval else None,
                  # one seed: no interval (t with 0 degrees of freedom), null rather than [NaN, NaN]
                  "ci95": [a.interval.low, a.interval.high] if a.interval and a.interval.n >= 2 else None}
                 for a in c.arms],
        "comparisons": [{"base": b, "other": o, "test": test(t), "welch": test(w),
                         "verdict": verdict(c, b, o, t, why)} for b, o, t, w, why in c.tests],
    }


def band(a: ArmResult) -> list[tuple[int, stats.Interval]]:
    """The arm's curve: at each step, the t-interval across its distinct seeds (replicas of one seed averaged
    first, as `per_seed` does for the final values: they are not independent draws)."""
    out = []
    for s in sorted({s for r in a.runs for s, _ in r.curve}):
        by_seed: dict[Any, list[float]] = {}
        for r in a.runs:
            for st, v in r.curve:
                if st == s and math.isfinite(v):
                    by_seed.setdefault(r.seed if r.seed is not None else ("run", r.run), []).append(v)
        if by_seed:
            out.append((s, stats.t_interval([math.fsum(vs) / len(vs) for vs in by_seed.values()])))
    return out


def plot(c: Comparison, out: Path) -> Path:
    """Each arm's mean curve across seeds with its 95% band (t-interval per step)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RlctlError("--plot needs matplotlib.", hint='pip install "rlctl[plot]"') from None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for a in c.arms:
        xs, ms, lo, hi = [], [], [], []
        for s, iv in band(a):
            xs.append(s)
            ms.append(iv.mean)
            lo.append(iv.low if not math.isnan(iv.low) else iv.mean)
            hi.append(iv.high if not math.isnan(iv.high) else iv.mean)
        if xs:
            ax.plot(xs, ms, label=f"{a.id}: {a.label} (n={len(a.values)} seeds)")
            ax.fill_between(xs, lo, hi, alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel(c.metric)
    ax.legend(fontsize=8)
    ax.set_title(f"{c.metric}: mean across seeds, 95% band")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def markdown(c: Comparison, manifest: dict[str, Any] | None, plot_path: Path | None, question: str | None) -> str:
    """The research-log entry: question, variants, diffs, commits, results table, plot, verdict."""
    m = manifest or {}
    title = m.get("name") or "comparison"
    q = question or m.get("question") or f"Does {' / '.join(a.label for a in c.arms[1:]) or 'the change'} change " \
                                          f"{c.metric} against {c.arms[0].label}?"
    git = m.get("git") or {}
    lines = [f"## Experiment {title}", "", f"*{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}*", "",
             f"**Question.** {q}", ""]
    lines += ["**Variants.**", "", "| arm | settings | diff against the base | runs |", "|---|---|---|---|"]
    arm_diffs = {a["id"]: a.get("diff") or {} for a in m.get("arms", [])}
    for a in c.arms:
        d = arm_diffs.get(a.id, {})
        dtext = "; ".join(f"`{k}`: {v[0]} -> {v[1]}" for k, v in d.items()) or "(base)"
        lines.append(f"| {a.id} | {a.label} | {dtext} | {', '.join(r.run for r in a.runs)} |")
    lines += ["", f"**Code.** commit `{git.get('commit', 'unknown')}`"
              + (" (uncommitted changes)" if git.get("dirty") else "")
              + (f" on `{git['branch']}`" if git.get("branch") else "")
              + (f"; patch sets: {', '.join(m['patches'])}" if m.get("patches") else "; no patch set"), ""]
    lines += [f"**Results.** {c.metric}, mean of each run's last {c.window} logged values; 95% t-interval across "
              "seeds.", "", "| arm | seeds | mean | 95% CI | per seed |", "|---|---|---|---|---|"]
    for a in c.arms:
        iv = a.interval
        per = ", ".join(f"{seed}: {fmt(v)}" + (f" (mean of {len(names)} runs)" if len(names) > 1 else "")
                        for seed, v, names in a.per_seed)
        lines.append(f"| {a.id} | {len(a.values)} | {fmt(iv.mean if iv else None)} | "
                     f"{f'[{fmt(iv.low)}, {fmt(iv.high)}]' if iv and iv.n >= 2 else '-'} | {per} |")
    if left := unfinished_lines(c):
        lines += ["", left[0], "", *(f"- {x.strip()}" for x in left[1:])]
    if plot_path is not None:
        lines += ["", f"![{c.metric}]({plot_path})"]
    lines += ["", f"**Verdict** ({c.paired_reason}).", ""]
    lines += [f"- {verdict(c, b, o, t, why)}" for b, o, t, _, why in c.tests]
    lines += [f"- note: {n}" for n in c.notes]
    return "\n".join(lines) + "\n"
