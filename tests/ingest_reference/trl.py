"""TRL's log and metric formats, mapped to rlctl's unified names (docs/metrics.md lists every mapping).

TRL logs through transformers' Trainer: every `logging_steps` optimizer steps the callbacks get one dict.
  - on the console, `ProgressCallback.on_log` writes `str(logs)` under the tqdm bar (transformers >= 4.5x formats
    floats as `'0.1234'` strings with `.4g`; older ones print the floats), `PrinterCallback` prints the same dict:
    **no `step` in it**. rlctl's own runner adds `'step': state.global_step`; a plain TRL run's dicts get a counted
    step (1, 2, 3, ... in order: the optimizer step when logging_steps = 1). Eval dicts (`eval_*` keys) and the
    final summary (`train_runtime`, ...) take the step in progress.
  - `trainer_state.json` (`log_history`, each entry with its `step`), the W&B run (`train/<key>` with
    `train/global_step`) and TensorBoard (`train/<key>` tags at the global step).
GRPOTrainer's keys: `reward`, `reward_std`, `rewards/<func>/mean`, `kl`, `entropy`, `completions/mean_length`,
`completions/clipped_ratio`, `clip_ratio/region_mean`, ...; 0.14 - 0.16 logged `completion_length`, 0.16 - 0.18
`clip_ratio` (0.18 next to `clip_ratio/region_mean`, which then is the unified one). Checked in the released wheels
0.14.0, 0.16.0, 0.18.0 and 1.16.0.
"""

from __future__ import annotations

import json
from typing import Any

from tests.ingest_reference.parsers import Malformed, literal_dict, number, strip_prefixes, unify

NAME = "trl"

MAP = {
    "reward": "reward/mean", "reward_std": "reward/std", "completions/mean_length": "response_length/mean",
    "completion_length": "response_length/mean",  # 0.14 - 0.16
    "completions/clipped_ratio": "response_length/clip_ratio", "kl": "kl", "entropy": "entropy",
    "loss": "policy_loss", "grad_norm": "grad_norm", "clip_ratio/region_mean": "clip_ratio",
    "clip_ratio": "clip_ratio",  # 0.16 - 0.18
    "learning_rate": "lr", "step_time": "time/step_s",
}
TRAIN_KEYS = ("'loss'", "'reward'", "'learning_rate'", "'grad_norm'")
SUMMARY_KEYS = ("'train_runtime'", "'eval_")
NEEDLES = ("{'", "'step'")


def parse(line: str | dict[str, Any]) -> dict[str, Any] | None:
    """A console dict (with or without `step`), or one W&B/TensorBoard/trainer_state row."""
    if isinstance(line, dict):
        return record(_row(line), counted=False)
    s = strip_prefixes(line).strip()
    brace = s.find("{'")
    if brace < 0 or not any(k in s for k in TRAIN_KEYS + SUMMARY_KEYS + ("'step'",)):
        return None
    return record(literal_dict(s[brace:]))


def _row(row: dict[str, Any]) -> dict[str, Any]:
    """A W&B/TensorBoard row: `train/` keys, `train/global_step` or the event step."""
    out = {k.removeprefix("train/"): v for k, v in row.items() if not k.startswith("_")}
    step = out.pop("global_step", None)
    if step is None:
        step = row.get("step", row.get("_step"))
    out["step"] = step
    for k in list(out):
        if k.startswith("eval/"):
            out["eval_" + k[5:]] = out.pop(k)
    return out


def record(raw: dict[str, Any], counted: bool = True) -> dict[str, Any] | None:
    step = raw.get("step")
    evals = {k: v for k, v in raw.items() if k.startswith("eval_")}
    rest = {k: v for k, v in raw.items() if not k.startswith("eval_")}
    rec: dict[str, Any] = {}
    if step is not None:
        rec["step"] = int(number(step) or 0)
    elif not counted:
        return None
    elif evals or "train_runtime" in raw:
        rec["step"] = None  # an eval or the final summary: the step in progress
    # else: no step key, the stream counts the step
    mapping = MAP if "clip_ratio/region_mean" not in rest else {k: v for k, v in MAP.items() if k != "clip_ratio"}
    rec.update(unify(NAME, {k: number(v) for k, v in rest.items()}, mapping))
    for k, v in evals.items():
        rec[f"eval/default/{k[5:]}"] = number(v)
    return rec


def parse_state(text: str) -> list[dict[str, Any]]:
    """transformers' trainer_state.json: the log_history entries with their step."""
    try:
        state = json.loads(text)
    except json.JSONDecodeError as e:
        raise Malformed(str(e)) from None
    out = []
    for entry in state.get("log_history", []) if isinstance(state, dict) else []:
        if isinstance(entry, dict):
            rec = record(entry, counted=False)
            if rec:
                out.append(rec)
    return out
