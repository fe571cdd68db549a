"""Idle GPUs (issue 32.5): a run that makes no step progress while its inference engine is gone — its process
ended, or its GPU's memory dropped to ~0 while the process lives (seed 004: vLLM died after step 6, GPU 0 showed
0 MiB, the trainer waited three hours) — is a stall after `[run.stall] inference_idle_s`, with evidence (the
trainer's stack through py-spy, the inference log's last lines, the NVML samples), restarted by the same policy. A
rollout GPU idling while the trainer works is normal (seeds 001 and 002 split them) and never a stall.

The trainer and its engine are real processes (seed 004's layout: `rl` starts an inference server, then trains, each
step waiting for its rollouts); the engine is killed for real, or its GPU memory vanishes under a live process. The
GPUs are NVML's interface over samples on seed 004's numbers (an H100: 79.6 GiB, 0.47 GiB in use before any run, as
tests/test_gpu_plan.py records; the engine at gpu_memory_utilization 0.9; the trainer's 30 GiB), read by the
supervisor's own sampler (rlctl.metrics.gpu.GpuSampler), as tests/test_gpu_plan.py feeds it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import types
from pathlib import Path

import psutil
import pytest

from rlctl.core.state import read_state
from tests.conftest import run_cli

cli = run_cli
GiB = 1024**3
NVML_TOTAL = 79.6
BEFORE = 0.47
ENGINE = BEFORE + 0.9 * 79.18  # vLLM at gpu_memory_utilization 0.9 of what torch sees
TRAINER = BEFORE + 30.2

RL = '''"""seed 004's `rl`: starts the inference engine, then trains; each step waits for its rollouts."""
import os, subprocess, sys, time
from pathlib import Path

ckdir, steps, step_s = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
resume = int(sys.argv[sys.argv.index("--resume") + 1]) if "--resume" in sys.argv else 0
here = Path(__file__).resolve().parent
req = here / "rollouts"
req.mkdir(exist_ok=True)
(here / "logs").mkdir(exist_ok=True)
engine = subprocess.Popen([sys.executable, str(here / "fake_vllm.py"), str(req)],
                          stdout=open(here / "logs" / "inference.log", "a"), stderr=subprocess.STDOUT)


def wait_for_rollouts(step):
    want = req / f"want_{os.getpid()}_{step}"
    want.touch()
    while not want.with_name(want.name.replace("want_", "got_")).exists():
        time.sleep(0.05)


for step in range(resume + 1, steps + 1):
    wait_for_rollouts(step)
    time.sleep(step_s)  # the training step
    print(f"step {step} reward {0.1 * step:.2f}", flush=True)
    if step % 2 == 0:
        d = ckdir / f"step_{step}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "weights.bin").write_bytes(b"w" * 4096)
        (d / "done").touch()
engine.kill()
'''

VLLM = '''"""The inference server: answers each rollout request; a crash (`crash_<pid>`) leaves its process hanging."""
import os, sys, time
from pathlib import Path

req = Path(sys.argv[1])
print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [api_server.py:1] vLLM API server ready on :8000", flush=True)
while not (req / f"crash_{os.getpid()}").exists():
    for want in sorted(req.glob("want_*")):
        got = want.with_name(want.name.replace("want_", "got_"))
        if not got.exists():
            print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [loggers.py:1] 8 rollouts for {want.name}", flush=True)
            got.touch()
    time.sleep(0.05)
while True:  # the engine died under its API server: the process lives, nothing answers
    time.sleep(1)
'''


class FakeNvml(types.SimpleNamespace):
    """NVML over seed 004's GPUs: GPU 0 holds the engine's memory while an engine process lives that has not
    crashed (else what it held before the run); GPU 1 the trainer's while it lives. Utilisation: the engine
    generates in bursts; the trainer works (trainer_busy) or waits."""

    def __init__(self, work: Path, trainer_busy: bool):
        super().__init__()
        self.work, self.trainer_busy, self.calls = work, trainer_busy, 0
        self._seen: tuple[float, tuple[bool, bool]] = (0.0, (False, False))
        self.nvmlInit = self.nvmlShutdown = lambda: None
        self.nvmlDeviceGetCount = lambda: 2
        self.nvmlDeviceGetHandleByIndex = lambda i: i
        self.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"

    def _alive(self) -> tuple[bool, bool]:
        """(an engine that has not crashed lives, the trainer lives), looked at every 0.2 s."""
        t, seen = self._seen
        if time.time() - t < 0.2:
            return seen
        engine = trainer = False
        for p in psutil.process_iter(["cmdline", "status"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if "fake_vllm.py" in cmd and not (self.work / "rollouts" / f"crash_{p.pid}").exists():
                engine = True
            trainer = trainer or "rl.py" in cmd
        self._seen = (time.time(), (engine, trainer))
        return engine, trainer

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802 - NVML's name
        engine, trainer = self._alive()
        used = (ENGINE if engine else BEFORE) if h == 0 else (TRAINER if trainer else BEFORE)
        return types.SimpleNamespace(total=NVML_TOTAL * GiB, used=used * GiB, free=(NVML_TOTAL - used) * GiB)

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        self.calls += 1
        engine, trainer = self._alive()
        if h == 0:
            return types.SimpleNamespace(gpu=(97 if self.calls % 2 else 0) if engine and not self.trainer_busy else 0)
        return types.SimpleNamespace(gpu=90 if trainer and self.trainer_busy else 0)


def recipe(work: Path, gpus: bool, steps: int = 6, step_s: float = 0.2, idle_s: float = 2.0) -> Path:
    (work / "rl.py").write_text(RL)
    (work / "fake_vllm.py").write_text(VLLM)
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    res = ('gpus_per_node = 2\ngpu = "H100-80GB"\ninference_gpus = [0]\ntrainer_gpus = [1]\n' if gpus else
           'gpus_per_node = 0\ngpu = "cpu"\n')
    r = work / "seed004.toml"
    r.write_text(f"""name = "seed004"
[backend]
name = "command"
[backend.command]
command = [{json.dumps(sys.executable)}, "rl.py", "{{checkpoint_dir}}", "{steps}", "{step_s}"]
cwd = {json.dumps(str(work))}
log_pattern = 'step (?P<step>\\d+) reward (?P<reward>\\S+)'
metrics_map = {{reward = "reward/mean"}}
checkpoint_pattern = "step_{{step}}"
checkpoint_marker = "done"
resume_args = ["--resume", "{{step}}"]
logs = {{inference = "logs/inference.log"}}
processes = {{inference = "fake_vllm\\\\.py"}}
[model]
path = "random:qwen2?hidden=64&layers=2"
max_model_len = 128
[data]
train = "prompts.jsonl"
max_prompt_tokens = 32
[rollout]
max_tokens = 16
[train]
steps = {steps}
[resources]
{res}[checkpoint]
every = 2
[run]
restart = "on-stall"
max_restarts = 1
[run.stall]
inference_idle_s = {idle_s}
""")
    return r


@pytest.fixture
def user(shell):
    return shell  # tests/conftest.py


def engine_pid(work: Path) -> int | None:
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] != psutil.STATUS_ZOMBIE and any(a.endswith("fake_vllm.py") for a in cmd) \
                and str(work) in " ".join(cmd):
            return p.pid
    return None


def when_step(work: Path, step: int, do) -> threading.Thread:
    """Once the run has logged `step` (its first attempt), do(engine pid)."""
    def go() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            runs = list((work / "runs").glob("*/stdout.log")) if (work / "runs").is_dir() else []
            if runs and f"step {step} reward" in runs[0].read_text():
                pid = engine_pid(work)
                if pid:
                    do(pid)
                return
            time.sleep(0.05)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def assert_restarted_after_the_engine_died(work: Path, how: str) -> tuple[Path, dict]:
    run = next((work / "runs").iterdir())
    st = read_state(run)
    assert st["status"] == "finished", st
    a1, a2 = st["attempts"]
    assert a1["outcome"] == "stalled" and "the inference engine is gone (" in a1["stall"] and how in a1["stall"], a1
    assert a1["cause"]["what"] == "inference engine dead" and how in a1["cause"]["summary"], a1["cause"]
    # from the newest complete checkpoint (every 2 steps) the first attempt wrote before it hung
    assert a2["from_step"] == a1["last_step"] // 2 * 2 and a2["outcome"] == "finished", (a1, a2)
    evidence = Path(a1["evidence"]).read_text()
    assert "wait_for_rollouts (rl.py:" in evidence, evidence  # the trainer's stack: where it waits
    assert "## inference log, last lines" in evidence and "8 rollouts for want_" in evidence, evidence
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()
             if "reward/mean" in x]
    assert steps == [1, 2, 3, 4, 5, 6], steps
    shown = cli("status", run.name).out
    assert "-> stalled" in shown and "cause: the inference engine died (" in shown, shown
    return run, st


def test_the_engine_process_killed_while_the_trainer_waits_is_a_stall_restarted(user):
    """No GPU here: the engine's process is what rlctl sees go (SIGKILL, for real); the trainer hangs in
    wait_for_rollouts. Stalled after inference_idle_s (2 s), evidence saved, restarted from the newest complete
    checkpoint."""
    t = when_step(user, 3, lambda pid: os.kill(pid, signal.SIGKILL))
    r = cli("launch", str(recipe(user, gpus=False, step_s=0.6)))  # the engine lives > 1 s: rlctl has seen it
    t.join(5)
    assert r.code == 0, r.out + r.err
    assert_restarted_after_the_engine_died(user, "fake_vllm.py")


def test_the_engine_gpu_at_zero_while_its_process_lives_is_a_stall_restarted(user, monkeypatch):
    """Seed 004: the engine died silently under its API server: the process lives, GPU 0's memory drops to what
    was there before the run (0 MiB of the engine's), the trainer waits. NVML's samples say it."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(user, trainer_busy=False))
    t = when_step(user, 3, lambda pid: (user / "rollouts" / f"crash_{pid}").touch())
    r = cli("launch", str(recipe(user, gpus=True)))
    t.join(5)
    assert r.code == 0, r.out + r.err
    run, st = assert_restarted_after_the_engine_died(user, f"GPU 0 at {BEFORE:.2f} GiB, it held {ENGINE:.1f}")
    assert "process" not in st["attempts"][0]["stall"]  # its process lived: the GPU told
    assert "NVML samples" in Path(st["attempts"][0]["evidence"]).read_text()


def test_a_rollout_gpu_idling_while_the_trainer_works_is_no_stall(user, monkeypatch):
    """Seeds 001/002 split the GPUs: the engine's GPU idles (its memory held) while the trainer's works, for longer
    than inference_idle_s at every step. That is training, not a stall."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(user, trainer_busy=True))
    r = cli("launch", str(recipe(user, gpus=True, steps=2, step_s=2.5, idle_s=1.0)))
    assert r.code == 0, r.out + r.err
    st = read_state(next((user / "runs").iterdir()))
    assert st["status"] == "finished" and len(st["attempts"]) == 1 and not st["attempts"][0].get("stall"), st


def test_the_idle_rule_on_recorded_samples():
    """The rule itself, sample by sample: both GPUs idle after a step is a stall after inference_idle_s; the rollout
    GPU idle beside a busy trainer never is; idle GPUs before the first step (loading) are not judged by it; the
    engine's memory gone is, even beside a trainer GPU that spins (NCCL kernels wait at 100%)."""
    from rlctl.runs.stall import InferenceWatch, StallConfig, StallDetector

    cfg = StallConfig(inference_idle_s=60, floor_s=600, first_step_s=1800)
    before = {0: BEFORE, 1: BEFORE}

    def run(samples, step_at=None):
        d = StallDetector(cfg, [], started_at=0.0)
        w = InferenceWatch([0], [1], cfg.gpu_busy_pct)
        if step_at is not None:
            d.observe_step(1, step_at)
        out = None
        for t, used0, util0, util1 in samples:
            w.observe_gpus(t, {0: used0, 1: TRAINER}, {0: util0, 1: util1}, before)
            out = d.check(t, util0 > 5 or util1 > 5, w) or out
        return out

    idle = [(t, ENGINE, 0, 0) for t in range(10, 80, 5)]
    assert "inference GPU 0 idle" in run(idle, step_at=10.0) and "trainer's GPU 1 idle" in run(idle, step_at=10.0)
    assert run(idle) is None  # no step yet: loading
    working = [(t, ENGINE, 0, 90 if t % 10 else 0) for t in range(10, 200, 5)]  # the trainer works in bursts
    assert run(working, step_at=10.0) is None
    gone = [(10, ENGINE, 97, 0)] + [(t, BEFORE, 0, 100) for t in range(15, 90, 5)]
    assert "GPU 0 at 0.47 GiB, it held 71.7" in run(gone, step_at=10.0)


def test_status_says_the_engine_is_gone_before_the_run_is_stalled(user):
    """While the run lives and before inference_idle_s has passed: `status RUN` says what the supervisor saw (as it
    recorded it in state.json), not only "running"."""
    import subprocess

    from rlctl.core.state import write_state

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        run = user / "runs" / "seed004-20261127-000000"
        run.mkdir(parents=True)
        seen = {"gone": {"at": time.time() - 30, "summary": f"GPU 0 at {BEFORE:.2f} GiB, it held {ENGINE:.1f}",
                         "evidence": []}}
        write_state(run, name=run.name, status="running", backend="command", executor="local",
                    started_at=time.time() - 60, inference=seen,
                    handle={"executor": "local", "ref": {"pid": proc.pid, "pgid": proc.pid}, "attempt": 1})
        shown = cli("status", run.name).out
        assert f"! the inference engine is gone (GPU 0 at {BEFORE:.2f} GiB, it held {ENGINE:.1f}) since" in shown, \
            shown
    finally:
        proc.kill()
        proc.wait()
