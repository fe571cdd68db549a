"""verl's log and metric formats, mapped to rlctl's unified names (docs/metrics.md lists every mapping).

verl's console logger (`verl/utils/logger/aggregate_logger.py`, `LocalLogger.log`) prints
`concat_dict_to_str(data, step)`: `step:12 - actor/pg_loss:0.013 - critic/score/mean:0.41 - ...`. Up to 0.4 each
value is `f"{v:.3f}"`; from 0.5 it is `pprint.pformat(v)`, which writes numpy scalars as `np.float64(0.0123)`
under numpy 2. Lines can come behind Ray's `(TaskRunner pid=.., ip=..)` prefix, with ANSI colours, and pasted ones
often end in ` -`. Its W&B and TensorBoard trackers log the same keys at the same step; its file logger
(`trainer.logger=[file]`, tracking.py `FileLogger`) writes JSON lines `{"step": N, "data": {...}}`.
Keys: `actor/entropy` (0.2: `actor/entropy_loss`, which 0.9's new engine logs again), `actor/kl_loss` (with
use_kl_loss), the KL applied in the reward: `critic/kl` (0.2), `actor/reward_kl_penalty` (0.4 on),
`critic/score/mean`, ...
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.ingest_reference.parsers import Incomplete, Malformed, number, strip_prefixes, unify

NAME = "verl"

MAP = {
    "critic/score/mean": "reward/mean", "critic/score/std": "reward/std", "actor/pg_loss": "policy_loss",
    "actor/entropy": "entropy", "actor/entropy_loss": "entropy", "actor/kl_loss": "kl", "critic/kl": "kl",
    "actor/reward_kl_penalty": "kl",
    "actor/grad_norm": "grad_norm", "actor/pg_clipfrac": "clip_ratio", "actor/lr": "lr",
    "critic/advantages/mean": "advantage/mean", "critic/advantages/std": "advantage/std",
    "response_length/mean": "response_length/mean", "response_length/clip_ratio": "response_length/clip_ratio",
    "perf/throughput": "throughput/tokens_per_s", "timing_s/step": "time/step_s", "timing_s/gen": "time/generation_s",
    "timing_s/update_actor": "time/train_s",
}
# when both are printed, the first of each pair is the unified one; the other passes through as verl/<key>
PREFERRED = {"actor/entropy_loss": "actor/entropy", "critic/kl": "actor/kl_loss",
             "actor/reward_kl_penalty": "actor/kl_loss"}
EVAL_PREFIXES = ("val-core/", "val-aux/", "val/")
NEEDLES = ("step:", '{"step"')

_STEP = re.compile(r"(?:^|\s|\))step:(\d+)(?:\s+-\s+(.*))?$")


def parse(line: str | dict[str, Any]) -> dict[str, Any] | None:
    """One console line, one line of its file logger (`{"step": N, "data": {...}}`), or one W&B/TensorBoard row
    (its keys are the console's)."""
    if isinstance(line, dict):
        step = line.get("step", line.get("_step"))
        data = line["data"] if isinstance(line.get("data"), dict) else line
        raw = {k: v for k, v in data.items() if not k.startswith("_") and k != "step"}
        return None if step is None else record(int(number(step)), raw)
    s = strip_prefixes(line).strip()
    if s.startswith('{"step"'):
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            raise (Malformed if s.endswith("}") else Incomplete)(str(e)) from None
        return parse(obj) if isinstance(obj, dict) else None
    m = _STEP.search(s)
    if not m:
        return None
    body = (m.group(2) or "").rstrip(" -")
    raw: dict[str, Any] = {}
    for part in body.split(" - ") if body else ():
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.rpartition(":")
        if not sep or not key or not value.strip():
            raise Malformed(f"bad field {part!r}")
        raw[key.strip()] = value.strip()
    if not raw:
        raise Malformed("a step with no values")
    return record(int(m.group(1)), raw)


def record(step: int, raw: dict[str, Any]) -> dict[str, Any]:
    evals = {k: v for k, v in raw.items() if k.startswith(EVAL_PREFIXES)}
    train = {k: number(v) for k, v in raw.items() if k not in evals}
    mapping = MAP
    for other, preferred in PREFERRED.items():
        if other in train and preferred in train:
            mapping = {k: v for k, v in mapping.items() if k != other}
    rec: dict[str, Any] = {"step": step}
    rec.update(unify(NAME, train, mapping))
    for k, v in evals.items():
        rec["eval/" + k.split("/", 1)[1]] = number(v)
    return rec
