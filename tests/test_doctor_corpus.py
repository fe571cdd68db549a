"""The doctor's precision on a labelled corpus of real runs (tests/fixtures/doctor_corpus, docs/doctor.md).

Each case is a real run: a short CPU run made by scripts/gen_doctor_corpus.py (its metrics.jsonl and resolved
recipe.toml), or a public log pasted in a GitHub issue (stdout.log, read by the backend's own parser here). Its
labels.toml says, from what the run did, which findings must appear and which must not. Checked both ways: the right
finding on each sick run, no finding that contradicts a run; every rule is wanted by one case and refused by another;
advice names only knobs the run's backend honours; status's health lines agree with the doctor.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from rlctl.backends import get_backend
from rlctl.metrics.stream import METRICS, by_step, ingest, iter_metrics
from rlctl.recipe.loader import load
from rlctl.runs.doctor import RULES, diagnose
from rlctl.runs.health import health_flags
from tests.conftest import FIXTURES, ROOT

CORPUS = FIXTURES / "doctor_corpus"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "labels.toml").is_file())
RECIPE_KEY = re.compile(r"\b((?:optim|algorithm|rollout|train|lora|model|data)\.[a-z_]+)")


def labels(case: str) -> dict:
    return tomllib.loads((CORPUS / case / "labels.toml").read_text())


def make_run(case: str, tmp_path: Path) -> Path:
    """The case as a run directory: its files, state.json with its backend, the public log ingested."""
    src = CORPUS / case
    run = tmp_path / case
    shutil.copytree(src, run)
    backend = json.loads((src / "run.json").read_text())["backend"]
    (run / "state.json").write_text(json.dumps({"backend": backend, "status": "finished"}))
    if (run / "recipe.toml").is_file():  # paths of the machine that made it -> this checkout
        (run / "recipe.toml").write_text((run / "recipe.toml").read_text().replace("<repo>", str(ROOT)))
    if not (run / METRICS).is_file():
        ingest(run, backend, final=True)
    return run


@pytest.mark.parametrize("case", CASES)
def test_the_doctor_says_what_the_run_did(case, tmp_path):
    want = labels(case)
    run = make_run(case, tmp_path)
    findings = diagnose(run)
    got = {f.rule for f in findings}
    missing = set(want.get("must", [])) - got
    wrong = set(want.get("must_not", [])) & got
    shown = "\n".join(f"[{f.severity}] {f.rule}: {f.message} -> {f.action}" for f in findings)
    assert not missing and not wrong, f"{case}: missing {sorted(missing)}, contradicting {sorted(wrong)}\n{shown}"
    for rule_name, severity in want.get("severity", {}).items():
        assert next((f.severity for f in findings if f.rule == rule_name), None) == severity, shown


@pytest.mark.parametrize("case", CASES)
def test_advice_names_only_knobs_the_backend_has(case, tmp_path):
    run = make_run(case, tmp_path)
    if not (run / "recipe.toml").is_file():
        pytest.skip("a public log: no recipe to ask the backend about")
    recipe = load(run / "recipe.toml").recipe
    adapter = get_backend(json.loads((run / "state.json").read_text())["backend"])
    for f in diagnose(run):
        for key in RECIPE_KEY.findall(f.action):
            assert adapter.honours(recipe, key) is not False, f"{case}: {f.rule} advises {key}: {f.action}"


@pytest.mark.parametrize("case", CASES)
def test_status_health_agrees_with_the_doctor(case, tmp_path):
    want = labels(case)
    run = make_run(case, tmp_path)
    text = " | ".join(f"{f.message}: {f.action}" for f in health_flags(by_step(list(iter_metrics(run / METRICS)))))
    if "frozen_weights" in want.get("must_not", []):
        assert "frozen weights:" not in text, f"{case}: {text}"
    for needle in want.get("health_must", []):
        assert needle in text, f"{case}: {text}"


def test_every_rule_is_checked_both_ways():
    """Each rule is required by some case (it finds what it should) and refused by another (it does not cry wolf)."""
    must = {r for c in CASES for r in labels(c).get("must", [])}
    must_not = {r for c in CASES for r in labels(c).get("must_not", [])}
    assert set(RULES) - must == set(), f"rules no sick case needs: {sorted(set(RULES) - must)}"
    assert set(RULES) - must_not == set(), f"rules no case refuses: {sorted(set(RULES) - must_not)}"


def test_a_run_without_records_says_so(tmp_path, cli):
    run = tmp_path / "empty-run"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"backend": "trl", "status": "finished"}))
    (run / METRICS).write_text("")
    res = cli("doctor", str(run))
    assert res.code == 1 and "no metrics records" in res.out
    res = cli("doctor", str(run), "--json")
    assert [f["rule"] for f in json.loads(res.out)["findings"]] == ["no_records"]


def test_command_backend_honours_only_its_placeholders(tmp_path):
    recipe = load(make_run("command_torchrun_learning", tmp_path) / "recipe.toml").recipe
    adapter = get_backend("command")
    assert adapter.honours(recipe, "optim.lr") is True  # {lr} is in the command
    assert adapter.honours(recipe, "algorithm.eps_clip") is False  # no placeholder carries it
    assert adapter.honours(recipe, "rollout.temperature") is False  # a placeholder exists, the command lacks it
    trl = get_backend("trl")
    qs = load(ROOT / "recipes" / "quickstart.toml").recipe
    assert trl.honours(qs, "algorithm.eps_clip") is True and trl.honours(qs, "algorithm.entropy_coef") is False
    # the default asks the adapter's own unhonoured(): prime-rl's loss has no clip range to tighten
    prime = load(ROOT / "recipes" / "prime-rl-qwen3-8b-2xh100.toml").recipe
    assert get_backend("prime_rl").honours(prime, "algorithm.eps_clip") is False
    assert get_backend("prime_rl").honours(prime, "optim.lr") is True


def test_spikes_on_a_trainer_without_a_clip_range_give_no_eps_clip_advice(tmp_path, cli):
    run = make_run("command_torchrun_spikes_high_lr", tmp_path)
    res = cli("doctor", str(run), "--json")
    spikes = next(f for f in json.loads(res.out)["findings"] if f["rule"] == "loss_grad_spikes")
    assert "eps_clip" not in spikes["action"] and "lower optim.lr" in spikes["action"]
    assert spikes["evidence"]["advice_not_applicable"] == ["algorithm.eps_clip"]


def test_spikes_where_the_clip_cannot_act_give_no_eps_clip_advice(tmp_path, cli):
    """noop's finding: on the quickstart (TRL, one optimizer step per generation batch, num_iterations 1) the ratio is
    exactly 1 and eps_clip cannot act (preflight algorithm.inert), yet doctor advised tightening it for spikes."""
    run = make_run("command_torchrun_spikes_high_lr", tmp_path)
    shutil.copyfile(ROOT / "recipes" / "quickstart.toml", run / "recipe.toml")
    (run / "state.json").write_text(json.dumps({"backend": "trl", "status": "finished"}))
    res = cli("doctor", str(run), "--json")
    spikes = next(f for f in json.loads(res.out)["findings"] if f["rule"] == "loss_grad_spikes")
    assert "eps_clip" not in spikes["action"] and "lower optim.lr" in spikes["action"], spikes["action"]
    assert spikes["evidence"]["advice_not_applicable"] == ["algorithm.eps_clip"], spikes["evidence"]
