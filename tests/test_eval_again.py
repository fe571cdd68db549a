"""`rlctl eval RUN` on a checkpoint that was evaluated already, as a user types it (the `user` fixture: every default).
Failed before its fix (new-user trial 4: D8)."""

from __future__ import annotations

import json
import sys

from tests.test_seams_followups import PROBE, counter_project


def _evals_at(run, step: int) -> list[float]:
    return [rec["eval/probe/greedy_pass@1"] for rec in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if rec.get("step") == step and "eval/probe/greedy_pass@1" in rec]


def test_eval_of_an_evaluated_checkpoint_says_so_and_runs_again_only_with_force(user):
    """A finished run whose newest checkpoint the run's own checkpoint evals evaluated: `rlctl eval RUN` ran it again
    and appended a second record at that step, silently. Now it says it was evaluated already, with the result, and
    runs nothing; --force evaluates again."""
    work, rlctl = user
    counter_project(work, extra=f'''[eval]
evaluator = "command"
command = "{sys.executable} probe.py {{step}} {{output}}"
primary = "probe"
baseline = false
[eval.sets.probe]
data = "prompts.jsonl"
''')
    (work / "probe.py").write_text(PROBE)
    r = rlctl("launch", "c.toml", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    name = next((work / "runs").iterdir()).name
    run = work / "runs" / name
    assert _evals_at(run, 6) == [0.6]
    r = rlctl("eval", name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "evaluated already" in r.stdout + r.stderr and "0.6" in r.stdout and "--force" in r.stdout + r.stderr, r
    assert _evals_at(run, 6) == [0.6]  # nothing appended
    r = rlctl("eval", name, "--json")
    row = json.loads(r.stdout)["results"][0]
    assert row["metrics"]["eval/probe/greedy_pass@1"] == 0.6 and row.get("evaluated_already"), row
    assert _evals_at(run, 6) == [0.6]
    r = rlctl("eval", name, "--force")
    assert r.returncode == 0 and "evaluated already" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert _evals_at(run, 6) == [0.6, 0.6]
