"""Experiments with real processes: sweeps and A/B tests queued and placed, every variant preflighted first, the
queue surviving kill -9 and resumed without relaunching what ran, a variant killed mid-run restarted by its own
policy, `compare` finding a real learning-rate effect and no difference between identical arms; the status index
never broken by damaged or foreign directories.

The lr effect, identical arms, the killed variant, kill -9 of the queue and the 2x2x2 grid run the CPU quickstart
(real GRPO with TRL). Placement (SSH hosts on a loopback sshd, a Ray head on loopback) and stop/resume use a real
learner that needs no torch (tests/fixtures/experiments/bandit.py, REINFORCE on a 4-armed bandit, through the command
backend): what they test is where runs go, not what they learn."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.core.state import read_state
from tests.conftest import RECIPES, ROOT, run_cli
from tests.remote_sshd import sshd  # noqa: F401 - the session fixture (one sshd per test session)

BANDIT = ROOT / "tests" / "fixtures" / "experiments" / "bandit.py"


def bandit_recipe(steps: int = 30, lr: float = 0.5, seed: int = 42, sleep: float = 0.0, restart: str = "never") -> str:
    cmd = [sys.executable, str(BANDIT), "--lr", "{lr}", "--seed", "{seed}", "--steps", "{steps}", "--sleep",
           str(sleep)]
    return f"""
name = "bandit"
[backend]
name = "command"
[backend.command]
command = {json.dumps(cmd)}
log_pattern = 'step (?P<step>\\d+) \\| reward (?P<reward>\\S+)'
metrics_map = {{reward = "reward/mean"}}
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
seed = {seed}
[optim]
lr = {lr}
[resources]
gpus_per_node = 0
gpu = "cpu"
[run]
restart = "{restart}"
max_restarts = 2
"""


@pytest.fixture
def w(tmp_path, monkeypatch):
    (tmp_path / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    runs = tmp_path / "runs"
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(runs))
    monkeypatch.setenv("RLCTL_CONFIG_DIR", str(tmp_path / "config"))  # no host of the user's (rlctl hosts)
    monkeypatch.chdir(tmp_path)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    yield {"dir": tmp_path, "runs": runs, "env": env}
    _kill_all(runs)


def _kill_all(runs: Path) -> None:
    """What a failed test left running goes: queues, supervisors, trainers (checked by start time, never a pid that
    was reused by someone else's process)."""
    from rlctl.runs.state import process_alive

    exps = runs / "_experiments"
    for q in exps.glob("*/queue.json") if exps.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            rec = json.loads(q.read_text())
            if process_alive(rec["pid"], rec.get("create_time")):
                os.kill(rec["pid"], signal.SIGKILL)
    for run in runs.glob("*/state.json") if runs.is_dir() else []:
        st = read_state(run.parent)
        if process_alive(st.get("supervisor_pid"), st.get("supervisor_create_time")):
            os.kill(st["supervisor_pid"], signal.SIGKILL)
        ref = (st.get("handle") or {}).get("ref", {})
        if process_alive(ref.get("pgid"), ref.get("create_time")):
            with contextlib.suppress(OSError):
                os.killpg(ref["pgid"], signal.SIGKILL)
        for pids in run.parent.glob("attempts/*/pids.json"):  # those that left the attempt's group (an engine)
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                for pid, rec in json.loads(pids.read_text()).items():
                    if process_alive(int(pid), rec.get("create_time")):
                        os.kill(int(pid), signal.SIGKILL)
        for adir in run.parent.glob("attempts/*"):  # and those only the attempt's mark in their environment finds
            if adir.name.isdigit():
                from rlctl.executors.attempt_procs import mark_value, marked

                for proc, _cmd in marked(mark_value(run.parent, int(adir.name))):
                    with contextlib.suppress(OSError, ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)


def rlctl(w, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], cwd=w["dir"], env=w["env"],
                          capture_output=True, text=True, timeout=timeout)


def cli(w, *args):
    return run_cli(*args, cwd=w["dir"])


def wait_for(pred, timeout=120.0, every=0.3) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(every)
    return False


def queue_record(w, exp: str) -> dict:
    try:
        return json.loads((w["runs"] / "_experiments" / exp / "queue.json").read_text())
    except (OSError, ValueError):
        return {}


def run_dirs(w, prefix: str) -> list[Path]:
    return sorted(p for p in w["runs"].glob(f"{prefix}*") if (p / "state.json").is_file())


# -- fast: declaring variants, refusing bad ones -------------------------------------------------------------------

def test_a_variant_that_fails_preflight_is_reported_with_its_settings_and_nothing_launches(w):
    (w["dir"] / "b.toml").write_text(bandit_recipe())
    r = cli(w, "sweep", "b.toml", "--grid", "optim.lr=0.1,0.5", "--grid", "rollout.max_tokens=16,4096", "--name", "x")
    assert r.code == 1, r.err
    assert "variant(s) fail preflight; nothing launched" in r.err
    assert "a1-s42  (optim.lr=0.1 rollout.max_tokens=4096 train.seed=42)" in r.err, r.err
    assert not (w["runs"] / "_experiments" / "x").exists() and not run_dirs(w, "x-")


def test_bad_grids_and_options_are_usage_errors(w):
    (w["dir"] / "b.toml").write_text(bandit_recipe())
    for args, msg in [(["--grid", "optim.lr"], "expected KEY=V1,V2"),
                      (["--grid", "train.seed=1,2"], "seeds are not a grid axis"),
                      (["--grid", "optim.lr=1,1"], "repeated"),
                      (["--grid", "optim.lrr=0.1,0.2"], "optim.lrr"),
                      ([], "nothing to sweep"),
                      (["--grid", "optim.lr=0.1,0.2", "--on", "gpu-box-1,gpu-box-2"], "no host 'gpu-box-1'")]:
        r = cli(w, "sweep", "b.toml", *args, "--name", "bad")
        assert r.code == 2 and msg in r.err and "Traceback" not in r.err, (args, r.err)


def test_sweep_table_in_the_recipe_and_the_manifest(w, monkeypatch):
    text = bandit_recipe(steps=3) + '\n[sweep]\ngrid = { "optim.lr" = [0.1, 0.3], "algorithm.eps_clip" = [0.1, 0.2] }\n'
    (w["dir"] / "s.toml").write_text(text)
    monkeypatch.setattr("rlctl.experiments.queue.start_detached", lambda d: 12345)  # the manifest only
    r = cli(w, "sweep", "s.toml", "--seeds", "2", "--name", "tbl")
    assert r.code == 0, r.err
    m = json.loads((w["runs"] / "_experiments" / "tbl" / "manifest.json").read_text())
    assert [a["label"] for a in m["arms"]] == [f"optim.lr={lr} algorithm.eps_clip={c}" for lr in (0.1, 0.3)
                                               for c in (0.1, 0.2)]
    assert m["arms"][0]["diff"] == {"optim.lr": [0.5, 0.1], "algorithm.eps_clip": [0.2, 0.1]}
    assert len(m["variants"]) == 8 and {v["seed"] for v in m["variants"]} == {42, 43}
    assert m["placement"]["parallel"] == 1 and "git" in m


def test_gpu_slots_never_share_a_gpu():
    from rlctl.experiments.queue import Capacity

    cap = Capacity.from_placement({"parallel": 4, "gpu_ids": [0, 1, 2, 3]})
    a, b = cap.take("a", 2), cap.take("b", 1)
    c = cap.take("c", 2)  # one GPU left: waits
    assert a.gpus == (0, 1) and b.gpus == (2,) and c is None
    cap.free("a")
    c = cap.take("c", 2)
    assert c.gpus == (0, 1) and cap.take("d", 1).gpus == (3,) and cap.take("e", 1) is None
    hosts = Capacity.from_placement({"parallel": 1, "hosts": ["h1", "h2"], "executor": "ssh"})
    assert [hosts.take(v, 8).host for v in "xy"] == ["h1", "h2"] and hosts.take("z", 8) is None


def test_gpu_slots_have_the_memory_the_plan_says():
    """A GPU another process half fills is not given to a run whose plan needs more than it has free."""
    from rlctl.experiments.queue import Capacity

    free = {0: 10.0, 1: 79.0, 2: 79.0, 3: 5.0}
    cap = Capacity.from_placement({"parallel": 4, "gpu_ids": [0, 1, 2, 3]})
    assert cap.take("big", 2, 40.0, free).gpus == (1, 2)
    assert cap.take("big2", 1, 40.0, free) is None  # GPUs 0 and 3 are free of runs, not of memory
    assert cap.take("small", 1, 8.0, free).gpus == (0,)
    assert cap.take("any", 1, None, free).gpus == (3,)  # no plan (no model config): placed by count alone


def test_gpu_slots_with_the_placement_the_cli_records():
    """`rlctl sweep` without --executor records `executor: None`; that is this machine, and its GPUs are slots
    (before the fix every run got no CUDA_VISIBLE_DEVICES at all: all of them on every GPU, found on 2 real GPUs)."""
    from rlctl.experiments.queue import Capacity

    placement = {"parallel": 2, "hosts": None, "executor": None, "address": None, "force": False, "gpu_ids": [0, 1],
                 "needs": {}}
    cap = Capacity.from_placement(placement)
    a, b = cap.take("a", 1, 15.8, {0: 79.1, 1: 79.1}), cap.take("b", 1, 15.8, {0: 79.1, 1: 79.1})
    assert (a.gpus, b.gpus, a.name) == ((0,), (1,), "local:gpu0")
    assert cap.take("c", 1) is None
    cap.free("a")
    assert cap.take("c", 1, 15.8, {0: 63.0, 1: 0.9}).gpus == (0,)
    ray = Capacity.from_placement({**placement, "executor": "ray", "gpu_ids": [0, 1]})
    assert ray.take("r", 1).gpus == ()  # a Ray cluster places its jobs itself


def test_runs_of_two_gpus_and_of_one_share_a_machine(monkeypatch):
    """A sweep mixing 2-GPU and 1-GPU variants on 2 GPUs: the 2-GPU runs take both, the 1-GPU runs go side by side
    (`parallel` counts the smallest fit; it was 2 // 2 = 1, so the 1-GPU runs went one at a time, seen on 2 H100s)."""
    from rlctl.cli.experiments import _placement
    from rlctl.experiments.queue import Capacity

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    needs = {"a0-s1": {"gpus": 2, "gib": 8.0}, "a1-s1": {"gpus": 1, "gib": 8.0}, "a1-s2": {"gpus": 1, "gib": 8.0}}
    placement = _placement(None, None, None, None, False, needs)
    assert placement["parallel"] == 2 and placement["gpu_ids"] == [0, 1]
    cap = Capacity.from_placement(placement)
    assert cap.take("a0-s1", 2).gpus == (0, 1) and cap.take("a1-s1", 1) is None
    cap.free("a0-s1")
    assert (cap.take("a1-s1", 1).gpus, cap.take("a1-s2", 1).gpus) == ((0,), (1,))


def test_a_slot_names_its_gpus_in_nvidia_smi_order(monkeypatch):
    """The slot's indices are nvidia-smi's (PCI bus order): the run gets CUDA_DEVICE_ORDER=PCI_BUS_ID with them, so
    CUDA's index 0 is that GPU on a machine of mixed GPUs too; the queue's own environment is restored after."""
    from rlctl.experiments.queue import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    with visible_gpus((2,)):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and "CUDA_DEVICE_ORDER" not in os.environ
    with visible_gpus(()):  # a CPU slot changes nothing
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and "CUDA_DEVICE_ORDER" not in os.environ


def test_the_plan_memory_a_variant_needs():
    from rlctl.experiments.variants import planned_gib
    from rlctl.preflight import Result

    gib = 2**30
    results = [Result("memory.trainer", "ok", "", data={"per_gpu_bytes": 30 * gib}),
               Result("memory.vllm", "ok", "", data={"budget": 45 * gib}), Result("disk.free", "ok", "",
                                                                                 data={"per_gpu_bytes": 99 * gib})]
    assert planned_gib(results) == 45.0
    assert planned_gib([Result("memory.trainer", "skip", "no config")]) is None


# -- status: the index ------------------------------------------------------------------------------------------------

def _fake_run(root: Path, name: str, status: str = "finished", exp: str | None = None, steps: int = 3) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"name": name, "status": status, "backend": "trl",
                                              "started_at": time.time(), "ended_at": time.time() + 5}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": time.time(), "reward/mean": s / 10})
                                             + "\n" for s in range(1, steps + 1)))
    if exp:
        (d / "experiment.json").write_text(json.dumps({"experiment": exp}))
    return d


def test_status_index_survives_damage_and_follows_changes(w):
    runs = w["runs"]
    _fake_run(runs, "a-1")
    _fake_run(runs, "b-1", exp="lr")
    bad = runs / "damaged"
    bad.mkdir()
    (bad / "state.json").write_text('{"status": "runn')
    (runs / "someones-folder").mkdir()
    (runs / "a-file").write_text("x")
    weird = runs / "fifo-run"
    weird.mkdir()
    os.mkfifo(weird / "state.json")
    r = cli(w, "status")
    assert r.code == 0, r.err
    assert "a-1" in r.out and "damaged" in r.out and "unknown" in r.out and "someones-folder" not in r.out
    assert "experiment lr (1 runs)" in r.out and r.out.index("a-1") < r.out.index("experiment lr")
    assert (runs / ".index.json").is_file()
    # a run that grows is re-read; a corrupt index is rebuilt
    with (runs / "a-1" / "metrics.jsonl").open("a") as fh:  # an ingest: records appended, its record renamed
        fh.write(json.dumps({"step": 9, "time": time.time(), "reward/mean": 0.77}) + "\n")
    (runs / "a-1" / ".ingest.json.tmp").write_text("{}")
    os.replace(runs / "a-1" / ".ingest.json.tmp", runs / "a-1" / ".ingest.json")
    rows = json.loads(cli(w, "status", "--json").out)
    assert next(x for x in rows if x["name"] == "a-1")["reward"] == 0.77
    (runs / ".index.json").write_text("{not json")
    rows = json.loads(cli(w, "status", "--json").out)
    assert {x["name"] for x in rows} == {"a-1", "b-1", "damaged"}
    # the state changes by rename (as every rlctl writer does): the row follows
    from rlctl.runs.state import write_state

    write_state(runs / "a-1", status="failed", exit_code=3)
    rows = json.loads(cli(w, "status", "--json").out)
    assert next(x for x in rows if x["name"] == "a-1")["status"] == "failed"


# -- real runs ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_stop_then_resume_continues_the_stopped_run_and_launches_nothing_twice(w):
    """`experiment stop` mid-way, `experiment resume`: the stopped run continues (its own supervisor)."""
    # a0 is held at its step 2 by the gate (it was 40 steps of 0.3 s, run twice over, so the stop landed mid-way):
    # stopped mid-way whatever the machine's speed; let go before the resume
    gate = w["dir"] / "gate"
    gate.mkdir()
    (w["dir"] / "slow.toml").write_text(bandit_recipe(steps=40) + f'\n[env]\nBANDIT_GATE = "{gate}"\n')
    r = rlctl(w, "sweep", "slow.toml", "--grid", "optim.lr=0.1,0.5", "--parallel", "1", "--name", "s")
    assert r.returncode == 0, r.stderr[-3000:]
    assert wait_for(lambda: run_dirs(w, "s-a0") and read_state(run_dirs(w, "s-a0")[0]).get("status") == "running")
    r = cli(w, "experiment", "stop", "s", "--grace", "5")
    assert r.code == 0 and "stopped" in r.out, r.err
    assert read_state(run_dirs(w, "s-a0")[0])["status"] == "stopped" and not run_dirs(w, "s-a1")
    (gate / "42").write_text("")
    r = rlctl(w, "experiment", "resume", "s", "--wait")
    assert r.returncode == 0, r.stderr[-3000:] + (w["runs"] / "_experiments" / "s" / "queue.log").read_text()
    assert len(run_dirs(w, "s-")) == 2 and all(read_state(p)["status"] == "finished" for p in run_dirs(w, "s-"))


def test_experiment_show_tells_a_dead_run_as_status_does(user):
    """kill -9 of an A/B test's queue, one run's supervisor and its process group: `experiment show` said the run was
    `running` (its recorded state) while `rlctl status` said `lost`; both now tell it from the same rows."""
    work, rlctl_ = user
    gate = work / "gate"  # both runs held at their step 2: running until the kill, whatever the machine's speed
    gate.mkdir()
    (work / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    for arm, lr in (("a", 0.5), ("b", 0.1)):
        (work / f"{arm}.toml").write_text(bandit_recipe(steps=6, lr=lr) + f'\n[env]\nBANDIT_GATE = "{gate}"\n')
    r = rlctl_("ab", "a.toml", "b.toml", "--name", "clip", "--parallel", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    runs = work / "runs"
    q = json.loads((runs / "_experiments" / "clip" / "queue.json").read_text())

    def running(arm: str) -> Path | None:
        d = next(iter(sorted(runs.glob(f"clip-{arm}-s42-*"))), None)
        return d if d and read_state(d).get("status") == "running" and read_state(d).get("pgid") else None

    assert wait_for(lambda: running("A") and running("B")), rlctl_("status").stdout
    a = running("A")
    st = read_state(a)
    os.kill(q["pid"], signal.SIGKILL)
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    os.killpg(st["pgid"], signal.SIGKILL)
    assert wait_for(lambda: json.loads(rlctl_("status", a.name, "--json").stdout)["status"] == "lost")
    shown = rlctl_("experiment", "show", "clip").stdout
    line = next(x for x in shown.splitlines() if x.strip().startswith("A-s42"))
    assert line.split()[2] == "lost", shown  # the run's state column (the queue's own record is the column before)
    # the variant's column agrees: its queue is dead, so nothing runs it (it said `running`)
    assert line.split()[1] == "lost", shown
    # the way on is the experiment's resume: `rlctl resume RUN` alone would leave the other variants queued for ever
    told = json.loads(rlctl_("status", a.name, "--json").stdout)["next"]
    assert told.startswith("rlctl experiment resume clip"), told
    assert f"next: {told}" in rlctl_("status", a.name).stdout
    assert next(x for x in shown.splitlines() if x.strip().startswith("B-s42")).split()[2] == "running", shown
    got = {v["id"]: v["status"] for v in json.loads(rlctl_("experiment", "show", "clip", "--json").stdout)["variants"]}
    assert got == {"A-s42": "lost", "B-s42": "running"}, got


# -- the CPU quickstart (real GRPO with TRL on a tiny local Qwen2; reward = fraction of 'a') ------------------------


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture
def qs(w, model_cache):
    """The quickstart copied here (q.toml), and the same recipe with other seeds (q2.toml: train.seed 7)."""
    import shutil

    pytest.importorskip("trl")
    w["env"]["RLCTL_MODEL_CACHE"] = str(model_cache)
    shutil.copytree(RECIPES / "quickstart", w["dir"] / "quickstart")
    text = (RECIPES / "quickstart.toml").read_text()
    (w["dir"] / "q.toml").write_text(text)
    assert "\n[train]\n" in text
    (w["dir"] / "q2.toml").write_text(text.replace("\n[train]\n", "\n[train]\nseed = 7\n", 1))
    return w


def _log(w, exp: str) -> str:
    p = w["runs"] / "_experiments" / exp / "queue.log"
    return p.read_text() if p.is_file() else ""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quickstart_lr_effect_is_significant_and_identical_arms_are_not(qs):
    w = qs
    t0 = time.time()
    # 10 steps: at lr 3e-2 the quickstart saturates by then (the recipe's 5e-3 needs ~30; the suite's time). Seeds
    # 42-44 measured: reward 0.99-1.0 at step 9-10, the last-5 means 0.82-0.93 against ~0.0 at lr 1e-6 (p ~ 0.002)
    r = rlctl(w, "sweep", "q.toml", "--set", "train.steps=10", "--grid", "optim.lr=1e-6,3e-2", "--seeds", "3",
              "--parallel", "2", "--name", "lr", "--wait", timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:] + _log(w, "lr")
    print(f"lr sweep (6 runs): {time.time() - t0:.0f} s")
    shown = cli(w, "experiment", "show", "lr")
    assert shown.out.count(" done ") == 6 and "finished" in shown.out, shown.out
    r = cli(w, "compare", "lr", "--report", "lr.md", "--json")
    assert r.code == 0, r.err
    c = json.loads(r.out)
    (t,) = c["comparisons"]
    print("lr:", t["verdict"])
    # a0 is lr 1e-6, a1 lr 3e-2 (the recipe's 5e-3 changed in both): a1 - a0 > 0, clearly
    assert c["metric"] == "reward/mean" and c["test"].startswith("paired t-test by seed")
    assert t["test"]["significant"] and t["test"]["p"] < 0.05 and "significant at alpha 0.05" in t["verdict"]
    assert abs(t["test"]["diff"]) > 0.2, t
    md = (w["dir"] / "lr.md").read_text()
    assert "`optim.lr`: 0.005 -> 1e-06" in md and "**Verdict**" in md and "lr.png" in md
    assert (w["dir"] / "lr.png").stat().st_size > 1000
    # two identical arms that differ only in their seeds: Welch, and "no significant difference" (the bandit
    # learner: the statistics are the point here, and six more TRL start-ups cost the suite a minute and a half)
    t0 = time.time()
    (w["dir"] / "b1.toml").write_text(bandit_recipe(steps=6))
    (w["dir"] / "b2.toml").write_text(bandit_recipe(steps=6, seed=7))
    r = rlctl(w, "ab", "b1.toml", "b2.toml", "--seeds", "3", "--parallel", "2", "--name", "same", "--wait",
              timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:] + _log(w, "same")
    print(f"identical arms (6 runs): {time.time() - t0:.0f} s")
    r = cli(w, "compare", "same")
    assert r.code == 0, r.err
    print("same:", r.out)
    assert "Welch's t-test (the arms do not share the same seeds)" in r.out
    assert "no significant difference at this n (3 seeds per arm)" in r.out, r.out
    st = cli(w, "status")
    assert "experiment lr (6 runs)" in st.out and "experiment same (6 runs)" in st.out
    one = json.loads(cli(w, "status", "--experiment", "lr", "--json").out)
    assert len(one) == 6 and {x["experiment"] for x in one} == {"lr"}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quickstart_variant_whose_trainer_is_killed_restarts_by_its_policy_and_completes(qs):
    import psutil

    w = qs
    r = rlctl(w, "sweep", "q.toml", "--set", "train.steps=30", "--set", "run.restart=on-failure", "--set",
              "checkpoint.every=10", "--grid", "optim.lr=1e-6,5e-3", "--parallel", "2", "--name", "r")
    assert r.returncode == 0, r.stderr[-3000:]

    def stepped() -> bool:  # a0's trainer is past its first steps
        dirs = run_dirs(w, "r-a0")
        return bool(dirs) and (dirs[0] / "metrics.jsonl").is_file() and len(
            (dirs[0] / "metrics.jsonl").read_text().splitlines()) >= 3

    assert wait_for(stepped, timeout=300), _log(w, "r")
    run = run_dirs(w, "r-a0")[0]
    trainer = psutil.Process(read_state(run)["pid"]).children()[0]
    trainer.kill()  # the OOM killer
    assert wait_for(lambda: queue_record(w, "r").get("state") == "finished", timeout=900), _log(w, "r")
    st = read_state(run)
    assert st["status"] == "finished" and len(st["attempts"]) == 2 and st["attempts"][0]["outcome"] == "failed", st
    assert st["attempts"][1]["restart"] and st["attempts"][1]["last_step"] == 30
    other = read_state(run_dirs(w, "r-a1")[0])  # the other variant was never held up
    assert other["status"] == "finished" and len(other["attempts"]) == 1
    assert len(run_dirs(w, "r-")) == 2  # the restart is the run's own, not a new variant


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_queue_survives_kill_9_and_resumes_without_relaunching_then_extends(qs):
    """kill -9 of the queue while two runs go: one finishes meanwhile, one still runs when the queue is resumed.
    The resumed queue adopts the running one (not launched twice), does not relaunch the finished one; --seeds 2
    then runs only the new seeds."""
    w = qs
    # the bandit learner (no TRL start-up): a0 (4 steps) ends in a second; a1 (30 steps) is held at its step 5 by the
    # gate until the resumed queue has taken it over, so it still runs at the resume whatever the machine's speed
    # (it was 300 steps of 0.1 s, twice: a minute of waiting)
    gate = w["dir"] / "gate"
    gate.mkdir()
    (w["dir"] / "k.toml").write_text(bandit_recipe(sleep=0.1) + f'\n[env]\nBANDIT_GATE = "{gate}"\n'
                                     'BANDIT_GATE_STEP = "5"\n')
    r = rlctl(w, "sweep", "k.toml", "--grid", "train.steps=4,30", "--parallel", "2", "--name", "k")
    assert r.returncode == 0, r.stderr[-3000:]
    q = queue_record(w, "k")
    assert wait_for(lambda: sum(v.get("state") == "running" for v in queue_record(w, "k")["variants"].values()) == 2)
    os.kill(q["pid"], signal.SIGKILL)  # rlctl's queue dies; the runs (own sessions, own supervisors) go on
    assert wait_for(lambda: run_dirs(w, "k-a0") and read_state(run_dirs(w, "k-a0")[0]).get("status") == "finished",
                    timeout=300)
    long = run_dirs(w, "k-a1")[0]
    assert read_state(long)["status"] == "running"  # still going when the queue comes back
    shown = cli(w, "experiment", "show", "k").out  # the truth: the record says running, the queue is gone
    assert "queue dead (pid" in shown and "rlctl experiment resume k" in shown, shown
    assert "queue dead" in cli(w, "experiment", "list").out
    resume = subprocess.Popen([sys.executable, "-m", "rlctl.cli", "experiment", "resume", "k", "--wait"],
                              cwd=w["dir"], env=w["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the new queue has recorded itself (it adopts a1 next, in the same breath): a1 is let go
        assert wait_for(lambda: queue_record(w, "k").get("pid") not in (None, q["pid"]), timeout=120), _log(w, "k")
        assert read_state(long)["status"] == "running"
        (gate / "42").write_text("")
        _, err = resume.communicate(timeout=900)
    finally:
        resume.kill()
    assert resume.returncode == 0, err[-3000:] + _log(w, "k")
    dirs = run_dirs(w, "k-")
    assert len(dirs) == 2, [d.name for d in dirs]  # neither launched again
    assert all(read_state(p)["status"] == "finished" for p in dirs)
    assert len(read_state(long)["attempts"]) == 1  # adopted, not restarted
    # --seeds more: only the new seeds run (the new a1 is not held)
    (gate / "43").write_text("")
    r = rlctl(w, "sweep", "k.toml", "--name", "k", "--seeds", "2", "--wait", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:] + _log(w, "k")
    dirs = run_dirs(w, "k-")
    assert sorted(d.name.rsplit("-", 2)[0] for d in dirs) == ["k-a0-s42", "k-a0-s43", "k-a1-s42", "k-a1-s43"]
    assert all(read_state(p)["status"] == "finished" for p in dirs)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 8 TRL runs, 2 at a time: ~10 min on a busy 2-core machine
def test_quickstart_2x2_grid_2_seeds_parallel_2_runs_to_completion(w, tmp_path_factory):
    pytest.importorskip("trl")
    w["env"]["RLCTL_MODEL_CACHE"] = str(tmp_path_factory.mktemp("models"))
    r = rlctl(w, "sweep", str(RECIPES / "quickstart.toml"), "--set", "train.steps=2", "--grid",
              "optim.lr=1e-6,5e-3", "--grid", "rollout.temperature=0.7,1.0", "--seeds", "2", "--parallel", "2",
              "--name", "qs", "--wait", timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:] + (w["runs"] / "_experiments" / "qs" / "queue.log").read_text()
    dirs = run_dirs(w, "qs-")
    assert len(dirs) == 8 and all(read_state(p)["status"] == "finished" for p in dirs)
    seeds = {json.loads((p / "experiment.json").read_text())["seed"] for p in dirs}
    assert seeds == {42, 43}
    # never more than 2 at once: each run's lifetime, overlapped
    spans = [(read_state(p)["started_at"], read_state(p)["ended_at"]) for p in dirs]
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) <= 2
    r = cli(w, "compare", "qs")
    assert r.code == 0 and "a3" in r.out, r.err


def test_a_queue_killed_between_creating_a_run_and_recording_it_adopts_it(w):
    from rlctl.experiments.manifest import write_json, write_manifest
    from rlctl.experiments.queue import Queue

    d = w["runs"] / "_experiments" / "e"
    write_manifest(d, {"name": "e", "arms": [], "seeds": 1, "placement": {"runs_root": str(w["runs"])},
                       "variants": [{"id": "a0-s42", "arm": "a0", "seed": 42, "run_name": "e-a0-s42"},
                                    {"id": "a1-s42", "arm": "a1", "seed": 42, "run_name": "e-a1-s42"}]})
    write_json(d / "queue.json", {"variants": {"a0-s42": {"state": "launching"}, "a1-s42": {"state": "launching"}}})
    _fake_run(w["runs"], "e-a0-s42-20261125-000000")
    q = Queue(d)
    q.adopt()
    q.settle()
    v = q.queue["variants"]
    assert v["a0-s42"]["state"] == "done" and v["a0-s42"]["run_dir"].endswith("e-a0-s42-20261125-000000")
    assert v["a1-s42"]["state"] == "queued"  # never created: launched again, once


# -- placement across SSH hosts (a real OpenSSH server on loopback) ---------------------------------------------------

@pytest.fixture
def two_hosts(w, sshd, monkeypatch):  # noqa: F811
    """Two hosts, `h1` and `h2`: the same loopback sshd, each with its own workdir (so where a run went shows)."""
    import uuid

    from tests.remote_sshd import ALIAS

    ctl = Path(f"/tmp/rlctl-x-{uuid.uuid4().hex[:8]}")  # ControlPath sockets need a short path
    for k, v in {"RLCTL_SSH_CONFIG": str(sshd.client_config), "RLCTL_SSH_CONTROL_DIR": str(ctl),
                 "RLCTL_SSH_TIMEOUT": "5"}.items():
        monkeypatch.setenv(k, v)
        w["env"][k] = v
    work = {h: w["dir"] / f"remote-{h}" for h in ("h1", "h2")}
    for h, wd in work.items():
        r = cli(w, "hosts", "add", h, ALIAS, "--workdir", str(wd), "--python", sys.executable,
                "--env", f"PYTHONPATH={ROOT}")
        assert r.code == 0, r.err
    yield {**w, "work": work, "sshd": sshd, "ctl": ctl, "alias": ALIAS}
    for wd in work.values():
        _kill_all(wd / "runs")
    with contextlib.suppress(Exception):
        subprocess.run(["ssh", "-F", str(sshd.client_config), "-o", f"ControlPath={ctl}/%C", "-O", "exit", ALIAS],
                       capture_output=True, timeout=10)


def _spans(dirs: list[Path]) -> list[tuple[float, float]]:
    return [(read_state(p)["started_at"], read_state(p).get("ended_at") or time.time()) for p in dirs]


def _max_overlap(spans: list[tuple[float, float]]) -> int:
    return max((sum(s <= t < e for s, e in spans) for t, _ in spans), default=0)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sweep_on_two_ssh_hosts(two_hosts):
    w = two_hosts
    (w["dir"] / "b.toml").write_text(bandit_recipe(steps=8, sleep=0.3))
    t0 = time.time()
    r = rlctl(w, "sweep", "b.toml", "--grid", "optim.lr=1e-6,0.5", "--seeds", "3", "--on", "h1,h2",
              "--parallel", "2", "--name", "sh", "--wait")
    assert r.returncode == 0, r.stderr[-3000:] + (w["runs"] / "_experiments" / "sh" / "queue.log").read_text()
    print(f"ssh sweep: {time.time() - t0:.0f} s")
    local = run_dirs(w, "sh-")
    assert len(local) == 6 and all(read_state(p)["status"] == "finished" for p in local)
    by_host: dict[str, list[Path]] = {}
    for p in local:
        st = read_state(p)
        assert st["executor"] == "ssh"
        remote_dir = Path(st["remote_run_dir"])
        assert remote_dir.parent == w["work"][st["host"]] / "runs"  # it ran in that host's workdir
        assert read_state(remote_dir)["status"] == "finished"
        by_host.setdefault(st["host"], []).append(remote_dir)
    assert set(by_host) == {"h1", "h2"}, by_host
    for h, dirs in by_host.items():  # never more at once on a host than its slots
        assert _max_overlap(_spans(dirs)) <= 2, (h, _spans(dirs))
    st = cli(w, "status", "--experiment", "sh")
    assert st.code == 0 and "h1" in st.out and "h2" in st.out and st.out.count("finished") == 6, st.out
    rows = json.loads(cli(w, "status", "--experiment", "sh", "--json").out)
    assert {x["status"] for x in rows} == {"finished"} and len(rows) == 6
    c = cli(w, "compare", "sh", "--json")
    assert c.code == 0, c.err
    (t,) = json.loads(c.out)["comparisons"]
    assert t["test"]["significant"], c.out  # the remote runs' metrics were read


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_host_going_down_mid_sweep_is_said_and_nothing_hangs(two_hosts):
    """sshd stops while a run is on each host: the queue says so, places nothing there, gives up after
    RLCTL_EXP_UNREACHABLE_S; status answers at once; once the host is back, resume finishes without relaunching."""
    w = two_hosts
    w["env"]["RLCTL_EXP_UNREACHABLE_S"] = "8"
    # the runs over there are held at their step 2 by the gate until sshd is back (they were 30 steps of 0.5 s: a run
    # going on through the outage by its length, and two more of them after the resume)
    gate = w["dir"] / "gate"
    gate.mkdir()
    (w["dir"] / "b.toml").write_text(bandit_recipe(steps=30) + f'\n[env]\nBANDIT_GATE = "{gate}"\n')
    r = rlctl(w, "sweep", "b.toml", "--grid", "optim.lr=0.1,0.5", "--seeds", "2", "--on", "h1,h2", "--name", "dn")
    assert r.returncode == 0, r.stderr[-3000:]
    assert wait_for(lambda: sum(v.get("state") == "running" for v in queue_record(w, "dn")["variants"].values()) == 2)
    remote = [Path(read_state(p)["remote_run_dir"]) for p in run_dirs(w, "dn-")]
    assert wait_for(lambda: all(read_state(p).get("status") == "running" for p in remote))
    w["sshd"].stop()
    try:
        log = w["runs"] / "_experiments" / "dn" / "queue.log"
        assert wait_for(lambda: all(f"host {h} unreachable:" in log.read_text() for h in ("h1", "h2")),
                        timeout=60), log.read_text()
        t0 = time.time()
        st = rlctl(w, "status", "--experiment", "dn", "--timeout", "3", timeout=60)
        assert st.returncode == 0 and st.stdout.count("unreachable") == 2, st.stdout + st.stderr
        assert time.time() - t0 < 30
        shown = cli(w, "experiment", "show", "dn")
        assert shown.out.count("host unreachable since") == 2 and "hosts not answering: h1" in shown.out, shown.out
        # the queue gives up on them (does not wait forever) and launches nothing on the dead hosts
        assert wait_for(lambda: queue_record(w, "dn").get("state") == "incomplete", timeout=90), log.read_text()
        q = queue_record(w, "dn")["variants"]
        assert sorted(v.get("status") for v in q.values() if v.get("state") == "done") == ["unreachable"] * 2, q
        assert sum(v.get("state") == "queued" for v in q.values()) == 2 and "launch failed" not in log.read_text()
        assert "2 unreachable, and no host answers" in log.read_text() and "experiment resume dn" in log.read_text()
        shown = cli(w, "experiment", "show", "dn")
        assert shown.out.count("unreachable for 8 s") == 2 and "queue incomplete" in shown.out, shown.out
    finally:
        w["sshd"].start()
    assert all(read_state(p).get("status") == "running" for p in remote)  # through the outage
    for seed in ("42", "43"):
        (gate / seed).write_text("")
    # the runs went on over there; resume finds them finished and runs the two left, each once
    assert wait_for(lambda: all(read_state(p).get("status") == "finished" for p in remote), timeout=120)
    r = rlctl(w, "experiment", "resume", "dn", "--wait")
    assert r.returncode == 0, r.stderr[-3000:] + (w["runs"] / "_experiments" / "dn" / "queue.log").read_text()
    dirs = run_dirs(w, "dn-")
    assert len(dirs) == 4 and all(read_state(p)["status"] == "finished" for p in dirs), [
        (p.name, read_state(p).get("status")) for p in dirs]


# -- placement on a Ray cluster (a real head on loopback) --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sweep_on_a_ray_cluster_runs_each_variant_as_a_ray_job(w, tmp_path):
    pytest.importorskip("ray.job_submission")
    from rlctl.executors.ray import LocalHead, cluster_info

    (tmp_path / "head").mkdir()
    head = LocalHead(tmp_path / "head", num_gpus=0)  # the user's cluster: rlctl must not stop it
    address = head.start()
    try:
        (w["dir"] / "b.toml").write_text(bandit_recipe(steps=8))
        t0 = time.time()
        r = rlctl(w, "sweep", "b.toml", "--grid", "optim.lr=1e-6,0.5", "--seeds", "2", "--executor", "ray",
                  "--address", address, "--parallel", "2", "--name", "ry", "--wait")
        assert r.returncode == 0, r.stderr[-3000:] + (w["runs"] / "_experiments" / "ry" / "queue.log").read_text()
        print(f"ray sweep: {time.time() - t0:.0f} s")
        dirs = run_dirs(w, "ry-")
        assert len(dirs) == 4
        for p in dirs:
            st = read_state(p)
            assert st["status"] == "finished" and st["executor"] == "ray", st
            assert st["ray_job_status"] == "SUCCEEDED" and st["ray_address"] == address and not st["ray_started_head"]
        assert _max_overlap(_spans(dirs)) <= 2
        assert cluster_info(address)["nodes"]
        c = cli(w, "compare", "ry", "--json")
        assert c.code == 0 and len(json.loads(c.out)["comparisons"]) == 1, c.err
    finally:
        head.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sweep_on_ray_without_an_address_gives_each_run_its_own_head(w):
    """`--executor ray` and no cluster: each run starts a head of its own on loopback (distinct ports and temp
    dirs, two at once here) and stops it when it ends; nothing of Ray is left running."""
    pytest.importorskip("ray.job_submission")
    import psutil

    (w["dir"] / "b.toml").write_text(bandit_recipe(steps=4))
    r = rlctl(w, "sweep", "b.toml", "--grid", "optim.lr=1e-6,0.5", "--executor", "ray", "--parallel", "2",
              "--name", "own", "--wait")
    assert r.returncode == 0, r.stderr[-3000:] + (w["runs"] / "_experiments" / "own" / "queue.log").read_text()
    states = [read_state(p) for p in run_dirs(w, "own-")]
    assert len(states) == 2 and all(st["status"] == "finished" and st["ray_job_status"] == "SUCCEEDED"
                                    and st["ray_started_head"] for st in states), states
    assert len({st["ray_address"] for st in states}) == 2 and len({st["ray_head_temp_dir"] for st in states}) == 2
    assert _max_overlap(_spans(run_dirs(w, "own-"))) <= 2

    def heads_left() -> list[int]:
        temps = {st["ray_head_temp_dir"] for st in states}
        left = []
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(t in " ".join(p.info["cmdline"] or []) for t in temps):
                    left.append(p.pid)
        return left

    assert wait_for(lambda: not heads_left(), timeout=30), heads_left()


def test_a_down_host_gets_no_new_run_and_the_queue_ends_only_when_every_host_is_gone(w, monkeypatch):
    from rlctl.experiments import queue as qm
    from rlctl.experiments.manifest import write_manifest

    cap = qm.Capacity.from_placement({"parallel": 1, "hosts": ["h1", "h2"], "executor": "ssh"})
    assert cap.take("x", 0, down={"h1"}).host == "h2" and cap.take("y", 0, down={"h1"}) is None
    d = w["runs"] / "_experiments" / "g"
    write_manifest(d, {"name": "g", "arms": [], "seeds": 1, "variants": [],
                       "placement": {"hosts": ["h1", "h2"], "parallel": 1, "runs_root": str(w["runs"])}})
    q = qm.Queue(d)
    monkeypatch.setattr(qm, "UNREACHABLE_S", 0.0)
    assert not q.all_hosts_gone()  # no host known down: never "gone", even with a zero give-up time
    q.mark_down("h1")
    assert q.skip_hosts() == {"h1"} and not q.all_hosts_gone()
    q.mark_down("h2")
    assert q.all_hosts_gone()
    monkeypatch.setattr(qm, "RETRY_S", 0.0)
    assert q.skip_hosts() == set()  # time for one more try on each


def test_compare_says_when_an_eval_is_not_the_same_measurement(w):
    """Two runs whose eval set `ood` shares its name and mode label but not its temperature: compare says their
    numbers are different measurements (issue 24: two modes are never compared by accident)."""
    runs = w["runs"]
    for name, seed, temp in (("t6-1", 1, 0.6), ("t6-2", 2, 0.6), ("t10-1", 1, 1.0), ("t10-2", 2, 1.0)):
        d = _fake_run(runs, name)
        (d / "recipe.toml").write_text(f'[train]\nseed = {seed}\n[eval.sets.ood]\ndata = "ood.jsonl"\n'
                                       f'temperature = {temp}\nn = 8\nmode = "sampling_pass@8"\n')
        with (d / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps({"step": 3, "time": time.time(), "eval/ood/sampling_pass@8": 0.5 + seed / 10}) + "\n")
    r = cli(w, "compare", "t6-1", "t6-2", "t10-1", "t10-2", "--metric", "eval/ood/sampling_pass@8")
    assert r.code == 0, r.err
    assert "eval set 'ood' is not measured the same way in every run (temperature differ" in r.out
    assert "temperature=0.6" in r.out and "temperature=1.0" in r.out
    same = cli(w, "compare", "t6-1", "t6-2", "--metric", "eval/ood/sampling_pass@8")
    assert same.code == 0 and "not measured the same way" not in same.out


def test_a_host_run_that_answers_stalled_keeps_its_variant_running(tmp_path, monkeypatch):
    """A run on a host answers `stalled` (no step for a while; its own watchdog decides) while it lives: the queue
    kept it only for pool runs and recorded any other as done, freeing its slot while it still trained there."""
    import rlctl.runs.state as run_state
    from rlctl.experiments.queue import Queue

    run = tmp_path / "run"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"status": "running", "executor": "ssh"}))
    monkeypatch.setattr(run_state, "settled_status", lambda run_dir, st=None: "stalled")  # what the host answered
    q = Queue.__new__(Queue)
    assert q.look("v1", run) == "running"


def test_each_variant_syncs_under_a_prefix_of_its_own(w):
    """A sweep of a recipe with checkpoint.sync: every variant wrote the same store's `latest` (only pool runs got a
    prefix of their own), so a resume took another variant's checkpoint. Each variant's run syncs under
    URL/<its run name>."""
    import tomllib

    store = (w["dir"] / "store").as_uri()
    (w["dir"] / "b.toml").write_text(bandit_recipe(steps=3) + f'[checkpoint]\nsync = "{store}"\n')
    r = rlctl(w, "sweep", "b.toml", "--grid", "optim.lr=0.1,0.5", "--parallel", "2", "--name", "sy", "--wait")
    assert r.returncode == 0, r.stderr[-3000:]
    runs = run_dirs(w, "sy-")
    assert len(runs) == 2
    urls = {tomllib.loads((p / "recipe.toml").read_text())["checkpoint"]["sync"] for p in runs}
    assert urls == {f"{store}/{p.name.rsplit('-', 2)[0]}" for p in runs}, urls  # <run name>-YYYYmmdd-HHMMSS


def test_experiment_show_says_waiting_variants_wait_on_a_dead_queue(tmp_path):
    """A queue killed while launching one variant and before the other: `experiment show` said `launching` and
    `queued` as if something would start them. Nothing will: they wait on a dead queue, and its resume is the way on
    (as a dead queue's running variants are told). In-process, from the experiment's records as a kill -9 leaves
    them (the queue's pid gone, its record still `running`)."""
    d = tmp_path / "runs" / "_experiments" / "clip"
    d.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    variants = [{"id": f"{a}-s42", "arm": a, "seed": 42} for a in ("A", "B")]
    (d / "manifest.json").write_text(json.dumps({
        "name": "clip", "kind": "ab", "seeds": 1, "variants": variants,
        "arms": [{"id": a, "label": a.lower(), "diff": {}} for a in ("A", "B")]}))
    (d / "queue.json").write_text(json.dumps({"state": "running", "pid": gone.pid, "create_time": 1.0, "variants": {
        "A-s42": {"state": "launching"}, "B-s42": {"state": "queued"}}}))
    shown = run_cli("experiment", "show", "clip", cwd=tmp_path)
    assert shown.code == 0, shown.err
    rows = [x for x in shown.out.splitlines() if x.strip()[:5] in ("A-s42", "B-s42")]
    assert len(rows) == 2 and all("launching" not in x and "queued" not in x.split()[1] for x in rows), shown.out
    assert all("waiting on a dead queue" in x and "rlctl experiment resume clip" in x for x in rows), shown.out
    got = json.loads(run_cli("experiment", "show", "clip", "--json", cwd=tmp_path).out)["variants"]
    assert {v["id"]: v["next"] for v in got} == {v["id"]: "rlctl experiment resume clip" for v in variants}, got
