"""Older and rarer log formats through `rlctl attach` + `logs --metrics`, with fixtures printed by the backends' own
code at those releases (tests/fixtures/openrlhf/generate.py, tests/fixtures/trl/generate_old.py), and the rule that
no metrics-looking line is dropped without being counted as not understood."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlctl.metrics.stream import METRICS, by_step, ingest, iter_metrics
from tests.conftest import FIXTURES, run_cli
from tests.test_attach import attach, merged, released, rlctl


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(root))
    return root


# ---- OpenRLHF ------------------------------------------------------------------------------------------------


def test_openrlhf_059_ppo_with_critic_short_keys(runs):
    """0.5.9's actor bar with a critic in the process: `pg= rm= ret= glen= tlen= kl= act_lr= cri= vals= cri_lr=`
    (short_status and its critic additions, evaluated from the release's source), and its Episode bar."""
    res, run, backend = attach(str(FIXTURES / "openrlhf/console-0.5.9-critic.log"))
    assert res.code == 0 and backend == "openrlhf", res.out + res.err
    assert "not understood" not in res.out
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4]
    assert m[2]["policy_loss"] == pytest.approx(-0.02) and m[2]["reward/mean"] == pytest.approx(0.3)
    assert m[2]["kl"] == 0.0008 and m[3]["lr"] == 1.5e-06 and m[1]["response_length/mean"] == 1000.0  # tqdm's 1e+3
    assert m[1]["openrlhf/return"] == 0.1 and m[1]["openrlhf/total_length"] == 1501.0
    assert m[2]["openrlhf/critic_loss"] == 0.1 and m[3]["openrlhf/values"] == 0.15
    assert m[1]["openrlhf/critic_lr"] == 9e-06
    assert m[4]["kl"] is None and m[3]["correctness"] == 0.75  # nan; the Episode bar's full status


def test_openrlhf_global_step_dict_cut_short_behind_the_actor_prefix(runs):
    """`(ActorModelRayActor pid=1234) ... Global step 2: {'policy_loss': ..., ...}`: the pairs before the cut are
    read, a pair the cut went through is not (never a shorter number)."""
    res, run, _ = attach(str(FIXTURES / "openrlhf/console-0.9.3-truncated.log"), "--backend", "openrlhf")
    assert res.code == 0, res.out + res.err
    assert "1 line(s) looked like metrics but were not understood" in res.out  # the generator's killed last line
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4]
    assert m[2]["reward/mean"] == 0.30000000000000004 and "correctness" not in m[2]  # from the cut dict
    assert m[3]["lr"] == 1.5e-06 and m[3]["kl"] == 0.0012  # `'kl': 0.0...}` left out: the bar's value stands
    lg = rlctl("logs", run.name, "--metrics")
    assert lg.returncode == 0 and len(lg.stdout.splitlines()) >= 4, lg.stderr


@pytest.mark.parametrize("version", ["0.4.2", "0.5.9"])
def test_openrlhf_before_06_from_the_released_wheel(version, runs, tmp_path):
    root = released("openrlhf", version)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(FIXTURES / "openrlhf/generate.py"), str(root), version, str(out),
                        "--critic"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res, run, backend = attach(str(out / "train.log"))
    assert res.code == 0 and backend == "openrlhf" and "not understood" not in res.out, res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4] and m[4]["policy_loss"] == pytest.approx(-0.04)
    assert m[2]["openrlhf/critic_loss"] == 0.1


# Each family of OpenRLHF's progress-bar releases (found in the wheels, tests/fixtures/openrlhf/generate.py's
# docstring and docs/metrics.md): 0.3.6-0.3.8 `pg= rm= ret= glen= tlen= kl=` (no act_lr); 0.4-0.7.1 + `act_lr=`;
# 0.7.2-0.8.0 `act_loss= reward= return= gen_len= tot_len= kl= act_lr= ent_loss=`; the status in the `Episode [e/E]`
# bar up to 0.8.0 (0.8.0's async trainer: `Training Process`); from 0.8.1 the `Global step N: {...}` line
# (f-string names `steps`, `status` until 0.9.0). `--epochs 2`: two `Train epoch [e/2]` bars per step.
BAR_FAMILIES = [("0.3.8", ()), ("0.7.1", ("--epochs", "2")), ("0.7.2", ()), ("0.8.0", ("--async",)),
                ("0.8.1", ("--epochs", "2")), ("0.9.3", ("--epochs", "2"))]


@pytest.mark.parametrize("version,extra", BAR_FAMILIES, ids=[f"{v}{''.join(e)}" for v, e in BAR_FAMILIES])
def test_openrlhf_progress_bars_of_every_family_from_the_wheel(version, extra, runs, tmp_path):
    """The release's own bar postfix (its `short_status` evaluated) drawn by tqdm, its own status bar or Global step
    line: one record per step, whatever the epochs per step and the redraws (each bar's last frame drawn again by
    close()); the last epoch's values stand; keys without a unified name kept as openrlhf/<key>; nothing dropped."""
    root = released("openrlhf", version)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(FIXTURES / "openrlhf/generate.py"), str(root), version, str(out),
                        "--critic", *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    log = (out / "train.log").read_text()
    assert log.count(" 3/3 [") >= 8 * (2 if "--epochs" in extra else 1), "every bar's final frame, drawn twice"
    res, run, backend = attach(str(out / "train.log"), "--name", "orl-" + version.replace(".", "-"))
    assert res.code == 0 and backend == "openrlhf", res.out + res.err
    cut = "Global step" in log  # the generator's last Global step line, cut off: said, as it should be
    assert ("not understood" in res.out) == cut, res.out
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4], m.keys()
    assert m[2]["policy_loss"] == pytest.approx(-0.02) and m[2]["reward/mean"] == pytest.approx(0.3)
    assert m[3]["response_length/mean"] in (1000.0, 1003.0) and m[1]["openrlhf/return"] == 0.1  # tqdm's 1e+3
    assert m[2]["openrlhf/total_length"] == pytest.approx(1502.0) and m[3]["correctness"] == 0.75  # the status
    assert m[2]["openrlhf/critic_loss"] == 0.1 and m[3]["openrlhf/values"] == pytest.approx(0.15)
    if version != "0.3.8":
        assert m[3]["lr"] == 1.5e-06


def test_a_bar_with_a_status_no_rule_places_is_said(tmp_path):
    """A bar whose postfix is a step's status (`policy_loss=`) but which no rule knows is not understood (counted
    and shown), never dropped."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "stdout.log").write_text("Rollout [1/1]:  50%|##   | 1/2 [00:01<00:01, policy_loss=0.1, reward=0.5]\n"
                                    "Episode [1/1]:  50%|##   | 1/2 [00:01<00:01, policy_loss=0.2, reward=0.5]\n")
    st = ingest(run, "openrlhf", final=True)
    assert st is not None and st.skipped == 1 and "Rollout [1/1]" in st.examples[0]
    assert [r["step"] for r in iter_metrics(run / METRICS)] == [2]


# ---- TRL -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ppo-0.9.6.log", "ppo-0.12.2.log", "ppo-0.12.2-progress-callback.log"])
def test_trl_ppo_trainer_dicts(name, runs):
    """PPOv2Trainer (0.9) / PPOTrainer (0.12) dicts: objective/*, policy/*, loss/*, val/* keyed by episode."""
    res, run, backend = attach(str(FIXTURES / "trl" / name))
    assert res.code == 0 and backend == "trl" and "not understood" not in res.out, res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4]  # one per update (logging_steps = 1): counted
    assert m[1]["kl"] == 0.021234 if "callback" not in name else m[1]["kl"] == 0.02123
    assert m[2]["reward/mean"] == pytest.approx(0.121234, abs=1e-4) and m[2]["trl/episode"] == 128
    assert m[3]["policy_loss"] == pytest.approx(0.271234, abs=1e-4) and m[4]["lr"] == pytest.approx(1.8e-06)
    assert m[1]["entropy"] == pytest.approx(0.031234, abs=1e-4) and m[1]["clip_ratio"] == pytest.approx(0.081234,
                                                                                                          abs=1e-4)
    assert m[1]["trl/val/ratio"] == pytest.approx(0.131234, abs=1e-4) and not any(k.startswith("eval/") for k in m[1])
    assert m[1]["trl/objective/rlhf_reward"] == pytest.approx(0.051234, abs=1e-4) and m[1]["trl/eps"] == 3


def test_trl_notebook_progress_table(runs):
    """The notebook table (transformers' NotebookTrainingTracker, every log key a column, `.6f` cells), pasted as
    markdown and as tab-separated text: each row a step, `Training Loss` the loss, the rule and blank lines skipped."""
    res, run, backend = attach(str(FIXTURES / "trl/notebook-table.log"))
    assert res.code == 0 and backend == "trl" and "not understood" not in res.out, res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4]
    assert m[1]["reward/mean"] == 0.125 and m[4]["reward/mean"] == 0.5 and m[2]["kl"] == 0.000246
    assert m[3]["policy_loss"] == 0.0003 and m[1]["response_length/mean"] == 199.0 and m[1]["reward/std"] == 0.05
    assert m[4]["trl/rewards/xmlcount_reward_func"] == -0.06
    st = run_cli("status", run.name, "--json")
    assert st.code == 0 and '"step": 4' in st.out, st.out + st.err


def test_trl_old_formats_from_the_released_wheels(runs, tmp_path):
    pytest.importorskip("transformers")
    for version in ("0.9.6", "0.12.2"):
        root = released("trl", version)
        out = tmp_path / version
        r = subprocess.run([sys.executable, str(FIXTURES / "trl/generate_old.py"), str(root), version, str(out)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        for name in (f"ppo-{version}.log", "notebook-table.log"):
            res, run, backend = attach(str(out / name), "--name", f"{version}-{name}".replace(".", "-"))
            assert res.code == 0 and backend == "trl", res.out + res.err
            assert merged(run) and sorted(merged(run)) == [1, 2, 3, 4]


# ---- nothing dropped in silence --------------------------------------------------------------------------------

GARBLED = {
    "verl": ["(TaskRunner pid=1) step:x - actor/pg_loss:0.1", "step: - critic/score/mean:0.5",
             "step:3 - actor/pg_loss", "step:4 - :0.1 - a"],
    "prime_rl": ["12:00:00 SUCCESS Step x | Reward: 0.5", "12:00:00 SUCCESS Step 3 | Time",
                 "12:00:00 SUCCESS Step 4 | Reward 0.5 | ???", "╰─ math"],
    "openrlhf": ["✨ Global step 3: {'policy_loss': 0.1, ", "✨ Global step 4: {'a': 1, garbage}",
                 "✨ Global step 5: not a dict", "Eval at step 6: {'eval_x_pass1': oops}"],
    "trl": ["{'loss': 0.1, 'reward': broken}", "{'eps': 3, 'objective/kl': nope}",
            "| Step | Training Loss | reward |\n| 1 | 0.1 | 0.2 | 9 |\n| 2 | 0.1 | zero |"],
    "command": ['{"rlctl_command": {"step": 1, "loss": }', '{"rlctl_command": [1, 2'],
}
READABLE = {
    "verl": "step:9 - actor/pg_loss:0.1",
    "prime_rl": "12:00:00 SUCCESS Step 9 | Reward: 0.5",
    "openrlhf": "✨ Global step 9: {'policy_loss': 0.1}",
    "trl": "{'loss': 0.1, 'step': 9}",
    "command": '{"rlctl_command": {"step": 9, "loss": 0.1}}',
}
NOISE = ["the step: was slow - see", "INFO Step one of the guide", "{'config': 'x'}", "Global step", "plain text",
         "| a | b |", "Epoch\tTraining Loss"]


@pytest.mark.parametrize("backend", sorted(GARBLED))
def test_garbled_metrics_lines_are_counted_never_dropped(backend, tmp_path):
    """Lines that look like the backend's metrics but cannot be read are counted (and the first shown); ordinary
    lines are not; the readable line still gives its record."""
    garbled = GARBLED[backend]
    n_bad = sum(2 if "\n| 1 |" in g else 1 for g in garbled)  # the table block has two bad rows
    text = "\n".join([*NOISE, *garbled, READABLE[backend], *NOISE]) + "\n"
    run = tmp_path / "run"
    run.mkdir()
    (run / ("backend_metrics.jsonl" if backend == "command" else "stdout.log")).write_text(text)
    st = ingest(run, backend, final=True)
    assert st is not None
    assert st.skipped == n_bad, (st.skipped, st.examples)
    assert len(st.examples) == min(n_bad, 5)
    recs = by_step(list(iter_metrics(run / METRICS)))
    assert 9 in recs, recs


def test_the_notice_reaches_the_user(runs, tmp_path):
    log = tmp_path / "v.log"
    log.write_text("step:1 - actor/pg_loss:0.1\nstep:x - actor/pg_loss:0.2\nstep:2 - actor/pg_loss:0.3\n")
    res, run, _ = attach(str(log), "--backend", "verl")
    assert res.code == 0 and "1 line(s) looked like metrics but were not understood" in res.out
    assert "line 2: step:x" in res.out
    lg = rlctl("logs", run.name, "--metrics")
    assert "1 line(s) looked like metrics but were not understood" in lg.stderr
