"""What a new-user trial (CPU quickstart, LoRA, an eval set graded by the reward) found wrong in the eval marks:
an eval the supervisor itself stopped shown as a crash, and never cleared by a later success; `--step final` a
traceback-like type error; the baseline reported as the best checkpoint. Each failed before its fix."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlctl.core.state import read_state, write_state
from rlctl.evals.ledger import read_ledger
from rlctl.evals.loop import CheckpointEvals, job_files, record_by_hand
from rlctl.runs.checkpoints import best_from_stream
from rlctl.runs.state import run_status
from rlctl.runs.status import _detail_text, detail

KEY = "eval/held/greedy_pass@1"


def _status(run: Path) -> str:
    """`rlctl status RUN`'s text."""
    return _detail_text(detail(run_status(run)))


def _run(tmp_path: Path, steps: tuple[int, ...] = (10,)) -> Path:
    """A TRL-layout run directory: state.json, complete checkpoints at `steps`, a final save."""
    run = tmp_path / "runs" / "q-20261127-120000"
    for s in steps:
        d = run / "checkpoints" / f"checkpoint-{s}"
        d.mkdir(parents=True)
        (d / "adapter_config.json").write_text("{}")
        (d / "adapter_model.safetensors").write_bytes(b"x")
        (d / "trainer_state.json").write_text(json.dumps({"global_step": s}))
    write_state(run, backend="trl", status="running", name=run.name)
    return run


def _metrics(run: Path, *recs: dict[str, Any]) -> None:
    with (run / "metrics.jsonl").open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in recs)


class _Sup:
    """What CheckpointEvals asks of its supervisor."""

    def __init__(self, run: Path):
        self.run_dir = run
        self.spec = {"backend": "trl", "evals": {"sets": [{"name": "held", "data": "d.jsonl"}], "primary": "held"}}
        self.stop_requested_at = None
        self.events: list[dict[str, Any]] = []

    def state(self, **kw: Any) -> None:
        write_state(self.run_dir, **kw)

    def event(self, **kw: Any) -> None:
        self.events.append(kw)

    def _mark_log(self, msg: str) -> None:
        self.events.append({"log": msg})


def test_an_eval_the_supervisor_stops_is_stopped_not_crashed_and_requeued(tmp_path):
    run = _run(tmp_path)
    sup = _Sup(run)
    evals = CheckpointEvals(sup)
    out = run / "evals"
    out.mkdir()
    _, out_file, log = job_files(out, 10)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    evals.job = (10, proc, out_file, log, time.time())
    evals.kill()  # the attempt ended: the supervisor stops its eval
    assert not read_state(run).get("eval_failures"), read_state(run)
    ledger = read_ledger(run)
    assert "10" not in ledger.get("done", {}), ledger  # not done: the next supervisor (resume) evaluates it
    assert ledger["stopped"]["10"]["why"], ledger
    assert any(e.get("event") == "eval_stopped" and e.get("step") == 10 for e in sup.events), sup.events
    assert "crashed" not in _status(run)


def test_a_later_successful_eval_clears_the_supervisors_failure(tmp_path):
    run = _run(tmp_path)
    _metrics(run, {"step": 0, KEY: 0.0})
    write_state(run, eval_failures=[{"step": 10, "error": "evaluator crashed (exit code 1)", "log": "x",
                                     "at": time.time() - 5}])
    assert "failed at step 10" in _status(run)
    record_by_hand(run, 10, {KEY: 0.25}, None, ["held"])  # `rlctl eval RUN --step 10`, ok
    text = _status(run)
    assert "failed at step 10" not in text, text


def test_the_baseline_is_not_the_best_checkpoint(tmp_path):
    run = _run(tmp_path)
    _metrics(run, {"step": 0, KEY: 0.0}, {"step": 10, KEY: 0.0})
    best = best_from_stream(run, "trl", KEY)
    assert best and best["step"] == 10 and best["path"], best  # a tie goes to the checkpoint
    run2 = _run(tmp_path / "b")
    _metrics(run2, {"step": 0, KEY: 0.0})
    write_state(run2, best_checkpoint=best_from_stream(run2, "trl", KEY))
    text = _status(run2)
    assert "best checkpoint: step 0" not in text and "baseline" in text, text


def test_eval_step_final_is_a_clear_exit_2(user, tmp_path):
    work, rlctl = user
    run = _run(work)
    (run / "checkpoints" / "final").mkdir()
    (run / "checkpoints" / "final" / "adapter_model.safetensors").write_bytes(b"x")
    (run / "recipe.toml").write_text("")
    r = rlctl("eval", run.name, "--step", "final")
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out
    assert "final" in out and "10" in out and "--step 10" in out and "valid integer" not in out, out


def test_a_baseline_mark_gives_way_to_a_checkpoint_that_ties_it(tmp_path):
    """verl 0.9.1 on an H200 (docs/gpu/verl-5.json): killed whole at step 3, the run's `status --json` said
    best_checkpoint step 0 (the base model, path null) beside a complete checkpoint 2 whose in-loop eval tied the
    baseline (0.0 = 0.0): the baseline's mark, written before checkpoint 2 was complete, was returned as it was.
    The rule is one: a tie goes to a checkpoint, whatever was marked first."""
    from rlctl.runs.checkpoints import best_checkpoint

    run = _run(tmp_path, steps=(2,))
    _metrics(run, {"step": 0, KEY: 0.0}, {"step": 2, KEY: 0.0})
    write_state(run, best_checkpoint={"step": 0, "key": KEY, "value": 0.0, "path": None})
    best = best_checkpoint(run)
    assert best and best["step"] == 2 and best["path"], best
    write_state(run, best_checkpoint={"step": 0, "key": KEY, "value": 0.5, "path": None})  # the base model leads
    assert best_checkpoint(run)["step"] == 0
