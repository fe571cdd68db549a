"""`rlctl doctor`: the seeds' tuning playbook as rules over a run's metrics stream.

Each rule is a small function `(series, thresholds) -> Finding | None` with its thresholds in the recipe's
`[doctor]` table (defaults below); every finding carries its evidence (steps, values) and the suggested action.
"""

from __future__ import annotations

import statistics
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlctl.metrics.stream import METRICS, by_step, iter_metrics
from rlctl.runs.health import quality_eval_key, series

DEFAULTS: dict[str, float] = {
    "window": 10,  # steps looked at for "recent" behaviour
    "flat_reward_delta": 0.02,  # reward change over the window below this = flat
    "flat_kl_max": 1e-3,
    "kl_spike_factor": 5.0,  # kl above this x its running median = spike
    "loss_spike_factor": 3.0,
    "grad_norm_spike": 100.0,  # x max_norm (max_norm assumed 1 unless the recipe says)
    "entropy_collapse": 1.0,
    "truncation_high": 0.7,
    "length_collapse_factor": 0.5,  # mean length below this x its earlier level
    "zero_std_groups_high": 0.5,
    "eval_drops": 2,
}
# stop_when's `rule:N` sets this threshold of the rule (run.stop_when = ["eval_divergence:2"])
COUNT_KEYS: dict[str, str] = {"eval_divergence": "eval_drops", "eval_below_baseline": "eval_drops"}


@dataclass
class Finding:
    rule: str
    severity: str  # warn | critical
    message: str
    action: str
    evidence: dict[str, Any] = field(default_factory=dict)


Series = dict[str, list[tuple[int, float]]]
Rule = Callable[[Series, dict[str, Any]], "Finding | None"]
RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def reg(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return reg


def _window(s: list[tuple[int, float]], n: float) -> list[tuple[int, float]]:
    return s[-int(n):]


@rule("flat_learning")
def flat_learning(S: Series, t: dict[str, float]) -> Finding | None:
    reward = _window(S.get("reward/mean", []), t["window"])
    kl = _window(S.get("kl", []), t["window"])
    if len(reward) < t["window"]:
        return None
    delta = max(v for _, v in reward) - min(v for _, v in reward)
    if min(v for _, v in reward) >= 0.99 or max(v for _, v in reward) <= 0.0:
        return None  # saturated or dead reward: a different problem (status' health flags name it)
    kl_small = not kl or max(abs(v) for _, v in kl) < t["flat_kl_max"]
    if delta < t["flat_reward_delta"] and kl_small:
        return Finding("flat_learning", "warn",
                       f"reward flat over steps {reward[0][0]}-{reward[-1][0]} (range {delta:.3g}) with tiny KL",
                       "raise optim.lr, lower algorithm.kl_coef, or a larger rollout.group_size",
                       {"steps": [reward[0][0], reward[-1][0]], "reward_range": delta})
    return None


@rule("instability")
def instability(S: Series, t: dict[str, float]) -> Finding | None:
    kl = S.get("kl", [])
    if len(kl) < 6:
        return None
    base = statistics.median(abs(v) for _, v in kl[:-1]) or 1e-12
    step, last = kl[-1]
    ent = S.get("entropy", [])
    falling = len(ent) >= 4 and ent[-1][1] < ent[-4][1] * 0.8
    if abs(last) > t["kl_spike_factor"] * base and falling:
        return Finding("instability", "critical",
                       f"KL spiked to {last:.3g} at step {step} ({abs(last) / base:.0f}x median) while entropy falls",
                       "lower optim.lr, raise algorithm.kl_coef, clip gradients (optim.max_grad_norm)",
                       {"step": step, "kl": last, "kl_median": base})
    return None


@rule("loss_grad_spikes")
def spikes(S: Series, t: dict[str, float]) -> Finding | None:
    loss = S.get("policy_loss", [])
    grad = S.get("grad_norm", [])
    hits = []
    if len(loss) >= 6:
        level = max(statistics.median(abs(v) for _, v in loss), 1e-3)  # a loss near 0 has no "3x its level"
        hits += [(s, "policy_loss", v) for s, v in loss if abs(v) > t["loss_spike_factor"] * level]
    hits += [(s, "grad_norm", v) for s, v in grad if v > t["grad_norm_spike"]]
    if hits:
        steps = sorted({s for s, _, _ in hits})
        return Finding("loss_grad_spikes", "warn",
                       f"{len(hits)} loss/grad spike(s) at steps {steps[:8]}",
                       "tighten algorithm.eps_clip (0.2 -> 0.1), clamp the log-ratio, or lower optim.lr; advantage "
                       "clipping does not help (the cause is extreme log-probability ratios)",
                       {"spikes": [{"step": s, "key": k, "value": v} for s, k, v in hits[:20]]})
    return None


@rule("length_collapse")
def length_collapse(S: Series, t: dict[str, float]) -> Finding | None:
    length = S.get("response_length/mean", [])
    if len(length) < 2 * t["window"]:
        return None
    early = statistics.mean(v for _, v in length[: int(t["window"])])
    late = statistics.mean(v for _, v in length[-int(t["window"]):])
    if early > 0 and late < t["length_collapse_factor"] * early:
        return Finding("length_collapse", "warn", f"mean response length fell from {early:.0f} to {late:.0f}",
                       "add a length penalty, check entropy, add a KL constraint",
                       {"early": early, "late": late})
    return None


@rule("high_truncation")
def truncation(S: Series, t: dict[str, float]) -> Finding | None:
    tr = _window(S.get("response_length/clip_ratio", []), 3)
    if tr and all(v > t["truncation_high"] for _, v in tr):
        return Finding("high_truncation", "warn", f"{tr[-1][1]:.0%} of responses truncated (steps "
                       f"{tr[0][0]}-{tr[-1][0]})", "raise rollout.max_tokens or add a length penalty to the reward",
                       {"steps": [s for s, _ in tr], "values": [v for _, v in tr]})
    return None


@rule("entropy_collapse")
def entropy_collapse(S: Series, t: dict[str, float]) -> Finding | None:
    ent = S.get("entropy", [])
    if len(ent) >= 3 and ent[0][1] >= t["entropy_collapse"] > ent[-1][1]:
        return Finding("entropy_collapse", "warn", f"entropy fell below {t['entropy_collapse']} (now "
                       f"{ent[-1][1]:.3g} at step {ent[-1][0]}, started at {ent[0][1]:.3g})",
                       "diversity is collapsing: raise temperature or entropy bonus, lower optim.lr",
                       {"first": ent[0][1], "last": ent[-1][1]})
    return None


@rule("zero_variance_groups")
def zero_variance(S: Series, t: dict[str, float]) -> Finding | None:
    key = next((k for k in S if k.endswith("frac_reward_zero_std")), None)
    frac = _window(S.get(key, []), t["window"]) if key else []
    adv = _window(S.get("advantage/std", []), t["window"])
    if frac and statistics.mean(v for _, v in frac) > t["zero_std_groups_high"]:
        return Finding("zero_variance_groups", "warn",
                       f"{statistics.mean(v for _, v in frac):.0%} of groups have identical rewards "
                       f"(steps {frac[0][0]}-{frac[-1][0]}): no learning signal",
                       "harder/easier prompts (online difficulty filtering), larger rollout.group_size",
                       {"mean_fraction": statistics.mean(v for _, v in frac)})
    if len(adv) >= 3 and all(v == 0 for _, v in adv):
        return Finding("zero_variance_groups", "warn", "advantage std is 0: every group has identical rewards",
                       "check the reward function; larger rollout.group_size", {})
    return None


def _eval_series(S: Series, t: dict[str, Any]) -> tuple[str | None, list[tuple[int, float]], float | None]:
    """(the eval key to judge: the recipe's primary eval when it is in the stream, else the first quality eval;
    its evals after step 0; its step-0 baseline or None)."""
    from rlctl.evals.sets import resolve_key

    primary = t.get("primary")
    eval_key = (resolve_key(primary, [k for k, v in S.items() if v]) if isinstance(primary, str) else None) \
        or quality_eval_key(S)
    if not eval_key:
        return None, [], None
    ev = S[eval_key]
    base = next((v for s, v in ev if s == 0), None)
    return eval_key, [(s, v) for s, v in ev if s != 0], base


@rule("eval_divergence")
def eval_divergence(S: Series, t: dict[str, Any]) -> Finding | None:
    """Training reward up while eval falls for N consecutive evals: stop and take the earlier checkpoint."""
    eval_key, ev, base = _eval_series(S, t)
    if not eval_key:
        return None
    n = int(t["eval_drops"])
    if len(ev) < n + 1:
        return None
    tail = ev[-(n + 1):]
    dropping = all(tail[i + 1][1] < tail[i][1] for i in range(n))
    reward = S.get("reward/mean", [])
    up = len(reward) >= 2 and statistics.mean(v for _, v in reward[-3:]) >= statistics.mean(v for _, v in reward[:3])
    if dropping and up:
        best_step, best = max(ev, key=lambda x: x[1])
        below = (f", now below the pre-training baseline ({base:.3g} at step 0)"
                 if base is not None and tail[-1][1] < base else "")
        return Finding("eval_divergence", "critical",
                       f"{eval_key} fell {n} evals in a row ({tail[0][1]:.3g} -> {tail[-1][1]:.3g}) while training "
                       f"reward rose{below}: overfitting or reward hacking",
                       f"stop the run; the best eval was step {best_step} ({best:.3g}) — keep the checkpoint at or "
                       "before it (rlctl ckpt list)",
                       {"eval_key": eval_key, "best_step": best_step, "best": best, "baseline": base})
    return None


@rule("eval_below_baseline")
def eval_below_baseline(S: Series, t: dict[str, Any]) -> Finding | None:
    """The last N evals below the step-0 (base model) eval: training made held-out quality worse."""
    eval_key, ev, base = _eval_series(S, t)
    n = int(t["eval_drops"])
    if not eval_key or base is None or len(ev) < n:
        return None
    tail = ev[-n:]
    if all(v < base for _, v in tail):
        return Finding("eval_below_baseline", "warn",
                       f"{eval_key} is below the pre-training baseline ({base:.3g} at step 0) for the last {n} "
                       f"evals (steps {[s for s, _ in tail]}, now {tail[-1][1]:.3g})",
                       "the run is making held-out quality worse: lower optim.lr, raise algorithm.kl_coef, or stop "
                       "and keep an earlier checkpoint", {"eval_key": eval_key, "baseline": base,
                                                           "recent": [[s, v] for s, v in tail]})
    return None


def thresholds(run_dir: Path) -> dict[str, float]:
    t = dict(DEFAULTS)
    try:
        doc = tomllib.loads((run_dir / "recipe.toml").read_text()).get("doctor", {})
        t.update({k: float(v) for k, v in doc.items() if k in DEFAULTS})
    except (OSError, tomllib.TOMLDecodeError, ValueError, TypeError):
        pass
    return t


def diagnose_records(records: list[dict[str, Any]], t: dict[str, Any] | None = None) -> list[Finding]:
    t = {**DEFAULTS, **(t or {})}
    merged = by_step(records)
    keys = {k for rec in merged.values() for k in rec if k not in ("step", "time")}
    S = {k: series(merged, k) for k in keys}
    out = []
    for fn in RULES.values():
        f = fn(S, t)
        if f:
            out.append(f)
    return sorted(out, key=lambda f: f.severity != "critical")


def thresholds_with_primary(run_dir: Path) -> dict[str, Any]:
    """The run's thresholds and its primary eval key (the recipe's eval sets), which eval rules judge by."""
    from rlctl.evals.sets import primary_key_from_run

    t: dict[str, Any] = thresholds(run_dir)
    t["primary"] = primary_key_from_run(run_dir)
    return t


def diagnose(run_dir: Path) -> list[Finding]:
    return diagnose_records(list(iter_metrics(run_dir / METRICS)), thresholds_with_primary(run_dir))


def headline(run_dir: Path, records: list[dict[str, Any]] | None = None) -> str | None:
    """The most serious finding, over `records` (e.g. the tail status read) or the whole stream."""
    findings = diagnose(run_dir) if records is None else diagnose_records(records, thresholds_with_primary(run_dir))
    if not findings:
        return None
    f = findings[0]
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return f"{f.rule}: {f.message}{more}"


def to_json(findings: list[Finding]) -> list[dict[str, Any]]:
    return [asdict(f) for f in findings]
