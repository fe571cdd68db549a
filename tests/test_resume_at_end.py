"""Resuming from a run's final checkpoint: `train.steps` is the number of optimizer steps, so a run resumed at step ==
train.steps has nothing left to train. It ends at once, finished, and says so; no backend is started, so no step
past train.steps is trained and no checkpoint past it is written.

Before: the README quickstart with `train.steps = 4` run to the end, then `launch --resume RUN` trained `step 5/4`
and wrote checkpoint-5 (transformers' Trainer checks max_steps only after a step); the same on failover from a
final synced checkpoint and on a restart after a crash past the last save."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import RECIPES
from tests.test_seams_followups import counter_project


def _run(work: Path, prefix: str) -> Path:
    return next(d for d in (work / "runs").iterdir() if d.name.startswith(prefix))


def _state(run: Path) -> dict:
    return json.loads((run / "state.json").read_text())


@pytest.mark.slow
def test_the_quickstart_resumed_from_its_final_checkpoint_trains_nothing(user):
    pytest.importorskip("trl")
    work, rlctl = user
    shutil.copytree(RECIPES / "quickstart", work / "quickstart")
    (work / "q.toml").write_text((RECIPES / "quickstart.toml").read_text().replace("steps = 80", "steps = 4")
                                 .replace('dir = "checkpoints"', 'dir = "checkpoints"\nevery = 2'))
    r = rlctl("launch", "q.toml", "--name", "first")
    assert r.returncode == 0 and "step 4/4" in r.stderr, r.stderr[-3000:]
    first = _run(work, "first")
    assert (first / "checkpoints" / "checkpoint-4" / "trainer_state.json").is_file()
    r = rlctl("launch", "q.toml", "--resume", first.name, "--name", "res")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "nothing left to train: the checkpoint is at step 4 of 4" in out, out[-3000:]
    assert "step 5/4" not in out
    res = _run(work, "res")
    assert not (res / "checkpoints" / "checkpoint-5").exists()
    assert sorted(p.name for p in (res / "checkpoints").glob("checkpoint-*")) == ["checkpoint-4"]
    st = _state(res)
    assert st["status"] == "finished" and st["exit_code"] == 0, st
    status = rlctl("status", "res")
    assert "finished" in status.stdout and "4/4" in status.stdout and "5/4" not in status.stdout, status.stdout


def test_a_command_run_resumed_from_its_final_checkpoint_starts_no_trainer(user):
    """The seam is rlctl's, not the trainer's: whatever the trainer would do with a checkpoint at its last step, it
    is not started (the trainer's own line `rlctl-command: ...` never appears in the resumed run's log)."""
    work, rlctl = user
    counter_project(work, steps=4)
    r = rlctl("launch", "c.toml", "--name", "first")
    assert r.returncode == 0, r.stderr[-3000:]
    first = _run(work, "first")
    r = rlctl("launch", "c.toml", "--resume", first.name, "--name", "res")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "nothing left to train: the checkpoint is at step 4 of 4" in out, out[-3000:]
    res = _run(work, "res")
    st = _state(res)
    assert st["status"] == "finished" and st["exit_code"] == 0, st
    assert "rlctl-command:" not in (res / "stdout.log").read_text(), (res / "stdout.log").read_text()
    assert sorted(p.name for p in (res / "training_state").glob("step_*")) == ["step_4"]
    status = rlctl("status", "res")
    assert "finished" in status.stdout and "4/4" in status.stdout, status.stdout


def test_a_command_recipe_resuming_latest_at_its_end_does_not_start_the_trainer(user):
    """`checkpoint.resume = "latest"` is resolved by the command backend's runner when the attempt starts: there too
    a final checkpoint means nothing left to train (the trainer is not started)."""
    work, rlctl = user
    shared = work / "shared_ckpts"
    recipe = counter_project(work, steps=4)
    recipe.write_text(recipe.read_text().replace('dir = "training_state"', f'dir = "{shared}"\nresume = "latest"'))
    r = rlctl("launch", "c.toml", "--name", "first")
    assert r.returncode == 0, r.stderr[-3000:]
    r = rlctl("launch", "c.toml", "--name", "again", "--force")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    log = (_run(work, "again") / "stdout.log").read_text()
    assert "nothing left to train: the checkpoint is at step 4 of 4" in log, log
    assert "step 5" not in log and sorted(p.name for p in shared.glob("step_*")) == ["step_2", "step_4"]


def test_a_failover_from_the_final_synced_checkpoint_finishes_the_run(tmp_path, monkeypatch):
    """box1 saved and synced step 4 of 4, then became unreachable: the watcher records the run finished (on_event
    `finish`) and starts no attempt (before: it moved the run "from step 4" and box2 trained step 5/4). The newest
    checkpoint is the store's as fencing reads it (Failover._checkpoint, covered by test_failover.py's sshd tests)."""
    from rlctl.core.state import read_state, write_state
    from rlctl.runs.failover import Failover

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    write_state(run, name="r", status="running", host="box1", total_steps=4, backend="trl",
                pool={"hosts": ["box1", "box2"], "sync": "file:///nowhere", "failover_after_s": 1},
                lineage=[{"generation": 1, "host": "box1", "ref": {}}])

    class NoPlace:
        def pick_place(self, *a, **k):
            raise AssertionError("no place is picked for a run with nothing left to train")

    monkeypatch.setattr(Failover, "_checkpoint", lambda self, st, pool: {
        "kind": "store", "step": 4, "words": "the copy in file:///nowhere"})
    f = Failover(run, out=open(tmp_path / "watch.txt", "w"))  # noqa: SIM115
    assert f._fail_over(NoPlace(), read_state(run)["pool"], "unreachable for 301 s", 0.0) == "finished"
    st = read_state(run)
    assert st["status"] == "finished" and st["nothing_left_at"] == 4 and len(st["lineage"]) == 1, st
    f.out.close()
    said = (tmp_path / "watch.txt").read_text()
    assert "nothing left to train: the checkpoint is at step 4 of 4" in said and "moving" not in said, said
    assert "finish:end" in st["events_fired"]


def test_a_duration_below_zero_is_no_estimate():
    """A step past the run's total made the progress line say `eta -1:59:59` (new-user trial 6)."""
    from rlctl.ui.progress import fmt_duration

    assert fmt_duration(-3.0) == "-" and fmt_duration(None) == "-" and fmt_duration(61) == "1:01"
