"""Disk pressure (issue 32.4): before a checkpoint would not fit, rlctl prunes beyond keep_last — never the best-eval
checkpoint, never the newest synced one — and only if it still would not fit stops the run after its last complete
checkpoint, never leaving a half-written checkpoint as the newest; `[checkpoint] min_free_gb` sets the floor (seed
004's cleanup daemon as one line of recipe).

Real small tmpfs mounts (root: `mount -t tmpfs -o size=...`, unmounted in teardown) hold the run; a tiny trainer
writes real checkpoints on them; someone else's data fills the disk for real.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlctl.core.state import read_state, write_state
from rlctl.runs.status import state_cell
from tests.conftest import run_cli

cli = run_cli
KB = 1024


@pytest.fixture
def tmpfs(tmp_path):
    """A small filesystem of its own (a tmpfs): what fills it is only what the test and the run write."""
    mounts: list[Path] = []

    def mount(size_kb: int) -> Path:
        d = tmp_path / f"disk{len(mounts)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(d)], capture_output=True,
                           text=True)
        assert r.returncode == 0, f"mount a {size_kb} KB tmpfs (these tests run as root): {r.stderr}"
        mounts.append(d)
        return d

    yield mount
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def ckpt(root: Path, step: int, size: int, complete: bool = True) -> None:
    """A checkpoint of the tiny trainer's layout: step_N/weights.bin, `done` written last."""
    d = root / f"step_{step}"
    d.mkdir(parents=True)
    (d / "weights.bin").write_bytes(os.urandom(size))
    if complete:
        (d / "done").touch()


RUN_RECIPE = """name = "tiny"
[backend]
name = "command"
[backend.command]
command = {cmd}
log_pattern = 'step (?P<step>\\d+) reward (?P<reward>\\S+) acc (?P<acc>\\S+)'
metrics_map = {{reward = "reward/mean", acc = "eval/probe/greedy_pass@1"}}
checkpoint_pattern = "step_{{step}}"
checkpoint_marker = "done"
resume_args = ["--resume", "{{step}}"]
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
gpus_per_node = 0
gpu = "cpu"
[checkpoint]
every = 2
keep_last = {keep}
min_free_gb = {floor_gb}
"""

TRAINER = '''"""A tiny trainer: each step logs its reward and a held-out accuracy (best at step 2); every 2 steps it
saves a checkpoint in four pieces (a save takes a while), `done` last."""
import os, sys, time
from pathlib import Path

ckdir, steps, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
start = int(sys.argv[sys.argv.index("--resume") + 1]) + 1 if "--resume" in sys.argv else 1
for step in range(start, steps + 1):
    time.sleep(0.25)
    print(f"step {step} reward {0.1 * step:.2f} acc {0.9 if step == 2 else 0.3:.2f}", flush=True)
    if step % 2 == 0:
        d = ckdir / f"step_{step}"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "weights.bin", "wb") as fh:
            for _ in range(4):
                fh.write(os.urandom(size // 4))
                fh.flush()
                time.sleep(0.05)
        (d / "done").touch()
'''


def _said(run: Path) -> str:
    out = []
    for f in ("state.json", "stdout.log", "supervisor.log", "rlctl-events.jsonl"):
        with contextlib.suppress(OSError):
            out.append(f"--- {f}\n" + (run / f).read_text()[-3000:])
    return "\n".join(out)


def test_the_rule_prunes_beyond_keep_last_but_never_the_best_or_the_newest_synced(tmpfs):
    """On a 2 MB disk with checkpoints 2..12 of 150 KB (step 4 the best by its eval, step 6 the newest synced): a
    next checkpoint that would not fit beside min_free_gb prunes the oldest beyond keep_last, keeping 4 and 6; once
    pruning cannot make room, the run must stop, after step 12 (a half-written step 14 is removed)."""
    from rlctl.runs import disk_pressure
    from rlctl.runs.checkpoints import find_checkpoints

    disk = tmpfs(2048)
    run = disk / "runs" / "tiny-20261127-000000"
    root = run / "checkpoints"
    (run / "checkpoints").mkdir(parents=True)
    (run / "recipe.toml").write_text('[backend]\nname = "command"\n')
    (root / ".rlctl-checkpoints.json").write_text(json.dumps({"pattern": "step_{step}", "marker": "done"}))
    for step in range(2, 13, 2):
        ckpt(root, step, 150 * KB)
    write_state(run, backend="command", best_checkpoint={"step": 4, "key": "eval/probe/greedy_pass@1", "value": 0.9})
    (run / ".sync.json").write_text(json.dumps({"url": "s3://b/tiny", "steps": [2, 4, 6], "latest": 6}))
    spec = {"backend": "command", "keep_last": 2, "checkpoint_dir": "checkpoints"}
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize

    # the next checkpoint (150 KB) + a floor that leaves it just short: the two oldest beyond keep_last go
    spec["min_free_gb"] = (free - 150 * KB + 200 * KB) / 1e9
    assert disk_pressure.check(run, spec) is None
    assert [c.step for c in find_checkpoints("command", run)] == [4, 6, 10, 12]  # 2 and 8 pruned
    events = [json.loads(x) for x in (run / "rlctl-events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "disk_pressure" and events[-1]["pruned"] == [2, 8], events

    # a floor no pruning can meet: stop after step 12; a save of step 14 that had begun is removed then
    ckpt(root, 14, 60 * KB, complete=False)
    spec["min_free_gb"] = 10.0
    short = disk_pressure.check(run, spec)
    assert short is not None and short.newest == 12 and [c.step for c in short.saving] == [14]
    assert short.kept == {"newest synced": 6, "best": 4}, short.kept
    msg = short.message()
    took = disk_pressure.on_disk(find_checkpoints("command", run)[-2])  # step 12, as the filesystem holds it
    assert 150 * KB <= took < 160 * KB
    assert f"the next checkpoint (~{took / 1e3:.0f} kB, as large as the last) + checkpoint.min_free_gb 10.0 GB " \
           "would not fit" in msg, msg
    assert "kept the newest synced (step 6), the best (step 4); stopped after checkpoint step 12" in msg, msg
    assert disk_pressure.remove_partial(run, spec) == [14]
    assert [c.step for c in find_checkpoints("command", run)] == [4, 6, 10, 12]
    assert all(c.complete for c in find_checkpoints("command", run))


def test_a_run_whose_disk_fills_stops_after_its_last_complete_checkpoint_and_resumes(tmpfs, tmp_path, monkeypatch):
    """The whole working directory on a 4 MB disk. At step 4 someone else's data leaves too little room for the
    next checkpoint beside min_free_gb (500 KB): nothing beyond keep_last is left to prune, so rlctl stops the run
    after its last complete checkpoint — never ENOSPC, no half-written checkpoint left as the newest — and says so
    (status, status RUN, --json). Once there is room, `rlctl supervise RUN` picks it up from that checkpoint and it
    finishes, every step in the stream once."""
    for k in list(os.environ):
        if k.startswith("RLCTL_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    disk = tmpfs(4096)
    monkeypatch.chdir(disk)
    (disk / "prompts.jsonl").write_text('{"input": "a"}\n')
    trainer = tmp_path / "trainer.py"  # the code lives elsewhere; only the run is on the small disk
    trainer.write_text(TRAINER)
    size = 300 * KB
    cmd = json.dumps([sys.executable, str(trainer), "{checkpoint_dir}", "{steps}", str(size)])
    (disk / "tiny.toml").write_text(RUN_RECIPE.format(cmd=cmd, steps=12, keep=2, floor_gb=0.0005))

    filler = tmp_path / "filler"

    def fill_at_step_4() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            logs = list((disk / "runs").glob("*/stdout.log")) if (disk / "runs").is_dir() else []
            if logs and "step 4 reward" in logs[0].read_text():
                st = os.statvfs(disk)
                with open(disk / "other-data.bin", "wb") as fh:  # someone else's files
                    os.posix_fallocate(fh.fileno(), 0, st.f_bavail * st.f_frsize - 700 * KB)
                filler.touch()
                return
            time.sleep(0.02)

    t = threading.Thread(target=fill_at_step_4, daemon=True)
    t.start()
    # the user's `rlctl launch` is a process of its own (whose supervisor is gone once it returns)
    r = subprocess.run([sys.executable, "-m", "rlctl.cli", "launch", "tiny.toml"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    t.join(5)
    assert filler.exists(), "the disk was never filled"
    run = next((disk / "runs").iterdir())
    st = read_state(run)
    assert st["status"] == "stopped" and st["stopped_by"]["rule"] == "checkpoint.min_free_gb", (st, r.stderr)
    log = (run / "stdout.log").read_text()
    assert "No space left" not in log and "Errno 28" not in log, log
    from rlctl.runs.checkpoints import find_checkpoints

    ckpts = find_checkpoints("command", run)
    assert ckpts and all(c.complete for c in ckpts), ckpts  # the newest on disk is a complete one
    newest = ckpts[-1].step
    assert 2 in [c.step for c in ckpts]  # the best by its eval (step 2) is never pruned
    want = f"stopped after checkpoint step {newest}"
    d = json.loads(cli("status", run.name, "--json").out)
    assert d["status"] == "stopped" and want in d["reason"] and d["cause"]["what"] == "disk pressure", d
    assert d["reason"].startswith(f"out of disk on {socket.gethostname()}: the next checkpoint (~"), d["reason"]
    assert "+ checkpoint.min_free_gb 500 kB would not fit" in d["reason"], d["reason"]
    assert state_cell(d) in cli("status").out  # the table's cell (cut short); the whole reason in status RUN
    shown = cli("status", run.name).out
    assert "stopped by checkpoint.min_free_gb:" in shown and "fix: free space there" in shown, shown
    assert "disk:" in cli("logs", run.name, "--component", "supervisor").out

    os.unlink(disk / "other-data.bin")  # room again
    r = cli("supervise", run.name)
    assert r.code == 0, r.out + r.err
    st = read_state(run)
    assert st["status"] == "finished" and st["attempts"][-1]["from_step"] == newest, st["attempts"]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if "reward/mean" in x]
    assert steps == list(range(1, 13)), steps
    with contextlib.suppress(OSError):
        os.unlink(filler)


def test_a_disk_filled_during_a_save_fails_saying_which_and_leaves_no_half_checkpoint(tmpfs, tmp_path, monkeypatch):
    """Someone else's data fills the disk while step 6's checkpoint is being written (between its pieces): the
    trainer dies of ENOSPC before rlctl could stop it. The run is "failed: disk full on <this machine> while saving
    step_6" (status, --json) — or, when rlctl's look at the disk comes first, "stopped: out of disk ... stopped after
    checkpoint step 4" — and that half-written checkpoint is gone: the newest on disk is step 4, complete."""
    for k in list(os.environ):
        if k.startswith("RLCTL_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    disk = tmpfs(2048)
    monkeypatch.chdir(disk)
    (disk / "prompts.jsonl").write_text('{"input": "a"}\n')
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    cmd = json.dumps([sys.executable, str(trainer), "{checkpoint_dir}", "{steps}", str(200 * KB)])
    (disk / "tiny.toml").write_text(RUN_RECIPE.format(cmd=cmd, steps=8, keep=1, floor_gb=0))

    def fill_during_step_6_save() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            w = list(disk.glob("runs/*/checkpoints/step_6/weights.bin"))
            if w and w[0].stat().st_size > 0:
                with contextlib.suppress(OSError), open(disk / "other-data.bin", "wb") as fh:
                    while True:  # until ENOSPC: the disk is full
                        fh.write(b"\0" * 4096)
                        fh.flush()
                return
            time.sleep(0.005)

    t = threading.Thread(target=fill_during_step_6_save, daemon=True)
    t.start()
    r = subprocess.run([sys.executable, "-m", "rlctl.cli", "launch", "tiny.toml"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    t.join(5)
    assert (disk / "runs").is_dir(), r.stdout + r.stderr
    run = next((disk / "runs").iterdir())
    host = socket.gethostname()
    d = json.loads(cli("status", run.name, "--json").out)
    if d["status"] == "failed":  # the trainer met ENOSPC first (its log says so): it died of the full disk
        want = f"disk full on {host} while saving step_6"
        assert d["reason"] == want, (d, _said(run))
        assert any("No space left on device" in e for e in d["cause"]["evidence"]), d["cause"]
    else:  # rlctl's look at the disk (every 2 s) came first: it stopped the run after its last complete checkpoint
        want = f"out of disk on {host}: the next checkpoint"
        assert d["status"] == "stopped" and d["reason"].startswith(want), (d, _said(run))
        assert "stopped after checkpoint step 4" in d["reason"], d
    from rlctl.runs.checkpoints import find_checkpoints

    ckpts = find_checkpoints("command", run)
    assert [c.step for c in ckpts] == [2, 4] and all(c.complete for c in ckpts), ckpts
    assert state_cell(d) in cli("status").out and want in cli("status", run.name).out


def test_preflight_counts_min_free_gb_and_resume_says_a_run_stopped_for_disk_would_stop_again(user):
    """The quickstart with `checkpoint.min_free_gb` larger than the free disk: preflight said `OK disk.checkpoints`
    and the run stopped one second after its start (out of disk: the supervisor's rule counts min_free_gb); then
    `rlctl resume RUN` printed "RUN: stopping (attempt 2)" and it stopped again. Preflight now applies the same rule
    (FAIL, the fix names the key); resume refuses while the rule would stop it again, saying why."""
    import shutil

    work, rlctl = user
    shutil.copytree(Path(__file__).resolve().parents[1] / "recipes", work / "recipes")
    big = ["--set", "checkpoint.min_free_gb=900000", "--set", "checkpoint.every=3", "--set", "checkpoint.keep_last=2"]
    r = rlctl("preflight", "recipes/quickstart.toml", *big)
    line = next((x for x in r.stdout.splitlines() if "disk.checkpoints" in x), "")
    assert r.returncode != 0 and "FAIL" in line and "checkpoint.min_free_gb" in r.stdout, r.stdout + r.stderr
    r = rlctl("launch", "recipes/quickstart.toml", *big, "--force", "--detach", "--name", "full")
    assert r.returncode == 0, r.stdout + r.stderr
    run = next((work / "runs").glob("full*"))
    deadline = time.time() + 120
    while time.time() < deadline and read_state(run).get("status") not in ("stopped", "failed", "finished"):
        time.sleep(0.2)
    st = read_state(run)
    assert st["status"] == "stopped" and st["stopped_by"]["rule"] == "checkpoint.min_free_gb", st
    r = rlctl("resume", run.name)
    assert r.returncode == 2 and "would stop again" in r.stderr and "checkpoint.min_free_gb" in r.stderr, \
        r.stdout + r.stderr
    assert "Traceback" not in r.stderr and read_state(run).get("attempt") == st.get("attempt")
