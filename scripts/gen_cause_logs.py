#!/usr/bin/env python3
"""Write tests/fixtures/causes/*.log: what a trainer prints when it dies of a CUDA illegal memory access, an NCCL
timeout or an exception of its reward function, and what the command backend's runner prints when the step it is to
resume from is not there, with each library's own text (see tests/fixtures/causes/README.md),
printed the way the trainer's launcher prints it: a plain Python process's traceback (raised and printed by this
interpreter), and torchrun's own report of a rank that aborted (torch.distributed.elastic, run here for real on the
CPU).

    python scripts/gen_cause_logs.py [--out DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "causes"

# CUDA's text for error 700 (libcudart cudaGetErrorString / cudaGetErrorName), as torch 2.8+ raises it:
# "CUDA error: " + string (c10/cuda/CUDAException.cpp), get_cuda_error_help, get_cuda_check_suffix
# (c10/cuda/CUDAMiscFunctions.cpp), c10_retrieve_device_side_assertion_info (CUDADeviceAssertionHost.cpp)
CUDA_700 = ("CUDA error: an illegal memory access was encountered\n"
            "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
            "group__CUDART__TYPES.html for more information.\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")

ILLEGAL = textwrap.dedent('''
    import torch

    CUDA_700 = %r

    def synchronize(step):  # where torch raises a kernel's earlier fault: the next synchronising call
        if step == 3:
            raise torch.AcceleratorError(CUDA_700)

    def train_step(step):
        print(f"step {step} loss 0.41", flush=True)
        synchronize(step)

    for step in range(1, 5):
        train_step(step)
''') % CUDA_700

# PyTorch's NCCL watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: WorkNCCL::checkTimeout builds the first
# message, operator<<(WorkNCCL) the WorkNCCL(...) part, handleException the next two), printed by c10's LOG(ERROR)
# with the rank prefix; then libstdc++'s terminate handler and the abort it ends in
WATCHDOG = ("[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=412, OpType=ALLREDUCE, "
            "NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600043 milliseconds before timing "
            "out.")
NCCL = textwrap.dedent('''
    import os, sys, time
    rank = int(os.environ["RANK"])
    for step in range(1, 6):
        print(f"step {step} loss 0.{40 - step}", flush=True)
    if rank == 1:  # this rank's all_reduce never completes: its peer stopped taking part
        w = %r.format(r=rank)
        for n, msg in ((616, w), (630, "Some NCCL operations have failed or timed out. Due to the asynchronous "
                       "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."),
                       (636, "To avoid data inconsistency, we are taking the entire process down.")):
            print(f"[rank{rank}]:[E1127 03:12:44.118203611 ProcessGroupNCCL.cpp:{n}] {msg}", file=sys.stderr,
                  flush=True)
        print("terminate called after throwing an instance of 'std::runtime_error'", file=sys.stderr)
        print(f"  what():  {w}", file=sys.stderr, flush=True)
        os.abort()
    time.sleep(30)
''') % WATCHDOG


# a trainer whose reward function raises (the new-user trial's crashing reward server): its steps, then Python's own
# traceback through the reward module it imported
REWARD_TRAIN = textwrap.dedent('''
    import reward
    for step in range(1, 4):
        if step == 3:
            reward.reward(["a"])
        print(f"step {step} loss 0.0{12 - step}", flush=True)
''').lstrip()
REWARD_MODULE = textwrap.dedent('''
    def reward(completions):
        raise RuntimeError("simulated reward server crash")
''').lstrip()


def _python(tmp: Path, files: dict[str, str]) -> str:
    """`python3 train.py` in tmp with these files: what it printed, stdout then stderr."""
    for name, text in files.items():
        (tmp / name).write_text(text)
    p = subprocess.run([sys.executable, "train.py"], capture_output=True, text=True, cwd=tmp, timeout=120)
    return p.stdout + p.stderr


def illegal_memory_access(tmp: Path) -> str:
    return _python(tmp, {"train.py": ILLEGAL})


def nccl_timeout(tmp: Path) -> str:
    (tmp / "train.py").write_text(NCCL)
    torchrun = Path(sys.executable).with_name("torchrun")
    p = subprocess.run([str(torchrun), "--nproc-per-node=2", "--master-port=0", "train.py"],
                       capture_output=True, text=True, cwd=tmp, timeout=120)
    print(f"torchrun exit code {p.returncode}")
    return p.stdout + p.stderr


def reward_exception(tmp: Path) -> str:
    return _python(tmp, {"train.py": REWARD_TRAIN, "reward.py": REWARD_MODULE})


# the command backend's runner (rlctl/backends/command/runner.py, the file a run directory gets) asked to resume from a
# step its checkpoint directory lacks (checkpoint.resume = 2; step_1 is there, complete): what it prints before it
# exits 2, never starting the trainer
RESUME_CONFIG = {"argv": ["python3", "train.py"], "cwd": ".", "metrics": {"patterns": []},
                 "checkpoint": {"dir": "ck", "pattern": "step_{step}", "marker": "done.json", "resume_args": [],
                                "resume": 2, "total_steps": 3}}


def resume_missing(tmp: Path) -> str:
    import json

    runner = Path(__file__).resolve().parents[1] / "rlctl" / "backends" / "command" / "runner.py"
    (tmp / "ck" / "step_1").mkdir(parents=True)
    (tmp / "ck" / "step_1" / "done.json").write_text('{"step": 1}')
    (tmp / "command.json").write_text(json.dumps(RESUME_CONFIG))
    p = subprocess.run([sys.executable, str(runner), "command.json"], capture_output=True, text=True, cwd=tmp,
                       timeout=120)
    print(f"command runner exit code {p.returncode}")
    return p.stdout + p.stderr


# each log this script writes (tests/fixtures/causes/<name>.log): the trainer that prints it
CASES: dict[str, Callable[[Path], str]] = {
    "illegal_memory_access": illegal_memory_access,
    "nccl_timeout": nccl_timeout,
    "reward_exception": reward_exception,
    "resume_missing": resume_missing,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"where the logs go (default {OUT})")
    ap.add_argument("--only", action="append", choices=sorted(CASES), help="write only this log (repeatable)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            (args.out / f"{name}.log").write_text(CASES[name](Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
