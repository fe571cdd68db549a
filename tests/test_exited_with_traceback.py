"""A run whose command exits with a traceback failed of that exception, not of its idle GPUs (prime-rl v0.8.0's first
start on 2 x H100, docs/gpu/prime-rl-1.json part "2gpu"): `rl` exited 1 within 0.4 s with `ModuleNotFoundError: No
module named 'pynvml'`, twice, and rlctl named both attempts' cause, and why it gave up, "inference GPU 0 idle (0.5
GiB held) and the trainer's GPU 1 idle, no progress": the NVML sample the supervisor took of two GPUs nothing had
been loaded on yet. The trainer's own log (prime-rl's `logs/trainer.log`) was never written; the traceback is in the
output of the command rlctl started, the run's stdout.log.

Now the exception and the frame that raised it name the cause (status's reason, each attempt's cause, doctor's
`cause`, the gave-up text); GPUs idle beside the trainer's are a cause only of an attempt that did not exit on its own
(a stall rlctl ended, or one that still hangs).

The attempts' lines and the NVML numbers are the recorded ones, replayed through rlctl's real supervisor by a command
whose components log where prime-rl's do (the trainer and the engine to files of their own).
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest

from rlctl.core.state import read_state, write_state
from tests.conftest import replay_recipe_file, run_cli

cli = run_cli
EVIDENCE = Path(__file__).resolve().parents[1] / "docs" / "gpu" / "prime-rl-1.json"
GiB = 1024**3
SUMMARY = "ModuleNotFoundError: No module named 'pynvml' (raised in <module>, prime_rl/entrypoints/rl.py:13)"


def recorded() -> dict:
    return json.loads(EVIDENCE.read_text())["parts"]["2gpu"]["collected"]


def attempt_lines() -> list[str]:
    """One attempt's output as the run's stdout.log recorded it: uv's warnings, then `rl`'s traceback."""
    tail = recorded()["log_tail"]
    start = next(i for i, t in enumerate(tail) if t.startswith("warning: "))
    end = next(i for i, t in enumerate(tail) if t.startswith("ModuleNotFoundError"))
    return tail[start:end + 1]


class RecordedNvml(types.SimpleNamespace):
    """NVML as `status --json` recorded the two H100s: 0.47 GiB in use on each, both idle."""

    def __init__(self, gpus: list[dict]) -> None:
        super().__init__()
        self.gpus = {g["index"]: g for g in gpus}
        self.nvmlInit = self.nvmlShutdown = lambda: None
        self.nvmlDeviceGetCount = lambda: len(self.gpus)
        self.nvmlDeviceGetHandleByIndex = lambda i: i
        self.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802 - NVML's name
        g = self.gpus[h]
        used, total = g["memory_used_gib"] * GiB, g["memory_total_gib"] * GiB
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return types.SimpleNamespace(gpu=self.gpus[h]["utilization"])


REPLAY = '''"""`rl` as it ran: uv's warnings and its traceback on stdout, exit 1."""
import sys
sys.stdout.write(open(sys.argv[1]).read())
sys.exit(1)
'''


def recipe(work: Path) -> Path:
    (work / "attempt.log").write_text("".join(t + "\n" for t in attempt_lines()))
    return replay_recipe_file(
        work, "prime-2gpu.toml", "prime-2gpu", REPLAY, ["attempt.log"],
        "Step (?P<step>\\d+) \\| .*Reward (?P<reward>\\S+)", 'reward = "reward/mean"', 6,
        # where prime-rl v0.8.0's components log (its adapter's log_components): not the run's stdout.log
        command_extra='logs = {trainer = "checkpoints/logs/trainer.log", '
                      'inference = "checkpoints/logs/inference.log"}\n'
                      "processes = {inference = '(^|[\\s/])inference @ '}\n",
        resources='gpus_per_node = 2\ngpu = "H100-80GB"\ninference_gpus = [0]\ntrainer_gpus = [1]\n',
        tail='[run]\nrestart = "on-failure"\nmax_restarts = 3\n')


@pytest.fixture
def user(shell):
    return shell  # tests/conftest.py


@pytest.mark.timeout(120)
def test_a_command_that_exits_with_a_traceback_failed_of_it_not_of_idle_gpus(user, monkeypatch):
    rec = recorded()
    gpus = json.loads(rec["status"]["stdout"])["gpus"]
    monkeypatch.setitem(sys.modules, "pynvml", RecordedNvml(gpus))
    r = cli("launch", str(recipe(user)))
    assert r.code != 0, r.out + r.err
    run = next((user / "runs").iterdir())
    st = read_state(run)
    assert st["inference"]["idle"], st.get("inference")  # the supervisor saw both GPUs idle, as on the H100s
    a1, a2 = st["attempts"]
    for a in (a1, a2):
        assert a["outcome"] == "failed" and a["exit_code"] == 1, a
        assert a["cause"]["what"] == "exception" and a["cause"]["summary"] == SUMMARY, a["cause"]
        assert a["cause"]["component"] == "trainer", a["cause"]
        assert any(e.startswith("stdout.log:") and e.endswith("ModuleNotFoundError: No module named 'pynvml'")
                   for e in a["cause"]["evidence"]), a["cause"]
    want = f"failed twice the same way before its first step: {SUMMARY}; restarting would repeat it"
    assert st["gave_up"] == want, st["gave_up"]
    assert st["cause"]["summary"] == SUMMARY, st["cause"]
    d = json.loads(cli("status", run.name, "--json").out)
    assert d["status"] == "failed" and d["reason"] == SUMMARY and d["cause"]["what"] == "exception", d
    assert "idle" not in json.dumps(d["cause"]) and "idle" not in json.dumps(d["attempts"]), d["attempts"]
    assert f"rlctl resume {run.name}" in d["next"] and "RUN" not in d["next"], d["next"]  # ready to type
    shown = cli("status", run.name).out
    assert f"cause: {SUMMARY}" in shown and f"gave up: {want}" in shown, shown
    doc = cli("doctor", run.name)
    assert doc.code == 1 and f"[critical] cause: the run failed: {SUMMARY}" in doc.out, doc.out
    assert f"[critical] repeated_failure: {want}" in doc.out, doc.out


def idle_run(work: Path, attempt: dict) -> Path:
    """A run as the supervisor records one whose GPUs it saw idle (the recorded sample) and whose log shows the
    recorded traceback: only the attempt's end differs."""
    rec = recorded()
    run = work / "runs" / "prime-2gpu-20261127-231532"
    run.mkdir(parents=True)
    (run / "stdout.log").write_text("".join(t + "\n" for t in attempt_lines()))
    write_state(run, name=run.name, status="failed", backend="command", executor="local", exit_code=attempt.get(
        "exit_code"), started_at=time.time() - 60, inference=rec["state"]["inference"],
                attempts=[{"attempt": 1, "started_at": time.time() - 30, "reason": "launch", "log_offset": 0,
                           **attempt}])
    return run


def test_idle_gpus_name_a_stall_never_an_exit(user):
    """The rule's two sides on the recorded state: an attempt rlctl ended as stalled is said with its idle GPUs; one
    that exited by itself is said with the exception it printed."""
    from rlctl.runs.causes import find

    stalled = idle_run(user, {"exit_code": -15, "outcome": "stalled", "stall": "inference GPU 0 idle (0.5 GiB held) "
                                                                              "and the trainer's GPU 1 idle"})
    assert find(stalled)["what"] == "inference engine idle"
    write_state(stalled, attempts=[{"attempt": 1, "log_offset": 0, "exit_code": 1, "outcome": "failed"}])
    cause = find(stalled)
    assert cause["what"] == "exception" and cause["summary"] == SUMMARY, cause
