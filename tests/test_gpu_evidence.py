"""The GPU evidence (docs/gpu/<stack>-<n>.json, written by scripts/gpu/run.py on the GPU machine) and docs/gpu.md's
table: the table is exactly what scripts/gpu/report.py rebuilds from the files, and every finished part of every file
holds what issue 31.4 asks for (versions, the plan, raw NVML samples, rlctl's own outputs verbatim, checkpoint bytes,
the log's tail)."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

import report  # noqa: E402

FILES = report.evidence_files()


def test_the_table_in_docs_gpu_md_is_rebuilt_from_the_evidence():
    doc = report.DOC.read_text()
    assert report.render_doc(doc, report.table(FILES)) == doc, "run: python scripts/gpu/report.py --write"


def test_there_is_evidence_of_each_stack_that_ran():
    assert {json.loads(f.read_text())["stack"] for f in FILES} >= {"trl-vllm", "verl"}


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_each_finished_part_holds_what_was_measured(path):
    doc = json.loads(path.read_text())
    assert doc["versions"].get("vllm") and doc["versions"].get("torch") and doc["machine"]["gpus"]
    calls = doc["nvml"]["calls"]
    assert calls and all(c["samples"] and c["interval_s"] for c in calls)  # raw samples, every call
    finished = {k: p for k, p in doc["parts"].items() if not p.get("in_progress") and "collected" in p}
    # a run whose part broke in the kit (openrlhf-1: run.py's kill step) read to its end by a later `--part collect`
    later = {f"{k}/{run}": e for k, p in doc["parts"].items() if k.split("#")[0] == "collect"
             for run, e in p.items() if isinstance(e, dict) and "collected" in e}
    assert finished or later
    for name, part in {**finished, **later}.items():
        if name in finished:
            assert part["preflight"]["json"]["results"], name  # rlctl's plan, verbatim
        c = part["collected"]
        for verb in ("status", "doctor", "ckpt_list", "metrics"):
            assert c[verb]["argv"][0] == "rlctl" and "stdout" in c[verb], (name, verb)
        assert c["log_tail"], name
        assert isinstance(c["checkpoint_bytes"], dict), name
        # a run that logged a step past its first save has a checkpoint; one that failed at every attempt before it
        # has none (openrlhf-3: OpenRLHF LoRA failed at the weight sync after step 1, checkpoint.every = 2)
        seen = [int(s) for s in (part.get("steps") or {}).get("seen") or {}]
        every = (tomllib.loads(part["recipe"]).get("checkpoint") or {}).get("every") if "recipe" in part else None
        if not part.get("steps") or (seen and (every is None or max(seen) > every)):
            ckpts = json.loads(c["ckpt_list"]["stdout"])["checkpoints"]
            assert ckpts and all(k["bytes"] > 0 for k in ckpts if k["complete"]), name
