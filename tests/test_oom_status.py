"""`rlctl status` on a run that ran out of GPU memory: it says so, next to what the plan predicted, instead of
comparing a peak capped by the GPU with the plan ("plan overestimated by 50%").

tests/fixtures/oom/stdout.log is real output: torch 2.11.0+cu130 on an NVIDIA H100 80GB HBM3, a loop allocating
8 GiB tensors until the caching allocator raised torch.OutOfMemoryError (printed by torch itself, unedited).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import types
from pathlib import Path

import pytest

from rlctl.metrics.oom import TAIL_BYTES, find_oom
from tests.conftest import RECIPES

FIXTURE = Path(__file__).parent / "fixtures" / "oom" / "stdout.log"
GiB = 1024**3
# the quickstart on one H100 with a 5B-parameter model: preflight's memory.trainer says FAIL (80.8 GiB of 79.2)
BIG = (RECIPES / "quickstart.toml").read_text().replace(
    'path = "random:qwen2?hidden=64&layers=2"', 'path = "random:qwen2?hidden=5120&layers=64"').replace(
    "gpus_per_node = 0", "gpus_per_node = 1").replace('gpu = "cpu"', 'gpu = "H100-80GB"')


def _fake_nvml(monkeypatch, used_gib: list[float], total_gib: float = 79.18) -> None:
    used = iter(used_gib)
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=total_gib * GiB,
                                                                 used=next(used, used_gib[-1]) * GiB))
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def _run_dir(tmp_path, monkeypatch, log: str | Path, steps: int = 12) -> Path:
    """A finished-badly run as the supervisor leaves it: recipe, metrics, NVML samples and summary, log, state."""
    from rlctl.metrics.gpu import GpuSampler

    root = tmp_path / "runs"
    run = root / "oom-run"
    run.mkdir(parents=True)
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(root))
    (run / "recipe.toml").write_text(BIG)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": 1000.0 + s, "reward/mean": 0.1})
                                               + "\n" for s in range(1, steps + 1)))
    _fake_nvml(monkeypatch, [0.5, 40.0, 72.5, 78.9])
    s = GpuSampler(run, {"RLCTL_GPU_RECORD_S": "0"})
    for _ in range(4):
        s.tick()
    s.close()
    if isinstance(log, Path):
        shutil.copy(log, run / "stdout.log")
    else:
        (run / "stdout.log").write_text(log)
    (run / "state.json").write_text(json.dumps({"name": "oom-run", "status": "failed", "backend": "trl",
                                                "exit_code": 1, "started_at": time.time() - 60,
                                                "ended_at": time.time(), "total_steps": 80}))
    return run


def test_status_says_out_of_memory_next_to_the_plan_preflight_failed(cli, tmp_path, monkeypatch):
    run = _run_dir(tmp_path, monkeypatch, FIXTURE)
    plan = json.loads((run / "gpu_memory.json").read_text())["plan"]
    res = cli("status", "oom-run")
    assert res.code == 0, res.err
    line = next(x for x in res.out.splitlines() if "GPU memory" in x)
    assert "ran out of memory at step 12 (torch OutOfMemoryError: tried to allocate 8.00 GiB on GPU 0 " \
           "(79.18 GiB, 6.66 GiB free))" in line, line
    assert f"plan: {plan['trainer_gib']:.1f} GiB per trainer GPU needed of {plan['gpu_gib']:.1f} — preflight " \
           "said FAIL)" in line, line
    assert "estimated" not in line and "capped by the GPU" in line
    # the plan in the run is the one preflight judged: same figure, and FAIL
    (tmp_path / "big.toml").write_text(BIG)
    shutil.copytree(RECIPES / "quickstart", tmp_path / "quickstart")
    pre = cli("preflight", str(tmp_path / "big.toml"), "--only", "memory", "--json")
    trainer = next(r for r in json.loads(pre.out)["results"] if r["check"] == "memory.trainer")
    assert trainer["verdict"] == "fail"
    assert round(trainer["data"]["per_gpu_bytes"] / GiB, 1) == round(plan["trainer_gib"], 1)
    data = json.loads(cli("status", "oom-run", "--json").out)
    assert "ran out of memory at step 12" in data["gpu_memory"]


def test_without_an_oom_the_measured_peak_is_compared_as_before(cli, tmp_path, monkeypatch):
    _run_dir(tmp_path, monkeypatch, "step 1 loss 0.5\nstep 2 loss 0.4\n")
    line = next(x for x in cli("status", "oom-run").out.splitlines() if "GPU memory" in x)
    assert line.strip().startswith("GPU memory: peak 78.9 GiB of 79.2") and "plan said" in line
    assert "out of memory" not in line


def test_an_oom_without_nvml_or_summary_is_still_said(cli, tmp_path, monkeypatch):
    run = _run_dir(tmp_path, monkeypatch, FIXTURE, steps=0)
    (run / "gpu_memory.json").unlink()
    (run / "metrics.jsonl").unlink()
    line = next(x for x in cli("status", "oom-run").out.splitlines() if "GPU memory" in x)
    assert "ran out of memory before the first logged step (torch OutOfMemoryError" in line
    (run / "gpu_memory.json").write_text("[1, 2]")  # a damaged summary says nothing, breaks nothing
    res = cli("status", "oom-run")
    assert res.code == 0 and "ran out of memory" in res.out and "Traceback" not in res.err


@pytest.mark.parametrize("line,what", [
    ("(WorkerDict pid=4242) RuntimeError: CUDA error: out of memory", "CUDA error: out of memory"),
    ("ERROR 10-08 20:33:48 [core.py:708] ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine.", "vLLM: no memory left for the KV cache blocks"),
    ("ValueError: Free memory on device (6.92/8.0 GiB) on startup is less than desired GPU memory utilization "
     "(0.9, 7.2 GiB)", "vLLM: the GPU's free memory is below gpu_memory_utilization"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total "
     "capacity; 77.9 GiB already allocated)", "torch OutOfMemoryError"),
    ("node1:77:77 [0] include/alloc.h:103 NCCL WARN Cuda failure 2 'out of memory'", "NCCL: CUDA out of memory"),
])
def test_oom_signs(tmp_path, line, what):
    log = tmp_path / "stdout.log"
    log.write_text("step 3 loss 0.1\n" + line + "\n")
    oom = find_oom(log)
    assert oom is not None and oom.what == what and oom.line_no == 2


def test_the_log_tail_only_is_read(tmp_path):
    log = tmp_path / "stdout.log"
    with log.open("w") as fh:
        fh.write("torch.OutOfMemoryError: CUDA out of memory. (an old attempt, out of the tail)\n")
        fh.write(("step 1 loss 0.5 " * 8 + "\n") * (TAIL_BYTES // 128 + 10))
    assert find_oom(log) is None
    assert find_oom(tmp_path / "missing.log") is None
    with log.open("a") as fh:
        fh.write(FIXTURE.read_text())
    t = time.perf_counter()
    oom = find_oom(log)
    assert oom is not None and oom.line_no is None and "8.00 GiB" in (oom.detail or "")
    assert time.perf_counter() - t < 5
