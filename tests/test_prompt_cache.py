"""Prompt lengths from a `datasets` id already in the local cache (issue 22 point 2): seed 002's 1297-token prompts
with max_tokens 3000 in a 4096 context fail preflight when the dataset is cached, and are "not measured" (never OK)
when it is not.

The cache is made by `datasets`' own code, as a download leaves it: the hub snapshot (refs/main, the Parquet file)
and the Arrow cache that its Parquet builder prepares for the repo at that commit, config `default`; then
`load_dataset(id)` offline reads it back (checked here first), which is what preflight does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import RECIPES

pytest.importorskip("datasets")

SHA = "0123456789abcdef0123456789abcdef01234567"
MAKE_CACHE = textwrap.dedent(f"""
    import os
    from pathlib import Path
    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet
    hub = Path(os.environ["HF_HOME"]) / "hub" / "datasets--acme--long-prompts"
    snap = hub / "snapshots" / "{SHA}" / "data"
    snap.mkdir(parents=True)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("{SHA}")
    f = snap / "train-00000-of-00001.parquet"
    datasets.Dataset.from_dict({{"prompt": ["x" * 1297, "short"]}}).to_parquet(str(f))
    b = Parquet(hash="{SHA}", data_files={{"train": [str(f)]}}, dataset_name="acme___long-prompts")
    b.download_and_prepare()
    d = Path(b.cache_dir)
    for a in d.glob("acme___*.arrow"):  # as the hub module names its shards: <name>-<split>.arrow
        a.rename(a.with_name(a.name.replace("acme___", "")))
    d.parents[1].rename(d.parents[1].with_name("default"))  # a hub repo's single config
""")
CHECK = 'import datasets; print(len(datasets.load_dataset("acme/long-prompts", split="train")))'
ARGS = ["preflight", str(RECIPES / "quickstart.toml"), "--set", "data.train=acme/long-prompts", "--set",
        "data.input_key=prompt", "--set", "rollout.max_tokens=3000", "--set", "model.max_model_len=4096",
        "--only", "context", "--json"]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def _checks(p: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    return {r["check"]: r for r in json.loads(p.stdout)["results"]}


def test_prompt_lengths_from_the_local_datasets_cache(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_CACHE", None)
    env.pop("HF_DATASETS_CACHE", None)
    rlctl = [sys.executable, "-m", "rlctl.cli"]
    before = _run(rlctl + ARGS, env)
    checks = _checks(before)
    assert checks["context.prompt_lengths"]["verdict"] == "skip"
    assert "no dataset in the local cache" in checks["context.prompt_lengths"]["figure"]
    assert checks["context.budget"]["verdict"] != "ok"  # never OK on an assumed prompt length
    made = _run([sys.executable, "-c", MAKE_CACHE], env)
    assert made.returncode == 0, made.stderr[-2000:]
    offline = {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    back = _run([sys.executable, "-c", CHECK], offline)
    assert back.returncode == 0 and back.stdout.strip() == "2", back.stderr[-2000:]  # datasets reads it offline
    after = _run(rlctl + ARGS, env)
    checks = _checks(after)
    lengths = checks["context.prompt_lengths"]
    assert lengths["verdict"] == "warn" and "max 1297 tokens" in lengths["figure"], lengths
    assert checks["context.budget"]["verdict"] == "fail", checks["context.budget"]
    assert "1297" in checks["context.budget"]["figure"] and after.returncode == 1
