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
from itertools import repeat
from operator import add
from typing import Any

from rlctl.metrics.parsers import (
    Incomplete,
    Malformed,
    json_numbers,
    json_objects,
    lines_with,
    number,
    plain_numbers,
    plain_rows,
    strip_prefixes,
    unify,
)

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
_STEP_LIKE = re.compile(r"(?:^|\s|\))step:\S*\s+-\s+[\w/@.\-]+:")  # `step:x - key:..`: metrics, garbled


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
        if _STEP_LIKE.search(s):
            raise Malformed(f"a step line with an unreadable step: {s[:80]!r}")
        return None
    body = (m.group(2) or "").rstrip(" -")
    fast = _fast(body)
    if fast is not None:
        names = _names(tuple(fast))
        if names is not None:
            return {"step": int(m.group(1)), **dict(zip(names, fast.values(), strict=True))}
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


def _plain(body: str) -> bool:
    """Bodies (joined by NUL) that read as JSON exactly as parse's loop reads them: ASCII, no quotes or braces, keys
    without surrounding blanks, no empty key."""
    return not (not body or not body.isascii() or '"' in body or "\\" in body or "{" in body or "\t" in body
                or "-  " in body or " :" in body or ": -" in body or body.startswith(":") or " - :" in body
                or "\x00:" in body)


def _json_text(body: str) -> str:
    return '{"' + body.replace(" - ", ',"').replace(":", '":') + "}"


def _fast(body: str) -> dict[str, Any] | None:
    """`key:number - key:number ...` read as one JSON object in C, when that reads exactly what parse's loop reads;
    else None."""
    return json_numbers(_json_text(body)) if _plain(body) else None


# a step line as verl prints it, plain (no colours, CR frames, tabs or other blanks around it), behind Ray's prefix
_BULK = re.compile(r"^(?:\((?:[\w.:\-]+ )?pid=\d+(?:, \w+=[^,)\n]*)*\) ?)?step:(\d+) - ([!-~][ -~]*)$", re.M)


# the first key of a step line read as JSON: Ray's prefix (as strip_prefixes removes it) and `step`, newline-ended
_HEADS = re.compile(r"(?:(?:\((?:[\w.:\-]+ )?pid=\d+(?:, \w+=[^,)\x00-\x1f]*)*\) ?)?step\n)*")


def bulk(text: str) -> dict[int, dict[str, Any]]:
    """The records of a chunk's plain step lines, by the offset where each line starts, all read by one JSON parse
    in C: exactly what `parse` makes of each (tests/test_ingest_speed.py). Other lines are left to `parse`."""
    starts, lines = lines_with(text, "step:")
    if not lines:
        return {}
    j = "\n".join(lines)
    # as _plain, but keys with blanks around them or none (`-  `, ` :`, ` - :`) are left to _plan, which sees each set
    # of keys once; JSON allows no control character but \r (split_segments' frames) and \t between tokens
    if (j.isascii() and "\r" not in j and "\t" not in j and '"' not in j and "\\" not in j and "{" not in j
            and ": -" not in j and "step: " not in j and "step:-" not in j):
        # each line one object: its first key is what comes before `:N` (Ray's prefix and `step`), checked after
        rows = json_objects("[" + _json_text(j).replace("\n", '},{"') + "]")
        if rows is not None and len(rows) == len(lines):
            keys = set(map(tuple, rows))
            plans = {k: _plan(k) for k in keys} if len(keys) <= 64 else {}
            if (plans and None not in plans.values() and all(plain_rows(rows))
                    and set(map(type, map(next, map(iter, map(dict.values, rows))))) == {int}
                    and _HEADS.fullmatch("".join(map(add, {k[0] for k in keys}, repeat("\n"))))):
                names = repeat(plans[keys.pop()]) if len(keys) == 1 else map(plans.__getitem__, map(tuple, rows))
                return dict(zip(starts, map(dict, map(zip, names, map(dict.values, rows))), strict=True))
    return _by_line(text)


def _plan(keys: tuple[str, ...]) -> tuple[str, ...] | None:
    """The names of a line's keys, its first (`... step`) the step's; None for a key parse's loop would strip or
    find empty."""
    if any(not k or k != k.strip() for k in keys[1:]):
        return None
    names = _names(keys[1:]) if len(keys) > 1 else None
    return ("step", *names) if names is not None else None


def _by_line(text: str) -> dict[int, dict[str, Any]]:
    """The plain step lines of a chunk that has others, each read on its own."""
    out = {}
    for m in _BULK.finditer(text):
        step, body = m.groups()
        body = body.rstrip(" -")
        if body and "[repeated" not in body:  # Ray's dedup suffix: parse strips it
            d = _fast(body)
            if d is None or not plain_numbers(d):
                continue
            names = _names(tuple(d))
            if names is not None:
                out[m.start()] = {"step": int(step), **dict(zip(names, d.values(), strict=True))}
    return out


_NAMES: dict[tuple[str, ...], tuple[str, ...] | None] = {}


def _names(keys: tuple[str, ...]) -> tuple[str, ...] | None:
    """The record's names of a line's keys (what `record` gives them), worked out once per set of keys."""
    names = _NAMES.get(keys, ...)
    if names is ...:
        if "step" in keys or "time" in keys or len(set(keys)) != len(keys):
            names = None
        else:
            present = set(keys)
            mapping = {k: v for k, v in MAP.items() if not (k in PREFERRED and PREFERRED[k] in present)}
            names = tuple("eval/" + k.split("/", 1)[1] if k.startswith(EVAL_PREFIXES) else mapping.get(k) or
                          f"{NAME}/{k}" for k in keys)
        if len(_NAMES) > 4096:
            _NAMES.clear()
        _NAMES[keys] = names
    return names


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


# ---- in-loop eval names (rlctl.evals.in_loop) ------------------------------------------------------------------
# `_val_metrics_update` (trainer/ppo/ray_trainer.py, 0.9) over process_validation_metrics (metric_utils.py): per
# data_source and variable (`acc` when the reward function returns one, else `reward`; also its extra infos), over
# the N = val_kwargs.n responses: `mean@N`, and with N > 1 `std@N`, `best@n/mean|std`, `worst@n/...`, `maj@n/...`
# for bootstrapped subsets n <= N. Its core variable's `mean@1` (N = 1) or `best@N/mean` (pass@N) is the mode's
# score; `mean@N` of N > 1 is the mean over all samples. 0.2's `val/test_score/<data_source>` is the mean score.
_VAL_METRIC = re.compile(r"^eval/(.+)/([^/]+)/((?:mean|std)@\d+|(?:best|worst|maj)@\d+/(?:mean|std))$")
_TEST_SCORE = re.compile(r"^eval/test_score/(.+)$")


def name_in_loop_evals(rec: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """The record with its in-loop eval keys named eval/<set>/<mode>[/...] for what verl ran (ctx)."""
    from rlctl.evals.in_loop import named

    n = int(ctx.get("n", 1))
    parsed: dict[str, tuple[str, str, str]] = {}
    for k in rec:
        if not k.startswith("eval/"):
            continue
        t = _TEST_SCORE.match(k)
        m = None if t else _VAL_METRIC.match(k)
        if t:
            parsed[k] = (t.group(1), "score", f"mean@{n}")
        elif m:
            parsed[k] = (m.group(1), m.group(2), m.group(3))
    sources = sorted({p[0] for p in parsed.values()}) or [""]
    core = {s: "acc" if any(p[0] == s and p[1] == "acc" for p in parsed.values()) else
            "score" if any(p[0] == s and p[1] == "score" for p in parsed.values()) and
            not any(p[0] == s and p[1] == "reward" for p in parsed.values()) else "reward" for s in sources}
    score = "mean@1" if n == 1 else f"best@{n}/mean"
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if not k.startswith("eval/"):
            out[k] = v
        elif k not in parsed:  # val-aux/num_turns/...: not per source, under the set
            out[named(ctx, [""], "", k[len("eval/"):])] = v
        else:
            source, var, metric = parsed[k]
            if var == core[source] and metric == score:
                out[named(ctx, sources, source, None)] = v
            elif var == core[source] and metric == f"mean@{n}":
                out[named(ctx, sources, source, "mean_correct")] = v
            else:
                out[named(ctx, sources, source, f"{var}/{metric}")] = v
    return out
