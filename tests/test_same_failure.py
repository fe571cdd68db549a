"""The same deterministic failure restarted over and over (OpenRLHF 0.10.4 LoRA on an H100, 2026-11-27): four attempts
each trained to step 2 and failed with vLLM's `ValueError: There is no module or parameter named 'base_model' in
Qwen2ForCausalLM` at the same place; restart = "on-failure" started each again from the start. The named cause was
Ray's wrapper (`RayTaskError: ray::PPOTrainer.fit() (pid=..., actor_id=..., repr=<...>)`, colour codes and all), the
third attempt had none (two processes' tracebacks interleaved), and `rlctl doctor` said "no findings".

Now the cause of a failed attempt is the innermost exception line of the traceback, through Ray's RayTaskError chain
(and, where that line relays another process's error, that process's own line), colours removed; and an attempt that
fails the same way as the one before it without progress (the same cause, no newer step or complete checkpoint) is
not restarted: the run fails saying so, and doctor has a finding for it.

The log is the run's own (tests/fixtures/h100_failures/openrlhf_lora_same_failure.log: its three failed attempts,
split where rlctl wrote its restart lines), replayed attempt by attempt through rlctl's real supervisor by a trainer
rlctl does not know.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.core.state import read_state, write_state
from tests.conftest import FIXTURES, replay_recipe_file, run_cli

cli = run_cli
LOG = FIXTURES / "h100_failures" / "openrlhf_lora_same_failure.log"
ERROR = "ValueError: There is no module or parameter named 'base_model' in Qwen2ForCausalLM."
RELAYED = "Exception: Call to collective_rpc method failed: There is no module or parameter named 'base_model'"


def segments() -> list[str]:
    """The recorded log, one piece per attempt (rlctl's own restart lines between them are rlctl's, not the trainer's
    output)."""
    out, cur = [], []
    for line in LOG.read_text(encoding="utf-8", errors="surrogateescape").splitlines(keepends=True):
        if line.startswith("rlctl: attempt "):
            out.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    return [*out, "".join(cur)]


@pytest.fixture
def user(shell):
    return shell  # tests/conftest.py


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_the_cause_is_the_innermost_error_through_rays_chain(user, attempt):
    """Each recorded attempt as OpenRLHF's run directory holds it (its components: the vLLM engines' Ray actors apart
    from the driver): the cause is vLLM's own ValueError line, with the driver's innermost line (what Ray relayed)
    beside it; no colour code, no Ray wrapper. The third attempt's driver traceback is interleaved with the engine's
    (its "Traceback" glued to an engine line) and is read all the same."""
    from rlctl.backends import get_backend
    from rlctl.recipe.loader import load
    from rlctl.runs.components import write_components

    run = user / "runs" / f"openrlhf-lora-20261127-17093{attempt}"
    run.mkdir(parents=True)
    (run / "recipe.toml").write_text('[backend]\nname = "openrlhf"\nversion = "0.10.4"\n[model]\npath = '
                                     '"Qwen/Qwen2.5-0.5B"\n[data]\ntrain = "p.jsonl"\n[train]\nsteps = 4\n')
    write_components(run, get_backend("openrlhf"), load(run / "recipe.toml").recipe)
    (run / "stdout.log").write_text(segments()[attempt - 1], encoding="utf-8", errors="surrogateescape")
    # the rule the supervisor asks at the end of each attempt (a Ray-executor run keeps what it said in state.json)
    write_state(run, name=run.name, status="failed", backend="openrlhf", executor="local", exit_code=1, total_steps=4)
    d = json.loads(cli("status", run.name, "--json").out)
    cause = d["cause"]
    assert cause["what"] == "exception" and cause["summary"].startswith(ERROR), cause
    assert "RayTaskError" not in cause["summary"] and "\x1b" not in json.dumps(cause), cause
    assert cause["raised_in"] == "_load_module, vllm/model_executor/models/utils.py:346", cause
    ev = cause["evidence"]
    assert any(ERROR in e and "(EngineCore pid=" in e for e in ev), ev
    assert any(RELAYED in e for e in ev), ev


REPLAY = '''"""OpenRLHF's driver as it ran: this attempt's recorded output, then its exit code 1."""
import os, sys
n = int(os.environ["RLCTL_ATTEMPT"].rsplit("#", 1)[1])
pieces = open(sys.argv[1], encoding="utf-8", errors="surrogateescape").read().split("\\x00")
sys.stdout.write(pieces[min(n, len(pieces)) - 1])
sys.stdout.flush()
sys.exit(1)
'''


def replay_recipe(work: Path, max_restarts: int = 3) -> Path:
    (work / "attempts.log").write_text("\x00".join(segments()), encoding="utf-8", errors="surrogateescape")
    return replay_recipe_file(
        work, "openrlhf-lora.toml", "openrlhf-lora", REPLAY, ["attempts.log"],
        r"Train epoch \[\d+/\d+\]: 100%.*grad_norm=(?P<grad_norm>[0-9.e+-]+)", 'grad_norm = "grad_norm"', 4,
        f'[run]\nrestart = "on-failure"\nmax_restarts = {max_restarts}\n',
        comment="# OpenRLHF's step: the actor's train-epoch bar at 100% (steps counted)\n")


def test_the_same_failure_without_progress_is_not_restarted_again(user):
    r = cli("launch", str(replay_recipe(user)))
    assert r.code != 0, r.out + r.err
    run = next((user / "runs").iterdir())
    st = read_state(run)
    assert st["status"] == "failed" and len(st["attempts"]) == 2, st["attempts"]  # not four
    a1, a2 = st["attempts"]
    assert a1["last_step"] == a2["last_step"] == 2, st["attempts"]
    for a in (a1, a2):
        assert a["outcome"] == "failed" and a["cause"]["summary"].startswith(ERROR), a
    want = f"failed twice the same way at step 2: {a2['cause']['summary']}; restarting would repeat it"
    assert st["gave_up"] == want, st["gave_up"]
    assert st["cause"]["summary"].startswith(ERROR), st["cause"]
    assert "restarting would repeat it" in (run / "supervisor.log").read_text()
    shown = cli("status", run.name).out
    assert f"gave up: {want}" in shown and f"cause: {ERROR}" in shown, shown
    doc = cli("doctor", run.name)
    assert doc.code == 1, doc.out
    assert f"[critical] cause: the run failed: {ERROR}" in doc.out and f"[critical] repeated_failure: {want}" in \
        doc.out, doc.out
    found = {f["rule"]: f for f in json.loads(cli("doctor", run.name, "--json").out)["findings"]}
    assert found["repeated_failure"]["evidence"]["attempts"] == [1, 2], found


def test_a_failure_that_moved_on_is_restarted(user):
    """The same error at a later step (more steps than the attempt before) is progress: restarted as the policy
    says."""
    pieces = segments()
    step_line = next(ln for ln in pieces[0].splitlines(keepends=True) if ln.startswith("Train epoch [1/1]: 100%"))
    pieces[1] = pieces[1] + step_line * 2  # the second attempt logs two steps more before it fails
    r = replay_recipe(user, max_restarts=2)
    (user / "attempts.log").write_text("\x00".join(pieces), encoding="utf-8",
                                       errors="surrogateescape")
    assert cli("launch", str(r)).code != 0
    st = read_state(next((user / "runs").iterdir()))
    steps = [a["last_step"] for a in st["attempts"]]
    assert steps == [2, 4, 4] and len(st["attempts"]) == 3, st["attempts"]
    assert st["gave_up"].startswith("failed twice the same way at step 4: "), st["gave_up"]
