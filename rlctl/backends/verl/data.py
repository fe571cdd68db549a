"""The rows verl 0.9.x reads, checked before a GPU is touched (preflight's reference.data_format).

verl's RL dataset (verl/utils/dataset/rl_dataset.py, RLHFDataset) hands each row's `data.prompt_key` column to the
tokenizer's chat template: a list of messages, `[{"role": "user", "content": "..."}]`
(maybe_filter_out_long_prompts: `tokenizer.apply_chat_template(doc[prompt_key], ...)`; __getitem__: `raw_prompt`,
which the agent loop templates again). A plain string fails the template; with data.filter_overlong_prompts (rlctl
renders it on) the failure counts as "too long", so every such prompt is silently filtered out. Its reward managers
read `data_source` and `reward_model.ground_truth` from every row (experimental/reward_loop/reward_manager/naive.py
run_single: `data_item.non_tensor_batch["data_source"]`, `...["reward_model"]["ground_truth"]`): a missing column is
a KeyError at the first reward, after the first rollout. Without reward.function, verl's default_compute_score routes
on data_source (utils/reward_score/__init__.py) and raises NotImplementedError for a source it does not know."""

from __future__ import annotations

import json
from itertools import islice
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

ROWS = 200  # rows read per file: the shape is a column's, a sample suffices
EXAMPLE = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 1+1?"}],
           "reward_model": {"ground_truth": "2"}}
# default_compute_score's sources (verl/utils/reward_score/__init__.py, 0.9.0 and 0.9.1): the exact names
DEFAULT_SOURCES = ("openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                   "math_dapo", "math", "math_dapo_reasoning")


def _is_messages(v: Any) -> bool:
    return (isinstance(v, list) and len(v) > 0
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in v))


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, str):
        return "a plain string"
    if isinstance(v, list):
        return "an empty list" if not v else "a list that is not {role, content} messages"
    return f"a {type(v).__name__}"


def problems(recipe: Recipe, path: str) -> tuple[int, list[str], list[str]]:
    """(rows read, what verl fails on, what it runs otherwise than meant) for one local dataset file. verl reads the
    file with `datasets`, which gives every row every column of the file (null where a row lacks it): a column is
    missing when no row has it."""
    from rlctl.recipe.data import iter_records

    r = recipe
    rows = list(islice(iter_records(path, limit=ROWS), ROWS))
    if not rows:
        return 0, [], []
    n, col = len(rows), r.data.input_key
    fails, warns = [], []
    if not any(col in row for row in rows):
        fails.append(f"no {col!r} column (data.prompt_key = data.input_key): RLHFDataset reads the prompt from it")
    else:
        bad = [row.get(col) for row in rows if not _is_messages(row.get(col))]
        if bad:
            fails.append(f"{len(bad)} of {n} prompts in {col!r} are {_kind(bad[0])}, not chat messages: RLHFDataset "
                         "applies the chat template to a list of {role, content} messages (rl_dataset.py "
                         "maybe_filter_out_long_prompts); with filter_overlong_prompts a prompt the template fails on "
                         "is dropped as too long, so these prompts never train")
    if not any("data_source" in row for row in rows):
        fails.append("no 'data_source' column: verl's reward manager reads it from every row "
                     "(reward_manager/naive.py run_single) and fails at the first reward")
    else:
        odd = sorted({row.get("data_source") for row in rows if not isinstance(row.get("data_source"), str)},
                     key=str)
        unknown = sorted({row["data_source"] for row in rows if isinstance(row.get("data_source"), str)
                          and row["data_source"] not in DEFAULT_SOURCES and not row["data_source"].startswith("aime")})
        if not r.reward.function and (odd or unknown):
            fails.append(f"data_source {(odd or unknown)[0]!r} has no default reward in verl (utils/reward_score "
                         "default_compute_score raises for it) and reward.function is not set")
        elif odd:
            warns.append(f"{sum(1 for row in rows if not isinstance(row.get('data_source'), str))} of {n} rows have "
                         f"data_source {odd[0]!r}: reward.function receives it as it is")
    if not any("reward_model" in row for row in rows):
        fails.append("no 'reward_model' column: the reward manager reads reward_model['ground_truth'] from every row "
                     "(naive.py run_single)")
    else:
        null = sum(1 for row in rows if not isinstance(row.get("reward_model"), dict))
        if null:
            fails.append(f"{null} of {n} rows have no 'reward_model' value (null): the reward manager's "
                         "reward_model['ground_truth'] fails on them (naive.py run_single)")
        elif not any("ground_truth" in row["reward_model"] for row in rows):
            fails.append("'reward_model' has no 'ground_truth' key: the reward manager reads "
                         "reward_model['ground_truth'] from every row (naive.py run_single)")
    return n, fails, warns


def data_format(ctx: Any) -> list[Any]:
    """reference.data_format for data.train and data.eval (verl builds both datasets with RLHFDataset)."""
    from rlctl.preflight import FAIL, OK, SKIP, WARN, Result
    from rlctl.recipe.data import is_local

    r = ctx.recipe
    out = []
    files = [("data.train", r.data.train)] + ([("data.eval", r.data.eval)] if r.data.eval else [])
    for key, path in files:
        if not is_local(path):
            out.append(Result("reference.data_format", SKIP, f"{key} {path!r} is not a local file: the columns verl "
                              "reads (data_source, chat-message prompts, reward_model.ground_truth) are not checked",
                              "point it at a local Parquet/JSONL copy to have them checked"))
            continue
        n, found, odd = problems(r, path)
        if not n:
            continue  # unreadable or empty: reference.data says why
        if found:
            out.append(Result("reference.data_format", FAIL, f"{key} {path}: " + "; ".join(found),
                              f"give every row the shape verl reads: {json.dumps(EXAMPLE)} (data.input_key names the "
                              "prompt column)"))
        elif odd:
            out.append(Result("reference.data_format", WARN, f"{key} {path}: " + "; ".join(odd),
                              "give every row a string data_source"))
        else:
            out.append(Result("reference.data_format", OK, f"{key}: {n} rows read have data_source, chat-message "
                              f"prompts in {r.data.input_key!r} and reward_model.ground_truth, as verl reads them"))
    return out
