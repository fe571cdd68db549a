"""prime-rl's log and metric formats, mapped to rlctl's unified names (docs/metrics.md lists every mapping).

prime-rl's orchestrator and trainer log one loguru line per step (`HH:MM:SS SUCCESS Step 5 | Time: 12.34s | ...`),
the orchestrator's with `Reward`, `Throughput`, `Seq. Length`, the trainer's with `Loss`, `Entropy`,
`Mismatch KL`, `Grad. Norm`, `LR`, `Peak Mem.`; both for the same step are merged. Values carry units (`s`, `%`,
`GiB`, `tokens/s`), which are dropped; `Peak Mem.: 71.2/80.0 GiB (89.0%)` (later releases) keeps its first
number. Its W&B run logs the same quantities under its own keys at the same step.
"""

from __future__ import annotations

import re
from typing import Any

from rlctl.metrics import UNIFIED
from rlctl.metrics.parsers import Malformed, number, strip_prefixes, unify

NAME = "prime_rl"

ORCH_MAP = {
    "Reward": "reward/mean", "Throughput": "throughput/tokens_per_s", "Time": "time/generation_s",
    "Val. Reward": "eval/default/reward",
}
TRAINER_MAP = {
    "Loss": "policy_loss", "Entropy": "entropy", "Grad. Norm": "grad_norm", "LR": "lr", "Time": "time/train_s",
}
# W&B/TensorBoard rows: their keys are not mapped yet (not checked against a release); they pass through as
# prime_rl/<key>, except names that already are unified ones
ROW_MAP: dict[str, str] = {}
NEEDLES = ("Step ",)

_STEP = re.compile(r"(?:^|\s)Step (\d+) \| (.*)$")
_LEADING = re.compile(r"^(-?[\d.]+(?:e[+-]?\d+)?)(?=[/ ])")
_UNITS = re.compile(r"^(-?[\d.]+(?:e[+-]?\d+)?)\s*(s|%|GiB|tokens/s|tokens/sample)?$", re.IGNORECASE)


def parse(line: str | dict[str, Any]) -> dict[str, Any] | None:
    """A step line of the orchestrator or the trainer, or one W&B/TensorBoard row."""
    if isinstance(line, dict):
        step = line.get("step", line.get("_step"))
        if step is None:
            return None
        raw = {k: v for k, v in line.items() if not k.startswith("_") and k != "step"}
        mapping = {**{k: k for k in raw if k in UNIFIED}, **ROW_MAP}
        return {"step": int(number(step)), **unify(NAME, {k: number(v) for k, v in raw.items()}, mapping)}
    m = _STEP.search(strip_prefixes(line).strip())
    if not m:
        return None
    fields: dict[str, Any] = {}
    for part in m.group(2).split(" | "):
        key, sep, value = part.partition(": ")
        if not sep:
            raise Malformed(f"bad field {part!r}")
        vm = _UNITS.match(value.strip()) or _LEADING.match(value.strip())  # `71.2/80.0 GiB (89.0%)`: the first
        fields[key.strip()] = vm.group(1) if vm else value.strip()
    trainer = "Loss" in fields or "Grad. Norm" in fields
    mapping = TRAINER_MAP if trainer else ORCH_MAP
    renamed = {k.lower().replace(". ", "_").replace(" ", "_").replace(".", ""): v for k, v in fields.items()
               if k not in mapping}
    rec: dict[str, Any] = {"step": int(m.group(1))}
    for k, v in fields.items():
        if k in mapping:
            rec[mapping[k]] = number(v)
    prefix = "trainer_" if trainer else ""
    rec.update(unify(NAME, {prefix + k: v for k, v in renamed.items()}, {}))
    return rec
