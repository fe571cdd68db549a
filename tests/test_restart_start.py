"""Where a restart with no complete checkpoint starts: from the recipe's own starting point (the recipe is rendered
again as launched), and the run says which one (the restart line in its log, its events, `status`). Before, the
recipe's `checkpoint.resume = N` was rendered again while rlctl said "restarting from the start (no complete
checkpoint yet)" and `status` showed the attempt "from the start": the backend looked for step N all the same.

A user's run with the README's defaults (./runs, no RLCTL_* variable): the command backend with a trainer of a few
lines, no torch."""

from __future__ import annotations

import json
import sys

from rlctl.backends import get_backend
from rlctl.recipe.loader import load

TRAINER = """
import json, os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
start = json.load(open(os.path.join(args["--resume"], "done.json")))["step"] + 1 if "--resume" in args else 1
for step in range(start, int(args["--steps"]) + 1):
    print(f"step {step} loss {1.0 / step}", flush=True)
    ck = os.path.join(args["--save"], f"step_{step}")
    os.makedirs(ck, exist_ok=True)
    json.dump({"step": step}, open(os.path.join(ck, "done.json"), "w"))
"""


def recipe(resume: str) -> str:
    cmd = [sys.executable, "train.py", "--steps", "{steps}", "--save", "{checkpoint_dir}"]
    return f"""
name = "resumer"
[backend]
name = "command"
[backend.command]
command = {json.dumps(cmd)}
log_pattern = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'
metrics_map = {{loss = "policy_loss"}}
checkpoint_pattern = "step_{{step}}"
checkpoint_marker = "done.json"
resume_args = ["--resume", "{{path}}"]
[model]
path = "random:qwen2?hidden=64&layers=2"
[data]
train = "prompts.jsonl"
[train]
steps = 3
[resources]
gpus_per_node = 0
gpu = "cpu"
[checkpoint]
dir = "ck"
every = 1
resume = {resume}
[run]
restart = "on-failure"
max_restarts = 1
"""


def test_a_restart_without_a_complete_checkpoint_says_it_starts_where_the_recipe_does(user):
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "train.py").write_text(TRAINER)
    (work / "r.toml").write_text(recipe("2"))  # the recipe resumes from step 2, which this run does not have
    assert rlctl("preflight", "r.toml").returncode == 1  # preflight's checkpoint.resume check says so first
    r = rlctl("launch", "r.toml", "--force")
    assert r.returncode != 0, r.stdout + r.stderr
    run = next((work / "runs").iterdir())
    log = (run / "stdout.log").read_text()
    assert "no complete checkpoint of step 2" in log, log  # what the backend did: it looked for step 2 again
    # a named cause (was none): the runner's line as evidence, the resume key as the fix
    d = json.loads(rlctl("status", run.name, "--json").stdout)
    assert d["cause"]["what"] == "resume checkpoint missing", d
    assert d["reason"] == "no complete checkpoint of step 2 to resume from", d
    assert any("stdout.log:" in e and "no complete checkpoint of step 2" in e for e in d["cause"]["evidence"]), d
    assert "checkpoint.resume" in d["cause"]["fix"] and "r.toml" in d["cause"]["fix"], d["cause"]
    restart = next(line for line in log.splitlines() if "restarting from" in line)
    assert "the start" not in restart and "checkpoint.resume = 2" in restart, restart
    events = [json.loads(x) for x in (run / "rlctl-events.jsonl").read_text().splitlines()]
    said = [e for e in events if e.get("event") == "restart"]
    assert len(said) == 1 and said[0]["attempt"] == 2 and "checkpoint.resume = 2" in said[0]["from"], events
    state = json.loads((run / "state.json").read_text())
    assert [a.get("from_recipe") for a in state["attempts"]] == ["checkpoint.resume = 2"] * 2, state["attempts"]
    shown = rlctl("status", run.name).stdout
    for n in ("#1", "#2"):  # the launch started there too
        line = next(x for x in shown.splitlines() if x.strip().startswith(n))
        assert "from the recipe's checkpoint.resume = 2" in line and "from the start" not in line, shown


def test_a_recipe_that_starts_afresh_restarts_from_the_start(user):
    """The recipe's own start is the model: the restart says "from the start", as before; and where a backend loads
    something else than the step rendered (OpenRLHF reads `_actor/latest`, which rlctl removes when nothing is
    complete), its adapter says the start too."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "train.py").write_text(TRAINER.replace("for step in", "sys.exit(3)\nfor step in"))
    (work / "r.toml").write_text(recipe('"latest"'))
    assert rlctl("launch", "r.toml").returncode != 0
    run = next((work / "runs").iterdir())
    restart = next(line for line in (run / "stdout.log").read_text().splitlines() if "restarting from" in line)
    assert "restarting from the start (no complete checkpoint yet)" in restart, restart
    state = json.loads((run / "state.json").read_text())
    assert [a.get("from_recipe") for a in state["attempts"]] == [None, None]
    r = load(work / "r.toml", ["checkpoint.resume=2"]).recipe
    assert get_backend("command").recipe_start(r, work / "ck") == "checkpoint.resume = 2"
    from tests.conformance.test_openrlhf import BASE

    (work / "o.toml").write_text(BASE.format(version="0.10.4", data=work / "prompts.jsonl", reward=work / "r.py",
                                             ckpt=work / "ck"))
    assert get_backend("openrlhf").recipe_start(load(work / "o.toml", ["checkpoint.resume=2"]).recipe,
                                                work / "ck") is None
