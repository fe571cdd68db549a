"""The SLURM executor against a real SLURM cluster (tests/slurm_cluster.py: munged, slurmctld, two slurmd in their own
network namespaces, no accounting — so every answer comes from squeue/scontrol, as on a cluster without slurmdbd).

Each test runs rlctl as a user on the login node does: the README's commands from a working directory with every
default (./runs); the only difference from a user's shell is SLURM_CONF (a login node has /etc/slurm/slurm.conf).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.core.state import ACTIVE
from tests.conftest import RECIPES, ROOT
from tests.remote_sshd import ALIAS, sshd  # noqa: F401 - the session fixture
from tests.slurm_cluster import SlurmCluster, ensure_slurm, start_cluster


@pytest.fixture(scope="session")
def cluster():
    why = ensure_slurm()
    if why is None and os.geteuid() != 0:
        why = "a test cluster needs root (network namespaces, slurmd)"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"SLURM tests cannot run in CI: {why}")  # a skip in CI counts as a failure
        pytest.skip(why)
    c = start_cluster()
    yield c
    c.stop()


@pytest.fixture
def sl(user, cluster: SlurmCluster):
    """(work dir, rlctl, cluster): a user on the login node."""
    work, rlctl = user
    rlctl.env.update(cluster.env)
    (work / "quickstart").symlink_to(RECIPES / "quickstart")
    (work / "quickstart.toml").write_text((RECIPES / "quickstart.toml").read_text())
    yield work, rlctl, cluster
    cluster.cancel_all()


def _state(run_dir: Path) -> dict:
    return json.loads((run_dir / "state.json").read_text())


def _run_dir(work: Path) -> Path:
    runs = [p for p in (work / "runs").iterdir() if (p / "state.json").is_file()]
    assert len(runs) == 1, runs
    return runs[0]


def _wait(cond, timeout: float, what: str, run_dir: Path | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    extra = ""
    if run_dir is not None:
        extra = f"\nstate: {(run_dir / 'state.json').read_text() if (run_dir / 'state.json').exists() else '-'}"
        for p in sorted(run_dir.glob("slurm-*.out")) + [run_dir / "stdout.log"]:
            if p.exists():
                extra += f"\n--- {p.name}\n{p.read_text()[-3000:]}"
    raise AssertionError(f"{what} not within {timeout:.0f} s{extra}")


def _ended(run_dir: Path, rlctl=None) -> str | None:
    """The run's status once it is no longer active (any of ACTIVE is on its way somewhere), else None; with `rlctl`,
    asked through `rlctl status` as a user would (which also writes what SLURM says into state.json)."""
    if rlctl is not None:
        rlctl("status", run_dir.name)
    status = _state(run_dir).get("status")
    return status if status not in ACTIVE else None


def _said(run_dir: Path) -> str:
    out = (run_dir / "state.json").read_text()
    for p in sorted(run_dir.glob("slurm-*.out")) + [run_dir / "stdout.log", run_dir / "supervisor.log"]:
        if p.exists():
            out += f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
    return out


def _job(run_dir: Path) -> str:
    return str(_state(run_dir)["slurm_job_id"])


def _release(cluster: SlurmCluster, job: str) -> None:
    """A requeued job waits out SLURM's BeginTime delay (two minutes): start it now, as an admin may."""
    _wait(lambda: "JobState=PENDING" in cluster.scontrol("show", "job", job).stdout, 60, f"job {job} pending")
    cluster.scontrol("update", f"jobid={job}", "StartTime=now")


# ---- render and bad input (no cluster needed, but on the same login node) -----------------------------------------
def test_render_shows_the_sbatch_script(user):
    work, rlctl = user
    r = rlctl("render", str(RECIPES / "quickstart.toml"), "--executor", "slurm", "--partition", "gpu",
              "--account", "rl-team", "--time", "4:00:00")
    assert r.returncode == 0, r.stderr
    script = r.stdout.split("## slurm.sbatch", 1)[1]
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=rl-team", "#SBATCH --time=4:00:00",
                 "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300", "#SBATCH --nodes=1",
                 "trap '' USR1", "-m rlctl.executors.slurm.job"):
        assert line in script, line


def test_bad_slurm_options_are_said(user, write):
    work, rlctl = user
    r = rlctl("launch", str(RECIPES / "quickstart.toml"), "--executor", "slurm", "--time", "soon")
    assert r.returncode == 2 and "--time 'soon'" in r.stderr and "executor.slurm.time" in r.stderr, r.stderr
    bad = write("bad.toml", (RECIPES / "quickstart.toml").read_text().replace(
        'train = "quickstart/prompts.jsonl"', f'train = "{RECIPES}/quickstart/prompts.jsonl"').replace(
        'function = "quickstart/reward.py"', f'function = "{RECIPES}/quickstart/reward.py"')
        + '\n[executor.slurm]\npartiton = "gpu"\n')
    r = rlctl("preflight", str(bad))
    assert r.returncode == 2 and "executor.slurm.partiton" in r.stderr and "partition" in r.stderr, r.stderr


def test_a_time_limit_the_signal_would_open_is_refused(user):
    """`--time 5` with the default signal_before (300 s): SLURM would send USR1 at the job's start (its check is every
    30 s and may come early), and every allocation would stop and requeue itself at once; preflight says so, with the
    signal_before that fits."""
    work, rlctl = user
    r = rlctl("launch", str(RECIPES / "quickstart.toml"), "--executor", "slurm", "--time", "5")
    assert r.returncode == 1 and not (work / "runs").exists(), r.stdout + r.stderr
    assert "signal_before = 300 s with a time limit of 5 (300 s)" in r.stdout, r.stdout
    assert "--set executor.slurm.signal_before=260" in r.stdout, r.stdout


def test_two_nodes_render_ray_bring_up(user, write):
    """OpenRLHF / verl on 2 nodes x 8 GPUs: a Ray head on the first node, workers on the others, a bounded wait."""
    work, rlctl = user
    r = rlctl("render", str(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml"), "--executor", "slurm",
              "--set", "resources.nodes=2", "--no-validate")
    assert r.returncode == 0, r.stderr
    script = r.stdout.split("## slurm.sbatch", 1)[1]
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:8" in script
    assert "ray start --head" in script and "ray start --address" in script and "wait-ray" in script
    assert "export RAY_ADDRESS=" in script


# ---- against the cluster ----------------------------------------------------------------------------------------
QUICK_EVAL = """extends = "quickstart.toml"
[checkpoint]
every = 4
[eval.sets.id]
data = "quickstart/prompts.jsonl"
grader = "reward"
threshold = 0.5
limit = 2
"""


def test_quickstart_runs_as_a_slurm_job(sl):
    """The README's main command placed on SLURM (4 steps: the mechanism is under test, not the learning), with a
    held-out eval set: the run's checkpoint evals run inside its allocation (the step-0 baseline before training,
    then each checkpoint); `rlctl eval RUN` by hand on that run is a SLURM job of its own, its result recorded in
    the run's stream; status, logs, metrics and doctor read the run as a local one."""
    work, rlctl, cluster = sl
    (work / "qe.toml").write_text(QUICK_EVAL)
    r = rlctl("launch", "qe.toml", "--executor", "slurm", "--partition", "debug", "--set", "train.steps=4",
              timeout=900)
    run = _run_dir(work)
    assert r.returncode == 0, r.stderr + r.stdout + _said(run)
    st = _state(run)
    assert st["status"] == "finished" and st["executor"] == "slurm", st
    assert "submitted as SLURM job" in r.stderr
    s = rlctl("status", run.name)
    assert "finished" in s.stdout and f"job {st['slurm_job_id']}" in s.stdout, s.stdout
    assert "eval/id/greedy_pass@1" in s.stdout and "baseline" in s.stdout, s.stdout
    ledger = json.loads((run / "evals" / "evals.json").read_text())
    assert {k: v["outcome"] for k, v in ledger["done"].items()} == {"0": "ok", "4": "ok"}, ledger
    m = rlctl("metrics", run.name, "--csv")
    assert m.returncode == 0 and "reward/mean" in m.stdout
    lg = rlctl("logs", run.name, "-n", "5")
    assert lg.returncode == 0 and lg.stdout.strip(), lg.stderr
    assert rlctl("doctor", run.name).returncode in (0, 1)
    assert (run / "slurm.sbatch").is_file()

    # by hand, step 4 again: its checkpoint eval did it, so its result is shown and no job is submitted
    again = rlctl("eval", run.name, "--step", "4", "--json", timeout=600)
    assert again.returncode == 0 and json.loads(again.stdout)["results"][0]["evaluated_already"], again.stdout
    assert "by_hand" not in json.loads((run / "evals" / "evals.json").read_text()), "no job, no record"
    # --force: the run ran on SLURM, so its eval job is a SLURM job (not a process on the login node)
    e = rlctl("eval", run.name, "--step", "4", "--force", "--json", timeout=600)
    assert e.returncode == 0, e.stderr + (run / "evals" / "step-4.log").read_text(errors="replace")
    assert "each eval job goes there too" in e.stderr and "SLURM job" in e.stderr, e.stderr
    assert "eval/id/greedy_pass@1" in json.loads(e.stdout)["results"][0]["metrics"]
    assert "#SBATCH --nodes=1" in (run / "evals" / "step-4.sbatch").read_text()
    by_hand = json.loads((run / "evals" / "evals.json").read_text())["by_hand"]
    assert by_hand[-1]["step"] == 4 and by_hand[-1]["outcome"] == "ok" and by_hand[-1]["job"].startswith("SLURM job")
    bad = rlctl("eval", run.name, "--executor", "local", "--partition", "debug")
    assert bad.returncode == 2 and "--partition" in bad.stderr and "--executor slurm" in bad.stderr, bad.stderr


# a trainer for the SLURM tests: it starts in milliseconds, saves a checkpoint every E steps and on SIGTERM
SH_TRAINER = r"""
steps=$1; every=$2; i=0
[ "${3:-}" = "--from" ] && i=$4 && echo "resumed at step $i"
save() { mkdir -p ckpt/step_$1 && echo "{\"step\": $1}" > ckpt/step_$1/done.json; }
trap '[ $i -gt 0 ] && save $i && echo "saved step $i on SIGTERM"; exit 0' TERM
while [ $i -lt $steps ]; do
  i=$((i+1)); echo "step $i | reward 0.$i"
  [ $((i % every)) = 0 ] && save $i
  HOLD
  sleep STEP_S & wait $!
done
"""


def _sh_recipe(work: Path, steps: int, every: int, step_s: float = 1.0, hold: tuple[int, Path] | None = None) -> Path:
    """A command recipe of SH_TRAINER (a step every `step_s` seconds): checkpoints in ckpt/step_N (done.json last),
    resumed with --from N. `hold` (step, file): after that step the trainer waits while the file exists."""
    wait = f'while [ $i = {hold[0]} ] && [ -e "{hold[1]}" ]; do sleep 0.1; done' if hold else ":"
    (work / "trainer.sh").write_text(SH_TRAINER.replace("STEP_S", str(step_s)).replace("HOLD", wait))
    argv = ["sh", str(work / "trainer.sh"), "{steps}", "{checkpoint_every}"]
    rec = work / "sh.toml"
    rec.write_text(_command_recipe("", f"""log_pattern = 'step (?P<step>\\d+) \\| reward (?P<reward>\\S+)'
metrics_map = {{reward = "reward/mean"}}
checkpoint_pattern = "step_{{step}}"
checkpoint_marker = "done.json"
resume_args = ["--from", "{{step}}"]
[checkpoint]
dir = "ckpt"
every = {every}""").replace('command = ""\nshell = true', f"command = {json.dumps(argv)}")
        .replace("steps = 1", f"steps = {steps}"))
    return rec


def _sh_ckpt(run_dir: Path, at_least: int = 1) -> int | None:
    steps = [int(d.name.split("_")[1]) for d in (run_dir / "ckpt").glob("step_*") if (d / "done.json").is_file()]
    return max(steps) if steps and max(steps) >= at_least else None


def test_scancel_mid_run_and_stop(sl):
    """scancel by hand is said as cancelled; rlctl stop is said as stopped (TERM to the job's rlctl first, which
    stops the attempt: the trainer saves on it)."""
    work, rlctl, cluster = sl
    rec = _sh_recipe(work, steps=300, every=1000)
    for n in "ab":
        r = rlctl("launch", str(rec), "--executor", "slurm", "--detach", "--name", n)
        assert r.returncode == 0, r.stderr
    a, b = (next((work / "runs").glob(f"{n}-*")) for n in "ab")
    _wait(lambda: _state(a).get("status") == "running" and _state(b).get("status") == "running", 120,
          "both running", a)
    # its supervisor is the job's own rlctl: nothing to supervise on the login node, said as such
    sup = rlctl("supervise", b.name)
    assert sup.returncode == 2 and f"supervised by SLURM job {_job(b)}" in sup.stderr, sup.stderr
    assert "`rlctl supervise `" not in sup.stderr and f"rlctl resume {b.name}" in sup.stderr, sup.stderr
    subprocess.run(["scancel", _job(a)], env={**os.environ, **cluster.env}, check=True)
    _wait(lambda: rlctl("status", a.name).stdout.count("cancelled"), 60, "cancelled said", a)
    _wait(lambda: (b / "stdout.log").is_file() and "step 2 |" in (b / "stdout.log").read_text(), 60, "step 2", b)
    s = rlctl("stop", b.name, "--grace", "20")
    assert s.returncode == 0 and "stopped" in s.stdout, s.stdout + s.stderr
    assert _state(b)["status"] == "stopped" and _sh_ckpt(b, 2), _said(b)  # saved on the way out
    s = rlctl("status", b.name).stdout
    assert "stopped" in s and "RUNNING" not in s, s  # the job's queue state of while it ran is not its state now


def test_requeue_resumes_from_the_checkpoint(sl):
    """`scontrol requeue` (what preemption with requeue, or an admin, does): the next allocation resumes from the
    last complete checkpoint, and the run finishes all its steps."""
    work, rlctl, cluster = sl
    # held at step 3 until the requeue has happened (it was 16 steps of 1 s, so that the requeue landed mid-run)
    hold = work / "hold"
    hold.write_text("")
    r = rlctl("launch", str(_sh_recipe(work, steps=16, every=2, step_s=0.2, hold=(3, hold))), "--executor", "slurm",
              "--detach")
    assert r.returncode == 0, r.stderr
    run = _run_dir(work)
    _wait(lambda: _sh_ckpt(run, 2), 120, "a complete checkpoint", run)
    job = _job(run)
    assert cluster.scontrol("requeue", job).returncode == 0
    _wait(lambda: rlctl("status", run.name).stdout.count("queued"), 60, "said queued", run)
    hold.unlink()  # the next allocation runs through
    _release(cluster, job)
    # asked as a user does meanwhile: the login node's status writes SLURM's word into the state the job's rlctl
    # writes too, and neither loses the other's (a status that did left the run `restarting` while it ran)
    assert _wait(lambda: _ended(run, rlctl), 300, "the run's end", run) == "finished", _said(run)
    st = _state(run)
    assert len(st["slurm_allocations"]) == 2 and st["slurm_allocations"][1]["restart"] == 1
    assert st["attempts"][-1]["from_step"] >= 2, st["attempts"]
    log = (run / "stdout.log").read_text()
    assert "restarting from checkpoint step" in log and "step 16 |" in log


def test_time_limits(sl, write):
    """Two jobs of a one-minute limit, side by side (SLURM's shortest limit, waited for once):
    - USR1 `signal_before` seconds before the limit: the attempt is stopped (the trainer saves on SIGTERM, as TRL's
      runner does) and the job requeues itself; the next allocation resumes from that checkpoint;
    - no signal, no requeue: the job that reaches its limit anyway is said as timeout, with its last checkpoint."""
    work, rlctl, cluster = sl
    # SLURM sends the signal at its periodic check (every 30 s) once the limit is less than `signal_before` + 30 s
    # away: 20 s before a one-minute limit is 10-40 s after the start, after the trainer's first steps
    r = rlctl("launch", str(_sh_recipe(work, steps=100, every=1000, step_s=0.5)), "--executor", "slurm", "--detach",
              "--time", "1", "--name", "usr1", "--set", "executor.slurm.signal_before=20")
    assert r.returncode == 0, r.stderr
    long = write("long.toml", _command_recipe("sleep 600"))
    r = rlctl("launch", str(long), "--executor", "slurm", "--detach", "--time", "1", "--name", "limit",
              "--set", "executor.slurm.signal_before=0", "--set", "executor.slurm.requeue=false")
    assert r.returncode == 0, r.stderr
    run, lim = (next((work / "runs").glob(f"{n}-*")) for n in ("usr1", "limit"))
    job = _job(run)
    _wait(lambda: (run / "stdout.log").exists() and
          "time limit is near" in (run / "stdout.log").read_text(errors="replace"), 120, "the USR1 signal", run)
    _release(cluster, job)
    cluster.scontrol("update", f"jobid={job}", "TimeLimit=10")  # the next allocation has time to finish
    assert _wait(lambda: _ended(run), 300, "the run's end", run) == "finished", _said(run)
    st = _state(run)
    assert st["slurm_allocations"][-1]["restart"] >= 1
    assert st["attempts"][-1]["from_step"], st["attempts"]  # saved on the signal, resumed there
    assert "saved step" in (run / "stdout.log").read_text()
    _wait(lambda: "timeout" in rlctl("status", lim.name).stdout, 150, "timeout said", lim)
    s = rlctl("status", lim.name).stdout
    assert "the job reached its time limit; no complete checkpoint" in s, s


def test_preempted_and_node_failure_are_said(sl, write):
    """A job preempted (partition `cancel`: no requeue there) and a job whose node failed, each said as such."""
    work, rlctl, cluster = sl
    sleeper = write("sleeper.toml", _command_recipe("sleep 120"))
    r = rlctl("launch", str(sleeper), "--executor", "slurm", "--detach", "--name", "pre", "--partition", "cancel",
              "--set", "executor.slurm.requeue=false", "--set", "executor.slurm.sbatch=[\"--exclusive\"]",
              "--set", "resources.nodes=2")
    assert r.returncode == 0, r.stderr
    pre = next((work / "runs").glob("pre-*"))
    _wait(lambda: _state(pre).get("status") == "running", 60, "running", pre)
    subprocess.run(["sbatch", "-p", "urgent", "-N2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 1"],
                   env={**os.environ, **cluster.env}, check=True, capture_output=True)
    _wait(lambda: "preempted" in rlctl("status", pre.name).stdout, 60, "preempted said", pre)

    r = rlctl("launch", str(sleeper), "--executor", "slurm", "--detach", "--name", "nf",
              "--set", "executor.slurm.requeue=false", "--set", "executor.slurm.sbatch=[\"--nodelist=n2\"]")
    assert r.returncode == 0, r.stderr
    nf = next((work / "runs").glob("nf-*"))
    _wait(lambda: _state(nf).get("status") == "running", 60, "running", nf)
    cluster.scontrol("update", "nodename=n2", "state=down", "reason=rlctl-test")
    try:
        _wait(lambda: "node-failure" in rlctl("status", nf.name).stdout, 60, "node failure said", nf)
    finally:
        cluster.resume_node("n2")
    s = rlctl("status", nf.name).stdout
    assert "a node of the job failed" in s, s


def test_run_directory_not_shared_is_said(sl, write):
    """A run directory the compute nodes do not see (a local disk of the login node): a clear failure."""
    work, rlctl, cluster = sl
    here = cluster.root / "private" / "work"
    here.mkdir(parents=True, exist_ok=True)
    (here / "hello.toml").write_text(_command_recipe("echo hello"))
    r = rlctl("launch", "hello.toml", "--executor", "slurm", "--detach", cwd=here)
    assert r.returncode == 0, r.stderr
    run = next((here / "runs").glob("cmd-*"))
    _wait(lambda: "failed" in rlctl("status", str(run)).stdout, 60, "failed", run)
    s = rlctl("status", str(run)).stdout
    assert "without reaching the run directory" in s and "filesystem the compute nodes share" in s, s


def _command_recipe(command: str, extra: str = "") -> str:
    return f"""
name = "cmd"
[backend]
name = "command"
[backend.command]
command = {json.dumps(command)}
shell = true
{extra}
[model]
path = "none"
[data]
train = "none"
[train]
steps = 1
[resources]
gpus_per_node = 0
gpu = "cpu"
"""


RAY_PROBE = """
import os, ray
ray.init(address=os.environ["RAY_ADDRESS"])
nodes = [n for n in ray.nodes() if n["Alive"]]
ips = sorted(n["NodeManagerAddress"] for n in nodes)
print("ray nodes:", ips, flush=True)
assert len(nodes) == 2, ips
print('{"step": 1, "reward": 1.0}', flush=True)
"""


def test_two_nodes_ray_job_sees_both(sl, write):
    """Two slurmd nodes, the job's Ray cluster over both (the script a GPU cluster runs), a stand-in Ray job that
    asserts it sees both nodes."""
    pytest.importorskip("ray")
    work, rlctl, cluster = sl
    probe = write("probe.py", RAY_PROBE)
    rec = write("ray2.toml", _command_recipe(
        f"{sys.executable} {probe}", 'multi_node = "ray"\nmetrics_file = "none.jsonl"')
        .replace("gpus_per_node = 0", "gpus_per_node = 0\nnodes = 2"))
    r = rlctl("launch", str(rec), "--executor", "slurm", timeout=400)
    run = _run_dir(work)
    log = (run / "stdout.log").read_text(errors="replace")
    assert r.returncode == 0, r.stderr + log + "".join(p.read_text() for p in run.glob("slurm-*.out"))
    assert "Ray cluster up: 2 node(s) joined (n1, n2)" in log
    assert f"ray nodes: ['{cluster.addr('n1')}', '{cluster.addr('n2')}']" in log


def test_two_nodes_torchrun_one_world(sl, write):
    """The torchrun trainer of tests/backends/test_command.py on 2 nodes x 1 process (gloo on the CPU): `srun` starts
    a torchrun per node, rendezvous on the first; the two ranks are one world across n1 and n2, and each step is
    recorded once (only the first node's runner writes records)."""
    pytest.importorskip("torch")
    from tests.backends.test_command import LOG_PATTERN, TRAINER

    work, rlctl, cluster = sl
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", str(TRAINER), "--steps", "{steps}",
           "--save-every", "{checkpoint_every}", "--out", "{checkpoint_dir}", "--lr", "{lr}"]
    rec = write("ddp2.toml", _command_recipe(
        "", f"""multi_node = "torchrun"
log_pattern = '{LOG_PATTERN}'
metrics_map = {{loss = "policy_loss", reward = "reward/mean", lr = "lr"}}
checkpoint_pattern = "step_{{step}}"
checkpoint_marker = "training_info.json"
[checkpoint]
dir = "training_state"
every = 2""").replace('command = ""\nshell = true', f"command = {json.dumps(cmd)}")
        .replace("steps = 1", "steps = 4").replace("gpus_per_node = 0", "gpus_per_node = 0\nnodes = 2"))
    r = rlctl("launch", str(rec), "--executor", "slurm", timeout=600)
    run = _run_dir(work)
    assert r.returncode == 0, r.stderr + _said(run)
    log = (run / "stdout.log").read_text(errors="replace")
    assert "rank 0 of 2 on n1" in log and "rank 1 of 2 on n2" in log, _said(run)
    raw = [json.loads(line) for line in (run / "backend_metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [x["rlctl_command"]["step"] for x in raw] == [1, 2, 3, 4], raw  # once each, from node 0's runner
    m = rlctl("metrics", run.name, "--csv")
    assert m.returncode == 0 and "reward/mean" in m.stdout, m.stdout + m.stderr
    assert (run / "training_state" / "step_4" / "training_info.json").is_file()


def test_sweep_on_slurm(sl):
    """`rlctl sweep --executor slurm`: every variant handed to SLURM at once (its queue, not rlctl's, decides what
    runs when), each a job of its own; `status --experiment` and `compare` read them as any runs."""
    from tests.test_experiments import _max_overlap, _spans, bandit_recipe

    work, rlctl, cluster = sl
    (work / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=8, sleep=0.3))
    r = rlctl("sweep", "b.toml", "--grid", "optim.lr=1e-6,0.5", "--seeds", "2", "--executor", "slurm",
              "--name", "sl", "--wait", timeout=600)
    exp = work / "runs" / "_experiments" / "sl"
    assert r.returncode == 0, r.stderr[-3000:] + (exp / "queue.log").read_text()
    dirs = sorted(p for p in (work / "runs").glob("sl-*") if (p / "state.json").is_file())
    assert len(dirs) == 4
    jobs = {_state(p)["slurm_job_id"] for p in dirs}
    assert len(jobs) == 4 and all(_state(p)["status"] == "finished" and _state(p)["slurm_allocations"] for p in dirs)
    assert _max_overlap(_spans(dirs)) >= 2, _spans(dirs)  # queued in SLURM together, not one after the other
    st = rlctl("status", "--experiment", "sl", "--json")
    rows = json.loads(st.stdout)
    assert len(rows) == 4 and {x["status"] for x in rows} == {"finished"}, st.stdout
    c = rlctl("compare", "sl", "--json")
    assert c.returncode == 0, c.stderr
    got = json.loads(c.stdout)
    assert len(got["comparisons"]) == 1 and [len(a["values"]) for a in got["arms"]] == [2, 2], got  # every run read


def test_launch_from_the_laptop_through_the_login_node(sshd, cluster, tmp_path, monkeypatch, cli, write):  # noqa: F811
    """`--on login --executor slurm`: the login node is an SSH host; rlctl there submits the job, and the laptop's
    status follows it through the host."""
    ctl = Path(f"/tmp/rlctl-t-{os.urandom(4).hex()}")
    monkeypatch.setenv("RLCTL_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("RLCTL_SSH_CONFIG", str(sshd.client_config))
    monkeypatch.setenv("RLCTL_SSH_CONTROL_DIR", str(ctl))
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "laptop-runs"))
    r = cli("hosts", "add", "login", ALIAS, "--workdir", str(tmp_path / "login"), "--python", sys.executable,
            "--env", f"PYTHONPATH={ROOT}", "--env", f"SLURM_CONF={cluster.conf}")
    assert r.code == 0, r.err
    rec = write("hello.toml", _command_recipe("echo hello from the job"))
    r = cli("launch", str(rec), "--on", "login", "--executor", "slurm", "--partition", "debug", "--detach")
    assert r.code == 0, r.err + r.out
    name = r.out.strip().splitlines()[-1]
    _wait(lambda: "finished" in cli("status", name).out, 120, "finished on the cluster")
    remote = next((tmp_path / "login" / "runs").glob("cmd-*"))
    st = _state(remote)
    assert st["executor"] == "slurm" and st["slurm_allocations"], st
    assert "hello from the job" in (remote / "stdout.log").read_text()
    assert "hello from the job" in (tmp_path / "laptop-runs" / name / "stdout.log").read_text()  # the mirror
    with contextlib.suppress(Exception):
        subprocess.run(["ssh", "-F", str(sshd.client_config), "-o", f"ControlPath={ctl}/%C", "-O", "exit", ALIAS],
                       capture_output=True, timeout=10)


def test_a_job_slurm_forgot_is_read_from_accounting(sl, write):
    """The cluster keeps accounting (slurmdbd): a job that ended without its run recording how (scancel: the job's
    rlctl records only that the allocation ended) and that slurmctld no longer knows (an ended job is forgotten
    MinJobAge after its end) is said from sacct. Run last: it restarts slurmctld."""
    work, rlctl, cluster = sl
    rec = write("long.toml", _command_recipe("sleep 600"))
    r = rlctl("launch", str(rec), "--executor", "slurm", "--detach", "--set", "executor.slurm.requeue=false")
    assert r.returncode == 0, r.stderr
    run = _run_dir(work)
    _wait(lambda: _state(run).get("status") == "running", 60, "running", run)
    job = _job(run)
    env = {**os.environ, **cluster.env}
    subprocess.run(["scancel", job], env=env, check=True)

    def in_accounting() -> bool:
        p = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "State"], env=env, capture_output=True,
                           text=True)
        return p.stdout.startswith("CANCELLED")

    _wait(in_accounting, 60, "the job's end in slurmdbd", run)
    _wait(lambda: _state(run).get("slurm_interrupted"), 60, "the allocation's end recorded by the job", run)
    cluster.forget_jobs()
    assert "Invalid job id" in cluster.scontrol("show", "job", job).stderr
    s = rlctl("status", run.name)
    assert "cancelled" in s.stdout and "the job was cancelled (scancel)" in s.stdout, s.stdout
    assert _state(run)["slurm_end"]["source"] == "sacct", _state(run)
