"""The table of runs (`rlctl status`) as a user types it: one long reason must not widen every row."""

from __future__ import annotations

import json

from rlctl.core.state import write_state
from rlctl.runs.disk_pressure import Pressure
from rlctl.runs.status import STATE_WIDTH
from tests.test_experiments import bandit_recipe

GB = 10**9


def test_a_long_reason_is_cut_short_in_the_table_and_said_whole_in_status_run_and_json(user):
    """A new user's trial: `stopped: out of disk on vm: checkpoints + checkpoint.min_free_gb 500.0 GB would not fit
    ...` padded every row of the table to ~200 columns. The state column keeps the word and a short cause, cut with
    an ellipsis; `status RUN` and --json keep the whole reason."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=2))
    for name in ("full", "fine"):
        r = rlctl("launch", "b.toml", "--name", name)
        assert r.returncode == 0, r.stdout + r.stderr
    run = next(p for p in (work / "runs").iterdir() if p.name.startswith("full-"))
    # what the supervisor records when checkpoint.min_free_gb stops a run (rlctl.runs.supervisor, disk pressure)
    short = Pressure(root=run / "checkpoints", free=12 * GB, need=512 * GB, floor=500 * GB, next_bytes=None,
                     newest=2, kept={"best": 2})
    write_state(run, status="stopped", cause=short.to_cause(),
                stopped_by={"rule": "checkpoint.min_free_gb", "by": "disk", "message": short.message()})

    d = json.loads(rlctl("status", "full", "--json").stdout)
    reason = d["reason"]
    assert reason.startswith("out of disk on ") and "500.0 GB would not fit" in reason and len(reason) > 150, reason
    table = rlctl("status")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].index("step") - lines[0].index("state") <= STATE_WIDTH + 2, table.stdout  # was 280 columns
    row = next(x for x in lines if x.startswith("full-"))
    assert "stopped: out of disk on " in row and "..." in row and reason not in row, row
    assert "rlctl status RUN" in table.stdout, table.stdout  # where the whole reason is
    assert reason in rlctl("status", "full").stdout
    assert next(r for r in json.loads(rlctl("status", "--json").stdout) if r["name"] == run.name)["reason"] == reason
