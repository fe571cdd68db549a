"""Parsers for each backend's real output, mapped to the unified names.

Each `parse_<backend>(line)` returns a metrics record ({"step": int, ...unified...}), None for a line that
carries no metrics, or raises `Malformed` for a line that looks like metrics but cannot be read (counted as
skipped by the stream). Lines arrive with ANSI colours and carriage-return progress bars already stripped.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from rlctl.metrics import clean_value, unify


class Malformed(ValueError):
    """A metrics-looking line that could not be parsed."""


ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(s: str) -> str:
    return ANSI.sub("", s)


_NONFINITE = re.compile(r"(?<![\w'\"])(-?inf|nan|NaN|-?Infinity)(?![\w'\"])")
_VALUE = (r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+-]*|-?\.[0-9][0-9eE+-]*"""
          r"|nan|NaN|-?inf|-?Infinity|True|False|None")
_PAIR = re.compile(r"\s*'((?:[^'\\]|\\.)*)'\s*:\s*(" + _VALUE + r")\s*(?:,|$)")
_SCALARS = {"True": True, "False": False, "None": None}


def _fast_dict(inner: str) -> dict[str, Any] | None:
    """A flat dict of scalars as print() writes it, read with one regex; None if it is anything more."""
    out: dict[str, Any] = {}
    pos = 0
    for m in _PAIR.finditer(inner):
        if m.start() != pos:
            return None
        pos = m.end()
        raw = m.group(2)
        if raw[0] in "'\"":
            out[m.group(1)] = raw[1:-1]
        else:
            out[m.group(1)] = _SCALARS.get(raw, raw)
    return out if pos == len(inner) else None


def _literal_dict(text: str) -> dict[str, Any]:
    """A Python dict repr as printed by print(dict), with nan/inf and tensor(...) reprs tolerated."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise Malformed("not a complete dict")
    fast = _fast_dict(text[1:-1])
    if fast is not None:
        return fast
    t = _NONFINITE.sub(lambda m: f"'{m.group(1)}'", text)
    t = re.sub(r"tensor\(([^()]*?)(?:,\s*[a-z_]+=[^()]*)*\)", r"\1", t)
    try:
        d = ast.literal_eval(t)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
        raise Malformed(str(e)) from None
    if not isinstance(d, dict):
        raise Malformed("not a dict")
    return {str(k): v for k, v in d.items() if not isinstance(v, (list, dict, tuple))}


# ---- TRL ------------------------------------------------------------------------------------------------------

TRL_MAP = {
    "reward": "reward/mean", "reward_std": "reward/std", "completions/mean_length": "response_length/mean",
    "completions/clipped_ratio": "response_length/clip_ratio", "kl": "kl", "entropy": "entropy",
    "loss": "policy_loss", "grad_norm": "grad_norm", "clip_ratio/region_mean": "clip_ratio",
    "learning_rate": "lr", "step_time": "time/step_s",
}
_TRL_KEYS = ("'loss'", "'reward'", "'learning_rate'", "'train_runtime'", "'grad_norm'")


def parse_trl(line: str) -> dict[str, Any] | None:
    """TRL's per-step dicts (PrinterCallback: `{'loss': ..., 'reward': ..., 'step': 12}`), also eval dicts."""
    if "'step'" not in line and not any(k in line for k in _TRL_KEYS):
        return None
    s = line.strip()
    brace = s.find("{'")
    if brace < 0 or not any(k in s for k in _TRL_KEYS):
        return None
    raw = _literal_dict(s[brace:])
    return trl_record(raw)


def trl_record(raw: dict[str, Any]) -> dict[str, Any] | None:
    step = raw.get("step")
    if step is None:
        return None
    rec: dict[str, Any] = {"step": int(clean_value(step) or 0)}
    evals = {k: v for k, v in raw.items() if k.startswith("eval_")}
    rest = {k: v for k, v in raw.items() if not k.startswith("eval_")}
    rec.update(unify("trl", rest, TRL_MAP))
    for k, v in evals.items():
        rec[f"eval/default/{k[5:]}"] = clean_value(v)
    return rec


def parse_trl_state(text: str) -> list[dict[str, Any]]:
    """TRL/transformers' trainer_state.json: log_history entries with their step."""
    try:
        state = json.loads(text)
    except json.JSONDecodeError as e:
        raise Malformed(str(e)) from None
    out = []
    for entry in state.get("log_history", []) if isinstance(state, dict) else []:
        if isinstance(entry, dict):
            rec = trl_record(entry)
            if rec:
                out.append(rec)
    return out


# ---- OpenRLHF -------------------------------------------------------------------------------------------------

OPENRLHF_MAP = {
    "reward": "reward/mean", "correctness": "correctness", "response_length": "response_length/mean",
    "kl": "kl", "policy_loss": "policy_loss", "grad_norm": "grad_norm", "ppo_clip_ratio": "clip_ratio",
    "clip_ratio": "clip_ratio", "actor_lr": "lr", "entropy_loss": "entropy", "entropy_mean": "entropy",
    "advantage_mean": "advantage/mean", "advantage_std": "advantage/std", "reward_std": "reward/std",
    "truncated": "response_length/clip_ratio", "truncated_response": "response_length/clip_ratio",
}
_GLOBAL_STEP = re.compile(r"Global step (\d+):\s*(.*?)\s*$")
_EVAL = re.compile(r"(?:Evaluation|eval)[^{]*?step (\d+)[^{]*?(\{.*\})\s*$", re.IGNORECASE)


def parse_openrlhf(line: str) -> dict[str, Any] | None:
    """OpenRLHF's console (`✨ Global step 5: {...}`, possibly behind a Ray `(PPOTrainer pid=..)` prefix), its
    wandb-style dicts (`train/...` keys) and the JSON lines of rlctl's metrics patch."""
    s = line.strip()
    if s.startswith("{") and '"global_step"' in s:
        try:
            raw = json.loads(s)
        except json.JSONDecodeError as e:
            raise Malformed(str(e)) from None
        return _openrlhf_record(raw)
    m = _GLOBAL_STEP.search(s)
    if m:
        raw = _literal_dict(m.group(2))
        raw["global_step"] = int(m.group(1))
        return _openrlhf_record(raw)
    if "'train/global_step'" in s or "'eval/global_step'" in s:
        start = s.find("{")
        return _openrlhf_record(_literal_dict(s[start:]))
    return None


def _openrlhf_record(raw: dict[str, Any]) -> dict[str, Any] | None:
    step = raw.pop("global_step", None) or raw.pop("train/global_step", None) or raw.pop("eval/global_step", None)
    if step is None:
        return None
    flat = {}
    evals = {}
    for k, v in raw.items():
        if k.startswith("eval/"):
            evals[k] = v
        else:
            flat[k.removeprefix("train/")] = v
    rec: dict[str, Any] = {"step": int(clean_value(step) or 0)}
    rec.update(unify("openrlhf", flat, OPENRLHF_MAP))
    for k, v in evals.items():
        rest = k[len("eval/"):]
        rec[f"eval/{rest}" if "/" in rest else f"eval/default/{rest}"] = clean_value(v)
    return rec


# ---- verl -----------------------------------------------------------------------------------------------------

VERL_MAP = {
    "critic/score/mean": "reward/mean", "critic/score/std": "reward/std", "actor/pg_loss": "policy_loss",
    "actor/entropy": "entropy", "actor/kl_loss": "kl", "actor/grad_norm": "grad_norm",
    "actor/pg_clipfrac": "clip_ratio",
    "actor/lr": "lr", "critic/advantages/mean": "advantage/mean", "critic/advantages/std": "advantage/std",
    "response_length/mean": "response_length/mean", "response_length/clip_ratio": "response_length/clip_ratio",
    "perf/throughput": "throughput/tokens_per_s", "timing_s/step": "time/step_s", "timing_s/gen": "time/generation_s",
    "timing_s/update_actor": "time/train_s",
}
_VERL_STEP = re.compile(r"(?:^|\s|\))step:(\d+)\s+-\s+(.*)$")


def parse_verl(line: str) -> dict[str, Any] | None:
    """verl's console logger: `step:12 - actor/pg_loss:0.013 - critic/score/mean:0.41 - ...`."""
    m = _VERL_STEP.search(line.strip())
    if not m:
        return None
    raw: dict[str, Any] = {}
    for part in m.group(2).split(" - "):
        key, sep, value = part.rpartition(":")
        if not sep or not key:
            raise Malformed(f"bad field {part!r}")
        raw[key.strip()] = value.strip()
    rec: dict[str, Any] = {"step": int(m.group(1))}
    evals = {k: v for k, v in raw.items() if k.startswith(("val-core/", "val-aux/", "val/"))}
    rec.update(unify("verl", {k: v for k, v in raw.items() if k not in evals}, VERL_MAP))
    for k, v in evals.items():
        rec["eval/" + k.split("/", 1)[1]] = clean_value(v)
    return rec


# ---- prime-rl -------------------------------------------------------------------------------------------------

PRIME_ORCH_MAP = {
    "Reward": "reward/mean", "Throughput": "throughput/tokens_per_s", "Time": "time/generation_s",
    "Val. Reward": "eval/default/reward",
}
PRIME_TRAINER_MAP = {
    "Loss": "policy_loss", "Entropy": "entropy", "Grad. Norm": "grad_norm", "LR": "lr", "Time": "time/train_s",
}
_PRIME_STEP = re.compile(r"(?:^|\s)Step (\d+) \| (.*)$")
_UNITS = re.compile(r"^(-?[\d.]+(?:e[+-]?\d+)?)\s*(s|%|GiB|tokens/s|tokens/sample)?$", re.IGNORECASE)


def parse_prime_rl(line: str) -> dict[str, Any] | None:
    """prime-rl's orchestrator and trainer step lines (loguru): `12:01:02 SUCCESS Step 5 | Time: 12.34s |
    Reward: 0.2345 | ...` and `... Step 5 | Time: ... | Loss: ... | Grad. Norm: ... | LR: 1.00e-05 | ...`."""
    m = _PRIME_STEP.search(line.strip())
    if not m:
        return None
    fields: dict[str, Any] = {}
    for part in m.group(2).split(" | "):
        key, sep, value = part.partition(": ")
        if not sep:
            raise Malformed(f"bad field {part!r}")
        vm = _UNITS.match(value.strip())
        fields[key.strip()] = vm.group(1) if vm else value.strip()
    trainer = "Loss" in fields or "Grad. Norm" in fields
    mapping = PRIME_TRAINER_MAP if trainer else PRIME_ORCH_MAP
    renamed = {k.lower().replace(". ", "_").replace(" ", "_").replace(".", ""): v for k, v in fields.items()
               if k not in mapping}
    rec: dict[str, Any] = {"step": int(m.group(1))}
    for k, v in fields.items():
        if k in mapping:
            rec[mapping[k]] = clean_value(v)
    prefix = "trainer_" if trainer else ""
    rec.update(unify("prime_rl", {prefix + k: v for k, v in renamed.items()}, {}))
    return rec


PARSERS = {"trl": parse_trl, "openrlhf": parse_openrlhf, "verl": parse_verl, "prime_rl": parse_prime_rl}
# Every metrics line of a backend contains one of these: other lines are skipped without parsing.
NEEDLES = {"trl": ("'step'",), "openrlhf": ("lobal step", "global_step"), "verl": ("step:",),
           "prime_rl": ("Step ",)}

for _name, _fn in PARSERS.items():
    _fn.backend = _name  # type: ignore[attr-defined]
