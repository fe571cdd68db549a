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
import re
from itertools import repeat
from operator import itemgetter
from typing import Any

from rlctl.metrics.parsers import (
    _JSON_NUMBER,
    Header,
    KeyMap,
    LineTemplates,
    Malformed,
    RowPlans,
    lines_with,
    literal_dict,
    literal_rows,
    number,
    plain_lines,
    strip_prefixes,
)

NAME = "trl"

MAP = {
    "reward": "reward/mean", "reward_std": "reward/std", "completions/mean_length": "response_length/mean",
    "completion_length": "response_length/mean",  # 0.14 - 0.16
    "completions/clipped_ratio": "response_length/clip_ratio", "kl": "kl", "entropy": "entropy",
    "loss": "policy_loss", "grad_norm": "grad_norm", "clip_ratio/region_mean": "clip_ratio",
    "clip_ratio": "clip_ratio",  # 0.16 - 0.18
    "learning_rate": "lr", "step_time": "time/step_s",
    # PPOTrainer (PPOv2Trainer before 0.12) and RLOOTrainer: `objective/*`, `policy/*`, `loss/*`, `val/*` (the value
    # head's, not an eval), with `eps`, `lr` and `episode`
    "objective/scores": "reward/mean", "objective/kl": "kl", "objective/entropy": "entropy",
    "loss/policy_avg": "policy_loss", "policy/clipfrac_avg": "clip_ratio", "lr": "lr",
}
_KEYS = KeyMap(NAME, MAP)
_KEYS_REGION = KeyMap(NAME, {k: v for k, v in MAP.items() if k != "clip_ratio"})  # 0.18: region_mean is the one
TRAIN_KEYS = ("'loss'", "'reward'", "'learning_rate'", "'grad_norm'", "'objective/", "'episode'")
SUMMARY_KEYS = ("'train_runtime'", "'eval_")
TABLE = "Training Loss"  # the notebook progress table's header (transformers' NotebookTrainingTracker)
NEEDLES = ("{'", "'step'", TABLE)
# the notebook table's columns that are not log keys
TABLE_COLUMNS = {"Training Loss": "loss", "Validation Loss": "eval_loss"}


def parse(line: str | dict[str, Any]) -> dict[str, Any] | None:
    """A console dict (with or without `step`), or one W&B/TensorBoard/trainer_state row."""
    if isinstance(line, dict):
        return record(_row(line), counted=False)
    s = strip_prefixes(line).strip()
    if TABLE in s:
        head, nl, row = s.partition("\n")
        cols = _cells(head)
        if cols and cols[0] in ("Step", "Epoch") and TABLE in cols:
            if nl:
                return _table_row(head, cols, row)
            raise Header(head)
    brace = s.find("{'")
    if brace < 0 or not any(k in s for k in TRAIN_KEYS + SUMMARY_KEYS + ("'step'",)):
        return None
    return record(literal_dict(s[brace:]))


def _cells(line: str) -> list[str] | None:
    """A table line's cells: markdown (`| a | b |`, as a notebook's table is pasted) or tab-separated (as copied
    from the rendered HTML table)."""
    s = line.strip()
    if s.startswith("|"):
        return [c.strip() for c in s.strip("|").split("|")]
    if "\t" in s:
        return [c.strip() for c in s.split("\t")]
    return None


def _table_row(head: str, cols: list[str], line: str) -> dict[str, Any] | None:
    """One row of the notebook table (`| 10 | 0.012300 | 0.500000 | ...`): the header's columns are the log's keys
    (`Training Loss` is `loss`), each cell as the table prints it (`.6f`); `No log` cells are absent. None when the
    line is no row of it (the table has ended)."""
    cells = _cells(line)
    if cells is None:
        return None
    if all(c and set(c) <= set("-: ") for c in cells):
        raise Header(head)  # the `|---|` rule under the header
    first = number(cells[0])
    if not isinstance(first, int | float) or isinstance(first, bool):
        return None
    if len(cells) != len(cols):
        raise Malformed(f"a table row of {len(cells)} cells under {len(cols)} columns")
    raw: dict[str, Any] = {}
    for col, cell in zip(cols[1:], cells[1:], strict=True):
        if cell.lower() in ("no log", ""):  # on_evaluate writes `No log`, write_line `No Log`
            continue
        value = number(cell)
        if isinstance(value, str):
            raise Malformed(f"column {col!r}: {cell!r} is no number")
        raw[TABLE_COLUMNS.get(col, col)] = value
    if cols[0] == "Step":
        raw["step"] = first
    else:
        raw["epoch"] = first
    return record(raw)


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
    rest = {k: v for k, v in raw.items() if not k.startswith("eval_") and k != "step" and k != "time"}
    rec: dict[str, Any] = {}
    if step is not None:
        rec["step"] = int(number(step) or 0)
    elif not counted:
        return None
    elif evals or "train_runtime" in raw:
        rec["step"] = None  # an eval or the final summary: the step in progress
    # else: no step key, the stream counts the step
    rec.update((_KEYS if "clip_ratio/region_mean" not in rest else _KEYS_REGION).apply(rest))
    for k, v in evals.items():
        rec[f"eval/default/{k[5:]}"] = number(v)
    return rec


_TRAIN_EXACT = frozenset(k.strip("'") for k in TRAIN_KEYS + SUMMARY_KEYS + ("'step'",) if k.endswith("'"))
_TRAIN_PREFIXES = tuple(k.strip("'") for k in TRAIN_KEYS + SUMMARY_KEYS if not k.endswith("'"))


def _plan(keys: tuple[str, ...]) -> tuple[list[str], list[int]] | None:
    """What `parse` and `record` make of a plain dict with these keys: its names and values' positions, or None
    (a dict parse ignores, an eval or summary dict without its step: left to parse)."""
    if not any(k in _TRAIN_EXACT or k.startswith(_TRAIN_PREFIXES) for k in keys):
        return None
    evals = [i for i, k in enumerate(keys) if k.startswith("eval_")]
    has_step = "step" in keys
    if not has_step and (evals or "train_runtime" in keys):
        return None
    rest = [i for i, k in enumerate(keys) if not k.startswith("eval_") and k != "step" and k != "time"]
    rest_keys = tuple(keys[i] for i in rest)
    names = (_KEYS if "clip_ratio/region_mean" not in rest_keys else _KEYS_REGION).names(rest_keys)
    if names is None:
        return None
    order = ([keys.index("step")] if has_step else []) + rest + evals
    return (["step"] if has_step else []) + list(names) + [f"eval/default/{keys[i][5:]}" for i in evals], order


_PLANS = RowPlans(_plan)


def bulk(text: str) -> dict[int, dict[str, Any]]:
    """The records of a chunk's plain console dicts (a line that is one dict of numbers, nothing around it), by the
    offset where each line starts, all read by one JSON parse in C: exactly what `parse` makes of each
    (tests/test_ingest_speed.py). Other lines are left to `parse`."""
    starts, lines = lines_with(text, "{'")
    if len(lines) > 1:
        out = _uniform(starts, lines)
        if out is not None:
            return out
    starts, lines = plain_lines(starts, lines, "{'", "}")
    rows = literal_rows(lines)
    keys = set(map(tuple, filter(None, rows)))
    if len(keys) == 1 and None not in rows:  # one set of keys (a log's usual case): renamed in C
        plan = _PLANS.get(keys.pop())
        if plan is not None and (plan[0][0] != "step" or _int_steps(rows)):
            return dict(zip(starts, map(dict, map(zip, repeat(plan[0]), map(plan[1], map(list, map(
                dict.values, rows))))), strict=True))
    out = {}
    get = _PLANS.get
    for start, row in zip(starts, rows, strict=True):
        plan = get(tuple(row)) if row is not None else None
        if plan is None or ("step" in row and type(row["step"]) is not int):  # a float step: parse's int(..)
            continue
        out[start] = dict(zip(plan[0], plan[1](list(row.values())), strict=True))
    return out


# A chunk whose dict lines all have the first one's template (the same keys in the same order, each value quoted or
# not as there: a log's usual case): matched by one regex made from that line, the numbers read by one JSON parse.
# A key of word characters, `/`, `.`, `@`, `-`; a value a number as literal_dict's JSON path reads it (quoted:
# _QUOTED_NUMBER's), the step an int. Each line's values are matched loosely (characters of numbers), then read
# as JSON numbers (anything else fails the parse) whose magnitudes sum below 1e15 (template_rows): no integer part
# of 16 digits, no value that JSON and `number` would read differently.
_T_PAIR = re.compile(r"'([\w/.@-]+)': ('?)(" + _JSON_NUMBER + r")\2", re.ASCII)
_T_VALUE, _T_INT = "([0-9.eE+-]++)", "(-?[0-9]++)"  # possessive (never followed by such a character): 3x faster


def _template(line: str) -> Any:
    """The regex of dict lines like `line`, their records' names and the reorder of their values, or None."""
    out = None
    pairs = [_T_PAIR.fullmatch(p) for p in line[1:-1].split(", ")] if line[:2] == "{'" and line[-1:] == "}" else []
    if pairs and all(pairs):
        keys = tuple(m.group(1) for m in pairs if m)
        plan = _PLANS.get(keys) if len(set(keys)) == len(keys) else None
        if plan is not None:
            rx = "^" + re.escape("{") + ", ".join(
                re.escape(f"'{m.group(1)}': {m.group(2)}") + (_T_INT if m.group(1) == "step" else _T_VALUE)
                + re.escape(m.group(2)) for m in pairs if m)
            out = re.compile(rx + re.escape("}") + "$", re.MULTILINE), *plan
    return out


_uniform = LineTemplates(_template).records  # dict lines that all match the first one's template


def _int_steps(rows: list[Any]) -> bool:
    return set(map(type, map(itemgetter("step"), rows))) == {int}


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


def name_in_loop_evals(rec: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """The record with GRPOTrainer's eval keys (eval/default/<key>, from `eval_<key>`) named for what it ran: every
    one under eval/<set>/<mode>/<key> (the mean reward of its samples is no pass@k: none is the mode's score)."""
    from rlctl.evals.in_loop import named

    return {named(ctx, [""], "", k[len("eval/default/"):]) if k.startswith("eval/default/") else k: v
            for k, v in rec.items()}
