"""verl's data, checked by verl's own code (issue 30 point 2.11): the rows verl 0.9.x reads — chat-message prompts in
`data.prompt_key`, a `data_source` column and `reward_model.ground_truth` — built into datasets of each shape a user
may have, then read by the release's RLHFDataset (verl/utils/dataset/rl_dataset.py, with the data config rlctl
renders: filter_overlong_prompts on) and by the reads its reward manager makes of each row (experimental/reward_loop/
reward_manager/naive.py run_single). rlctl's preflight (reference.data_format) must fail exactly the shapes verl
cannot train on, with the fix naming the column and showing the shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl import preflight as pf
from rlctl.backends import get_backend
from rlctl.recipe.planning import prepare
from tests.conformance import _verl_support as vs

pytest.importorskip("hydra")
pytest.importorskip("datasets")
pytest.importorskip("pyarrow")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "recipes" / "verl-qwen2.5-math-1.5b-1xh100.toml"
VERL = get_backend("verl")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def row(i: int, **change: Any) -> dict[str, Any]:
    """A row as verl's examples write them (data_source, chat prompt, ability, reward_model, extra_info)."""
    r = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
         "extra_info": {"index": i}}
    r.update(change)
    return {k: v for k, v in r.items() if v is not ...}


# shape -> rows; `...` drops the column
SHAPES: dict[str, list[dict[str, Any]]] = {
    "chat": [row(i) for i in range(8)],
    "string_prompt": [row(i, prompt=f"What is {i} + 1?") for i in range(8)],
    "no_data_source": [row(i, data_source=...) for i in range(8)],
    "no_reward_model": [row(i, reward_model=...) for i in range(8)],
    "some_without_source": [row(i, **({"data_source": ...} if i == 5 else {})) for i in range(8)],  # null there
    "some_without_reward_model": [row(i, **({"reward_model": ...} if i == 5 else {})) for i in range(8)],
    "no_ground_truth": [row(i, reward_model={"style": "rule"}) for i in range(8)],
}


def write(d: Path, name: str, rows: list[dict[str, Any]], fmt: str) -> Path:
    p = d / f"{name}.{fmt}"
    if fmt == "jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(p))
    return p


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Any]:
    """{(shape, format): (rlctl's preflight results, verl's dataset results)} for 0.9.1, one verl subprocess."""
    from transformers import AutoTokenizer

    from rlctl.recipe.tiny_model import make_tiny

    d = tmp_path_factory.mktemp("verl-data")
    tok_dir = d / "tok"
    make_tiny(tok_dir)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(tok_dir)
    (d / "reward.py").write_text("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                 "    return 0.0\n")
    try:
        vs.verl_root("0.9.1")
    except RuntimeError as e:
        pytest.skip(str(e))
    jobs, ours = [], {}
    for shape, rows in SHAPES.items():
        for fmt in ("parquet", "jsonl"):
            p = write(d, f"{shape}-{fmt}", rows, fmt)
            prep = prepare(SEED, [f"data.train={p}", f"data.eval={p}", f"reward.function={d / 'reward.py'}",
                                  "reward.function_name=my_score"])
            ours[(shape, fmt)] = [r for r in pf.run(prep, ["reference"]) if r.check == "reference.data_format"]
            jobs.append({"id": f"{shape}-{fmt}", "overrides": prep.plan.argv[3:], "tokenizer": str(tok_dir),
                         "cwd": str(d)})
    theirs = {res["id"]: res for res in vs.run_jobs("0.9.1", jobs)}
    return {k: (ours[k], theirs[f"{k[0]}-{k[1]}"]) for k in ours}


def verl_trains_on(res: dict[str, Any]) -> tuple[bool, str]:
    assert "error" not in res, res["error"]  # the rendered overrides compose and validate
    for key, ds in res["dataset"].items():
        if "error" in ds:
            return False, f"{key}: {ds['error']}"
        if ds["rows"] == 0:
            return False, f"{key}: RLHFDataset kept 0 rows (every prompt filtered out)"
    return True, ""


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_rlctl_fails_what_verls_dataset_and_reward_cannot_read(cases, shape, fmt):
    ours, theirs = cases[(shape, fmt)]
    ok, why = verl_trains_on(theirs)
    verdicts = [r.verdict for r in ours]
    assert (pf.FAIL not in verdicts) == ok, (shape, fmt, why, [(r.verdict, r.figure) for r in ours])
    if not ok:
        failed = next(r for r in ours if r.verdict == pf.FAIL)
        assert '"data_source": "openai/gsm8k"' in failed.fix and '"role": "user"' in failed.fix
        column = {"string_prompt": "'prompt'", "no_data_source": "'data_source'", "no_reward_model": "'reward_model'",
                  "some_without_reward_model": "'reward_model'", "no_ground_truth": "'ground_truth'"}[shape]
        assert column in failed.figure, failed.figure
    elif shape == "some_without_source":  # datasets gives the row a null data_source, passed to the reward function
        assert verdicts == ["warn", "warn"] and "data_source None" in ours[0].figure, ours
    else:
        assert verdicts == ["ok", "ok"], ours


def test_the_fix_closes_the_check(cases):
    """Rows written in the shape the fix shows pass both rlctl and verl (the `chat` case is that shape)."""
    shown = json.loads(cases[("string_prompt", "jsonl")][0][0].fix.split("shape verl reads: ", 1)[1].split(" (")[0])
    assert set(shown) == {"data_source", "prompt", "reward_model"}
    assert set(shown) <= set(SHAPES["chat"][0]) and isinstance(shown["prompt"], list)
