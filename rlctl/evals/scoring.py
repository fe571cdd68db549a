"""Scoring: pass@k with the unbiased estimator, and the named graders (exact_match, math, reward)."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from math import comb
from typing import Any

from rlctl.errors import RlctlError


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with `c` correct among `n` samples: 1 - C(n-c, k) / C(n, k)
    (Chen et al. 2021). k > n is an error, not a silent clamp."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float:
    """The mean pass@k over prompts, each (n, c)."""
    if not counts:
        return float("nan")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str) -> str | None:
    """The last \\boxed{...}, else the last number (seed 001's extraction)."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def normalize(ans: str) -> str:
    a = ans.strip().strip("$").strip()
    for wrap in ("\\text", "\\textbf", "\\mathrm", "\\mathbf"):
        a = re.sub(re.escape(wrap) + r"\{([^{}]*)\}", r"\1", a)
    a = a.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    a = re.sub(r"\s+", "", a).rstrip(".")
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", a):
        a = a.replace(",", "")
        a = a.lstrip("0") or "0" if not a.startswith("-") else "-" + (a[1:].lstrip("0") or "0")
    return a


def math_equal(pred: str | None, label: Any) -> bool:
    if pred is None or label is None:
        return False
    p, g = normalize(pred), normalize(str(label))
    if p == g:
        return True
    try:
        return abs(float(p) - float(g)) <= 1e-6
    except ValueError:
        return False


Grader = Callable[[list[str], list[str], list[Any]], list[bool]]


def exact_match(prompts: list[str], completions: list[str], labels: list[Any]) -> list[bool]:
    del prompts  # Unused
    return [lab is not None and c.strip() == str(lab).strip() for c, lab in zip(completions, labels, strict=True)]


def math_grader(prompts: list[str], completions: list[str], labels: list[Any]) -> list[bool]:
    del prompts  # Unused
    return [math_equal(extract_answer(c), lab) for c, lab in zip(completions, labels, strict=True)]


def load_function(path: str, name: str) -> Callable[..., Any]:
    """A reward function from a Python file, loaded as TRL's runner loads `reward.function`."""
    spec = importlib.util.spec_from_file_location("rlctl_eval_reward", path)
    if spec is None or spec.loader is None:
        raise RlctlError(f"cannot load reward file {path}", hint="reward.function must be a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if fn is None:
        raise RlctlError(f"{path} has no function {name!r}", hint="set reward.function_name")
    return fn


def reward_grader(path: str, name: str, threshold: float = 1.0) -> Grader:
    """The recipe's reward function (TRL signature: completions, prompts=..., label=... -> floats); a sample is
    correct when its reward reaches `threshold`."""
    fn = load_function(path, name)

    def grade(prompts: list[str], completions: list[str], labels: list[Any]) -> list[bool]:
        rewards = fn(completions=completions, prompts=prompts, label=labels)
        return [r is not None and float(r) >= threshold for r in rewards]

    return grade


GRADERS: dict[str, Grader] = {"exact_match": exact_match, "math": math_grader}


def grader(name: str | None, has_labels: bool, reward_file: str | None, reward_name: str,
           threshold: float = 1.0) -> tuple[str, Grader]:
    """(the grader's name, the grader) for a set: its `grader`, else math with labels, else the reward function."""
    if name is None:
        name = "math" if has_labels else "reward"
    if name == "reward":
        if not reward_file:
            raise RlctlError("eval grader `reward` needs reward.function", hint="set the set's grader = \"math\"")
        return name, reward_grader(reward_file, reward_name, threshold)
    if name not in GRADERS:
        raise RlctlError(f"unknown eval grader {name!r}; known: reward, {', '.join(GRADERS)}")
    return name, GRADERS[name]
