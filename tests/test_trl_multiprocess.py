"""TRL on several GPUs of one node, as rlctl renders it (`python3 -m torch.distributed.run --standalone
--nproc_per_node=N -m rlctl.backends.trl.runner`), played on a CPU: two processes train one model over gloo (TRL's
own `use_cpu`, set through backend.trl.extra, stands in for the GPUs this machine lacks, so the launch needs
--force). What the GPU sitting has not yet shown (docs/gpu.md): one run of two ranks logs each step once, saves each
checkpoint once, and when rank 0 is SIGKILLed mid-run (a crashed worker) torch's launcher ends the other rank, rlctl
restarts the run from its last complete checkpoint with no process of the dead attempt left, and every step lands
in the stream once.
"""

from __future__ import annotations

import json
from collections import Counter

import psutil
import pytest

from tests.test_seams_followups import wait_for

pytest.importorskip("trl")

SLOW_REWARD = '''
import time


def reward_func(completions, **kwargs):
    time.sleep(0.3)  # a verifier that takes a moment: the kill lands while the run still trains
    return [c.count("a") / max(len(c), 1) for c in completions]
'''


def _rank0(run_pid: int) -> psutil.Process | None:
    """The trainer process of rank 0 under torch's launcher (LOCAL_RANK=0 in its environment)."""
    try:
        kids = psutil.Process(run_pid).children(recursive=True)
    except psutil.Error:
        return None
    for k in kids:
        try:
            if "rlctl.backends.trl.runner" in " ".join(k.cmdline()) and k.environ().get("LOCAL_RANK") == "0":
                return k
        except psutil.Error:
            continue
    return None


@pytest.mark.slow
def test_two_ranks_log_once_and_restart_from_the_checkpoint_after_rank0_dies(user):
    work, rlctl = user
    (work / "slow_reward.py").write_text(SLOW_REWARD)
    r = rlctl("launch", "quickstart", "--detach", "--force", "--restart", "on-failure", "--max-restarts", "1",
              "--set", "train.steps=8", "--set", "checkpoint.every=2", "--set", "train.micro_batch_size=16",
              "--set", "resources.gpus_per_node=2", "--set", 'resources.gpu="H100-80GB"',
              "--set", "backend.trl.extra.use_cpu=true", "--set", 'reward.function="slow_reward.py"')
    assert r.returncode == 0, r.stdout + r.stderr
    run = next((work / "runs").glob("quickstart-*"))
    script = (run / "launch.sh").read_text()
    assert "torch.distributed.run" in script and "--nproc_per_node=2" in script, script

    def steps() -> list[int]:
        if not (run / "metrics.jsonl").is_file():
            return []
        return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()
                if "reward/mean" in x]

    def state() -> dict:
        return json.loads((run / "state.json").read_text())

    done = run / "checkpoints" / "checkpoint-2" / "trainer_state.json"
    assert wait_for(lambda: done.is_file() and max(steps(), default=0) >= 3, timeout=240), \
        (run / "stdout.log").read_text()[-3000:]
    rank0 = _rank0(state()["pid"])
    assert rank0 is not None, (run / "stdout.log").read_text()[-2000:]
    attempt1 = [p.pid for p in psutil.Process(state()["pid"]).children(recursive=True)]
    rank0.kill()
    assert wait_for(lambda: state().get("status") == "finished", timeout=300), (run / "stdout.log").read_text()[-3000:]
    st = state()
    a1, a2 = st["attempts"]
    assert a1["outcome"] == "failed" and a2["outcome"] == "finished", st["attempts"]
    assert a2["from_step"] in (2, 4, 6) and a2["from_checkpoint"].endswith(f"checkpoint-{a2['from_step']}")
    got = steps()
    assert sorted(got) == list(range(1, 9)) and max(Counter(got).values()) == 1, got
    left = []
    for pid in attempt1:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE and "rlctl.backends.trl.runner" in " ".join(p.cmdline()):
                left.append(pid)
        except psutil.Error:
            continue
    assert not left, f"attempt 1 left rank(s) {left} running"
    assert "[rank1]" in (run / "stdout.log").read_text()  # both ranks trained one model (DDP's reducer names them)
