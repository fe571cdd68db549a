"""Seed 001's workflow as its team types it: a primary box trains, a spare evaluates; held-out probe sets in three
modes with a step-0 baseline; early stopping when the OOD probe drops twice; pruning that keeps the best
checkpoint; resume from it; the eps_clip A/B of attempt 28 with its statistics checked against scipy.

The GPU parts of the seed become the CPU quickstart (TRL, tiny random Qwen2, reward = fraction of 'a'); the two
machines are SSH aliases `h100-8-4` and `h100-8-5` in the user's ~/.ssh/config. The early-stop run uses the
team's own post-hoc evaluator (`eval.evaluator = "command"`, seed 001's eval_posthoc.py): it reads the step of the
checkpoint it is given and answers with attempt 26's OOD probe curve (a peak, then two drops below it), so that
the rule fires at a known step whatever the machine's speed.
"""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest

from tests.journeys.conftest import User, evals_by_step, stream, wait_for

pytestmark = pytest.mark.slow
pytest.importorskip("trl")

PROBES = {  # seed 001's three levels of eval data, cut from the quickstart's prompts
    "data/probe_set_200_ood.jsonl": slice(48, 64),
    "data/probe_set_200.jsonl": slice(0, 16),
    "data/aime_eval.jsonl": slice(39, 48),
}

A26 = """\
# attempt 26: the quickstart as seed 001 runs it, with its three probe sets in three modes
extends = "quickstart.toml"
name = "a26"
[train]
steps = 6
[checkpoint]
every = 2
[eval]
primary = "ood"                 # checkpoint selection

[eval.sets.ood]                 # OOD probe, greedy: eval/ood/greedy_pass@1
data = "data/probe_set_200_ood.jsonl"
grader = "reward"
threshold = 0.5

[eval.sets.aime]                # AIME, sampled at 0.6: eval/aime/sampling_pass@2
data = "data/aime_eval.jsonl"
temperature = 0.6
n = 4
k = 2
every = 4
grader = "reward"
threshold = 0.5

[eval.sets.id]                  # ID probe, 4 greedy samples: eval/id/nondet_proxy_pass@4 (diagnostics)
data = "data/probe_set_200.jsonl"
n = 4
every = 4
grader = "reward"
threshold = 0.5
"""

EVAL_POSTHOC = '''\
"""Post-hoc OOD probe of one checkpoint (seed 001's eval_posthoc.py, its attempt-26 numbers)."""
import json, pathlib, sys

checkpoint, out = pathlib.Path(sys.argv[1]), sys.argv[2]
state = checkpoint / "trainer_state.json"
step = json.loads(state.read_text())["global_step"] if state.is_file() else 0  # the base model: step 0
# greedy_pass@1 of the OOD probe: the baseline, a peak at step 4, then two drops (below the baseline)
curve = {0: 0.30, 2: 0.33, 4: 0.354, 6: 0.31, 8: 0.271}
json.dump({"primary": curve.get(step, 0.25), "checkpoint_step": step}, open(out, "w"))
'''

A27 = """\
# attempt 27: stop when the OOD probe drops for 2 consecutive evals; the best checkpoint is kept
extends = "quickstart.toml"
name = "a27"
[train]
steps = 200
[checkpoint]
every = 2
[eval]
evaluator = "command"
command = "python {evaluator} {{checkpoint}} {{output}}"
primary = "ood"
[eval.sets.ood]
data = "data/probe_set_200_ood.jsonl"
[run]
stop_when = ["eval_divergence:2"]
"""

A28A = """\
# attempt 28, arm A: eps_clip 0.2 (the baseline); two optimizer steps per rollout, so clipping acts
extends = "quickstart.toml"
name = "a28a"
[algorithm]
eps_clip = 0.2
[train]
steps = 6
seed = 42
train_batch_size = 16
micro_batch_size = 16
"""


@pytest.fixture(scope="module")
def team(new_user, sshd) -> User:
    """The seed 001 team's laptop: its project (quickstart, probe sets, recipes), the primary and the spare."""
    u = new_user("seed001")
    u.copy_quickstart()
    prompts = (u.cwd / "quickstart" / "prompts.jsonl").read_text().splitlines()
    for path, cut in PROBES.items():
        u.write(path, "\n".join(prompts[cut]) + "\n")
    u.write("a26.toml", A26)
    u.write("a27.toml", A27.format(evaluator="eval_posthoc.py"))  # beside the recipe, as the docs write it
    u.write("eval_posthoc.py", EVAL_POSTHOC)
    u.write("a28a.toml", A28A)
    u.write("a28b.toml", A28A.replace("arm A: eps_clip 0.2 (the baseline)", "arm B: eps_clip 0.1")
            .replace('"a28a"', '"a28b"').replace("eps_clip = 0.2", "eps_clip = 0.1"))
    u.add_host("primary", "h100-8-4", sshd)
    u.add_host("spare", "h100-8-5", sshd)
    return u


def test_hosts_come_from_the_ssh_config(team):
    p = team.ok("rlctl hosts check")
    assert re.search(r"^primary: ok", p.stdout, re.M) and re.search(r"^spare: ok", p.stdout, re.M), p.stdout
    assert "trl: trl " in p.stdout
    listed = team.ok("rlctl hosts list").stdout
    assert "h100-8-4" in listed and "h100-8-5" in listed


def test_preflight_names_each_set_by_its_mode(team):
    p = team.ok("rlctl preflight a26.toml")
    for metric in ("eval/ood/greedy_pass@1", "eval/aime/sampling_pass@2", "eval/id/nondet_proxy_pass@4"):
        assert metric in p.stdout, p.stdout
    assert "eval.sets.ood.data: 16 records" in p.stdout and "eval.sets.aime.data: 9 records" in p.stdout


def test_preflight_says_its_notes_as_notes(team):
    """Where each set is evaluated is a note in render (docs/eval.md): preflight warns of nothing for a26, a
    recipe written as the docs show."""
    notes = [x for x in team.ok("rlctl render a26.toml").stdout.splitlines() + team.ok("rlctl render a26.toml").stderr
             .splitlines() if x.startswith("note: eval set")]
    assert len(notes) == 3, notes
    p = team.ok("rlctl preflight a26.toml")
    assert not re.search(r"^WARN", p.stdout, re.M), p.stdout
    assert re.search(r"^\d+ ok, \d+ skip$", p.stdout, re.M), p.stdout


def test_preflight_says_an_every_the_checkpoints_cannot_serve(team):
    """The OOD probe every 3 steps with checkpoints every 2 would be evaluated at 0, 6, 12: preflight says so."""
    p = team("rlctl preflight a26.toml --set eval.sets.ood.every=3")
    assert re.search(r"^(WARN|FAIL).*eval\.sets\.ood\.every|^(WARN|FAIL).*every = 3", p.stdout, re.M), p.stdout


# ---- attempt 26: trained on the primary, three eval modes, a baseline -------------------------------------------
@pytest.fixture(scope="module")
def a26(team):
    p = team("rlctl launch a26.toml --on primary --name a26", timeout=900)
    return p, team.run_dir("a26"), team.host_run_dir("primary", "a26")


def test_a26_trains_on_the_primary(team, a26):
    p, run, there = a26
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"{run.name} runs on primary in {there}" in p.stderr
    row = next(line for line in team.ok("rlctl status").stdout.splitlines() if line.startswith(run.name))
    assert row.split()[1:5] == ["primary", "trl", "finished", "6/6"], row
    st = team.json(f"rlctl status {run.name} --json")
    assert st["status"] == "finished" and st["step"] == 6 and st["total_steps"] == 6
    train = [m for m in stream(run) if "reward/mean" in m]
    assert [m["step"] for m in train] == list(range(1, 7))  # each step once, in order
    assert st["metrics"]["reward/mean"]["latest"] == pytest.approx(train[-1]["reward/mean"])
    assert float(row.split()[5]) == pytest.approx(train[-1]["reward/mean"], rel=1e-3)  # the table's reward column
    assert (there / "checkpoints" / "checkpoint-6" / "trainer_state.json").is_file()
    listed = team.ok(f"rlctl ckpt list {run.name}").stdout
    assert f"primary:{there}/checkpoints/checkpoint-6" in listed
    assert "final  complete" in listed and f"primary:{there}/checkpoints/final" in listed, listed  # the final model


def pass_at_k(counts: list[int], n: int, k: int) -> float:
    """The unbiased estimator, from scipy's binomial coefficients (not rlctl's)."""
    from scipy.special import comb

    return statistics.fmean(1.0 - comb(n - c, k, exact=True) / comb(n, k, exact=True) for c in counts)


MODES = {"ood": ("eval/ood/greedy_pass@1", 1, 1, [0, 2, 4, 6]),
         "aime": ("eval/aime/sampling_pass@2", 4, 2, [0, 4]),
         "id": ("eval/id/nondet_proxy_pass@4", 4, 4, [0, 4])}


@pytest.mark.parametrize("name", list(MODES))
def test_each_eval_set_in_its_mode_with_a_baseline(team, a26, name):
    """Every set at its steps, the baseline first; each value is the pass@k of the per-prompt counts the job kept;
    `rlctl status` shows the latest next to the baseline."""
    _, run, there = a26
    key, n, k, steps = MODES[name]
    team.ok(f"rlctl status {run.name}")  # refreshes the local mirror
    ev = evals_by_step(run)
    assert sorted(s for s, m in ev.items() if key in m) == steps, ev
    for step in steps:
        out = json.loads((there / "evals" / f"step-{step}.out.json").read_text())
        assert name not in out.get("errors", {}), out["errors"]
        counts = out["sets"][name]["correct_per_prompt"]
        assert len(counts) == {"ood": 16, "aime": 9, "id": 16}[name]
        assert ev[step][key] == pytest.approx(pass_at_k(counts, n, k))
        assert ev[step][f"{key}/mean_correct"] == pytest.approx(sum(counts) / (n * len(counts)))
    first_train = min(m["time"] for m in stream(run) if "reward/mean" in m)
    assert next(m["time"] for m in stream(run) if m["step"] == 0) < first_train  # the baseline came first
    last, base = ev[steps[-1]][key], ev[0][key]
    status = team.ok(f"rlctl status {run.name}").stdout
    line = next((x for x in status.splitlines() if x.strip().startswith(key)), None)
    assert line is not None, status
    assert f"{last:.4g}" in line and f"at step {steps[-1]}" in line and f"baseline {base:.4g}" in line, line


def test_status_of_the_remote_run_names_its_best_checkpoint(team, a26):
    """The primary marked the best checkpoint by the primary eval; `rlctl status` here says which."""
    _, run, there = a26
    best = json.loads((there / "state.json").read_text())["best_checkpoint"]
    st = team.json(f"rlctl status {run.name} --json")
    assert (st.get("best_checkpoint") or {}).get("step") == best["step"], st.get("best_checkpoint")
    assert f"best checkpoint: step {best['step']}" in team.ok(f"rlctl status {run.name}").stdout


def test_eval_by_hand_where_the_run_lives(team, a26):
    """`rlctl eval RUN --on primary`: one set at one checkpoint, into the run's stream at that step."""
    _, run, there = a26
    p = team.ok(f"rlctl eval {run.name} --on primary --step 6 --set aime --json", timeout=600)
    got = json.loads(p.stdout)["results"][0]
    assert got["step"] == 6 and "eval/aime/sampling_pass@2" in got["metrics"]
    team.ok(f"rlctl status {run.name}")
    key = "eval/aime/sampling_pass@2"
    assert evals_by_step(run)[6][key] == pytest.approx(got["metrics"][key])


def test_the_spare_evaluates_a_run_trained_on_the_primary(team, a26):
    """Seed 001 §13: a checkpoint of a run trained on h100-8-4 evaluated on h100-8-5 (--all does them all)."""
    _, run, there = a26
    p = team(f"rlctl eval {run.name} --step 4 --on spare --json", timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout)["results"][0]
    assert got["step"] == 4 and "eval/ood/greedy_pass@1" in got["metrics"]
    assert "spare" in p.stderr  # where it ran


def test_the_metrics_of_the_remote_run_count_each_step_once(team, a26):
    """`rlctl metrics` and `logs --metrics` read the stream the primary wrote: the same records, never twice."""
    _, run, there = a26
    csv = team.ok(f"rlctl metrics {run.name} --keys reward/mean --csv").stdout.splitlines()
    assert [line.split(",")[0] for line in csv[1:]] == [str(s) for s in range(1, 7)], csv
    lines = team.ok(f"rlctl logs {run.name} --metrics").stdout.splitlines()
    assert [json.loads(x)["step"] for x in lines if "reward/mean" in x] == list(range(1, 7))
    team.ok(f"rlctl status {run.name}")
    assert stream(run) == stream(there)  # the mirror is the primary's stream, byte for byte in content


def test_prune_on_the_primary_keeps_the_newest_and_the_best(team, a26):
    """`ckpt prune --keep-last 1 --keep-best` on a run that lives on the primary prunes there."""
    _, run, there = a26
    ckpts = there / "checkpoints"
    best = json.loads((there / "state.json").read_text())["best_checkpoint"]["step"]
    before = sorted(int(d.name.split("-")[1]) for d in ckpts.glob("checkpoint-*"))
    assert before == [2, 4, 6], before
    dry = team.ok(f"rlctl ckpt prune {run.name} --keep-last 1 --keep-best --dry-run")
    doomed = [s for s in before if s not in (best, 6)]
    assert f"would delete {len(doomed)} checkpoint(s)" in dry.stdout, dry.stdout
    assert sorted(int(d.name.split("-")[1]) for d in ckpts.glob("checkpoint-*")) == before  # a dry run
    team.ok(f"rlctl ckpt prune {run.name} --keep-last 1 --keep-best")
    assert sorted(int(d.name.split("-")[1]) for d in ckpts.glob("checkpoint-*")) == sorted({best, 6})
    listed = team.ok(f"rlctl ckpt list {run.name}").stdout
    assert "best eval: eval/ood/greedy_pass@1" in listed and f"at step {best}" in listed, listed


def test_relative_evaluator_on_the_primary(team):
    """The team's evaluator as the docs write it, `python eval_posthoc.py ...`, on the primary: its step-0 baseline
    (evaluated before training starts) is recorded; then the run is stopped."""
    team.write("a27rel.toml", A27.format(evaluator="eval_posthoc.py").replace('"a27"', '"a27rel"'))
    team.ok("rlctl launch a27rel.toml --on primary --name a27rel --detach", timeout=900)
    there = team.host_run_dir("primary", "a27rel")
    ledger = there / "evals" / "evals.json"
    try:
        assert wait_for(lambda: ledger.is_file() and "0" in json.loads(ledger.read_text()).get("done", {}),
                        timeout=300), "no baseline eval"
    finally:
        team("rlctl stop a27rel")
    base = json.loads(ledger.read_text())["done"]["0"]
    assert base["outcome"] == "ok", base
    assert evals_by_step(there)[0]["eval/ood/greedy_pass@1"] == 0.30


# ---- attempt 27: early stop, prune, resume from the best ---------------------------------------------------------
@pytest.fixture(scope="module")
def a27(team):
    p = team("rlctl launch a27.toml --name a27", timeout=900)
    return p, team.run_dir("a27")


def test_a27_stops_when_the_ood_probe_drops_twice(team, a27):
    p, run = a27
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "stopped", (state.get("status"), p.stderr[-2000:])
    assert state["stopped_by"]["rule"] == "eval_divergence"
    ev = evals_by_step(run)
    assert [ev[s]["eval/ood/greedy_pass@1"] for s in (0, 2, 4, 6, 8)] == [0.30, 0.33, 0.354, 0.31, 0.271]
    assert ev[8]["eval/ood/greedy_pass@1/checkpoint_step"] == 8  # the evaluator was given checkpoint-8
    assert max(m["step"] for m in stream(run)) < 200  # stopped well before the end
    assert state["best_checkpoint"]["step"] == 4


def test_launch_says_the_run_was_stopped_by_its_rule(team, a27):
    """The rule the user wrote stopped the run: launch says so and exits 0, as for a run that ended as asked."""
    p, run = a27
    assert "eval_divergence" in p.stdout + p.stderr, p.stderr[-2000:]
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])


def test_status_says_why_a27_stopped(team, a27):
    _, run = a27
    row = next(line for line in team.ok("rlctl status").stdout.splitlines() if line.startswith(run.name))
    assert row.split()[3] == "stopped", row
    out = team.ok(f"rlctl status {run.name}").stdout
    assert "stopped by stop_when eval_divergence" in out and "best checkpoint: step 4" in out, out


def test_prune_with_keep_best(team, a27):
    _, run = a27
    ckpts = run / "checkpoints"
    before = sorted(int(d.name.split("-")[1]) for d in ckpts.glob("checkpoint-*"))
    assert 4 in before and len(before) >= 4, before
    dry = team.ok(f"rlctl ckpt prune {run.name} --keep-last 1 --keep-best --dry-run")
    doomed = [s for s in before if s not in (4, before[-1])]
    assert f"would delete {len(doomed)} checkpoint(s)" in dry.stdout, dry.stdout
    assert "step       4" not in dry.stdout
    team.ok(f"rlctl ckpt prune {run.name} --keep-last 1 --keep-best")
    assert sorted(int(d.name.split("-")[1]) for d in ckpts.glob("checkpoint-*")) == [4, before[-1]]


def test_prune_never_deletes_the_best_by_default(team, a27):
    _, run = a27
    dry = team.ok(f"rlctl ckpt prune {run.name} --keep-last 1 --dry-run").stdout
    assert not re.search(r"would delete step +4 ", dry), dry
    assert re.search(r"best.*\b4\b|\b4\b.*best", dry), dry  # the dry run names the best


def test_resume_from_the_best_checkpoint(team, a27):
    """`launch --resume` of a run stopped by stop_when continues from its best checkpoint (step 4), not its newest."""
    _, parent = a27
    p = team(f"rlctl launch a27.toml --resume {parent.name} --name a27r --set train.steps=6", timeout=900)
    run = team.run_dir("a27r")
    state = json.loads((run / "state.json").read_text())
    assert p.returncode == 0, p.stderr[-2000:]
    assert state["status"] == "finished" and str(state["resumed_from_checkpoint"]).endswith("checkpoint-4")
    assert [m["step"] for m in stream(run) if "reward/mean" in m] == [5, 6]
    row = next(line for line in team.ok("rlctl status").stdout.splitlines() if line.startswith(run.name))
    assert row.split()[3:5] == ["finished", "6/6"], row


def test_a_run_is_found_by_the_name_it_was_given(team, a27):
    """`--name a27`, then `--name a27r`: `rlctl status a27` is the run named a27, not 'matches 2 runs'."""
    _, run = a27
    assert team.run_dir("a27r")
    p = team("rlctl status a27")
    assert p.returncode == 0 and p.stdout.startswith(run.name), p.stdout + p.stderr
    assert team("rlctl status a2").returncode == 2  # a prefix of both is still ambiguous


# ---- attempt 28: the eps_clip A/B ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def a28(team):
    p = team("rlctl ab a28a.toml a28b.toml --seeds 2 --name a28 --parallel 2 --wait", timeout=1200)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p


def window_mean(run, key="reward/mean", window=5) -> float:
    vals = [m[key] for m in stream(run) if key in m]
    return statistics.fmean(vals[-window:])


def test_ab_runs_both_arms_on_the_same_seeds(team, a28):
    status = team.ok("rlctl status --experiment a28").stdout
    rows = [line.split() for line in status.splitlines() if line.startswith("a28-")]
    assert sorted(r[0].rsplit("-", 2)[0] for r in rows) == ["a28-A-s42", "a28-A-s43", "a28-B-s42", "a28-B-s43"]
    assert all(r[3:5] == ["finished", "6/6"] for r in rows), status
    show = team.ok("rlctl experiment show a28").stdout
    assert "algorithm.eps_clip: 0.2 -> 0.1" in show, show
    assert re.search(r"^  A: a28a\.toml ", show, re.M) and re.search(r"^  B: a28b\.toml ", show, re.M), show


def test_compare_agrees_with_scipy(team, a28):
    """Each run's value is the mean of its last 5 rewards; the paired t-test by seed and Welch's test are scipy's."""
    from scipy import stats

    got = team.json("rlctl compare a28 --json")
    assert got["metric"] == "reward/mean" and got["window"] == 5
    arms = {a["id"]: a for a in got["arms"]}
    runs = {r.name: r for r in (team.cwd / "runs").iterdir() if r.name.startswith("a28-")}
    by_seed = {}
    for arm in ("A", "B"):
        assert len(arms[arm]["values"]) == 2
        for name, value in arms[arm]["values"].items():
            assert value == pytest.approx(window_mean(runs[name]), rel=1e-9)
            by_seed[(arm, name.split("-")[2])] = value
        vals = list(arms[arm]["values"].values())
        half = stats.t.ppf(0.975, len(vals) - 1) * stats.sem(vals)
        assert arms[arm]["ci95"] == pytest.approx([statistics.fmean(vals) - half, statistics.fmean(vals) + half])
    a = [by_seed[("A", s)] for s in ("s42", "s43")]
    b = [by_seed[("B", s)] for s in ("s42", "s43")]
    assert a != b, "the arms trained alike: eps_clip had nothing to clip"
    cmp = got["comparisons"][0]
    paired, welch = stats.ttest_rel(b, a), stats.ttest_ind(b, a, equal_var=False)
    assert cmp["test"]["kind"] == "paired"
    assert cmp["test"]["t"] == pytest.approx(paired.statistic, rel=1e-6)
    assert cmp["test"]["p"] == pytest.approx(paired.pvalue, rel=1e-6)
    assert cmp["welch"]["t"] == pytest.approx(welch.statistic, rel=1e-6)
    assert cmp["welch"]["p"] == pytest.approx(welch.pvalue, rel=1e-6)
    table = team.ok("rlctl compare a28 --report a28.md").stdout
    p_text = re.search(r"paired t = (\S+), df = 1, p = ([0-9.e-]+)\)", table)
    assert p_text and float(p_text.group(2)) == pytest.approx(paired.pvalue, rel=1e-2), table
    report = (team.cwd / "a28.md").read_text()
    assert "algorithm.eps_clip" in report and p_text.group(0) in report
    assert math.isfinite(cmp["test"]["p"])


def test_compare_with_the_docs_metric_name(team, a28):
    """The docs' example metric, eval/aime/pass@1, is one rlctl never writes: exit 2, the metrics there are."""
    p = team("rlctl compare a28 --metric eval/aime/pass@1")
    assert p.returncode == 2 and "reward/mean" in p.stderr, (p.returncode, p.stdout, p.stderr)
