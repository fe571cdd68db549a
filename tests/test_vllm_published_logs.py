"""rlctl's vLLM plan (estimate/memory.py, vllm_memory) against the memory figures vLLM itself logged at startup, as
published in GitHub issues and pull requests (docs/vllm_published_logs.json: URL, configuration and the verbatim log
lines of every entry). The data is committed: no network at test time.

Tolerances: the budget is vLLM's own arithmetic (utilization x total, printed to 0.01 GiB). Weights are counted from
the architecture's parameters: 5% (quantized checkpoints are skipped: the bytes per parameter are not the dtype's). The
KV cache is what the budget leaves: max(10%, 1 GiB), the spread of vLLM's own profiled activation and non-torch figures
across versions and machines for one configuration (the non-torch figure alone moves 0.03-0.46 GiB at TP 1, activations
by up to 0.2 GiB between TP ranks and builds), while a wrong activation term is off by 1-4 GiB (it was: the table). The
KV token count checks the per-token bytes against vLLM's own division of its logged KV GiB: 1% (block rounding).

`pytest -s tests/test_vllm_published_logs.py` prints the comparison table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.estimate.memory import GiB, vllm_memory
from rlctl.recipe.models import Arch
from rlctl.recipe.planning import prepare
from tests.conftest import RECIPES

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "docs" / "vllm_published_logs.json").read_text())
ENTRIES = DATA["entries"]
VERL = RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"  # a vLLM recipe that renders max_num_batched_tokens
ARCH_FIELDS = set(Arch.__dataclass_fields__)


def _arch(e: dict) -> Arch:
    return Arch(**{k: v for k, v in e["arch"].items() if k in ARCH_FIELDS})


def _plan(e: dict):
    arch = _arch(e)
    sets = [f"model.path={arch.name}", f"model.dtype={e['dtype']}", f"model.max_model_len={e['max_model_len']}",
            f"rollout.tensor_parallel={e['tp']}", f"resources.gpus_per_node={e['tp']}",
            f"rollout.gpu_memory_utilization={e['utilization']}",
            f"rollout.max_num_batched_tokens={e['max_num_batched_tokens']}", f'resources.gpu="{e["gpu"]}"']
    recipe = prepare(VERL, sets).recipe
    return vllm_memory(recipe, arch, e["total_gib"] * GiB, vllm_version=e["vllm_version"])


def _kv_tolerance(logged: float) -> float:
    return max(0.10 * abs(logged), 1.0)


def test_the_data_is_what_the_tests_need():
    assert len(ENTRIES) >= 8
    assert len({e["id"] for e in ENTRIES}) == len(ENTRIES)
    for e in ENTRIES:
        assert e["url"].startswith("https://github.com/"), e["id"]
        assert e["log_lines"], e["id"]
        assert e["max_num_batched_tokens"] and e["max_num_batched_tokens_source"], e["id"]
        logged = e["logged"]
        assert logged["weights_gib"] is not None and logged["activation_gib"] is not None, e["id"]
        # vLLM's own rule: the budget minus weights, activation peak and non-torch memory is the KV cache
        if logged["kv_cache_gib"] is not None:
            rest = logged["budget_gib"] - logged["weights_gib"] - logged["activation_gib"] - logged["non_torch_gib"]
            assert rest == pytest.approx(logged["kv_cache_gib"], abs=0.03), e["id"]


@pytest.mark.parametrize("e", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_budget_is_utilization_times_total(e):
    assert _plan(e).budget / GiB == pytest.approx(e["logged"]["budget_gib"], abs=0.01)


@pytest.mark.parametrize("e", [e for e in ENTRIES if e["quantization"] is None], ids=lambda e: e["id"])
def test_weights_within_5_percent(e):
    assert _plan(e).weights / GiB == pytest.approx(e["logged"]["weights_gib"], rel=0.05)


@pytest.mark.parametrize("e", [e for e in ENTRIES if e["logged"]["kv_cache_gib"] is not None], ids=lambda e: e["id"])
def test_kv_cache_within_tolerance(e):
    logged = e["logged"]["kv_cache_gib"]
    assert _plan(e).kv_cache / GiB == pytest.approx(logged, abs=_kv_tolerance(logged))


@pytest.mark.parametrize("e", [e for e in ENTRIES if e["logged"]["kv_tokens"] and e["kv_tokens_comparable"]],
                         ids=lambda e: e["id"])
def test_kv_tokens_per_byte(e):
    p = _plan(e)
    assert e["logged"]["kv_cache_gib"] * GiB / p.kv_per_token == pytest.approx(e["logged"]["kv_tokens"], rel=0.01)
    # and the planned KV cache holds about the logged token count, within the KV tolerance
    assert p.kv_cache / p.kv_per_token == pytest.approx(
        e["logged"]["kv_tokens"], rel=_kv_tolerance(e["logged"]["kv_cache_gib"]) / e["logged"]["kv_cache_gib"])


def test_activation_term_is_not_systematically_off():
    """Activations + non-torch as vLLM profiled them: no sign bias over the entries, none off by more than 1 GiB
    except the development build whose non-torch figure no other log approaches (its note)."""
    errors = {}
    for e in ENTRIES:
        logged = e["logged"]["activation_gib"] + e["logged"]["non_torch_gib"]
        errors[e["id"]] = _plan(e).activations / GiB - logged
    outliers = {k: v for k, v in errors.items() if abs(v) > 1.0}
    assert set(outliers) <= {"vllm-pr10511-llama3-8b-tp1", "vllm-pr10511-llama3-8b-tp2"}, outliers
    over = sum(v > 0 for v in errors.values())
    assert 0.25 < over / len(errors) < 0.75, errors


def test_print_table():
    rows = [("entry", "vLLM", "TP", "weights plan/log", "act+non-torch plan/log", "KV plan/log GiB", "KV err")]
    for e in ENTRIES:
        p, logged = _plan(e), e["logged"]
        kv = logged["kv_cache_gib"]
        err = f"{(p.kv_cache / GiB - kv) / abs(kv) * 100:+.1f}%" if kv is not None else "-"
        rows.append((e["id"], e["vllm_version"].split(" ")[0], str(e["tp"]),
                     f"{p.weights / GiB:.2f}/{logged['weights_gib']:.2f}",
                     f"{p.activations / GiB:.2f}/{logged['activation_gib'] + logged['non_torch_gib']:.2f}",
                     f"{p.kv_cache / GiB:.2f}/{kv if kv is not None else float('nan'):.2f}", err))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
