"""OpenRLHF's log and metric formats, mapped to rlctl's unified names (docs/metrics.md lists every mapping).

What OpenRLHF prints, read from its released sources (0.3.6 to 0.11.2, each family's printing code run in the
tests):
  - `ppo_trainer.py` (from 0.8.1): `logger.info(f"✨ Global step {global_step}: {log_status}")` through its own
    logging format (`INFO 01-06 09:20:11 ppo_trainer.py:323] ...`), often behind Ray's `(PPOTrainer pid=.., ip=..)`
    prefix; the async trainer of 0.11 prints the same without the ✨. A long dict can reach the log wrapped over
    several lines.
  - evaluation: `✨ Evaluation completed in 0:01:02, global_step 10, eval_metrics: {...}` and (async, 0.11)
    `Eval at step 10: {...}`, keys `eval_<datasource>_pass1`, `eval_<datasource>_pass<k>`, ...
  - the actor's tqdm bar `Train epoch [e/E]: 100%|...| 8/8 [.., <short_status>]` (its `short_status` dict, every
    release from 0.3.6): 0.3.6 - 0.3.8 `pg=, rm=, ret=, glen=, tlen=, kl=` (+ `cri=, vals=, ptx=` with a critic,
    pretraining loss); 0.4.0 - 0.7.1 the same + `act_lr=` (+ `cri_lr=`); from 0.7.2 `act_loss=, reward=, return=,
    gen_len=, tot_len=, kl=, act_lr=, ent_loss=` (0.10 adds grad_norm). The final frame of a bar (drawn again by
    close()) is the last micro-batch of the step being trained: the first epoch's gets a counted step (the step
    after the last one seen), a later epoch's (--max_epochs) the step in progress; both stand in for the step's
    Global step line (parsers.STAND_IN): printed by the actor's process, they reach a Ray log before or after it,
    and one that comes after it is left out (the Global dict has the step's exact values, the bar 3 digits).
  - up to 0.8.0, the `Episode [e/E]` bar's postfix is the step's whole status dict (`policy_loss=.., reward=..`),
    printed by `set_postfix` before `update()`, and in 0.8.0's async trainer the `Training Process` bar's: a frame
    showing n of N is step (e-1)*N + n + 1 (the closing frame, n = N, repeats step e*N). Up to 0.4.4 that bar
    counts rollout micro-batches (rollout_batch_size / (world size x micro_rollout_batch_size) per step), so its
    steps are right only where that is 1. A bar with a status no rule places is not understood, never dropped.
  - its W&B/TensorBoard loggers: `train/<key>` with `train/global_step`, `eval/<key>` with `eval/global_step`.
  - rlctl's own patch: JSON lines with `global_step` (backend_metrics.jsonl).
"""

from __future__ import annotations

import json
import re
from itertools import chain, repeat
from typing import Any

from rlctl.metrics.parsers import (
    STAND_IN,
    STAND_IN_CURRENT,
    Incomplete,
    KeyMap,
    Malformed,
    RowPlans,
    key_values,
    lines_with,
    literal_dict,
    literal_rows,
    number,
    plain_lines,
    strip_prefixes,
    unify,
)

NAME = "openrlhf"

# The Global step dict (and the W&B/TensorBoard `train/` keys), 0.9.3 and 0.11.2
MAP = {
    "reward": "reward/mean", "reward_std": "reward/std", "correctness": "correctness",
    "response_length": "response_length/mean", "kl": "kl", "policy_loss": "policy_loss",
    "grad_norm": "grad_norm", "actor_grad_norm": "grad_norm",  # 0.11 names it actor_grad_norm
    "ppo_clip_ratio": "clip_ratio", "clip_ratio": "clip_ratio", "actor_lr": "lr",
    "entropy_loss": "entropy", "entropy_mean": "entropy", "entropy": "entropy",
    "advantage_mean": "advantage/mean", "advantage_std": "advantage/std",
    "truncated": "response_length/clip_ratio", "truncated_response": "response_length/clip_ratio",
    "timing/step_total": "time/step_s", "timing/generation": "time/generation_s", "timing/ppo_train": "time/train_s",
}
# The actor's progress-bar postfix: 0.7.2 .. 0.11 names, then those of 0.3.6 .. 0.7.1
POSTFIX_MAP = {
    "act_loss": "policy_loss", "reward": "reward/mean", "gen_len": "response_length/mean", "kl": "kl",
    "act_lr": "lr", "grad_norm": "grad_norm", "ent_loss": "entropy",
    "pg": "policy_loss", "rm": "reward/mean", "glen": "response_length/mean",
}
_KEYS = KeyMap(NAME, MAP)
POSTFIX_RENAME = {"return": "return", "ret": "return", "tot_len": "total_length", "tlen": "total_length",
                  # up to 0.7.1, a PPO run with a critic in the same process: its short names in the actor's bar
                  "cri": "critic_loss", "vals": "values", "cri_lr": "critic_lr", "ptx": "ptx_loss"}

NEEDLES = ("lobal step", "global_step", "act_lr=", "pg=", "critic_loss=", "policy_loss=", "Eval at step")

_GLOBAL_STEP = re.compile(r"Global step (\d+):\s*(.*?)\s*$", re.DOTALL)
_EVAL_DONE = re.compile(r"global_step (\d+), eval_metrics:\s*(.*?)\s*$", re.DOTALL)
_EVAL_ASYNC = re.compile(r"Eval at step (\d+):\s*(.*?)\s*$", re.DOTALL)
# the bars whose postfix is a step's whole status: `Episode [e/E]` (<= 0.8.0), 0.8.0's async `Training Process`
_EPISODE = re.compile(r"(?:Episode \[(\d+)/\d+\]|Training Process)[^|]*\|[^|]*\|\s*(\d+)/(\d+) \[[^\]]*?,"
                      r"\s*([A-Za-z_]+=.*?)\]?\s*$")
_BAR = re.compile(r"(\d+)/(\d+) \[[^\]]*?,\s*([A-Za-z_]+=.*?)\]?\s*$")
_EPOCH = re.compile(r"Train epoch \[(\d+)/(\d+)\]")
_EVAL_KEY = re.compile(r"^eval_(.+)_(pass\d+|response_length_mean|truncated_rate)$")
_LOG_PREFIX = re.compile(r"^(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d \d\d:\d\d:\d\d [\w.]+:\d+\] ")


def _join(text: str) -> str:
    """A record wrapped over lines: each line without its Ray/logging prefix, joined again."""
    if "\n" not in text:
        return text
    parts = [_LOG_PREFIX.sub("", strip_prefixes(p)).strip() for p in text.split("\n")]
    return " ".join(p for p in parts if p)


def parse(line: str | dict[str, Any]) -> dict[str, Any] | None:
    """One console line (or several joined by the stream after `Incomplete`), or one W&B/TensorBoard row."""
    if isinstance(line, dict):
        return record(dict(line))
    s = _join(strip_prefixes(line)).strip()
    if s.startswith("{") and '"global_step"' in s:  # rlctl's metrics patch: JSON lines
        try:
            raw = json.loads(s)
        except json.JSONDecodeError as e:
            raise (Incomplete if not s.endswith("}") else Malformed)(str(e)) from None
        return record(raw)
    m = _GLOBAL_STEP.search(s)
    if m:
        if not m.group(2):
            raise Incomplete("the dict starts on the next line")
        raw = literal_dict(m.group(2))
        raw["global_step"] = int(m.group(1))
        return record(raw)
    m = _EVAL_DONE.search(s) or _EVAL_ASYNC.search(s)
    if m:
        if not m.group(2):
            raise Incomplete("the dict starts on the next line")
        return eval_record(int(m.group(1)), literal_dict(m.group(2)))
    if "'train/global_step'" in s or "'eval/global_step'" in s:
        return record(literal_dict(s[s.find("{"):]))
    if "=" in s and "|" in s:
        return _bar(s)
    return None


def _bar(s: str) -> dict[str, Any] | None:
    e = _EPISODE.search(s)
    if e:
        fields = key_values(e.group(4))
        if "policy_loss" not in fields and "reward" not in fields:
            return None
        episode, n, total = int(e.group(1) or 1), int(e.group(2)), int(e.group(3))
        rec: dict[str, Any] = {"step": (episode - 1) * total + min(n + 1, total)}
        rec.update(unify(NAME, {k: number(v) for k, v in fields.items()}, MAP))
        return rec
    m = _BAR.search(s)
    if not m:
        return None
    fields = key_values(m.group(3))
    actor = any(k in fields for k in ("act_lr", "act_loss", "pg"))
    if not actor and "critic_loss" not in fields:
        if "policy_loss" in fields:  # a step's status in a bar no rule here knows: said, never dropped
            raise Malformed(f"a progress bar with a step's status rlctl cannot place: {s[:80]!r}")
        return None  # other bars (`prompts_consumed=`, ...)
    if int(m.group(1)) != int(m.group(2)):
        return None  # a frame before the bar's end: the final frame carries the step's last micro-batch
    raw = {POSTFIX_RENAME.get(k, k): v for k, v in fields.items()}
    rec = unify(NAME, {k: number(v) for k, v in raw.items()}, POSTFIX_MAP if actor else {})
    epoch = _EPOCH.search(s)
    # It stands in for the step's Global step line (from 0.8.1), printed by the trainer's process: it reaches the log
    # before or after that line (Ray forwards each actor's output on its own), and the stream pairs them
    # (parsers.STAND_IN); up to 0.8.0 it is the step's only record while the run goes, and counts the steps.
    if not actor or (epoch and int(epoch.group(1)) > 1):
        rec["step"] = STAND_IN_CURRENT  # the critic's bar, or a later epoch (--max_epochs): the step in progress
    else:
        rec["step"] = STAND_IN  # the actor's bar of a step's first epoch ends a step: counted
    return rec


def record(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A Global step dict, a W&B/TensorBoard row (`train/`, `eval/` keys) or a metrics-patch JSON line."""
    step = None
    for key in ("global_step", "train/global_step", "eval/global_step"):
        if raw.get(key) is not None:
            step = raw.pop(key)
            break
    fallback = raw.pop("_step", None)
    raw.pop("_timestamp", None)
    raw.pop("_runtime", None)
    if step is None:
        step = fallback
    if step is None:
        return None
    flat, evals = {}, {}
    for k, v in raw.items():
        if k.startswith("eval/"):
            evals[k] = v
        else:
            flat[k.removeprefix("train/")] = v
    flat.pop("global_step", None)
    rec: dict[str, Any] = {"step": int(number(step) or 0)}
    rec.update(_KEYS.apply(flat))
    for k, v in evals.items():
        rest = k[len("eval/"):]
        rec.update(_eval_key(rest, v) if "/" not in rest else {f"eval/{rest}": number(v)})
    return rec


def _eval_key(key: str, value: Any) -> dict[str, Any]:
    m = _EVAL_KEY.match(key)
    if m:
        return {f"eval/{m.group(1)}/{m.group(2)}": number(value)}
    return {f"eval/default/{key.removeprefix('eval_')}": number(value)}


def eval_record(step: int, raw: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {"step": step}
    for k, v in raw.items():
        rec.update(_eval_key(k, v))
    return rec


# ---- in-loop eval names (rlctl.evals.in_loop) ------------------------------------------------------------------
# `evaluate()` (trainer/ppo_trainer.py, 0.9.3 and 0.11.2), per datasource (the data's `datasource` field, else
# "default"), over n = --eval_n_samples_per_prompt samples at --eval_temperature: `pass{n}` the mean over prompts of
# the max reward (pass@n with 0/1 rewards), `pass1` the mean reward of all samples; 0.11 adds `response_length_mean`
# and `truncated_rate` per datasource and over all (`eval_response_length_mean`, read as eval/default/...).
_SOURCE_METRIC = re.compile(r"^eval/(.+)/(pass\d+|response_length_mean|truncated_rate)$")


def name_in_loop_evals(rec: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """The record with its in-loop eval keys named eval/<set>/<mode>[/...] for what OpenRLHF ran (ctx)."""
    from rlctl.evals.in_loop import named

    n = int(ctx.get("n", 1))
    parts = {k: _SOURCE_METRIC.match(k) for k in rec if k.startswith("eval/")}
    # the whole-eval lengths of 0.11 are read as source `default`; a source of its own only where it logs pass@
    sources = sorted({m.group(1) for m in parts.values() if m and m.group(2).startswith("pass")}) or ["default"]
    out: dict[str, Any] = {}
    for k, v in rec.items():
        m = parts.get(k)
        if m is None:
            out[k] = v
            continue
        source, metric = m.groups()
        many = sources if source in sources else [source]  # 0.11's overall lengths: under the set itself
        if metric == f"pass{n}":
            out[named(ctx, many, source, None)] = v
        elif metric == "pass1":  # n > 1: the mean reward of all samples
            out[named(ctx, many, source, "mean_correct")] = v
        else:
            out[named(ctx, many, source, metric)] = v
    return out


# What may come before `Global step N: {...}` on a line read in bulk: Ray's prefix (as strip_prefixes removes it),
# OpenRLHF's logging prefix and its ✨; each line's, newline-ended
_HEADS = re.compile(r"(?:(?:\((?:[\w.:\-]+ )?pid=\d+(?:, \w+=[^,)\x00-\x1f]*)*\) ?)?"
                    r"(?:(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d \d\d:\d\d:\d\d [\w.]+:\d+\] )?(?:✨ )?\n)*")
_RESERVED = frozenset(("global_step", "train/global_step", "eval/global_step", "_step", "_timestamp", "_runtime",
                       "step", "time"))


def _plan(keys: tuple[str, ...]) -> tuple[list[str], list[int]] | None:
    """What `record` makes of a Global step dict with these keys (after its step), or None where it is more than
    a renaming (a step, W&B or eval key in the dict): left to parse."""
    if any(k in _RESERVED or k.startswith(("eval/", "train/")) for k in keys):
        return None
    names = _KEYS.names(keys)
    return (["step", *names], list(range(len(keys) + 1))) if names is not None else None


_PLANS = RowPlans(_plan)


def bulk(text: str) -> dict[int, dict[str, Any]]:
    """The records of a chunk's plain `Global step N: {...}` lines (a dict of numbers ending the line), by the
    offset where each line starts, their dicts read by one JSON parse in C: exactly what `parse` makes of each
    (tests/test_ingest_speed.py). Other lines are left to `parse`."""
    starts, lines = plain_lines(*lines_with(text, "Global step "), "", "}", ascii_only=False)
    if not lines:
        return {}
    heads, _, rests = zip(*map(str.partition, lines, repeat("Global step ")), strict=True)
    steps, _, dicts = zip(*map(str.partition, rests, repeat(": ")), strict=True)
    if not (all(steps) and "".join(steps).isdigit() and all(map(str.startswith, dicts, repeat("{")))
            and _HEADS.fullmatch("\n".join(set(heads)) + "\n")):  # a log repeats its heads
        return _one_by_one(starts, heads, steps, dicts)
    rows = literal_rows(list(dicts))
    keys = set(map(tuple, filter(None, rows)))
    if len(keys) == 1 and None not in rows:  # one set of keys (a log's usual case): renamed in C
        plan = _PLANS.get(keys.pop())
        if plan is not None:
            values = map(chain, zip(map(int, steps)), map(dict.values, rows))
            return dict(zip(starts, map(dict, map(zip, repeat(plan[0]), values)), strict=True))
    out = {}
    get = _PLANS.get
    for start, step, row in zip(starts, steps, rows, strict=True):
        plan = get(tuple(row)) if row is not None else None
        if plan is not None:
            out[start] = dict(zip(plan[0], (int(step), *row.values()), strict=True))
    return out


def _one_by_one(starts: list[int], heads: Any, steps: Any, dicts: Any) -> dict[int, dict[str, Any]]:
    """The plain lines of a chunk that has others."""
    keep = [i for i, (h, s, d) in enumerate(zip(heads, steps, dicts, strict=True))
            if s.isdigit() and d.startswith("{") and _HEADS.fullmatch(h + "\n")]
    rows = literal_rows([dicts[i] for i in keep])
    out = {}
    for i, row in zip(keep, rows, strict=True):
        plan = _PLANS.get(tuple(row)) if row is not None else None
        if plan is not None:
            out[starts[i]] = dict(zip(plan[0], (int(steps[i]), *row.values()), strict=True))
    return out
