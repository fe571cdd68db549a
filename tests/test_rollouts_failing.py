"""Every rollout failing while nothing exits (prime-rl v0.8.0's first start on 2 x H100, docs/gpu/prime-rl-1.json part
"2gpu#3"): inference loaded on GPU 0 (41.6 GiB), the trainer on GPU 1, and for ~7 minutes the orchestrator logged
hundreds of `WARNING Rollout task failed in group <uuid> (a-fraction): RuntimeError("ImportError: cannot import name
'RendererPool' from 'renderers' (...)")` (renderers 0.1.12 lacks RendererPool) while step 0 never ended. `rlctl
status` said `running`, reason null, and `rlctl doctor` had no finding: GPU hours lost in silence.

Now prime-rl's adapter reads its orchestrator's "Rollout task failed" lines (src/prime_rl/orchestrator/dispatcher.py,
handle_completed_rollout) as rollout failures with their error; the supervisor counts them (state.json
`rollouts_failed`: how many, the first error verbatim, since when); `status` and `doctor` say at once that rollouts
fail and no step completes, while the run is still running; and with no step for the stall floor (`[run.stall]
floor_s`; after a first step, as long as a step may take) it is a stall with that cause, restarted under on-failure
too (a failure the trainer does not notice) and not restarted into the same failure twice.

The lines are the recorded ones: the `rl` launcher's and orchestrator's start-up (the same stack's part "2gpu#2",
whose log kept them; part "2gpu#3"'s log kept only its last 120 lines), then part "2gpu#3"'s rollout failures, played
by a stand-in for `rl` under rlctl's real supervisor, in a run directory as `rlctl launch` makes one for the recorded
recipe.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from rlctl.core.state import read_state, write_state
from tests.conftest import run_cli

cli = run_cli
EVIDENCE = Path(__file__).resolve().parents[1] / "docs" / "gpu" / "prime-rl-1.json"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ERROR = ("RuntimeError(\"ImportError: cannot import name 'RendererPool' from 'renderers' "
         "(/tmp/site/prime-rl/renderers/__init__.py)\")")


def evidence() -> dict:
    return json.loads(EVIDENCE.read_text())["parts"]


def recorded_lines(failures: int = 12) -> list[str]:
    """`rl`'s start-up as the run's stdout.log showed it, up to the orchestrator loading its environments, then the
    first `failures` rollout failures."""
    parts = evidence()
    tail = parts["2gpu#2"]["collected"]["log_tail"]
    start = next(i for i, t in enumerate(tail) if t.startswith("warning: "))
    end = next(i for i, t in enumerate(tail) if "Loading training environments" in t)
    fails = [t for t in parts["2gpu#3"]["collected"]["log_tail"] if "Rollout task failed" in t]
    assert len(fails) == 120
    return tail[start:end + 1] + fails[:failures]


REPLAY = '''"""`uv run --project CHECKOUT rl @ rl.toml` as it ran: `rl`'s start-up, every rollout failing, then the
orchestrator goes on waiting."""
import sys, time
from pathlib import Path
sys.stdout.write((Path(__file__).resolve().parent / "rl.log").read_text(encoding="utf-8"))
sys.stdout.flush()
time.sleep(600)
'''


def prime_run(work: Path, floor_s: float | None) -> tuple[Path, dict[str, str]]:
    """The run directory `rlctl launch` makes for the recorded recipe (its resolved recipe, where each component
    logs, its spec: prime-rl's own command, rendered), and the environment its supervisor runs in: a `uv` on PATH that
    plays `rl`'s recorded output (a restart renders the command again)."""
    from rlctl.backends import get_backend
    from rlctl.recipe.loader import load
    from rlctl.runs.components import write_components
    from rlctl.runs.rundir import create_run_dir
    from rlctl.runs.supervisor import write_spec

    bin_ = work / "bin"
    bin_.mkdir()
    (bin_ / "uv").write_text(f"#!{sys.executable}\n{REPLAY}")
    (bin_ / "uv").chmod(0o755)
    (bin_ / "rl.log").write_text("".join(t + "\n" for t in recorded_lines()), encoding="utf-8")
    (work / "prime-rl").mkdir()  # the checkout (PRIME_RL_DIR)
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "PRIME_RL_DIR": str(work / "prime-rl")}
    run = create_run_dir(work / "runs", "prime-2gpu")
    (run / "recipe.toml").write_text(evidence()["2gpu#3"]["recipe"])
    recipe = load(run / "recipe.toml").recipe
    prime = get_backend("prime_rl")
    write_components(run, prime, recipe)
    plan = prime.render(recipe)
    plan.write(run)
    stall = {"floor_s": floor_s} if floor_s is not None else {}
    write_spec(run, {"argv": [str(work / "prime-rl") if a == "${PRIME_RL_DIR}" else a for a in plan.argv],
                     "backend": "prime_rl", "executor": "local", "grace_seconds": 5, "total_steps": 6,
                     "checkpoint_every": 2, "restart": {"mode": "on-failure", "max_restarts": 3}, "stall": stall})
    write_state(run, name=run.name, status="starting", backend="prime_rl", version="0.8.0", total_steps=6,
                executor="local", started_at=time.time(), restart={"mode": "on-failure", "max_restarts": 3})
    return run, env


@pytest.fixture
def user(shell):
    return shell  # tests/conftest.py


def test_prime_rls_adapter_reads_its_rollout_failures():
    """The recorded line (colours and all) is a rollout failure with its error verbatim; prime-rl's other failure
    line (an environment's own errored rollout) too; its start-up and step lines are none."""
    from rlctl.backends import get_backend

    prime = get_backend("prime_rl")
    lines = recorded_lines()
    fails = [prime.rollout_failure(t) for t in lines]
    assert fails[-12:] == [ERROR] * 12, fails[-12:]
    assert not any(fails[:-12]), [t for t, f in zip(lines, fails, strict=True) if f][:3]
    said = ("\x1b[2m23:35:50\x1b[0m \x1b[33m\x1b[1mWARNING\x1b[0m \x1b[33m\x1b[1m\x1b[22mRollout failed in group "
            "e180c67a-94a4-432f-8d4c-2c0da157bd1e (a-fraction) — ToolError: sandbox timed out\x1b[0m\x1b[0m")
    assert prime.rollout_failure(said) == "ToolError: sandbox timed out"
    as_json = json.dumps({"timestamp": "2026-11-27T23:35:49+00:00", "level": "WARNING",
                          "message": ANSI.sub("", lines[-1]).split("WARNING ", 1)[1]})  # json_logging
    assert prime.rollout_failure(as_json) == ERROR
    assert prime.rollout_failure("Step 5 |   12.3s | Reward 0.4567 | Error 0.0% | Truncation 3.1%") is None
    assert get_backend("verl").rollout_failure(lines[-1]) is None  # another backend's knowledge is its own


def test_the_stall_rule_on_the_recorded_lines():
    """No step for the floor after the first failure is a stall (not the first step's 30-minute grace, busy GPU or
    not); a step clears it; after steps the limit is as long as a step may take."""
    from rlctl.backends import get_backend
    from rlctl.runs.stall import StallConfig, StallDetector

    d = StallDetector(StallConfig(floor_s=600, first_step_s=1800), [], started_at=0.0,
                      rollout_failure=get_backend("prime_rl").rollout_failure)
    d.observe_log("".join(t + "\n" for t in recorded_lines()), 100.0)
    seen = d.rollouts_failed
    assert seen is not None and seen.count == 12 and seen.first == ERROR and seen.at == 100.0, seen
    assert "Rollout task failed in group f23cbe9b-" in seen.line and "\x1b" not in seen.line, seen.line
    assert d.check(699.0, gpus_busy=True) is None
    said = d.check(701.0, gpus_busy=True)
    assert said and said.startswith(f"12 rollouts failed (the first: {ERROR}) and no step came for 601s"), said
    assert said.endswith("(limit 600s, run.stall.floor_s)"), said
    d.observe_step(1, 702.0)
    assert d.rollouts_failed is None and d.check(900.0) is None
    for step, t in ((2, 902.0), (3, 1102.0), (4, 1302.0)):  # steps 200 s apart: the limit is 5 x 200 s
        d.observe_step(step, t)
    d.observe_log(recorded_lines()[-1] + "\n", 1400.0)
    assert d.rollouts_failed.count == 1 and d.rollouts_failed_stall(2399.0) is None
    assert d.rollouts_late_s() == 200.0  # news once a step is late: a few failing between steps is a run going on
    said = d.rollouts_failed_stall(2401.0)
    assert said and said.endswith("(limit 1000s, k x the median step time, at least run.stall.floor_s)"), said


@pytest.mark.timeout(120)
def test_the_recorded_run_through_the_supervisor_is_a_stall_not_restarted_into_the_same_failure(user, monkeypatch):
    """The recorded policy (on-failure, 3 restarts), the stall floor 1 s here (600 s by default): attempt 1 stalled
    with the rollouts' error as its cause, restarted (a failure the trainer does not notice), attempt 2 the same
    before its first step: rlctl stops there and says so, rather than burning the other restarts on an ImportError."""
    from rlctl.runs.supervisor import Supervisor, read_spec

    run, env = prime_run(user, floor_s=1.0)
    for key in ("PATH", "PRIME_RL_DIR"):  # the supervisor runs in this process: its environment is the user's
        monkeypatch.setenv(key, env[key])
    t0 = time.time()
    code = Supervisor(run, read_spec(run), env).run()
    assert code != 0 and time.time() - t0 < 60
    st = read_state(run)
    assert st["status"] == "failed", st
    a1, a2 = st["attempts"]
    assert a1["outcome"] == "stalled" and a2["reason"] == "stalled" and a2["restart"], st["attempts"]
    assert a1["stall"].startswith(f"12 rollouts failed (the first: {ERROR}) and no step came for "), a1["stall"]
    for a in (a1, a2):
        cause = a["cause"]
        assert cause["what"] == "rollouts failing", cause
        assert cause["summary"] == f"rollouts fail and no step completes: 12 failed, the first: {ERROR}", cause
        assert any("Rollout task failed in group f23cbe9b-" in e for e in cause["evidence"]), cause
    want = f"stalled twice the same way before its first step: {a2['cause']['summary']}; restarting would repeat it"
    assert st["gave_up"] == want, st["gave_up"]
    d = json.loads(cli("status", run.name, "--json").out)
    assert d["status"] == "failed" and d["cause"]["what"] == "rollouts failing", d
    assert d["ingest"]["skipped"] == 0, d["ingest"]  # no metrics line: counted once, by the supervisor
    doc = cli("doctor", run.name)
    assert doc.code == 1 and f"[critical] repeated_failure: {want}" in doc.out, doc.out


@pytest.mark.timeout(120)
def test_status_and_doctor_say_it_while_the_run_is_running(user):
    """With every default (the floor 600 s): the supervisor, detached as `rlctl launch --detach` starts it, has read
    the failures; `status` still says running, now with why no step comes, and `doctor` has a critical finding with
    the count, the first error and what to do."""
    from rlctl.runs.supervisor import start_detached

    run, env = prime_run(user, floor_s=None)
    start_detached(run, env)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and (read_state(run).get("rollouts_failed") or {}).get("count") != 12:
            time.sleep(0.1)
        seen = read_state(run)["rollouts_failed"]
        assert seen["count"] == 12 and seen["first"] == ERROR and seen["limit_s"] == 600.0, seen
        d = json.loads(cli("status", run.name, "--json").out)
        summary = f"rollouts fail and no step completes: 12 failed, the first: {ERROR}"
        assert d["status"] == "running" and d["reason"] == summary and d["cause"]["what"] == "rollouts failing", d
        assert d["rollouts_failed"]["count"] == 12, d
        shown = cli("status", run.name).out
        assert f"running: {summary}" in shown and "(run.stall.floor_s = 600 s)" in shown, shown
        doc = cli("doctor", run.name)
        assert doc.code == 1, doc.out
        assert f"[critical] cause: the run is running, but {summary}" in doc.out, doc.out
        found = next(f for f in json.loads(cli("doctor", run.name, "--json").out)["findings"] if f["rule"] == "cause")
        assert "then `rlctl resume RUN`" in found["action"], found
        assert any("Rollout task failed in group f23cbe9b-" in e for e in found["evidence"]["lines"]), found
    finally:
        assert cli("stop", run.name).code == 0


def test_an_attempt_that_exited_with_a_traceback_after_failed_rollouts_failed_of_its_exception(user):
    """What the supervisor counted while the attempt lived names the cause of a stall; an attempt that exited on its
    own is said with the exception its output shows, the failed rollouts only where it shows none."""
    from rlctl.runs.causes import find, settle

    run = user / "runs" / "prime-2gpu-20261127-232638"
    run.mkdir(parents=True)
    tb = ["Traceback (most recent call last):", '  File "/tmp/site/prime-rl/prime_rl/orchestrator/orchestrator.py", '
          "line 598, in finalize_train_batch", "    raise RuntimeError(", "RuntimeError: 8 consecutive empty train "
          "batches — check filter config (pre_batch_filters / post_batch_filters) or task difficulty."]
    (run / "stdout.log").write_text("".join(t + "\n" for t in recorded_lines() + tb))
    seen = {"at": time.time() - 700, "count": 12, "first": ERROR, "line": ANSI.sub("", recorded_lines()[-12]),
            "limit_s": 600.0, "limit": "run.stall.floor_s"}
    write_state(run, name=run.name, status="failed", backend="prime_rl", executor="local", rollouts_failed=seen,
                attempts=[{"attempt": 1, "log_offset": 0, "exit_code": -15, "outcome": "stalled", "stall": "..."}])
    assert find(run)["what"] == "rollouts failing"
    write_state(run, attempts=[{"attempt": 1, "log_offset": 0, "exit_code": 1, "outcome": "failed"}])
    cause = find(run)
    assert cause["what"] == "exception" and cause["summary"].startswith("RuntimeError: 8 consecutive empty"), cause
    (run / "stdout.log").write_text("".join(t + "\n" for t in recorded_lines()))  # no traceback
    assert find(run)["what"] == "rollouts failing"
    # a run going on, whose rollouts began to fail after steps 200 s apart: said once the next step is late
    st = {**read_state(run), "rollouts_failed": {**seen, "at": time.time() - 10, "late_s": 200.0}}
    assert settle(run, st, "running") == ("running", None)
    st["rollouts_failed"]["at"] = time.time() - 300
    assert settle(run, st, "running")[1]["what"] == "rollouts failing"
