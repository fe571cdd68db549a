"""Reward functions of the doctor corpus's sick runs (TRL reward-function signature; see gen_doctor_corpus.py)."""

import math


def a_fraction(text: str) -> float:
    return text.count("a") / len(text) if text else 0.0


def _text(completion) -> str:
    return completion if isinstance(completion, str) else "".join(m.get("content", "") for m in completion)


def constant(completions, **kwargs):
    """Every completion scores the same: every group has zero variance from the first step."""
    return [0.5 for _ in completions]


def nan_after(completions, **kwargs):
    """The quickstart's reward, but a broken scorer that returns NaN for every completion containing 'a'."""
    return [math.nan if "a" in _text(c) else a_fraction(_text(c)) for c in completions]


def nan_all(completions, **kwargs):
    """A scorer that is broken for every completion: NaN throughout."""
    return [math.nan for _ in completions]


def short(completions, **kwargs):
    """Pays for brevity alone: the policy learns to stop at once (length collapse)."""
    return [1.0 - min(len(_text(c)), 16) / 16 for c in completions]


def byte_mean(completions, **kwargs):
    """A tenth of the completion's mean byte value / 255: every group has spread, the batch mean moves little."""
    out = []
    for c in completions:
        raw = _text(c).encode("utf-8", "replace")
        out.append(0.1 * sum(raw) / (255 * len(raw)) if raw else 0.0)
    return out


def by_label(completions, label=None, **kwargs):
    """'a' fraction on prompts labelled "a"; on prompts labelled "not-a" (the eval set) its complement: a policy that
    learns the training reward gets worse on the eval set (train/eval divergence)."""
    labels = label if isinstance(label, list) else [label] * len(completions)
    out = []
    for c, lab in zip(completions, labels, strict=True):
        f = a_fraction(_text(c))
        out.append(1.0 - f if lab == "not-a" else f)
    return out
