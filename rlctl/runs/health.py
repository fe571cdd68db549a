"""Health flags from the seeds' early smoke-test criteria, over the last steps of a metrics stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Flag:
    key: str
    message: str
    action: str


def series(merged: dict[int, dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(s, float(r[key])) for s, r in merged.items() if isinstance(r.get(key), (int, float))
            and not isinstance(r.get(key), bool)]


# Eval metrics that measure quality (higher is better) vs those that measure cost or failure; the best checkpoint and
# the doctor's eval rule must compare steps on one quality metric, not on whichever eval number happens to be largest.
_QUALITY = ("reward", "accuracy", "acc", "score", "pass", "correct", "success", "win")
_NOT_QUALITY = ("length", "len", "error", "clip_ratio", "truncat", "time", "turns", "branches", "loss", "kl",
                "entropy", "policy_version", "std", "frac_")  # a spread or a fraction of groups is not a quality


def quality_eval_key(keys: Any, prefix: str = "eval/") -> str | None:
    """The eval metric to rank steps by: the first quality-looking one (reward, accuracy, pass@k, ...), else the first
    one that is not a cost (lengths, errors, truncation, time, turns)."""
    evals = [k for k in keys if k.startswith(prefix)]
    for k in evals:
        leaf = k[len(prefix):].lower()
        if any(q in leaf for q in _QUALITY) and not any(n in leaf for n in _NOT_QUALITY):
            return k
    return next((k for k in evals if not any(n in k[len(prefix):].lower() for n in _NOT_QUALITY)), None)


def _find_key(merged: dict[int, dict[str, Any]], suffix: str) -> str | None:
    for rec in reversed(list(merged.values())):
        for k in rec:
            if k == suffix or k.endswith("/" + suffix):
                return k
    return None


def _identical_rewards(rec: dict[str, Any]) -> bool | None:
    """Did every group of this step get identical rewards (no learning signal)? None: the step does not say."""
    frac = next((v for k, v in rec.items() if k.endswith("frac_reward_zero_std") and isinstance(v, (int, float))),
                None)
    if frac is not None:
        return frac >= 1.0
    for key in ("reward/std", "advantage/std"):
        if isinstance(rec.get(key), (int, float)):
            return rec[key] == 0
    return None


def _zero_grad(merged: dict[int, dict[str, Any]], grad: list[tuple[int, float]], step: int, window: int) -> Flag:
    """grad_norm 0 is frozen weights only when the groups carried a signal: with identical rewards in every group
    (a saturated or constant reward) the advantages are 0 and so is the gradient, while the weights are fine."""
    rec = merged.get(step, {})
    if any(k in rec and rec[k] is None for k in ("reward/mean", "reward/std")):  # NaN/inf, stored as null
        return Flag("grad_norm", f"grad_norm 0 at step {step} with NaN rewards",
                    "the reward function returns NaN: no learning signal (see rlctl doctor)")
    if _identical_rewards(rec):
        return Flag("grad_norm", f"grad_norm 0 at step {step}: every group had identical rewards",
                    "no learning signal at this step (saturated or constant reward; see rlctl doctor), the "
                    "weights are not frozen")
    recent = grad[-window:]
    if _identical_rewards(rec) is False and len(recent) >= window and all(v == 0 for _, v in recent):
        return Flag("grad_norm", f"grad_norm 0 for {window} steps (to step {step}) while rewards differ",
                    "frozen weights: check LoRA targets / lr (rlctl doctor --weights)")
    return Flag("grad_norm", f"grad_norm 0 at step {step}",
                "no gradient at this step (a converged loss, or no reward signal); if the reward is not at its best: "
                "rlctl doctor --weights")


def health_flags(merged: dict[int, dict[str, Any]], window: int = 5) -> list[Flag]:
    flags: list[Flag] = []
    reward = series(merged, "reward/mean")[-window:]
    if len(reward) >= window:
        if all(v == 0 for _, v in reward):
            flags.append(Flag("reward/mean", f"reward stuck at 0 for {window} steps", "data or reward-function bug"))
        elif all(v == 1 for _, v in reward):
            flags.append(Flag("reward/mean", f"reward stuck at 1 for {window} steps", "prompts too easy: no signal"))
    boxed_key = _find_key(merged, "has_boxed")
    if boxed_key:
        boxed = series(merged, boxed_key)
        if boxed:
            peak = max(v for _, v in boxed)
            last = boxed[-1][1]
            if last < 0.5 or peak - last > 0.2:
                flags.append(Flag(boxed_key, f"format rate {last:.2f} (peak {peak:.2f})",
                                  "losing format compliance: consider a short SFT phase"))
    grad = series(merged, "grad_norm")
    if grad:
        step, g = grad[-1]
        if g == 0:
            flags.append(_zero_grad(merged, grad, step, window))
        elif g > 100:
            flags.append(Flag("grad_norm", f"grad_norm {g:.3g} at step {step}", "LR too high or extreme ratios"))
    adv = series(merged, "advantage/std")
    if len(adv) >= 2 and all(v == 0 for s, v in adv[-window:] if s > 1):
        flags.append(Flag("advantage/std", "advantage std stuck at 0", "advantage computation bug or no variance"))
    trunc = series(merged, "response_length/clip_ratio")
    if trunc and trunc[-1][1] > 0.5:
        flags.append(Flag("response_length/clip_ratio", f"{trunc[-1][1]:.0%} of responses truncated",
                          "raise rollout.max_tokens or add a length penalty"))
    clip = series(merged, "clip_ratio")
    if clip and clip[-1][1] > 0.4:
        flags.append(Flag("clip_ratio", f"clip ratio {clip[-1][1]:.0%}", "updates too aggressive: lower the LR"))
    return flags
