"""`rlctl doctor`: the seeds' tuning playbook as rules over a run's metrics stream.

Each rule is a small function `(series, thresholds) -> Finding | None` with its thresholds in the recipe's
`[doctor]` table (defaults below); every finding carries its evidence (steps, values) and the suggested action.
A rule's advice names recipe keys only where the run's backend has that knob (`Backend.honours`): a trainer without
a clip range is never told to tighten `algorithm.eps_clip`. The rules are checked both ways on a labelled corpus of
real runs (tests/fixtures/doctor_corpus, tests/test_doctor_corpus.py); docs/doctor.md lists them.
"""

from __future__ import annotations

import math
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
    "kl_spike_min": 0.1,  # ... and above this (a first KL after an exact 0 is no spike)
    "reward_ceiling": 1.0,  # a reward at 99% of this is "solved"; below it a plateau is only a plateau
    "loss_spike_factor": 3.0,  # |loss| above this x the median of the steps before it = spike
    "grad_norm_spike": 100.0,  # x optim.max_grad_norm (1 unless the recipe says)
    "entropy_collapse": 1.0,
    "stationary_entropy": 1e-3,  # entropy range over the window below this x its level = a policy that does not move
    "truncation_high": 0.7,
    "length_collapse_factor": 0.5,  # mean length below this x its earlier level
    "zero_std_groups_high": 0.5,
    "reward_rise": 0.1,  # reward up by this much (first window -> last window) = learned
    "saturated_std": 0.02,  # reward std (within groups) below this = no signal left
    "saturation_band": 0.05,  # the last window within this fraction of the best reward = stays at its best
    "eval_drops": 2,
}
# stop_when's `rule:N` sets this threshold of the rule (run.stop_when = ["eval_divergence:2"])
COUNT_KEYS: dict[str, str] = {"eval_divergence": "eval_drops", "eval_below_baseline": "eval_drops"}

SEVERITY_ORDER = {"critical": 0, "warn": 1, "info": 2, "ok": 3}


@dataclass
class Finding:
    rule: str
    severity: str  # critical | warn | info (true and expected, e.g. a reward saturated at its ceiling) | ok
    message: str
    action: str  # a rule returns its advice as a list of (recipe key | None, words); _advise makes it this line
    evidence: dict[str, Any] = field(default_factory=dict)


Series = dict[str, list[tuple[int, float]]]
Rule = Callable[[Series, dict[str, Any]], "Finding | None"]
RULES: dict[str, Rule] = {}
# Advice: (recipe key the advice turns, or None for advice about code/data) and the words. A part whose key the run's
# backend does not honour is left out (and listed in the finding's evidence under `advice_not_applicable`).
Advice = list[tuple[str | None, str]]
Knobs = Callable[[str], "bool | None"]


def rule(name: str) -> Callable[[Rule], Rule]:
    def reg(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return reg


def _window(s: list[tuple[int, float]], n: float) -> list[tuple[int, float]]:
    return s[-int(n):]


def _finite(s: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(k, v) for k, v in s if math.isfinite(v)]


def _mean(s: list[tuple[int, float]]) -> float:
    return statistics.mean(v for _, v in s)


def _zero_std_key(S: Series) -> str | None:
    return next((k for k in S if k.endswith("frac_reward_zero_std")), None)


def _no_signal(S: Series, t: dict[str, float]) -> tuple[bool, str]:
    """Do the recent groups carry no learning signal (identical rewards within each group)? (answer, evidence)"""
    key = _zero_std_key(S)
    frac = _finite(_window(S.get(key, []), t["window"])) if key else []
    if frac:
        m = _mean(frac)
        return m > t["zero_std_groups_high"], f"{m:.0%} of groups with identical rewards"
    std = _finite(_window(S.get("reward/std", []), t["window"]))
    if len(std) >= 3:
        return max(v for _, v in std) < t["saturated_std"], f"reward std <= {max(v for _, v in std):.3g}"
    adv = _finite(_window(S.get("advantage/std", []), t["window"]))
    if len(adv) >= 3:
        return all(v == 0 for _, v in adv), "advantage std 0"
    return False, ""


def _rewards_differ(S: Series, t: dict[str, float]) -> bool:
    """Positive evidence that recent groups' rewards differ: finite rewards, and a reward std above 0 (or, without
    one, most groups not zero-variance). NaN rewards are no evidence (a trainer may count a NaN std as "not zero")."""
    recent = _window(S.get("reward/mean", []), t["window"]) + _window(S.get("reward/std", []), t["window"])
    if any(not math.isfinite(v) for _, v in recent):
        return False
    std = _window(S.get("reward/std", []), t["window"])
    if std:
        return any(v > 0 for _, v in std)
    return bool(_zero_std_key(S)) and not _no_signal(S, t)[0]


def _rise(S: Series, t: dict[str, float]) -> float | None:
    """How much the reward rose from the first window to the last (None: too short to tell)."""
    reward = _finite(S.get("reward/mean", []))
    n = int(min(t["window"], len(reward) // 2))
    if n < 3:
        return None
    return _mean(reward[-n:]) - _mean(reward[:n])


def saturated(S: Series, t: dict[str, float]) -> bool:
    """The reward rose, then stayed at its best (the recent window within `saturation_band` of the run's maximum) or
    the groups ran out of variance: the task's ceiling as posed (or a plateau), not a problem of the optimizer."""
    rise = _rise(S, t)
    if rise is None or rise < t["reward_rise"]:
        return False
    if _no_signal(S, t)[0]:
        return True
    reward = _finite(S.get("reward/mean", []))
    recent = [v for _, v in _window(reward, t["window"])]
    best = max(v for _, v in reward)
    band = max(t["flat_reward_delta"], t["saturation_band"] * abs(best))
    return min(recent) >= best - band


def at_ceiling(S: Series, t: dict[str, float]) -> bool:
    """The last steps' reward within 2% of doctor.reward_ceiling (1.0 unless the recipe says)."""
    recent = _finite(_window(S.get("reward/mean", []), min(5, t["window"])))
    return bool(recent) and _mean(recent) >= 0.98 * t["reward_ceiling"]


@rule("saturated")
def saturation(S: Series, t: dict[str, float]) -> Finding | None:
    if not saturated(S, t):
        return None
    reward = _finite(S.get("reward/mean", []))
    last = _window(reward, t["window"])
    none, what = _no_signal(S, t)
    if at_ceiling(S, t):
        why = (f"{what}: " if what else "") + "the task is solved as posed, nothing is left to learn from these prompts"
    else:
        why = ((f"{what}; " if what else "") + f"a plateau below {t['reward_ceiling']:g} (doctor.reward_ceiling): if "
               "that is not the task's ceiling, the policy may have collapsed onto one answer (check entropy)")
    solved = at_ceiling(S, t)
    return Finding("saturated", "info" if solved else "warn",
                   f"reward rose by {_rise(S, t):.3g} to {_mean(last):.3g} and stays at its best (steps "
                   f"{last[0][0]}-{last[-1][0]}), {why}",
                   "stop here (the newest checkpoint is the result), or make the task harder (prompts the policy "
                   "still fails, online difficulty filtering)" if solved else
                   "read samples of the newest completions; if they are one repeated answer, take an earlier "
                   "checkpoint (rlctl ckpt list) and lower the lr or raise the KL",
                   {"reward_rise": _rise(S, t), "reward_recent": _mean(last)})


@rule("flat_learning")
def flat_learning(S: Series, t: dict[str, float]) -> Finding | None:
    reward = _finite(_window(S.get("reward/mean", []), t["window"]))
    kl = _finite(_window(S.get("kl", []), t["window"]))
    if len(reward) < t["window"]:
        return None
    delta = max(v for _, v in reward) - min(v for _, v in reward)
    if min(v for _, v in reward) >= 0.99 or max(v for _, v in reward) <= 0.0:
        return None  # saturated or dead reward: a different problem (saturated / zero_variance_groups name it)
    if _no_signal(S, t)[0]:
        return None  # no variance within groups: a larger lr cannot help (zero_variance_groups / saturated)
    rise = _rise(S, t)
    if rise is not None and rise >= t["reward_rise"]:
        return None  # it learned, then levelled off: a plateau or the ceiling (saturated), not a run that never moved
    kl_small = not kl or max(abs(v) for _, v in kl) < t["flat_kl_max"]
    if delta < t["flat_reward_delta"] and kl_small:
        return Finding("flat_learning", "warn",
                       f"reward flat over steps {reward[0][0]}-{reward[-1][0]} (range {delta:.3g}) with tiny KL "
                       "while the groups do carry a signal",
                       [("optim.lr", "raise optim.lr"), ("algorithm.kl_coef", "lower algorithm.kl_coef"),
                        ("rollout.group_size", "a larger rollout.group_size")],
                       {"steps": [reward[0][0], reward[-1][0]], "reward_range": delta})
    return None


def _coarse(S: Series) -> bool:
    """Was every number of the stream printed with at most 3 decimals? Then a 0 says only "below 0.0005"."""
    return not any(v != 0 and abs(v - round(v, 3)) > 1e-12 * max(1.0, abs(v))
                   for vals in S.values() for _, v in vals if math.isfinite(v))


@rule("frozen_weights")
def frozen_weights(S: Series, t: dict[str, float]) -> Finding | None:
    """Signs in the metrics that the weights cannot move: lr 0, no gradient although the groups carry a signal, or a
    KL to the reference that stays exactly 0. (`doctor --weights` proves it from the checkpoints.)"""
    w = int(t["window"])
    if _coarse(S):
        return None  # printed at 3 decimals (a console log): an lr of 1e-6 reads 0.000, a small grad_norm 0.000
    lr = _finite(S.get("lr", []))
    if len(lr) >= 3 and all(v == 0 for _, v in _window(lr, w)):
        recent = _window(lr, w)
        return Finding("frozen_weights", "critical",
                       f"the learning rate is 0 at steps {recent[0][0]}-{recent[-1][0]}: the weights do not move",
                       [("optim.lr", "check optim.lr and its schedule (warmup, decay to 0)"),
                        (None, "rlctl doctor --weights compares the checkpoints")],
                       {"steps": [recent[0][0], recent[-1][0]]})
    grad = _finite(_window(S.get("grad_norm", []), w))
    if len(grad) >= min(w, 5) and all(v == 0 for _, v in grad) and _rewards_differ(S, t):
        return Finding("frozen_weights", "critical",
                       f"grad_norm is 0 at every step {grad[0][0]}-{grad[-1][0]} although the groups' rewards differ: "
                       "no gradient reaches the trainable parameters",
                       [("lora.target_modules", "check lora.target_modules"),
                        (None, "check which parameters require grad; rlctl doctor --weights compares the checkpoints")],
                       {"steps": [grad[0][0], grad[-1][0]]})
    ent = _finite(_window(S.get("entropy", []), w))
    kl_recent = _finite(_window(S.get("kl", []), w))
    if (len(ent) >= w and min(v for _, v in ent) > t["entropy_collapse"] and _rewards_differ(S, t)
            and max(v for _, v in ent) - min(v for _, v in ent) < t["stationary_entropy"] * ent[-1][1]
            and all(abs(v) < t["flat_kl_max"] for _, v in kl_recent)):
        span = max(v for _, v in ent) - min(v for _, v in ent)
        return Finding("frozen_weights", "warn",
                       f"the policy's entropy stayed at {ent[-1][1]:.4g} (range {span:.2g}) over steps "
                       f"{ent[0][0]}-{ent[-1][0]} although the groups' rewards differ: the weights may not be moving",
                       [(None, "rlctl doctor --weights compares the checkpoints"),
                        ("model.precision", "with pure bf16 parameters an update below half a bf16 step is rounded "
                         "away: model.precision = \"mixed\""), ("optim.lr", "or raise optim.lr")],
                       {"steps": [ent[0][0], ent[-1][0]], "entropy_range": span})
    kl = _finite(S.get("kl", []))
    if len(kl) >= w and all(v == 0 for _, v in _window(kl, w)):
        recent = _window(kl, w)
        return Finding("frozen_weights", "warn",
                       f"the KL to the reference is exactly 0 at steps {recent[0][0]}-{recent[-1][0]}: the policy "
                       "has not moved from the reference",
                       [(None, "rlctl doctor --weights compares the checkpoints"),
                        ("model.precision", "with pure bf16 parameters an update below half a bf16 step is rounded "
                         "away: model.precision = \"mixed\""), ("optim.lr", "or raise optim.lr")],
                       {"steps": [recent[0][0], recent[-1][0]]})
    return None


@rule("instability")
def instability(S: Series, t: dict[str, float]) -> Finding | None:
    """A KL spike (over kl_spike_factor x its median over the steps before, and over kl_spike_min) at a step where
    entropy drops by a fifth or more: the policy jumped away from the reference. The first such step is reported."""
    kl = _finite(S.get("kl", []))
    ent = dict(_finite(S.get("entropy", [])))
    for i in range(1, len(kl)):
        step, value = kl[i]
        base = statistics.median(abs(v) for _, v in kl[max(0, i - 5):i])
        if abs(value) <= max(t["kl_spike_factor"] * base, t["kl_spike_min"]):
            continue
        before = [ent[s] for s, _ in kl[max(0, i - 3):i] if s in ent]
        if step in ent and before and ent[step] < 0.8 * max(before):
            return Finding("instability", "critical",
                           f"KL jumped to {value:.3g} at step {step} (median before: {base:.3g}) while entropy fell "
                           f"{max(before):.3g} -> {ent[step]:.3g}" + (f"; KL now {kl[-1][1]:.3g}" if i < len(kl) - 1
                                                                        else ""),
                           [("optim.lr", "lower optim.lr"), ("algorithm.kl_coef", "raise algorithm.kl_coef"),
                            ("optim.max_grad_norm", "clip gradients (optim.max_grad_norm)")],
                           {"step": step, "kl": value, "kl_median": base})
    return None


@rule("loss_grad_spikes")
def spikes(S: Series, t: dict[str, float]) -> Finding | None:
    """A spike is a jump above the run's own recent level: |loss| over loss_spike_factor x the median |loss| of the
    steps just before it (a loss that falls, as a loss should, never spikes), or grad_norm over grad_norm_spike x
    max_grad_norm. The first steps have no level yet and are never spikes."""
    loss = _finite(S.get("policy_loss", []))
    grad = _finite(S.get("grad_norm", []))
    hits = []
    scale = max((abs(v) for _, v in loss), default=0.0)
    floor = max(1e-3, 0.05 * scale)  # a GRPO loss hovers around 0: "3x its level" needs a level
    for i in range(3, len(loss)):
        level = max(statistics.median(abs(v) for _, v in loss[max(0, i - 5):i]), floor)
        s, v = loss[i]
        if abs(v) > t["loss_spike_factor"] * level:
            hits.append((s, "policy_loss", v))
    limit = t["grad_norm_spike"] * t.get("max_grad_norm", 1.0)
    hits += [(s, "grad_norm", v) for s, v in grad if v > limit]
    if hits:
        steps = sorted({s for s, _, _ in hits})
        return Finding("loss_grad_spikes", "warn",
                       f"{len(hits)} loss/grad spike(s) at steps {steps[:8]}",
                       [("algorithm.eps_clip", "tighten algorithm.eps_clip (0.2 -> 0.1)"),
                        (None, "clamp the log-ratio"), ("optim.lr", "lower optim.lr"),
                        (None, "advantage clipping does not help (the cause is extreme log-probability ratios)")],
                       {"spikes": [{"step": s, "key": k, "value": v} for s, k, v in hits[:20]]})
    return None


@rule("length_collapse")
def length_collapse(S: Series, t: dict[str, float]) -> Finding | None:
    length = _finite(S.get("response_length/mean", []))
    if len(length) < 2 * t["window"]:
        return None
    early = statistics.mean(v for _, v in length[: int(t["window"])])
    late = statistics.mean(v for _, v in length[-int(t["window"]):])
    if early > 0 and late < t["length_collapse_factor"] * early:
        return Finding("length_collapse", "warn", f"mean response length fell from {early:.0f} to {late:.0f}",
                       [(None, "add a length penalty"), (None, "check entropy"),
                        ("algorithm.kl_coef", "add a KL constraint (algorithm.kl_coef)")],
                       {"early": early, "late": late})
    return None


@rule("high_truncation")
def truncation(S: Series, t: dict[str, float]) -> Finding | None:
    tr = _finite(_window(S.get("response_length/clip_ratio", []), 3))
    if tr and all(v > t["truncation_high"] for _, v in tr):
        return Finding("high_truncation", "warn", f"{tr[-1][1]:.0%} of responses truncated (steps "
                       f"{tr[0][0]}-{tr[-1][0]})",
                       [("rollout.max_tokens", "raise rollout.max_tokens"),
                        (None, "add a length penalty to the reward"),
                        (None, "if the model never emits its end-of-sequence token (a tiny or base model), "
                         "truncation is by design")],
                       {"steps": [s for s, _ in tr], "values": [v for _, v in tr]})
    return None


@rule("entropy_collapse")
def entropy_collapse(S: Series, t: dict[str, float]) -> Finding | None:
    ent = _finite(S.get("entropy", []))
    if len(ent) >= 3 and ent[0][1] >= t["entropy_collapse"] > ent[-1][1]:
        msg = (f"entropy fell below {t['entropy_collapse']} (now {ent[-1][1]:.3g} at step {ent[-1][0]}, started at "
               f"{ent[0][1]:.3g})")
        if saturated(S, t) and at_ceiling(S, t):
            return Finding("entropy_collapse", "info", msg + ": the policy converged on a saturated reward",
                           [(None, "expected once the task is solved"),
                            ("rollout.temperature", "for more diverse samples raise rollout.temperature")],
                           {"first": ent[0][1], "last": ent[-1][1]})
        return Finding("entropy_collapse", "warn", msg + ": diversity is collapsing",
                       [("rollout.temperature", "raise rollout.temperature"),
                        ("algorithm.entropy_coef", "an entropy bonus (algorithm.entropy_coef)"),
                        ("optim.lr", "lower optim.lr")],
                       {"first": ent[0][1], "last": ent[-1][1]})
    return None


@rule("zero_variance_groups")
def zero_variance(S: Series, t: dict[str, float]) -> Finding | None:
    """Groups with identical rewards carry no signal. After the reward rose to its ceiling that is `saturated`;
    otherwise the prompts are too hard or too easy from the start, or the reward cannot tell samples apart."""
    if saturated(S, t):
        return None
    none, what = _no_signal(S, t)
    if not none:
        return None
    key = _zero_std_key(S)
    s = _finite(S.get(key or "reward/std", [])) or _finite(S.get("advantage/std", []))
    from_start = bool(s) and (s[0][1] > t["zero_std_groups_high"] if key else s[0][1] < t["saturated_std"])
    reward = _finite(S.get("reward/mean", []))
    constant = len(reward) >= 3 and max(v for _, v in reward) - min(v for _, v in reward) < 1e-9
    recent = _window(s, t["window"])
    return Finding("zero_variance_groups", "warn",
                   f"{what} (steps {recent[0][0]}-{recent[-1][0]})" + (", from the first step" if from_start else "")
                   + (f"; the reward is the same ({reward[0][1]:.3g}) at every step" if constant else "")
                   + ": those groups give no learning signal",
                   [(None, "check that the reward function can tell completions apart" if constant else
                     "prompts the policy sometimes solves (online difficulty filtering)"),
                    ("rollout.group_size", "a larger rollout.group_size")],
                   {"from_start": from_start, "constant_reward": constant})


# keys whose NaN means a broken run; a NaN elsewhere can be by design (a mean length of the completions that
# terminated is NaN when every completion was truncated)
_MUST_BE_FINITE = ("reward/mean", "reward/std", "policy_loss", "grad_norm", "kl", "entropy", "lr", "correctness")


def _must_be_finite(key: str) -> bool:
    parts = key.split("/")
    return key in _MUST_BE_FINITE or parts[0] == "advantage" or any(
        p.startswith("reward") or p.endswith("loss") for p in parts[1:])


@rule("non_finite")
def non_finite(S: Series, t: dict[str, float]) -> Finding | None:
    """NaN or inf in a reward, loss, gradient, KL, entropy or lr (stored as null: see _series)."""
    bad = {k: [s for s, v in vals if not math.isfinite(v)] for k, vals in S.items() if _must_be_finite(k)}
    bad = {k: v for k, v in bad.items() if v}
    if not bad:
        return None
    first = min(s for v in bad.values() for s in v)
    keys = sorted(bad, key=lambda k: bad[k][0])
    return Finding("non_finite", "critical",
                   f"NaN/inf values: {', '.join(f'{k} at {len(bad[k])} step(s) from {bad[k][0]}' for k in keys[:5])}",
                   [(None, f"look at step {first}: a reward function that returns NaN, a division by zero in the "
                     "loss, or an overflow"), ("optim.lr", "lower optim.lr if the loss diverged"),
                    ("model.precision", "model.precision = \"mixed\" if half precision overflowed")],
                   {"first_step": first, "keys": {k: bad[k][:20] for k in keys}})


@rule("reward_hacking")
def reward_hacking(S: Series, t: dict[str, float]) -> Finding | None:
    """The seeds' playbook: training reward up while correctness (a `correctness` metric, else the eval's quality
    metric) is flat or down."""
    rise = _rise(S, t)
    if rise is None or rise < t["reward_rise"]:
        return None
    key = "correctness" if len(_finite(S.get("correctness", []))) >= 3 else quality_eval_key(S)
    q = _finite(S.get(key, [])) if key else []
    if len(q) < 3:
        return None
    n = max(1, len(q) // 3)
    before, after = _mean(q[:n]), _mean(q[-n:])
    if after > before + 0.01 * max(abs(before), 1.0):
        return None
    return Finding("reward_hacking", "warn",
                   f"training reward rose by {rise:.3g} while {key} went {before:.3g} -> {after:.3g}: the reward "
                   "pays for something other than what is measured",
                   [(None, "reweight the reward toward correctness, add judge redundancy; read samples of the "
                     "highest-reward completions")],
                   {"reward_rise": rise, "quality_key": key, "before": before, "after": after})


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
    ev = _finite(ev)
    n = int(t["eval_drops"])
    if len(ev) < n + 1:
        return None
    tail = ev[-(n + 1):]
    dropping = all(tail[i + 1][1] < tail[i][1] for i in range(n))
    reward = _finite(S.get("reward/mean", []))
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
    ev = _finite(ev)
    n = int(t["eval_drops"])
    if not eval_key or base is None or len(ev) < n:
        return None
    tail = ev[-n:]
    if all(v < base for _, v in tail):
        return Finding("eval_below_baseline", "warn",
                       f"{eval_key} is below the pre-training baseline ({base:.3g} at step 0) for the last {n} "
                       f"evals (steps {[s for s, _ in tail]}, now {tail[-1][1]:.3g})",
                       [(None, "the run is making held-out quality worse"), ("optim.lr", "lower optim.lr"),
                        ("algorithm.kl_coef", "raise algorithm.kl_coef"),
                        (None, "or stop and keep an earlier checkpoint")],
                       {"eval_key": eval_key, "baseline": base, "recent": [[s, v] for s, v in tail]})
    return None


def _advise(f: Finding, knobs: Knobs | None) -> Finding:
    """Turn a rule's advice parts into the action line, leaving out knobs the backend does not have."""
    if isinstance(f.action, str):
        return f
    kept, dropped, at_limit = [], [], []
    value = getattr(knobs, "value", None)
    for key, words in f.action:
        now = value(key) if key is not None and value is not None else None
        if key is not None and words.startswith("lower ") and isinstance(now, (int, float)) and now <= 0:
            at_limit.append(f"{key} = {now}")  # nothing below 0 to lower it to: never advised
        elif key is None or knobs is None or knobs(key) is not False:
            kept.append(words)
        else:
            dropped.append(key)
    if dropped:
        f.evidence["advice_not_applicable"] = dropped  # the backend has no such knob (Backend.honours)
    if at_limit:
        f.evidence["advice_at_limit"] = at_limit
    f.action = ", ".join(kept) if kept else "no knob of this backend addresses it: see docs/doctor.md"
    return f


def recipe_knobs(run_dir: Path) -> Knobs | None:
    """`key -> honoured?` for the run's backend and recorded recipe (None: no recipe or backend to ask)."""
    import json

    try:
        backend_name = json.loads((run_dir / "state.json").read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        backend_name = None
    try:
        from rlctl.backends import get_backend
        from rlctl.recipe.loader import load

        recipe = load(run_dir / "recipe.toml").recipe
        adapter = get_backend(backend_name or recipe.backend.name)
    except Exception:  # an attached run without a recipe, a recipe that no longer validates, an unknown backend
        return None
    cache: dict[str, bool | None] = {}
    try:  # a knob the backend has but this recipe's settings leave without effect (algorithm.inert: eps_clip with
        inert = {i.key for i in adapter.inert(adapter.effective(recipe).recipe)}  # one optimizer step per rollout)
    except Exception:  # an adapter that cannot judge this recipe: the knob question alone decides
        inert = set()

    def honours(key: str) -> bool | None:
        if key not in cache:
            cache[key] = False if key in inert else adapter.honours(recipe, key)
        return cache[key]

    def value(key: str) -> Any:
        """The recorded recipe's value at a dotted key (None where there is none): advice to lower a value already
        at 0 is left out."""
        obj: Any = recipe
        for part in key.split("."):
            obj = getattr(obj, part, None)
        return obj

    honours.value = value  # type: ignore[attr-defined]
    return honours


def thresholds(run_dir: Path) -> dict[str, float]:
    t = dict(DEFAULTS)
    try:
        doc = tomllib.loads((run_dir / "recipe.toml").read_text())
        grad_clip = doc.get("optim", {}).get("max_grad_norm")
        if isinstance(grad_clip, (int, float)) and grad_clip > 0:
            t["max_grad_norm"] = float(grad_clip)
        t.update({k: float(v) for k, v in doc.get("doctor", {}).items() if k in DEFAULTS})
    except (OSError, tomllib.TOMLDecodeError, ValueError, TypeError, AttributeError):
        pass
    return t


def _series(merged: dict[int, dict[str, Any]], keys: list[str]) -> Series:
    """Numeric series per key; a null where the key is otherwise a number, or any null of a reward, loss, gradient,
    KL, entropy or lr, is a NaN/inf the stream could not store (metrics.clean_value turns them into null), kept as NaN
    for the non_finite rule."""
    S = {k: series(merged, k) for k in keys}
    for k, vals in S.items():
        if not vals and not _must_be_finite(k):
            continue  # never a number: not a metric whose null means NaN
        nulls = [(s, math.nan) for s, r in merged.items() if k in r and r[k] is None]
        if nulls:
            S[k] = sorted(vals + nulls)
    return {k: v for k, v in S.items() if v}


def diagnose_records(records: list[dict[str, Any]], t: dict[str, Any] | None = None,
                     knobs: Knobs | None = None) -> list[Finding]:
    t = {**DEFAULTS, **(t or {})}
    merged = by_step(records)
    if not merged:
        return [Finding("no_records", "critical", "no metrics records: nothing was diagnosed",
                        "check that the run has started and logged a step (rlctl logs RUN); for a run rlctl did not "
                        "start, that its metrics map matches the log (rlctl attach --backend ...)", {})]
    # first-seen order, as the stream has them (the eval quality metric is the first quality-looking key)
    keys = list(dict.fromkeys(k for rec in merged.values() for k in rec if k not in ("step", "time")))
    S = _series(merged, keys)
    out = []
    for fn in RULES.values():
        f = fn(S, t)
        if f:
            out.append(_advise(f, knobs))
    return sorted(out, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))


def thresholds_with_primary(run_dir: Path) -> dict[str, Any]:
    """The run's thresholds and its primary eval key (the recipe's eval sets), which eval rules judge by."""
    from rlctl.evals.sets import primary_key_from_run

    t: dict[str, Any] = thresholds(run_dir)
    t["primary"] = primary_key_from_run(run_dir)
    return t


def diagnose(run_dir: Path) -> list[Finding]:
    findings = diagnose_records(list(iter_metrics(run_dir / METRICS)), thresholds_with_primary(run_dir),
                                recipe_knobs(run_dir))
    if findings and findings[0].rule == "no_records":
        findings[0].message = f"no metrics records in {run_dir / METRICS}: nothing was diagnosed"
    return findings


def cause_finding(run_dir: Path) -> Finding | None:
    """A run that died or hangs: why, with its evidence lines (rlctl.runs.causes, the one place that decides)."""
    from rlctl.runs.causes import say
    from rlctl.runs.state import run_status

    rs = run_status(run_dir, ingest=False)
    if rs.cause is None:
        return None
    verb = {"stalled": "hangs:", "running": "is running, but"}.get(rs.status, f"{rs.status}:")
    return Finding("cause", "critical", f"the run {verb} {say(rs.cause, rs.state.get('host'))}",
                   str(rs.cause.get("fix") or ""), {"lines": list(rs.cause.get("evidence") or []),
                                                    "cause": rs.cause})


def repeated_failure_finding(run_dir: Path) -> Finding | None:
    """A run the supervisor did not restart because its attempt failed as the one before it did, no further on."""
    from rlctl.core.state import read_state

    seen = read_state(run_dir).get("repeated_failure")
    if not isinstance(seen, dict) or not seen.get("message"):
        return None
    cause = seen.get("cause") if isinstance(seen.get("cause"), dict) else {}
    return Finding("repeated_failure", "critical", str(seen["message"]),
                   "the same recipe fails the same way again: fix what the evidence shows (a recipe key, the "
                   "backend's release or a patch), then `rlctl resume RUN`; raising --max-restarts would only repeat "
                   "it", {"lines": list(cause.get("evidence") or []), "attempts": seen.get("attempts")})


def headline(run_dir: Path, records: list[dict[str, Any]] | None = None) -> str | None:
    """The most serious finding, over `records` (e.g. the tail status read) or the whole stream."""
    if records is None:
        findings = diagnose(run_dir)
    else:
        findings = diagnose_records(records, thresholds_with_primary(run_dir), recipe_knobs(run_dir))
    findings = [f for f in findings if f.rule != "no_records"]  # status shows "no steps" itself
    if not findings:
        return None
    f = findings[0]
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return f"{f.rule}: {f.message}{more}"


def to_json(findings: list[Finding]) -> list[dict[str, Any]]:
    return [asdict(f) for f in findings]
