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
    # carried on this run (new-user trial: a mistyped run or set, a recorded eval behind a pruned checkpoint), in
    # process from the same working directory
    from tests.conftest import run_cli

    given = name.rsplit("-", 2)[0]  # "counter"
    r = run_cli("eval", given[:-1] + "x", cwd=work)  # "countex": no such run
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.out, r.err)
    assert r.err.count("fix: ") == 1 and f"Did you mean `{given}`?" in r.err and "(no run" not in r.err, r.err
    r = run_cli("eval", name, "--set", "prob", cwd=work)
    assert r.code == 2 and "no such eval set" in r.err and "Did you mean `probe`?" in r.err, r.err
    r = run_cli("ckpt", "prune", name, "--keep-last", "1", cwd=work)
    assert r.code == 0 and not (run / "training_state" / "step_2").exists(), (r.out, r.err)
    # the prune is recorded as the in-run one is: a pruned step that was never evaluated is said to be pruned
    from rlctl.cli.evals import _gone

    assert "pruned by rlctl ckpt prune" in _gone(run, 2) and _gone(run, 99) == "", _gone(run, 2)
    r = run_cli("eval", name, "--step", "2", cwd=work)  # pruned; its result recorded by the run's own evals
    assert r.code == 0, (r.code, r.out, r.err)
    assert "0.2" in r.out and "recorded" in r.out and "pruned" in r.out, r.out
    assert _evals_at(run, 2) == [0.2]  # shown, not run again (it cannot be: its checkpoint is gone)
