"""Runs that survive losing their machine (issue 32, points 1-2), typed as a user types them: from a working directory
with every default (relative ./runs, no RLCTL_* variables; only HOME isolated, its ~/.ssh/config naming the hosts).

The pool is the suite's one loopback OpenSSH server under several aliases, each host a workdir of its own: `box1` is
reached through a TCP forwarder the test kills (box1 is gone for the laptop, while its run goes on and still reaches
the object store: the fencing is what stops it) and starts again later (a spot pod resumed); `box2` directly; `tiny`
has a 2 MB disk (a tmpfs), too small for the plan's checkpoints. The object store is the session's S3 server on
loopback. The trainer is one rlctl does not know (the command backend): pure Python, a step every 0.3 s (box1 is a
slower machine: 1.2 s), a checkpoint every 2 steps whose marker is written last.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlctl.core.state import read_state
from tests.conftest import run_cli
from tests.remote_sshd import Sshd, ssh_home, sshd  # noqa: F401 - the session fixture
from tests.tcp_cut import Cut

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUCKET = "rlctl-failover"
cli = run_cli

TRAINER = r'''"""A trainer rlctl does not know: a step every --step-seconds (POOL_STEP_SECONDS on a slower machine), a
checkpoint every --save-every steps (its weights, then training_info.json, the marker, last); --resume continues after
one, from its state."""
import argparse
import json
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int)
ap.add_argument("--save-every", type=int)
ap.add_argument("--out")
ap.add_argument("--resume")
ap.add_argument("--step-seconds", type=float)
a = ap.parse_args()
pace = float(os.environ.get("POOL_STEP_SECONDS") or a.step_seconds)
start, w = 1, 0.0
if a.resume:
    with open(os.path.join(a.resume, "training_info.json")) as fh:
        info = json.load(fh)
    start, w = info["step"] + 1, info["w"]
    print(f"resumed from {a.resume} at step {start}", flush=True)
for step in range(start, a.steps + 1):
    time.sleep(pace)
    w = round(w + 0.1, 6)
    print(f"step {step} | loss {1 / (1 + w):.6f} | reward {w / (1 + w):.6f}", flush=True)
    if a.save_every and step % a.save_every == 0:
        d = os.path.join(a.out, f"step_{step}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "weights.bin"), "wb") as fh:
            fh.write(os.urandom(2048))
        with open(os.path.join(d, "training_info.json"), "w") as fh:
            json.dump({"step": step, "w": w}, fh)
'''

EVENT = r'''import json, os, sys
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv, **{k: v for k, v in os.environ.items() if k.startswith("RLCTL_EVENT")
                         or k in ("RLCTL_RUN", "RLCTL_HOST", "RLCTL_FROM_HOST", "RLCTL_STEP")}}) + "\n")
'''


def recipe(world: World, *, steps: int, sync: str | None, pool: list[str], step_seconds: float = 0.3) -> str:
    cmd = ["python3", str(world.laptop / "trainer.py"), "--steps", "{steps}", "--save-every", "{checkpoint_every}",
           "--out", "{checkpoint_dir}", "--step-seconds", str(step_seconds)]
    return f"""name = "pool"
[backend]
name = "command"
[backend.command]
command = {json.dumps(cmd)}
log_pattern = 'step (?P<step>\\d+) \\| loss (?P<loss>\\S+) \\| reward (?P<reward>\\S+)'
metrics_map = {{loss = "policy_loss", reward = "reward/mean"}}
checkpoint_pattern = "step_{{step}}"
checkpoint_marker = "training_info.json"
resume_args = ["--resume", "{{path}}"]
[model]
path = "random:qwen2?hidden=64&layers=2"
dtype = "float32"
max_model_len = 128
[data]
train = "prompts.jsonl"
max_prompt_tokens = 32
[rollout]
group_size = 4
prompts_per_step = 2
max_tokens = 16
[train]
steps = {steps}
train_batch_size = 8
micro_batch_size = 4
[resources]
gpus_per_node = 0
gpu = "cpu"
[checkpoint]
dir = "training_state"
every = 2
keep_last = 2
{f'sync = "{sync}"' if sync else ""}
[logging]
rlctl_sinks = ["wandb"]
[logging.wandb]
project = "pool"
offline = true
[run]
on = {json.dumps(pool)}
failover_after_s = 3
on_event = "python3 {world.laptop / 'event.py'} {world.laptop / 'events.jsonl'}"
"""


@dataclass
class World:
    tmp: Path
    laptop: Path
    work: dict[str, Path]
    cut: Cut
    s3: object
    fs: object
    procs: list[subprocess.Popen] = field(default_factory=list)

    def watch(self, *args: str) -> tuple[subprocess.Popen, Path]:
        """`rlctl watch ...` in its own process, as a user leaves it running; its output in a file."""
        log = self.tmp / f"watch-{len(self.procs)}.log"
        p = subprocess.Popen([sys.executable, "-m", "rlctl.cli", "watch", *args], cwd=self.laptop,
                             stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p, log


def _kill_runs(workdir: Path) -> None:
    for run in (workdir / "runs").glob("*") if (workdir / "runs").is_dir() else []:
        st = read_state(run)
        for key in ("pgid", "supervisor_pid"):
            if st.get(key):
                with contextlib.suppress(OSError):
                    os.killpg(st[key], signal.SIGKILL) if key == "pgid" else os.kill(st[key], signal.SIGKILL)


@pytest.fixture(scope="module")
def world(sshd, s3_server, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("pool")
    mp = pytest.MonkeyPatch()
    homes = {n: tmp / f"{n}-home" for n in ("laptop", "box1", "box2", "tiny")}
    laptop_bin = ssh_home(sshd, homes["laptop"], ["box2", "tiny"])
    cut = Cut(sshd.port)
    cut.up()
    # box1: the same server, reached through the forwarder's port (its own known_hosts line: keys go by port)
    known = homes["laptop"] / ".ssh" / "known_hosts_box1"
    known.write_text(f"[127.0.0.1]:{cut.port} {' '.join(Path(f'{sshd.host_key}.pub').read_text().split()[:2])}\n")
    import pwd

    with (homes["laptop"] / ".ssh" / "config").open("a") as fh:
        fh.write(f"""Host box1
  HostName 127.0.0.1
  Port {cut.port}
  User {pwd.getpwuid(os.getuid()).pw_name}
  IdentityFile {sshd.root / 'home' / '.ssh' / 'id_ed25519'}
  IdentitiesOnly yes
  UserKnownHostsFile {known}
  StrictHostKeyChecking yes
  ConnectTimeout 3
  LogLevel ERROR
""")
    bins = {n: ssh_home(sshd, homes[n], []) for n in ("box1", "box2", "tiny")}
    for k in list(os.environ):
        if k.startswith("RLCTL_") or k == "XDG_CONFIG_HOME" or k.startswith("AWS_"):
            mp.delenv(k)
    mp.setenv("HOME", str(homes["laptop"]))
    mp.setenv("PATH", f"{laptop_bin}:{os.environ['PATH']}")
    for k, v in s3_server.env.items():  # the user's own object-store credentials, in the laptop's environment
        mp.setenv(k, v)
    laptop = tmp / "laptop"
    laptop.mkdir()
    mp.chdir(laptop)
    (laptop / "trainer.py").write_text(TRAINER)
    (laptop / "event.py").write_text(EVENT)
    (laptop / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    tiny = tmp / "tiny-disk"
    tiny.mkdir()
    # a 2 MB disk: smaller than the plan's checkpoints (root only, as the suite's other disk tests)
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(tiny)]).returncode == 0
    work = {"box1": tmp / "box1-work", "box2": tmp / "box2-work", "tiny": tiny / "rlctl"}
    for n in ("box1", "box2", "tiny"):
        slow = ["--env", "POOL_STEP_SECONDS=1.2"] if n == "box1" else []  # box1 is a slower machine
        r = run_cli("hosts", "add", n, n, "--workdir", str(work[n]), "--python", sys.executable,
                    "--env", f"HOME={homes[n]}", *slow,
                    "--env", f"PATH={bins[n]}:{Path(sys.executable).parent}:{SYSTEM_PATH}")
        assert r.code == 0, r.err
    w = World(tmp, laptop, work, cut, s3_server, s3_server.bucket(BUCKET, versioned=True))
    try:
        yield w
    finally:
        for p in w.procs:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
        for wd in work.values():
            _kill_runs(wd)
        cut.down()
        with contextlib.suppress(Exception):
            for alias in ("box2",):
                subprocess.run([str(laptop_bin / "ssh"), "-o", f"ControlPath=/tmp/rlctl-ssh-{os.getuid()}/%C",
                                "-O", "exit", alias], capture_output=True, timeout=10)
        subprocess.run(["umount", "-l", str(tiny)], capture_output=True)
        mp.undo()


def wait_for(pred, timeout: float = 120.0, interval: float = 0.3) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False


def stream_steps(run: Path) -> list[int]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["step"] for r in recs if "reward/mean" in r]


def rewards(run: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["reward/mean"] for r in recs if "reward/mean" in r}


def wandb_ids(run_dir: Path) -> set[str]:
    """The run ids of the W&B offline runs in a run directory (wandb/offline-run-<time>-<id>/run-<id>.wandb)."""
    files = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    return {f.name.removeprefix("run-").removesuffix(".wandb") for f in files}


def test_watch_of_a_run_that_does_not_exist_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("watch", "no-such-run")
    assert r.code == 2, r.out + r.err
    assert "no run 'no-such-run'" in r.err and "Traceback" not in r.err, r.err
    r = cli("watch", "--interval", "0")
    assert r.code == 2 and "--interval" in r.err, r.err
    (tmp_path / "runs" / "solo").mkdir(parents=True)  # a run on one machine: nothing to move it to
    (tmp_path / "runs" / "solo" / "state.json").write_text(json.dumps({"name": "solo", "status": "running"}))
    r = cli("watch", "solo")
    assert r.code == 2 and "not a pool run" in r.err and "--on HOST1,HOST2" in r.err, r.err
    r = cli("watch")  # no pool run here: nothing to wait for
    assert r.code == 0 and "no pool run" in r.out, r.out + r.err


def test_a_pool_without_checkpoint_sync_is_warned_at_preflight(world):
    (world.laptop / "nosync.toml").write_text(recipe(world, steps=4, sync=None, pool=["box1", "box2"]))
    r = cli("preflight", "nosync.toml")
    assert "placement.pool" in r.out and "checkpoint.sync" in r.out and "from step 0" in r.out, r.out
    (world.laptop / "synced.toml").write_text(recipe(world, steps=4, sync=f"s3://{BUCKET}/x", pool=["box1", "box2"]))
    r = cli("preflight", "synced.toml", "--only", "placement")
    assert "placement.pool" in r.out and "WARN" not in r.out.split("placement.pool")[0].splitlines()[-1], r.out


def test_a_run_whose_host_is_lost_finishes_on_another_host_of_the_pool(world):
    """`[run] on = ["tiny", "box1", "box2"]`: launch skips tiny (its disk cannot hold the plan's checkpoints) and
    starts on box1, which syncs its checkpoints to S3. Two `rlctl watch RUN` run; box1 becomes unreachable while its
    run goes on; the watcher holding the run is killed with -9 and started again; after `failover_after_s` one of
    them claims generation 2 and relaunches the run on box2 from the S3 copy. box1's attempt, superseded, stops
    itself (it still reaches the store) and writes nothing more; box1 comes back and the watcher says what became of
    its attempt. The run finishes on box2: steps 1..N once in the stream, one `latest` writer at a time, one W&B run
    id; status shows the lineage; on_event ran for the failover and the finish."""
    world.cut.up()  # whatever an earlier test left
    url = f"s3://{BUCKET}/pool"
    steps = 60
    (world.laptop / "pool.toml").write_text(recipe(world, steps=steps, sync=url, pool=["tiny", "box1", "box2"]))
    r = cli("launch", "pool.toml", "--detach")
    assert r.code == 0, r.out + r.err
    assert "tiny: " in r.err and "does not fit" in r.err, r.err  # why tiny was passed over, from its facts
    assert "on box1" in r.err, r.err
    name = r.out.strip().splitlines()[-1]
    local = world.laptop / "runs" / name
    there1 = Path(read_state(local)["remote_run_dir"])
    assert there1.parent == world.work["box1"] / "runs"

    from rlctl.runs.sync import read_latest

    assert wait_for(lambda: (m := read_latest(url)) is not None and m["step"] >= 4, timeout=120)
    w1, log1 = world.watch(name, "--interval", "0.5")
    w2, log2 = world.watch(name, "--interval", "0.5")
    assert wait_for(lambda: "watching" in log1.read_text() + log2.read_text(), timeout=60)
    world.cut.down()  # box1 is gone for everyone who reaches it through that port; its run goes on
    time.sleep(1.0)
    holder = w1 if "watching" in log1.read_text() else w2
    os.killpg(holder.pid, signal.SIGKILL)  # the watcher itself dies (kill -9) ...
    holder.wait()
    w3, log3 = world.watch(name, "--interval", "0.5")  # ... and is started again
    others = [p for p in (w1, w2, w3) if p is not holder]

    def on_box2() -> list[Path]:
        runs = world.work["box2"] / "runs"
        return [p for p in runs.iterdir() if (p / "state.json").is_file()] if runs.is_dir() else []

    assert wait_for(lambda: len(on_box2()) == 1 and read_state(on_box2()[0]).get("status") == "running", timeout=120)
    there2 = on_box2()[0]
    # box1's attempt, superseded, stopped itself: it reaches the store, so it learned of generation 2 there
    assert wait_for(lambda: read_state(there1).get("status") == "stopped", timeout=60), read_state(there1)
    st1 = read_state(there1)
    assert st1["outcome"] == "superseded" and st1["superseded_by"]["host"] == "box2", st1
    box1_last = max(stream_steps(there1))
    assert box1_last < steps  # it did not get to finish there
    world.cut.up()  # box1 comes back (a spot pod resumed)
    logs = [log1, log2, log3]
    assert wait_for(lambda: any("box1 is back" in lg.read_text() for lg in logs), timeout=120), \
        "\n".join(lg.read_text() for lg in logs)
    for p in others:
        assert p.wait(timeout=180) == 0, "\n".join(lg.read_text() for lg in logs)
    text = "\n".join(lg.read_text() for lg in logs)
    assert "stopped itself" in text and "superseded" in text, text

    # the run finished on box2, from the S3 copy
    st2 = read_state(there2)
    assert st2["status"] == "finished", (there2 / "stdout.log").read_text()[-2000:]
    gen = [json.loads(world.fs.cat_file(f"{BUCKET}/pool/generations/{g}.json")) for g in (1, 2)]
    assert not world.fs.exists(f"{BUCKET}/pool/generations/3.json")  # exactly one failover, by one watcher
    assert [g["host"] for g in gen] == ["box1", "box2"]
    k = gen[1]["from_step"]
    assert k is not None and k >= 4 and st2["resumed_from"] == url, st2
    assert (there2 / "stdout.log").read_text().count("resumed from") == 1
    assert f"at step {k + 1}" in (there2 / "stdout.log").read_text()
    assert read_state(local)["status"] == "finished"
    assert read_state(local)["host"] == "box2"
    # every step once in the run's stream, each the value of the lineage that continued (w grows 0.1 a step)
    assert sorted(stream_steps(local)) == list(range(1, steps + 1)), stream_steps(local)
    assert max(Counter(stream_steps(local)).values()) == 1
    for s, v in rewards(local).items():
        assert v == pytest.approx((0.1 * s) / (1 + 0.1 * s), abs=1e-5), (s, v)
    # one `latest` writer at a time: every version of `latest`, in the order written, has a generation no older
    # than the one before, and none of generation 1 was written after generation 2 was claimed
    versions = world.fs.object_version_info(f"{BUCKET}/pool/latest")[::-1]  # S3 lists the newest first
    written = [json.loads(world.fs.cat_file(f"{BUCKET}/pool/latest", version_id=v["VersionId"])) for v in versions]
    gens = [x["generation"] for x in written]
    assert gens == sorted(gens) and set(gens) == {1, 2}, written
    claimed = gen[1]["claimed_at"]
    late = [v for v, x in zip(versions, written, strict=True)
            if x["generation"] == 1 and v["LastModified"].timestamp() > claimed + 1]
    assert not late, late
    assert written[-1]["step"] == steps
    # box1 forwarded no W&B record after generation 2 was claimed (its sink offset ends before any later record)
    sent = (there1 / "metrics.jsonl").read_bytes()[:json.loads((there1 / ".sinks.json").read_text())["offset"]]
    assert all(json.loads(x).get("time", 0) <= claimed + 1 for x in sent.decode().splitlines() if x.strip())
    # one W&B run: the same id in the offline runs of both hosts, the one the laptop's record names
    wid = read_state(local)["wandb_run_id"]
    assert wandb_ids(there1) == {wid} and wandb_ids(there2) == {wid}, (wandb_ids(there1), wandb_ids(there2))
    # the lineage, as status shows it
    shown = cli("status", name)
    assert shown.code == 0, shown.err
    assert f"#2 on box2 from step {k}; box1 unreachable since" in shown.out, shown.out
    assert "#1 on box1" in shown.out and "superseded" in shown.out, shown.out
    # the attempts list agrees with the lineage: each attempt on its host, #2 from step k (it said "attempts: 1 ...
    # launch, from the start" and --json from_step null: new-user trial of pools)
    assert re.search(r"#1 \S+ launch on box1, from the start -> ", shown.out), shown.out
    assert re.search(rf"#2 \S+ failover on box2, from step {k} -> ", shown.out), shown.out
    d = json.loads(cli("status", name, "--json").out)
    assert [a["host"] for a in d["lineage"]] == ["box1", "box2"], d.get("lineage")
    assert [(a["host"], a["from_step"]) for a in d["attempts"]][:2] == [("box1", None), ("box2", k)], d["attempts"]
    assert d["attempts"][1]["from_checkpoint"], d["attempts"]
    assert d["elapsed_s"] >= st2["ended_at"] - read_state(there1)["started_at"] - 1  # from attempt #1 on, not box2's
    # on_event: once for the failover, once for the finish; the event in the environment, never a secret in argv
    events = [json.loads(x) for x in (world.laptop / "events.jsonl").read_text().splitlines()]
    assert [e["RLCTL_EVENT"] for e in events] == ["failover", "finish"], events
    assert events[0]["RLCTL_HOST"] == "box2" and events[0]["RLCTL_FROM_HOST"] == "box1"
    assert events[0]["RLCTL_STEP"] == str(k) and events[0]["RLCTL_RUN"] == name
    # every event says its generation (the finish's was empty: new-user trial of pools)
    assert [json.loads(e["RLCTL_EVENT_JSON"]).get("generation") for e in events] == [2, 2], events
    assert json.loads(events[1]["RLCTL_EVENT_JSON"])["host"] == "box2", events
    assert not any("testing" in a for e in events for a in e["argv"])  # the store's secret key stays out of argv
    # watching again is idempotent: the run has ended, nothing is launched
    again = cli("watch", name)
    assert again.code == 0 and "finished" in again.out, again.out + again.err
    assert len(on_box2()) == 1


def test_a_pool_without_sync_fails_over_from_the_laptop_copy_and_stops_the_old_attempt(world, monkeypatch):
    """No checkpoint.sync (warned at launch): the newest complete checkpoint the laptop can reach is the one `rlctl
    ckpt pull` brought here; nothing can tell box1's attempt it was superseded, so when box1 answers again the
    watcher stops it there and says so. A secret given with --set is never kept in the record: the failover reads it
    from the environment again."""
    world.cut.up()
    steps = 30
    secret = "pool-s3cr3t-value"
    monkeypatch.setenv("POOL_TOKEN", secret)  # the user's environment, where rlctl watch runs too
    (world.laptop / "nosync.toml").write_text(recipe(world, steps=steps, sync=None, pool=["box1", "box2"]))
    r = cli("launch", "nosync.toml", "--detach", "--name", "nosync", "--set", f"env.POOL_TOKEN={secret}")
    assert r.code == 0, r.out + r.err
    assert "checkpoint.sync" in r.err and "from step 0" in r.err, r.err  # the preflight warning, on the laptop
    name = r.out.strip().splitlines()[-1]
    local = world.laptop / "runs" / name
    there1 = Path(read_state(local)["remote_run_dir"])
    assert there1.parent == world.work["box1"] / "runs"
    assert wait_for(lambda: (there1 / "training_state" / "step_4" / "training_info.json").is_file(), timeout=120)
    r = cli("ckpt", "pull", name)
    assert r.code == 0, r.out + r.err
    pulled = max(int(p.name.split("_")[1]) for p in (local / "training_state").glob("step_*")
                 if (p / "training_info.json").is_file())
    w, log = world.watch(name, "--interval", "0.5")
    # the watcher's looks keep this machine's copy of the stream fresh (the stream a failover carries over)
    assert wait_for(lambda: (local / "metrics.jsonl").is_file() and max(stream_steps(local)) >= pulled, timeout=60)
    world.cut.down()
    target = world.work["box2"] / "runs" / f"{name}-g2"
    assert wait_for(lambda: read_state(target).get("status") == "running", timeout=120), log.read_text()
    assert f"from step {pulled}" in log.read_text() and "copy on this machine" in log.read_text(), log.read_text()
    st1 = read_state(there1)
    assert st1["status"] == "running"  # no store to learn it was superseded from: it goes on, unseen
    world.cut.up()
    assert wait_for(lambda: "box1 is back" in log.read_text(), timeout=120), log.read_text()
    assert "stopped its attempt #1 there" in log.read_text(), log.read_text()
    assert wait_for(lambda: read_state(there1).get("status") == "stopped", timeout=60), read_state(there1)
    assert w.wait(timeout=180) == 0, log.read_text()
    assert read_state(target)["status"] == "finished"
    assert sorted(stream_steps(local)) == list(range(1, steps + 1)), stream_steps(local)
    for f in [local / "state.json", *local.rglob("*")]:
        assert not f.is_file() or secret.encode() not in f.read_bytes(), f


def test_an_experiment_queue_moves_a_run_whose_host_is_gone(world):
    """`rlctl sweep ... --on box1,box2`: the queue follows each run by the same rule as `rlctl watch`: box1 gone, the
    variant's run moves to box2 from the store's copy, its slot with it, and the experiment finishes."""
    from rlctl.runs.sync import read_latest

    world.cut.up()
    url = f"s3://{BUCKET}/exp"
    steps = 40
    (world.laptop / "exp.toml").write_text(recipe(world, steps=steps, sync=url, pool=["box1", "box2"]))
    r = cli("sweep", "exp.toml", "--grid", "optim.lr=0.05", "--on", "box1,box2", "--name", "fo")
    assert r.code == 0, r.out + r.err
    exp = world.laptop / "runs" / "_experiments" / "fo"

    def variant() -> dict:
        q = json.loads((exp / "queue.json").read_text())
        return next(iter(q["variants"].values()), {}) if q.get("variants") else {}

    assert wait_for(lambda: (exp / "queue.json").is_file() and variant().get("state") == "running", timeout=120)
    run = Path(variant()["run_dir"])
    assert read_state(run)["host"] == "box1" and isinstance(read_state(run).get("pool"), dict)
    own = read_state(run)["pool"]["sync"]  # each variant its own store under the recipe's: never shared
    assert own == f"{url}/{run.name.rsplit('-', 2)[0]}", own  # .../fo-a0-s42
    assert wait_for(lambda: (m := read_latest(own)) is not None and m["step"] >= 4, timeout=120)
    world.cut.down()
    try:
        assert wait_for(lambda: read_state(run).get("host") == "box2", timeout=120), (exp / "queue.log").read_text()
    finally:
        world.cut.up()
    assert wait_for(lambda: json.loads((exp / "queue.json").read_text()).get("state") == "finished", timeout=180), \
        (exp / "queue.log").read_text()
    v = variant()
    assert v["status"] == "finished" and v["slot"]["host"] == "box2", v
    assert [e["host"] for e in read_state(run)["lineage"]] == ["box1", "box2"]
    assert sorted(stream_steps(run)) == list(range(1, steps + 1)), stream_steps(run)
    assert "#2 on box2 from step" in (exp / "queue.log").read_text()


# ---- a host that answers while the GPUs its run was placed on are gone (issue 32, point 2) ----------------------
H100_UUIDS = ("GPU-c5460912-01ff-30c7-edc2-be2d72764fd0", "GPU-61affa47-1d8d-d723-69a1-4d6048fd4c8d")
# what the real tool printed on a 2 x H100 pod (docs/gpu/gpu_placement_h100x2.json: nvidia_smi_raw, nvidia_smi_uuid_raw)
SMI_QUERY = ("0, NVIDIA H100 80GB HBM3, 81559, 0, 81079, 580.159.04\n"
             "1, NVIDIA H100 80GB HBM3, 81559, 0, 81079, 580.159.04\n")
SMI_UUIDS = f"0, {H100_UUIDS[0]}, 00000000:00:06.0\n1, {H100_UUIDS[1]}, 00000000:00:07.0\n"
SMI_LIST = (f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {H100_UUIDS[0]})\n"
            f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {H100_UUIDS[1]})\n")
# what it prints (on stdout, exit 15) once a GPU fell off the bus (Xid 79), and when the driver sees none
OFF_THE_BUS = "Unable to determine the device handle for GPU0000:00:07.0: Unknown Error\n"
NO_DEVICES = "No devices were found\n"


def stand_in_smi(bin_dir: Path, gone_flag: Path) -> None:
    """`nvidia-smi` standing in for the GPU driver only (no GPU here): the 2 x H100 pod's answers, and once
    `gone_flag` exists, what the real tool prints when GPU 1 fell off the bus."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text(f"""#!/bin/sh
if [ -e {gone_flag} ]; then printf '%s' '{OFF_THE_BUS}'; exit 15; fi
case "$*" in
  *--query-gpu=index,uuid,pci.bus_id*) printf '%s' '{SMI_UUIDS}' ;;
  *--query-gpu=index,name,memory.total*) printf '%s' '{SMI_QUERY}' ;;
  -L*) printf '%s' '{SMI_LIST}' ;;
  *) echo "stand-in nvidia-smi: $* not recorded" >&2; exit 2 ;;
esac
""")
    exe.chmod(0o755)


def test_which_gpus_an_attempt_was_placed_on():
    """At launch on a host: the GPUs the run takes (CUDA_VISIBLE_DEVICES of its environment, by index or UUID, else
    the first gpus_per_node), as nvidia-smi listed them then; none for a CPU run or a host without GPUs."""
    from rlctl.executors.host_gpus import parse, placed

    rows = parse(SMI_UUIDS)
    assert [r["uuid"] for r in rows] == list(H100_UUIDS) and rows[1]["bus_id"] == "00000000:00:07.0"
    assert placed(0, None, rows) == []  # a CPU run on a GPU host: its GPUs cannot be lost
    assert placed(0, "", rows) == [] and placed(2, "", rows) == []  # CUDA_VISIBLE_DEVICES="" hides every GPU
    assert placed(0, "1", rows) == [rows[1]]  # a trainer rlctl does not model, placed on GPU 1 by the user
    assert placed(2, None, rows) == rows
    assert placed(1, H100_UUIDS[1][:12], rows) == [rows[1]]  # a UUID prefix, as CUDA accepts it
    assert placed(1, "0", []) == []  # a host that never had GPUs (CI): nothing recorded, never judged


def test_which_gpus_are_gone_from_what_nvidia_smi_says():
    from rlctl.executors.host_gpus import gone, parse

    rows = parse(SMI_UUIDS)
    assert gone(rows, SMI_UUIDS, 0) is None
    assert gone([], OFF_THE_BUS, 15) is None  # nothing recorded at launch: never judged
    lost = gone([rows[1]], OFF_THE_BUS, 15)
    assert [g["uuid"] for g in lost["missing"]] == [H100_UUIDS[1]] and "Unable to determine" in lost["said"]
    assert gone([rows[0]], SMI_UUIDS.splitlines()[0] + "\n" + OFF_THE_BUS, 15) is None  # its GPU still answers
    lost = gone(rows, NO_DEVICES, 6)  # a pod whose GPUs were taken back while the container lives
    assert len(lost["missing"]) == 2 and lost["said"] == "No devices were found"
    # fewer GPUs listed than at launch (exit 0): the one whose UUID is not there, whatever index the rest now have
    lost = gone(rows, f"0, {H100_UUIDS[1]}, 00000000:00:07.0\n", 0)
    assert [g["index"] for g in lost["missing"]] == [0]
    assert gone(rows, "", None) is None  # nvidia-smi did not answer in time: not evidence either way
    lost = gone(rows, "nvidia-smi: not found on PATH", 127)  # nvidia-smi itself is gone (the driver's mount with it)
    assert len(lost["missing"]) == 2 and "not found" in lost["said"]


def test_a_run_whose_gpus_are_gone_while_its_host_answers_fails_over(world, sshd):  # noqa: F811
    """A pool run on `gpuA` (a pod whose GPU 1 is the run's: CUDA_VISIBLE_DEVICES=1 there) syncs its checkpoints to
    S3; GPU 1 falls off the bus while the host answers and the run's processes live (the stand-in nvidia-smi, which
    stands in for the GPU driver only, from then on prints what the real one prints). `rlctl watch` judges the
    attempt gone, naming the GPU and what nvidia-smi said, stops its processes there and moves the run to box2 from
    the S3 copy; the stuck attempt writes no `latest` after the claim; every step once; status says why."""
    from rlctl.runs.sync import read_latest
    from tests.remote_sshd import ssh_home

    world.cut.up()
    home = world.tmp / "gpuA-home"
    smi_bin = world.tmp / "gpuA-driver"
    flag = world.tmp / "gpuA-gpu1-off-the-bus"
    stand_in_smi(smi_bin, flag)
    bin_dir = ssh_home(sshd, home, [])
    work = world.tmp / "gpuA-work"
    r = cli("hosts", "add", "gpuA", "box2", "--workdir", str(work), "--python", sys.executable,
            "--env", f"HOME={home}", "--env", "CUDA_VISIBLE_DEVICES=1", "--env", "POOL_STEP_SECONDS=0.8",
            "--env", f"PATH={smi_bin}:{bin_dir}:{Path(sys.executable).parent}:{SYSTEM_PATH}")
    assert r.code == 0, r.err
    url = f"s3://{BUCKET}/gpus"
    steps = 40
    (world.laptop / "gpus.toml").write_text(recipe(world, steps=steps, sync=url, pool=["gpuA", "box2"]))
    r = cli("launch", "gpus.toml", "--detach", "--name", "gpus")
    assert r.code == 0, r.out + r.err
    assert "on gpuA" in r.err, r.err
    name = r.out.strip().splitlines()[-1]
    local = world.laptop / "runs" / name
    there1 = Path(read_state(local)["remote_run_dir"])
    assert there1.parent == work / "runs"
    try:
        assert wait_for(lambda: (m := read_latest(url)) is not None and m["step"] >= 4, timeout=60)
        w, log = world.watch(name, "--interval", "0.5")
        assert wait_for(lambda: "watching" in log.read_text(), timeout=60), log.read_text()
        flag.touch()  # GPU 1 falls off the bus; the host answers, the run's processes live
        target = world.work["box2"] / "runs" / f"{name}-g2"
        assert w.wait(timeout=120) == 0, log.read_text()
    finally:
        _kill_runs(work)
    text = log.read_text()
    assert "stopped its attempt #1 there" in text, text
    st1 = read_state(there1)
    assert st1["status"] == "stopped", st1
    import psutil

    assert not psutil.pid_exists(st1["pgid"]) or psutil.Process(st1["pgid"]).status() == psutil.STATUS_ZOMBIE
    assert read_state(target)["status"] == "finished"
    # the GPU the run was placed on at launch on gpuA (CUDA_VISIBLE_DEVICES=1 there); box2 has none: nothing recorded
    assert [g["uuid"] for g in json.loads((there1 / "host_gpus.json").read_text())["gpus"]] == [H100_UUIDS[1]]
    assert not (target / "host_gpus.json").exists()
    gen = json.loads(world.fs.cat_file(f"{BUCKET}/gpus/generations/2.json"))
    k = gen["from_step"]
    assert gen["host"] == "box2" and k is not None and k >= 4 and read_state(target)["resumed_from"] == url
    assert sorted(stream_steps(local)) == list(range(1, steps + 1)), stream_steps(local)
    versions = world.fs.object_version_info(f"{BUCKET}/gpus/latest")
    written = [json.loads(world.fs.cat_file(f"{BUCKET}/gpus/latest", version_id=v["VersionId"])) for v in versions]
    late = [v for v, x in zip(versions, written, strict=True)
            if x["generation"] == 1 and v["LastModified"].timestamp() > gen["claimed_at"] + 1]
    assert not late, late
    shown = cli("status", name)
    assert shown.code == 0, shown.err
    # gpuA answered: the lineage says the run was lost there, not that the host was unreachable (issue 32 trial)
    assert f"#2 on box2 from step {k}; gpuA answered without the run since" in shown.out, shown.out
    assert f"its GPUs gone: GPU 1 ({H100_UUIDS[1]}" in shown.out, shown.out
    assert "Unable to determine the device handle for GPU0000:00:07.0: Unknown Error" in shown.out, shown.out


def test_a_pool_run_syncs_to_a_local_store_and_a_resume_reads_from_it(world):
    """`checkpoint.sync = "file:///..."` (a directory, maybe on an NFS mount, that does not exist yet): fsspec's
    local filesystem creates no parent directories, so the launch failed on generations/1.json and, once the user
    made that, every upload failed (`sync_error` in rlctl-events.jsonl, the run 'finished' with nothing synced).
    The store now holds the checkpoints and `latest`, and a run resumed from it starts after its step."""
    from rlctl.runs.sync import read_latest

    world.cut.up()
    store = world.tmp / "nfs" / "store"  # not there: the user names it, rlctl makes it
    url = f"file://{store}"
    (world.laptop / "local.toml").write_text(recipe(world, steps=4, sync=url, pool=["box2", "box1"]))
    r = cli("launch", "local.toml", "--detach", "--name", "localsync")
    assert r.code == 0, r.out + r.err
    there = Path(read_state(world.laptop / "runs" / r.out.strip().splitlines()[-1])["remote_run_dir"])
    assert wait_for(lambda: read_state(there).get("status") in ("finished", "failed"), timeout=120)
    assert read_state(there)["status"] == "finished", (there / "stdout.log").read_text()[-2000:]
    events = (there / "rlctl-events.jsonl").read_text() if (there / "rlctl-events.jsonl").is_file() else ""
    assert "sync_error" not in events, events
    m = read_latest(url)
    assert m is not None and m["step"] == 4, m
    assert (store / "latest").is_file() and (store / "generations" / "1.json").is_file()
    assert all((store / m["prefix"] / "checkpoints" / f).stat().st_size == n for f, n in m["files"].items())
    # a new run resumes from the local store (its own store beside it: one run per store)
    (world.laptop / "more.toml").write_text(recipe(world, steps=6, sync=f"file://{store}-2", pool=["box2"]))
    r = cli("launch", "more.toml", "--detach", "--name", "more", "--resume", url)
    assert r.code == 0, r.out + r.err
    there2 = Path(read_state(world.laptop / "runs" / r.out.strip().splitlines()[-1])["remote_run_dir"])
    assert wait_for(lambda: read_state(there2).get("status") in ("finished", "failed"), timeout=120)
    log = (there2 / "stdout.log").read_text()
    assert read_state(there2)["status"] == "finished" and "at step 5" in log, log[-2000:]
    assert read_latest(f"file://{store}-2")["step"] == 6


def test_every_on_event_says_its_generation(tmp_path):
    """The finish event's RLCTL_GENERATION was empty (the failover's was 2); docs/resilience.md says every event has
    it: failover, death and finish each carry the generation (and host) of the lineage's newest attempt."""
    from rlctl.core.state import write_state
    from rlctl.runs import on_event
    from rlctl.runs.failover import Failover

    log = tmp_path / "events.txt"
    script = tmp_path / "ev.py"
    script.write_text("import os, sys\nopen(sys.argv[1], 'a').write(os.environ['RLCTL_EVENT'] + ' ' + "
                      "os.environ.get('RLCTL_GENERATION', '') + ' ' + os.environ.get('RLCTL_HOST', '') + '\\n')\n")
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    write_state(run, name="r", status="finished", host="box2",
                pool={"hosts": ["box1", "box2"], "on_event": f"{sys.executable} {script} {log}"},
                lineage=[{"generation": 1, "host": "box1"}, {"generation": 2, "host": "box2"}])
    f = Failover(run)
    st = read_state(run)
    f._ended(st, "finished")
    f._fire(read_state(run), "failover", "failover:2", host="box2", from_host="box1", step=4, generation=2)
    f._ended({**read_state(run), "events_fired": []}, "failed")
    on_event.wait_all(60)
    assert sorted(log.read_text().splitlines()) == ["death 2 box2", "failover 2 box2", "finish 2 box2"]
