"""prime-rl's log and metric formats, mapped to rlctl's unified names (docs/metrics.md lists every mapping).

prime-rl's orchestrator and trainer log one loguru line per step (`utils/logger.py`: `HH:MM:SS SUCCESS [tag] ...`,
coloured), both for the same step merged here:
  - v0.3: `Step 5 | Time: 12.34s | Reward: 0.2345 | Throughput: 2408.9 tokens/s | Seq. Length: 345.6 tokens/sample
    | Async Level: 1 | Max. Off-Policy Level: 0` (orchestrator) and `Step 5 | Time: .. | Loss: .. | Entropy: .. |
    Mismatch KL: .. | Grad. Norm: .. | LR: 1.00e-05 | Throughput: 5077 tokens/s | MFU: 12.3% | Peak Mem.: 71.2 GiB`
    (trainer); some builds print `Peak Mem.: 71.2/80.0 GiB (89.0%)` (the first number is kept).
  - v0.8: no colons, and the time as `format_time` writes it (`350ms`, `12.3s`, `1m 5s`, `1h 2m`):
    `Step 5 |   12.3s | Reward 0.4567 | Trainable 30/32 (93.8%) | Turns 1.0 | Branches 1.0 | Max Off-Policy 1 |
    Error 0.0% | Truncation 3.1%` and `Step 5 |   40.7s | Loss 0.0069 | Entropy 0.4720 | Mismatch KL 0.0010 |
    Grad. Norm 0.2764 | LR 1.00e-05 | Throughput 5077 tokens/s | MFU 12.3% | Peak Mem. 71.2 GiB`; with
    `json_logging` each line is a JSON object whose `message` is that text.
    A multi-environment v0.8 run adds one line per environment to the orchestrator's message (joined with
    `\n\t\t `): `╰─ math         | Ratio 40.0% | Reward 0.1500 | Turns 1.0 | Branches 1.0 | Max Off-Policy 1 |
    Error 0.0% | Truncation 6.2%`, read as `env/<name>/<metric>` of the step in progress (unified metric names where
    they are the same concept: `env/math/reward/mean`, `env/math/response_length/clip_ratio`).
    Its online evals log `Evaluated aime (Step 5) | Policy v5 |   21.0s | Reward 0.6000 | Turns 1.0 | Branches 1.0 |
    Error 0.0% | Truncation 12.5%` (orchestrator.py finalize_eval_batch), often after later step lines: read at the
    step it names as `eval/<env>/reward`, `/turns`, `/branches`, `/error` (%), `/response_length/clip_ratio` (a
    fraction); the policy version and the eval's time as `prime_rl/eval/<env>/policy_version`, `.../time_s` (kept out
    of `eval/`, whose keys are read as eval quality: the doctor's eval rules, the best checkpoint).
Units are dropped; a percentage stays a percentage except `Truncation`, the unified clip ratio (a fraction).
"""

from __future__ import annotations

import json
import re
from itertools import repeat
from operator import add, itemgetter
from typing import Any

from rlctl.metrics import UNIFIED, clean_value
from rlctl.metrics.parsers import (
    Incomplete,
    LineTemplates,
    Malformed,
    RowPlans,
    json_objects,
    lines_with,
    number,
    plain_rows,
    strip_prefixes,
    unify,
)

NAME = "prime_rl"

ORCH_MAP = {
    "Reward": "reward/mean", "Throughput": "throughput/tokens_per_s", "Time": "time/generation_s",
    "Val. Reward": "eval/default/reward",
}
TRAINER_MAP = {
    "Loss": "policy_loss", "Entropy": "entropy", "Grad. Norm": "grad_norm", "LR": "lr", "Time": "time/train_s",
}
# v0.8 per-environment lines: env/<name>/<this>; other fields lower-cased (env/<name>/ratio, /turns, ...)
ENV_MAP = {"Reward": "reward/mean"}
# fields whose percentage becomes a unified fraction
FRACTIONS = {"Truncation": "response_length/clip_ratio"}
# W&B/TensorBoard rows: their keys are not mapped yet (not checked against a release); they pass through as
# prime_rl/<key>, except names that already are unified ones
ROW_MAP: dict[str, str] = {}
ENV_MARK = "╰─"
NEEDLES = ("Step ", ENV_MARK)  # "Step " also passes the eval lines (`Evaluated aime (Step 5) | ..`)

_STEP = re.compile(r"(?:^|\s)Step (\d+) \| (.*)$")
_STEP_LIKE = re.compile(r"(?:^|\s)Step \S*\s*\|\s*[A-Z][\w. ]*:? ")  # `Step x | Reward ..`: metrics, garbled
_UNITS = re.compile(r"^(-?[\d.]+(?:e[+-]?\d+)?)\s*(s|%|GiB|tokens/s|tokens/sample)?$", re.IGNORECASE)
_LEADING = re.compile(r"^(-?[\d.]+(?:e[+-]?\d+)?)(?=[/ ])")
_KEY_VALUE = re.compile(r"^([A-Za-z][A-Za-z .\-]*?)\s+(-?[\d.].*)$")  # v0.8: `Grad. Norm 0.2764`
_ENV = re.compile(r"^╰─ (\S.*?)\s*\| (.*)$")
_EVAL = re.compile(r"(?:^|\s)Evaluated (\S.*?) \(Step (\d+)\) \| (.*)$")  # v0.8 online eval
_POLICY = re.compile(r"^Policy v(\d+)$")
_DURATION = re.compile(r"^(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m(?!s))?\s*(?:([\d.]+)s)?\s*(?:([\d.]+)ms)?$")


def duration(text: str) -> float | None:
    """`350ms`, `12.3s`, `1m 5s`, `1h 2m`, `1d 2h` (prime-rl's format_time) in seconds."""
    m = _DURATION.match(text.strip())
    if not m or not any(m.groups()):
        return None
    d, h, mi, s, ms = (float(g) if g else 0.0 for g in m.groups())
    return round(d * 86400 + h * 3600 + mi * 60 + s + ms / 1000, 6)


def parse(line: str | dict[str, Any]) -> dict[str, Any] | None:
    """A step line of the orchestrator or the trainer (text or JSON logging), or one W&B/TensorBoard row."""
    if isinstance(line, dict):
        step = line.get("step", line.get("_step"))
        if step is None:
            return None
        raw = {k: v for k, v in line.items() if not k.startswith("_") and k != "step"}
        mapping = {**{k: k for k in raw if k in UNIFIED}, **ROW_MAP}
        return {"step": int(number(step)), **unify(NAME, {k: number(v) for k, v in raw.items()}, mapping)}
    s = strip_prefixes(line).strip()
    if s.startswith('{"timestamp"'):  # v0.8 json_logging
        try:
            entry = json.loads(s)
        except json.JSONDecodeError as e:
            raise (Malformed if s.endswith("}") else Incomplete)(str(e)) from None
        message = entry.get("message") if isinstance(entry, dict) else None
        if not isinstance(message, str):
            return None
        first, *more = message.split("\n")
        rec = parse(first)
        for extra in more:  # a multi-env step: its per-environment lines are in the same message
            if rec is not None and extra.strip().startswith(ENV_MARK):
                rec.update(env_record(extra))
        return rec
    if s.startswith(ENV_MARK):
        return {"step": None, **env_record(s)}
    m = _EVAL.search(s)
    if m:
        return eval_record(m.group(1), int(m.group(2)), m.group(3))
    m = _STEP.search(s)
    if not m:
        if _STEP_LIKE.search(s):
            raise Malformed(f"a step line with an unreadable step: {s[:80]!r}")
        return None
    fields = _fields(m.group(2))
    trainer = "Loss" in fields or "Grad. Norm" in fields
    mapping = {**(TRAINER_MAP if trainer else ORCH_MAP), **FRACTIONS}
    rec: dict[str, Any] = {"step": int(m.group(1))}
    for k, v in fields.items():
        if k in mapping:
            rec[mapping[k]] = number(v)
    prefix = "trainer_" if trainer else ""
    rec.update(unify(NAME, {prefix + _lower(k): number(v) for k, v in fields.items() if k not in mapping}, {}))
    return rec


def env_record(line: str) -> dict[str, Any]:
    """A v0.8 per-environment line (`╰─ name | Ratio 40.0% | Reward 0.1500 | ...`) as `env/<name>/<metric>`."""
    m = _ENV.match(line.strip())
    if not m:
        raise Malformed(f"bad environment line {line.strip()[:80]!r}")
    mapping = {**ENV_MAP, **FRACTIONS}
    return {f"env/{m.group(1)}/{mapping.get(k) or _lower(k)}": clean_value(number(v))
            for k, v in _fields(m.group(2)).items()}


def eval_record(env: str, step: int, body: str) -> dict[str, Any]:
    """A v0.8 eval line's fields (`Policy v5 |   21.0s | Reward 0.6000 | ...`) at the step it names."""
    head, _, rest = body.partition(" | ")
    pm = _POLICY.match(head.strip())
    if not pm:
        raise Malformed(f"bad eval line of {env!r}: {body[:80]!r}")
    fields = _fields(rest)
    rec: dict[str, Any] = {"step": step}
    if "Reward" in fields:  # first: the doctor's eval rules take the first eval/ key
        rec[f"eval/{env}/reward"] = clean_value(number(fields.pop("Reward")))
    time_s = fields.pop("Time", None)
    for k, v in fields.items():
        rec[f"eval/{env}/{FRACTIONS.get(k) or _lower(k)}"] = clean_value(number(v))
    rec[f"{NAME}/eval/{env}/policy_version"] = int(pm.group(1))
    if time_s is not None:
        rec[f"{NAME}/eval/{env}/time_s"] = clean_value(number(time_s))
    return rec


def _lower(key: str) -> str:
    return key.lower().replace(". ", "_").replace(" ", "_").replace(".", "").replace("-", "_")


def _fields(body: str) -> dict[str, Any]:
    """`Key: value | ...` (v0.3) or `Key value | ...` (v0.8) fields, units dropped, the time in seconds."""
    fields: dict[str, Any] = {}
    for i, part in enumerate(body.split(" | ")):
        part = part.strip()
        key, sep, value = part.partition(": ")
        if not sep:  # v0.8: `Key value`, or the bare time right after the step
            kv = _KEY_VALUE.match(part)
            if kv:
                key, value = kv.group(1), kv.group(2)
            elif i == 0 and duration(part) is not None:
                key, value = "Time", part
            else:
                raise Malformed(f"bad field {part!r}")
        key, value = key.strip(), value.strip()
        if key == "Time":
            secs = duration(value)
            fields[key] = secs if secs is not None else value
            continue
        if key in FRACTIONS and value.endswith("%"):
            fields[key] = number(value[:-1]) / 100 if isinstance(number(value[:-1]), float | int) else value
            continue
        vm = _UNITS.match(value) or _LEADING.match(value)
        fields[key] = vm.group(1) if vm else value
    return fields


# v0.3 step lines read in bulk: loguru's time and level before `Step N | `, then `Key: number` fields with an optional
# unit (dropped, as _UNITS does), `Time` in seconds as `12.34s` with at most 6 decimals (which `duration` keeps as
# written). All checked in C over the chunk's step lines; the lines then read by one JSON parse, each an object of
# what came before `Step ` (_HEAD_KEY), the step (_STEP_KEY) and the fields.
_HEADS = re.compile(r"(?:(?:[0-9][0-9]:[0-9][0-9]:[0-9][0-9] +[A-Z]+ )?\n)*")  # each line's, newline-ended
_TIMES = re.compile(r"Time: ([^ |\n]*)")
_TIME_VALUES = re.compile(r"(?:[0-9]{1,9}\.[0-9]{1,6}s\n)*")
_UNIT_NAMES = (" tokens/sample", " tokens/s", " GiB", "%", "s")  # longest first: each is cut before the next
_HEAD_KEY, _STEP_KEY = "\x00", "\x01"  # no field's keys (printable)


def _plan(keys: tuple[str, ...]) -> tuple[list[str], list[int]] | None:
    """What `parse` makes of a step line with these fields (the step first, as _STEP_KEY): the names in the
    fields' order; None where that is more than a renaming: a key `_fields` would strip or read as v0.8, a fraction
    (`Truncation`, a percentage made a fraction), a name unify leaves out."""
    if len(keys) < 2 or keys[0] != _STEP_KEY or _STEP_KEY in keys[1:] or _HEAD_KEY in keys:
        return None  # a line without fields (no ` | `), or one the JSON was not built from
    for k in keys[1:]:
        if not k or k != k.strip() or k in FRACTIONS or not k[0].isalpha():
            return None
    trainer = "Loss" in keys or "Grad. Norm" in keys
    mapping = TRAINER_MAP if trainer else ORCH_MAP
    prefix = "trainer_" if trainer else ""
    names = ["step"]
    for k in keys[1:]:
        if k in mapping:
            names.append(mapping[k])
        else:
            name = prefix + _lower(k)
            if name in ("step", "time"):  # unify leaves those out
                return None
            names.append(f"{NAME}/{name}")
    return names, list(range(len(keys)))


_PLANS = RowPlans(_plan)


def bulk(text: str) -> dict[int, dict[str, Any]]:
    """The records of a chunk's plain v0.3 step lines, by the offset where each line starts: exactly what `parse`
    makes of each (tests/test_ingest_speed.py). Other lines are left to `parse`. Every step per line is a C loop."""
    starts, lines = lines_with(text, "Step ")
    if not lines:
        return {}
    if len(lines) > 1:
        out = _uniform(starts, lines)
        if out is not None:
            return out
        out = _block(starts, lines)
        if out is not None:
            return out
    out = {}
    for start, line in zip(starts, lines, strict=True):  # a chunk with other lines: each on its own
        out.update(_block([start], [line]) or {})
    return out


def _block(starts: list[int], lines: list[str]) -> dict[int, dict[str, Any]] | None:
    """The records of step lines all plain, or None: printable ASCII (no colours, CR frames, tabs), one `Step N | `
    each after loguru's head, a step of digits, times as `12.34s`."""
    j = "\n".join(lines)
    # JSON allows no control character but \t and \r (split_segments' frames) between tokens: ruled out here
    if not (j.isascii() and "\r" not in j and "\t" not in j and j.count("Step ") == len(lines) and '"' not in j
            and "\\" not in j and "Step -" not in j and "Step  " not in j and "  |" not in j
            and _TIME_VALUES.fullmatch("".join(map(add, _TIMES.findall(j), repeat("\n"))))):
        return None
    rows = json_objects(_json(j))
    if rows is None or len(rows) != len(lines):
        return None
    heads = set(map(dict.pop, rows, repeat(_HEAD_KEY)))  # what came before `Step `, the same on most lines
    if not _HEADS.fullmatch("".join(map(add, heads, repeat("\n")))):
        return None
    return _records(starts, rows)


def _json(lines: str) -> str:
    """Step lines (joined by newlines) as a JSON array of objects: what came before `Step ` (_HEAD_KEY), the step
    (_STEP_KEY), the fields with their units dropped."""
    t = lines.replace("\n", " |\n") + " |"  # every field then ends in ` |`: a unit is cut where it is followed by it
    for unit in _UNIT_NAMES:  # (a key, by `: `)
        if unit + " |" in t:
            t = t.replace(unit + " |", " |")
    t = t[:-2].replace(": ", '": ').replace(" | ", ', "').replace("Step ", '", "\\u0001": ')
    return '[{"\\u0000": "' + t.replace(" |\n", '}, {"\\u0000": "') + "}]"


def _records(starts: list[int], rows: list[Any]) -> dict[int, dict[str, Any]]:
    """Rows of step lines (step first) as records; a step that is no int is parse's (`Step 5.0 | ..` is garbled)."""
    keys = set(map(tuple, rows))
    plan = _PLANS.get(next(iter(keys))) if len(keys) == 1 else None
    if plan is not None and set(map(type, map(itemgetter(_STEP_KEY), rows))) == {int} and all(plain_rows(rows)):
        # one set of keys (a log's usual case): renamed in C
        return dict(zip(starts, map(dict, map(zip, repeat(plan[0]), map(dict.values, rows))), strict=True))
    out = {}
    get = _PLANS.get
    for start, row, ok in zip(starts, rows, plain_rows(rows), strict=True):
        plan = get(tuple(row)) if ok else None
        if plan is not None and type(row[_STEP_KEY]) is int:
            out[start] = dict(zip(plan[0], row.values(), strict=True))
    return out


# A chunk whose step lines all have the first one's template (a log's usual case: the same head, keys and units on
# every line, only the numbers differ): matched by one regex made from that line, the numbers read by one JSON parse.
# Each field `Key: number unit`: a key of letters, spaces, dots and dashes (no `:`, `|`, digit), a number of digits
# and dots that is a JSON number (the parse fails on anything else: `1.`, `01`, `1.2.3`) and, with all the block's
# numbers, sums below 1e15 (template_rows: an int of at most 15 digits, as `number` reads it exactly), a unit _UNITS
# drops; `Time` as `duration` reads `12.34s` (at most 6 decimals: kept as written). Possessive repeats: a number is
# never followed by a digit or a dot, and sre runs them several times faster.
_T_HEAD = re.compile(r"[0-9][0-9]:[0-9][0-9]:[0-9][0-9] +[A-Z]+ ")
_T_FIELD = re.compile(r"([A-Za-z](?:[A-Za-z .\-]*[A-Za-z.])?): ([0-9][0-9.]*)( tokens/sample| tokens/s| GiB|%|s|)")
_T_NUMBER = r"([0-9][0-9.]*+)"
_T_TIME = r"([0-9]{1,9}+\.[0-9]{1,6}+)"
_T_STEP = r"([0-9]++)"


def _template(line: str) -> tuple[re.Pattern[str], tuple[str, ...], None] | None:
    """The regex of lines like `line` (its head, keys and units) and their records' names, or None."""
    out = None
    at = line.find("Step ")
    head, (_, sep, body) = line[:at], line[at + 5:].partition(" | ")
    fields = [_T_FIELD.fullmatch(part) for part in body.split(" | ")] if sep else [None]
    if at >= 0 and (not head or _T_HEAD.fullmatch(head)) and all(fields):
        keys = tuple(m.group(1) for m in fields if m)
        plan = _PLANS.get((_STEP_KEY, *keys)) if len(set(keys)) == len(keys) else None
        if plan is not None and (all(m.group(3) == "s" for m in fields if m and m.group(1) == "Time")):
            rx = "^" + (r"[0-9][0-9]:[0-9][0-9]:[0-9][0-9]" + re.escape(head[8:]) if head else "") + "Step " + _T_STEP
            for m in fields:
                if m:
                    rx += (re.escape(f" | {m.group(1)}: ") + (_T_TIME if m.group(1) == "Time" else _T_NUMBER)
                           + re.escape(m.group(3)))
            out = re.compile(rx + "$", re.MULTILINE), plan[0], None
    return out


_uniform = LineTemplates(_template).records  # step lines that all match the first one's template
