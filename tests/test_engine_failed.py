"""A run whose vLLM engine failed while the trainer waits (verl 0.9.1 LoRA on an H100, 2026-11-27): vLLM's worker
raised StopIteration in add_lora, the EngineCore logged `RuntimeError: Worker failed with error ''`, and the trainer
waited forever with no step logged. Nine minutes later `rlctl status` said `running  step 0/4 ... last step 0:05
ago` — the "last step" was rlctl's own GPU-memory record — and no stall was ever declared: the run's restart policy
was on-failure (stalls were not watched), the first step's grace is 30 minutes, and the dead-engine rule of issue 32
looks for a gone process while the Ray actor hosting vLLM lived on.

Now vLLM's own fatal engine lines (vllm/v1/engine/core.py, utils.py, executor/multiproc_executor.py: "EngineCore
encountered a fatal error", "EngineCore failed to start", "Engine core initialization failed", "Worker failed with
error", ...) are a named cause, "inference engine failed", with the exception that preceded them, seen by status and
doctor at once; no step for `[run.stall] engine_failed_s` after such a line is a stall the restart policy handles;
status never calls a record of rlctl's own a step.

The log is the run's own (tests/fixtures/h100_failures/verl_lora_engine_failed.log, its README), replayed by a trainer
rlctl does not know through rlctl's real supervisor; NVML is the recorded machine's numbers at the end of the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest

from rlctl.core.state import read_state, write_state
from tests.conftest import FIXTURES, replay_recipe_file, run_cli

cli = run_cli
LOGS = FIXTURES / "h100_failures"
VERL_LOG = LOGS / "verl_lora_engine_failed.log"
GiB = 1024**3
# the recorded run's GPUs when status was asked (evidence.json: status --json "gpus"): GPU 0 holds verl's worker and
# the hung vLLM worker, GPU 1 is not the run's
USED = {0: 8.186, 1: 0.472}
TOTAL = 79.647
ROOT = "StopIteration"
WORKER_FAILED = "RuntimeError: Worker failed with error '', please check the stack trace above for the root cause"


class RecordedNvml(types.SimpleNamespace):
    """NVML answering with the recorded machine's memory, both GPUs idle (the trainer waits, the engine is dead)."""

    def __init__(self) -> None:
        super().__init__()
        self.nvmlInit = self.nvmlShutdown = lambda: None
        self.nvmlDeviceGetCount = lambda: 2
        self.nvmlDeviceGetHandleByIndex = lambda i: i
        self.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802 - NVML's name
        return types.SimpleNamespace(total=TOTAL * GiB, used=USED[h] * GiB, free=(TOTAL - USED[h]) * GiB)

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return types.SimpleNamespace(gpu=0)


@pytest.fixture
def user(shell):
    return shell  # tests/conftest.py


def test_vllms_fatal_lines_are_its_own():
    """The texts the rule reads are vLLM 0.24.0's own (the release the recorded run used), from its wheel."""
    from rlctl.runs.causes import ENGINE_FAILED

    wheels = sorted((Path.home() / ".cache" / "rlctl-tests" / "wheels").glob("vllm-0.24.0-*.whl"))
    if not wheels:
        pytest.skip("vllm 0.24.0's wheel is not in the tests' cache")
    with zipfile.ZipFile(wheels[0]) as zf:
        src = {p: zf.read(p).decode() for p in ("vllm/v1/engine/core.py", "vllm/v1/engine/utils.py",
                                                 "vllm/v1/engine/exceptions.py",
                                                 "vllm/v1/executor/multiproc_executor.py")}
    said = {  # what vLLM prints (its source's literal) -> a line of it as a log shows it
        "EngineCore encountered a fatal error.": "EngineCore encountered a fatal error.",
        "EngineCore failed to start.": "EngineCore failed to start.",
        '"Engine core initialization failed. "': "RuntimeError: Engine core initialization failed. See root cause "
                                                  "above. Failed core proc(s): {'EngineCore_DP0': 1}",
        "f\"Worker failed with error '{result}', please check the\"": WORKER_FAILED,
        '"Worker proc %s died unexpectedly, shutting down executor."': "Worker proc VllmWorker-0 died unexpectedly, "
                                                                       "shutting down executor.",
        "EngineCore encountered an issue. See stack trace (above) for the root cause.":
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
            "for the root cause.",
    }
    for literal, line in said.items():
        assert any(literal in s for s in src.values()), literal
        assert ENGINE_FAILED.search(line), line
    assert not ENGINE_FAILED.search("Invocation of collective_rpc method failed")  # a failed call; the engine lives


def test_the_stall_rule_on_the_recorded_log():
    """engine_failed_s after vLLM's line, not the first step's grace, busy GPU or not; a step after it clears it."""
    from rlctl.runs.stall import StallConfig, StallDetector

    d = StallDetector(StallConfig(engine_failed_s=300, first_step_s=1800, floor_s=600), [], started_at=0.0)
    d.observe_log(VERL_LOG.read_text(errors="replace"), 100.0)
    assert d.check(399.0, gpus_busy=True) is None
    said = d.check(401.0, gpus_busy=True)
    assert said and said.endswith("no step came for 301s after it (limit 300s, run.stall.engine_failed_s)"), said
    d.observe_step(1, 402.0)  # the trainer went on: the engine that failed was not the run's end
    assert d.check(1000.0) is None


def live_verl_run(work: Path, proc: subprocess.Popen) -> Path:
    """The recorded run as `status` met it: verl's components as launch records them, the recorded log, the GPU
    memory records rlctl's own sampler wrote (no step was ever logged), its trainer alive and hung."""
    from rlctl.backends import get_backend
    from rlctl.metrics.gpu import GpuSampler
    from rlctl.recipe.loader import load
    from rlctl.runs.components import write_components

    run = work / "runs" / "verl-lora-20261127-165917"
    run.mkdir(parents=True)
    (run / "recipe.toml").write_text('[backend]\nname = "verl"\nversion = "0.9.1"\n[model]\n'
                                     'path = "Qwen/Qwen2.5-0.5B"\n[data]\ntrain = "p.jsonl"\n[train]\nsteps = 4\n')
    write_components(run, get_backend("verl"), load(run / "recipe.toml").recipe)
    (run / "stdout.log").write_bytes(VERL_LOG.read_bytes())
    started = time.time() - 555
    write_state(run, name=run.name, status="running", backend="verl", version="0.9.1", executor="local",
                total_steps=4, started_at=started, restart={"mode": "on-failure", "max_restarts": 3},
                attempts=[{"attempt": 1, "started_at": started + 1, "reason": "launch", "restart": False}],
                handle={"executor": "local", "ref": {"pid": proc.pid, "pgid": proc.pid}, "attempt": 1},
                pid=proc.pid, pgid=proc.pid)
    sys.modules["pynvml"] = RecordedNvml()
    try:
        GpuSampler(run).tick()  # the supervisor's sampler: a record at the run's latest step (none: 0), time now
    finally:
        del sys.modules["pynvml"]
    assert "gpu/0/memory_used_gib" in (run / "metrics.jsonl").read_text()
    return run


def test_status_and_doctor_name_the_failed_engine_at_once_and_claim_no_step(user):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        run = live_verl_run(user, proc)
        d = json.loads(cli("status", run.name, "--json").out)
        assert d["status"] == "running" and d["last_step_age_s"] is None, d
        cause = d["cause"]
        assert cause and cause["what"] == "inference engine failed", d
        assert cause["summary"].startswith(f"the inference engine failed: {ROOT} (raised in "), cause
        assert "_create_merged_loras_inplace" in cause["summary"], cause
        ev = cause["evidence"]
        assert any(e.endswith(f"[multiproc_executor.py:1000] {ROOT}") for e in ev), ev  # the root cause, vLLM's line
        assert any(e.endswith(WORKER_FAILED) for e in ev), ev  # the fatal line itself
        lines = (run / "stdout.log").read_text().splitlines()
        for e in ev:  # each says where it is, colours gone
            where, _, text = e.partition(": ")
            assert "\x1b" not in e and text[-60:] in lines[int(where.split(":")[1]) - 1], e
        shown = cli("status", run.name).out
        assert "no step logged yet" in shown and "last step" not in shown.splitlines()[1], shown
        assert f"cause: the inference engine failed: {ROOT}" in shown, shown
        table = cli("status").out
        assert "running: the inference engine failed" in table, table
        doc = cli("doctor", run.name)
        assert doc.code == 1 and "[critical] cause: the run is running, but the inference engine failed: " \
            f"{ROOT}" in doc.out, doc.out

        # the supervisor saw the fatal line 400 s ago, with the run's limit of 300 s: stalled, said with its cause
        write_state(run, engine_failed={"at": time.time() - 400, "limit_s": 300.0, "line": WORKER_FAILED})
        d = json.loads(cli("status", run.name, "--json").out)
        assert d["status"] == "stalled" and d["cause"]["what"] == "inference engine failed", d
        assert "(run.stall.engine_failed_s = 300 s)" in cli("status", run.name).out
    finally:
        proc.kill()
        proc.wait()


REPLAY = '''"""verl's trainer as it ran on the H100: its output (the recorded log), then it waits forever."""
import sys, time
for line in open(sys.argv[1], encoding="utf-8", errors="surrogateescape"):
    sys.stdout.write(line)
sys.stdout.flush()
time.sleep(600)
'''


def replay_recipe(work: Path, log: Path, restart: str = "on-failure", engine_failed_s: float = 1.0) -> Path:
    return replay_recipe_file(
        work, "verl-lora.toml", "verl-lora", REPLAY, [str(log)], r"step:(?P<step>\d+) - .*reward/mean:(?P<reward>\S+)",
        'reward = "reward/mean"', 4,
        f'[run]\nrestart = "{restart}"\nmax_restarts = 3\n[run.stall]\nengine_failed_s = {engine_failed_s}\n')


@pytest.mark.timeout(120)
def test_the_recorded_run_through_the_supervisor_stalls_soon_and_is_not_restarted_into_the_same_failure(
        user, monkeypatch):
    """The recorded log through rlctl's real supervisor with the recorded policy (on-failure, 3 restarts): stalled
    `engine_failed_s` after the fatal line (1 s here; 300 s by default), not after the 30-minute first-step grace;
    its evidence saved, its cause the root one; restarted by the policy; the restart fails the same way before its
    first step, so rlctl stops there and says so rather than burning the other two restarts."""
    monkeypatch.setitem(sys.modules, "pynvml", RecordedNvml())
    t0 = time.time()
    r = cli("launch", str(replay_recipe(user, VERL_LOG)))
    assert r.code != 0, r.out + r.err
    run = next((user / "runs").iterdir())
    st = read_state(run)
    assert st["status"] == "failed", st
    a1, a2 = st["attempts"]
    assert a1["outcome"] == "stalled" and a2["reason"] == "stalled" and a2["restart"], st["attempts"]
    assert "the inference engine failed" in a1["stall"] and "limit 1s, run.stall.engine_failed_s" in a1["stall"], a1
    assert WORKER_FAILED in a1["stall"], a1["stall"]
    for a in (a1, a2):
        assert a["cause"]["what"] == "inference engine failed" and ROOT in a["cause"]["summary"], a
    evidence = Path(a1["evidence"]).read_text()
    assert "## last log lines" in evidence and WORKER_FAILED in evidence, evidence[-2000:]
    want = (f"stalled twice the same way before its first step: {a2['cause']['summary']}; restarting would repeat "
            "it")
    assert st["gave_up"] == want, st["gave_up"]
    assert time.time() - t0 < 60  # seconds, not the first step's 30-minute grace
    d = json.loads(cli("status", run.name, "--json").out)
    assert d["status"] == "failed" and d["cause"]["what"] == "inference engine failed" and d["last_step_age_s"] is None
    shown = cli("status", run.name).out
    assert f"gave up: {want}" in shown and "no step logged yet" in shown, shown
    doc = cli("doctor", run.name)
    assert doc.code == 1 and f"[critical] repeated_failure: {want}" in doc.out, doc.out


@pytest.mark.timeout(120)
def test_with_restart_never_the_failed_engine_is_said_and_left_alone(user):
    """restart = "never": the supervisor records what it saw (status says stalled, with the cause) and kills
    nothing; `rlctl stop` ends it."""
    r = cli("launch", str(replay_recipe(user, VERL_LOG, restart="never", engine_failed_s=1.0)), "--detach")
    assert r.code == 0, r.out + r.err
    run = next((user / "runs").iterdir())
    deadline = time.time() + 60
    while time.time() < deadline:
        d = json.loads(cli("status", run.name, "--json").out)
        if d["status"] == "stalled":
            break
        time.sleep(0.2)
    assert d["status"] == "stalled" and d["cause"]["what"] == "inference engine failed", d
    assert read_state(run)["attempts"][0].get("outcome") is None  # alive: nothing was killed
    assert cli("stop", run.name).code == 0
