"""`rlctl compare` as a user types it: the README's defaults (runs in ./runs of the directory the commands are typed
in, no RLCTL_* variable; only HOME isolated), a real sweep of a real learner that needs no torch
(tests/fixtures/experiments/bandit.py through the command backend), and every figure checked against scipy.

Issue 30 §2.8: a metric no run has is an error that lists the metrics there are; runs that have not finished are
left out (and said, by name) unless --include-running; a degenerate test (identical paired differences: t = inf,
p = 0) is said in words; --json is strict JSON (no bare Infinity or NaN)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from tests.test_experiments import bandit_recipe

scipy_stats = pytest.importorskip("scipy.stats")


def strict_json(text: str):
    """json.loads that refuses what Python's json writes for non-finite floats (and no other parser reads)."""

    def refuse(name: str):
        raise ValueError(f"not JSON: a bare {name}")

    return json.loads(text, parse_constant=refuse)


def shift_recipe(gate: Path) -> str:
    """The bandit, 6 steps; the reward shift and the gate come from [env] (so that `--grid env.BANDIT_SHIFT=...`
    makes arms that differ by a constant in every seed)."""
    return bandit_recipe(steps=6) + f'\n[env]\nBANDIT_SHIFT = "0"\nBANDIT_GATE = "{gate}"\n'


def wait_for(pred, timeout: float = 180.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False


def records(run: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def final(run: Path, window: int = 5) -> float:
    vals = [r["reward/mean"] for r in records(run) if "reward/mean" in r][-window:]
    return math.fsum(vals) / len(vals)


@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore:Precision loss")  # scipy on identical differences (what the test is about)
def test_compare_as_a_user_types_it_unknown_metric_unfinished_runs_degenerate_test_strict_json(user):
    work, rlctl = user
    gate = work / "gate"
    gate.mkdir()
    (work / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (work / "b.toml").write_text(shift_recipe(gate))
    r = rlctl("sweep", "b.toml", "--grid", 'env.BANDIT_SHIFT="0","0.25"', "--seeds", "2", "--parallel", "4",
              "--name", "shift")
    assert r.returncode == 0, r.stdout + r.stderr
    runs = work / "runs"  # the default, relative to where the user typed the command

    def by(arm: str, seed: int) -> list[Path]:
        return sorted(p for p in runs.glob(f"shift-{arm}-s{seed}-*") if (p / "state.json").is_file())

    # every run is held at step 2 (the gate); then seed 42's runs are let go and finish, seed 43's stay running
    assert wait_for(lambda: all(len(by(a, s)) == 1 and len(records(by(a, s)[0])) >= 2
                                for a in ("a0", "a1") for s in (42, 43))), rlctl("status").stdout
    (gate / "42").write_text("")
    assert wait_for(lambda: all(json.loads((by(a, 42)[0] / "state.json").read_text()).get("status") == "finished"
                                for a in ("a0", "a1")))
    running = sorted(by(a, 43)[0].name for a in ("a0", "a1"))

    # a metric no run logs: exit 2, the metrics there are, the nearest name; no table
    r = rlctl("compare", "shift", "--metric", "eval/aime/pass@1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "eval/aime/pass@1" in r.stderr and "reward/mean" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""

    # the unfinished runs are left out, by name, in the table, the report and --json
    r = rlctl("compare", "shift", "--report", "shift.md")
    assert r.returncode == 0, r.stderr
    assert "left out: 2 unfinished runs" in r.stdout and all(n in r.stdout for n in running), r.stdout
    assert "--include-running" in r.stdout
    assert "wrote report shift.md" in r.stderr and "wrote plot shift.png" in r.stderr, r.stderr  # was silent
    md = (work / "shift.md").read_text()
    assert "left out: 2 unfinished runs" in md and all(n in md for n in running), md
    c = strict_json(rlctl("compare", "shift", "--json").stdout)  # one seed per arm: no interval (was NaN)
    assert sorted(x["run"] for x in c["left_out"]) == running
    assert {x["status"] for x in c["left_out"]} == {"running"}
    assert [len(a["values"]) for a in c["arms"]] == [1, 1] and c["arms"][0]["ci95"] is None
    # --include-running: all four, on their values so far
    r = rlctl("compare", "shift", "--include-running", "--json")
    c = strict_json(r.stdout)
    assert c["left_out"] == [] and sorted(x["run"] for x in c["included_unfinished"]) == running
    assert [len(a["values"]) for a in c["arms"]] == [2, 2]

    # all finished: the arms differ by exactly 0.25 in every seed (same seed, same draws, a constant shift)
    (gate / "43").write_text("")
    assert wait_for(lambda: all(json.loads((by(a, 43)[0] / "state.json").read_text()).get("status") == "finished"
                                for a in ("a0", "a1")))
    r = rlctl("compare", "shift")
    assert r.returncode == 0, r.stderr
    assert "left out" not in r.stdout
    assert "degenerate" in r.stdout and "identical in every seed" in r.stdout, r.stdout
    assert "significant at alpha" not in r.stdout, r.stdout
    r = rlctl("compare", "shift", "--json")
    assert r.returncode == 0, r.stderr
    c = strict_json(r.stdout)
    (t,) = c["comparisons"]
    a = [final(by("a0", s)[0]) for s in (42, 43)]
    b = [final(by("a1", s)[0]) for s in (42, 43)]
    ref = scipy_stats.ttest_rel(b, a)  # scipy: identical differences give t = inf, p = 0
    assert math.isinf(ref.statistic) and ref.pvalue == 0.0
    assert t["test"]["t"] is None and t["test"]["p"] == 0.0 and t["test"]["degenerate"], t
    assert t["test"]["significant"] is None
    assert math.isclose(t["test"]["diff"], 0.25, abs_tol=1e-12)
    assert "t = inf" in t["verdict"] and "degenerate" in t["verdict"]


@pytest.mark.timeout(300)
def test_compare_of_one_run_or_one_arm_says_there_is_nothing_to_compare_against(user):
    """A new user's `rlctl compare RUN`: it printed 'test: paired t-test by seed (...)' and no test. One run is a
    usage error (exit 2, what to give instead); several seeds of one recipe (one arm) show the arm's mean and
    interval, and say that no test ran and why."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=3))
    for seed, name in ((42, "one"), (43, "two")):
        r = rlctl("launch", "b.toml", "--name", name, "--set", f"train.seed={seed}")
        assert r.returncode == 0, r.stdout + r.stderr

    r = rlctl("compare", "one")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and "t-test" not in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "one run" in r.stderr and "nothing to compare" in r.stderr, r.stderr
    assert "fix: " in r.stderr and "rlctl compare one RUN2" in r.stderr, r.stderr
    # the same run named twice (by name, by a prefix, by its directory) was two seeds of one arm, with "zero
    # variance across its 2 seeds" (new-user trial 6): a usage error naming the run
    run_dir = str(next((work / "runs").glob("one-*")))
    for twice in (["one", "one"], ["one", "on"], ["one", run_dir], ["one", "two", "one"]):
        r = rlctl("compare", *twice)
        assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, (twice, r.stdout + r.stderr)
        assert "named twice" in r.stderr and "one" in r.stderr and "fix: " in r.stderr, (twice, r.stderr)

    r = rlctl("compare", "one", "two")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "t-test" not in r.stdout, r.stdout
    assert "test: none: one arm" in r.stdout and "nothing to compare it against" in r.stdout, r.stdout
    c = strict_json(rlctl("compare", "one", "two", "--json").stdout)
    assert c["comparisons"] == [] and c["test"].startswith("none: one arm"), c
    assert len(c["arms"]) == 1 and c["arms"][0]["ci95"] is not None


def test_runs_that_differ_only_in_what_does_not_train_are_one_arm(tmp_path):
    """Two seeds of one recipe, one of them launched with `--set run.restart=never` (and another keep_last, eval
    schedule and name), were two arms of one run each: arms are keyed by what changes training."""
    from rlctl.experiments.report import arms_of_runs

    def run(name: str, extra: str) -> str:
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"name": name, "status": "finished", "backend": "command"}))
        (d / "recipe.toml").write_text(f'name = "{name}"\n[optim]\nlr = 1e-6\n{extra}')
        return str(d)

    a = run("a", '[train]\nseed = 1\n[run]\nrestart = "on-failure"\n[checkpoint]\nkeep_last = 2\n[eval]\nevery = 5\n')
    b = run("b", '[train]\nseed = 2\n[run]\nrestart = "never"\nmax_restarts = 0\n[checkpoint]\nkeep_last = 9\n'
            '[eval]\nevery = 10\n')
    arms, runs = arms_of_runs([a, b])
    assert len(arms) == 1 and len(runs["a0"]) == 2, arms
    c = run("c", '[train]\nseed = 1\n[optim.schedule]\nwarmup = 3\n')
    arms, _ = arms_of_runs([a, b, c])
    assert len(arms) == 2 and "optim.schedule.warmup=3" in arms[1]["label"], arms


def test_runs_of_one_seed_are_replicas_and_the_ignored_differences_are_named(user):
    """New-user trial: two quickstart runs that differ only in run.restart, both train.seed = 42, printed
    `a0  2 ... [0.005736, 0.005736]` and 'zero variance across its 2 seeds': one seed counted twice, a CI from
    replicas, and the run.restart difference unsaid. The arm counts distinct seeds and says which keys it ignored."""
    work, rlctl = user

    def run(name: str, extra: str, value: float) -> None:
        d = work / "runs" / f"{name}-20260101-000000"
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"name": name, "status": "finished", "backend": "command"}))
        (d / "recipe.toml").write_text(f'name = "{name}"\n[train]\nseed = 42\n{extra}')
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": value}) + "\n"
                                                 for s in (1, 2, 3)))

    run("base", "", 0.005736)
    run("rs", '[run]\nrestart = "never"\n', 0.005736)
    r = rlctl("compare", "base", "rs")
    assert r.returncode == 0, r.stdout + r.stderr
    row = next(x for x in r.stdout.splitlines() if x.startswith("a0"))
    assert row.split()[1] == "1" and "[" not in row, r.stdout  # one distinct seed: no interval
    assert "replica" in r.stdout and "42" in r.stdout, r.stdout
    assert "run.restart" in r.stdout and "not affecting training" in r.stdout, r.stdout
    assert "zero variance across its 2 seeds" not in r.stdout, r.stdout
    c = strict_json(rlctl("compare", "base", "rs", "--json").stdout)
    assert c["arms"][0]["ci95"] is None and c["arms"][0]["seeds"] == 1, c
    # the report's per-seed column and the plot's band count the seed once too (trial 9: both listed replicas)
    assert rlctl("compare", "base", "rs", "--report", "a.md").returncode == 0
    row = [x for x in (work / "a.md").read_text().splitlines() if x.startswith("| a0 |")][-1]  # results
    assert row.count("42: ") == 1 and "2 runs" in row, row
    from rlctl.experiments.report import arms_of_runs, band, compare

    arms, runs = arms_of_runs([str(p) for p in sorted((work / "runs").iterdir())])
    arm = compare(arms, runs, "reward/mean", 5).arms[0]
    assert [(s, iv.n) for s, iv in band(arm)] == [(1, 1), (2, 1), (3, 1)]
