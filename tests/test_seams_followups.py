"""Defects met beside issue 30's (its helpers' follow-ups), each played as a user types it: the README's commands
from a working directory with every default (relative ./runs, no RLCTL_* variables, only HOME isolated: the `user`
fixture). Each test failed before its fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.test_experiments import bandit_recipe


def project(work: Path, steps: int = 2, sleep: float = 0.0, extra: str = "") -> Path:
    """A bandit recipe (a real tiny learner through the command backend: seconds on a CPU) and its prompts."""
    (work / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=steps, sleep=sleep) + extra)
    return work / "b.toml"


COUNTER = Path(__file__).resolve().parent / "fixtures" / "command" / "counter_trainer.py"


def counter_project(work: Path, steps: int = 6, extra: str = "") -> Path:
    """A custom trainer's recipe (the command backend: seed 003's checkpoint layout, step_N/ with a marker written
    last, resumed with --resume PATH), standard library only: seconds on a CPU."""
    cmd = [sys.executable, str(COUNTER), "--steps", "{steps}", "--save-every", "{checkpoint_every}", "--out",
           "{checkpoint_dir}"]
    (work / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (work / "c.toml").write_text(f"""name = "counter"
[backend]
name = "command"
[backend.command]
command = {json.dumps(cmd)}
log_pattern = 'step (?P<step>\\d+) \\| reward (?P<reward>\\S+)'
metrics_map = {{reward = "reward/mean"}}
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
""" + extra)
    return work / "c.toml"


# ---- env values are strings: a number typed for env.X is that string ---------------------------------------------

def test_env_numbers_given_with_set_grid_or_in_the_file_are_the_strings_typed(user):
    work, rlctl = user
    project(work, extra='[env]\nBANDIT_VERSION = 12.10\nBANDIT_FLAG = true\n')
    r = rlctl("recipe", "show", "b.toml", "--set", "env.BANDIT_SHIFT=0.250", "--set", "env.N=0", "--json")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["env"]
    assert env == {"BANDIT_SHIFT": "0.250", "N": "0", "BANDIT_VERSION": "12.10", "BANDIT_FLAG": "true"}, env
    assert rlctl("preflight", "b.toml", "--set", "env.BANDIT_SHIFT=0").returncode == 0
    # a sweep over an environment variable: each arm's run gets the value as typed
    r = rlctl("sweep", "b.toml", "--grid", "env.BANDIT_SHIFT=0,0.25", "--name", "shift", "--wait", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    shifts = sorted(_recipe_env(d)["BANDIT_SHIFT"] for d in (work / "runs").glob("shift-*"))
    assert shifts == ["0", "0.25"], shifts
    # another type mismatch names the option the value came from
    r = rlctl("sweep", "b.toml", "--grid", "train.steps=abc,2", "--name", "bad")
    assert r.returncode == 2 and "--grid train.steps: `train.steps`" in r.stderr and "--set" not in r.stderr, r.stderr
    (work / "s.toml").write_text(bandit_recipe(steps=2) + '[sweep]\ngrid = { "train.steps" = ["abc", 2] }\n')
    r = rlctl("sweep", "s.toml", "--name", "bad2")
    assert r.returncode == 2 and "[sweep] grid train.steps: `train.steps`" in r.stderr, r.stderr
    r = rlctl("preflight", "b.toml", "--set", "env.X=[1, 2]")
    assert r.returncode == 2 and "--set env.X: `env.X`" in r.stderr and "Traceback" not in r.stderr, r.stderr


def _recipe_env(run: Path) -> dict[str, str]:
    import tomllib

    return tomllib.loads((run / "recipe.toml").read_text()).get("env", {})



# ---- an experiment's arms keep their --set paths resolved -----------------------------------------------------------

def test_an_experiment_extended_from_another_directory_keeps_its_set_paths(user, tmp_path):
    """`rlctl sweep ... --set data.train=data/p.jsonl`, then, from another directory, `rlctl experiment resume EXP
    --seeds 2`: the new variants read the file the --set named where it was typed (before: the arms kept the words
    as typed and the queue, started elsewhere, resolved them there: preflight failed, "does not exist")."""
    work, rlctl = user
    project(work)
    (work / "data").mkdir()
    (work / "data" / "p.jsonl").write_text('{"input": "c"}\n')
    r = rlctl("sweep", "b.toml", "--set", "data.train=data/p.jsonl", "--grid", "optim.lr=0.1,0.5", "--name", "lrs",
              "--wait", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    other = tmp_path / "elsewhere"
    other.mkdir()
    r = rlctl("experiment", "resume", "lrs", "--seeds", "2", "--wait", cwd=other, timeout=600)
    assert r.returncode == 0 and "2 runs added" in r.stderr, r.stdout + r.stderr
    runs = sorted((work / "runs").glob("lrs-*"))
    assert len(runs) == 4 and not (other / "runs").exists(), runs
    for run in runs:
        assert _recipe(run)["data"]["train"] == str(work / "data" / "p.jsonl"), run
    shown = json.loads(rlctl("experiment", "show", "lrs", "--json", cwd=other).stdout)
    arms = shown["manifest"]["arms"]
    assert all(str(work / "data" / "p.jsonl") in " ".join(a["sets"]) for a in arms), arms


def _recipe(run: Path) -> dict:
    import tomllib

    return tomllib.loads((run / "recipe.toml").read_text())


# ---- launch --resume of a run that still trains -------------------------------------------------------------------

def wait_for(pred, timeout: float = 120.0) -> bool:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def held_run(work: Path, rlctl, timeout: float = 120.0) -> Path:
    """The counter trainer launched detached and held after its first save (TRAINER_GATE): a run that is running,
    with a complete checkpoint, until the test lets it go (a file `go` in work/gate) or stops it."""
    gate = work / "gate"
    gate.mkdir()
    counter_project(work, extra=f'[env]\nTRAINER_GATE = "{gate}"\n')
    r = rlctl("launch", "c.toml", "--detach")
    assert r.returncode == 0, r.stderr
    run = work / "runs" / r.stdout.strip().splitlines()[-1]
    assert wait_for(lambda: (run / "training_state" / "step_2" / "training_info.json").is_file(), timeout=timeout)
    return run


def test_resume_of_a_running_run_is_refused_unless_forced(user):
    """`rlctl launch R --resume RUN` while RUN still trains started a second run from its checkpoint beside it,
    silently; now exit 2 with the fix (stop it first, or --force to fork on purpose, said when it happens)."""
    work, rlctl = user
    run = held_run(work, rlctl)
    name, gate = run.name, work / "gate"
    r = rlctl("launch", "c.toml", "--resume", name)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert f"--resume {name}: that run is still running" in r.stderr and "a fork" in r.stderr, r.stderr
    assert f"rlctl stop {name}" in r.stderr and "--force" in r.stderr
    assert len(list((work / "runs").iterdir())) == 1  # nothing was made
    r = rlctl("launch", "c.toml", "--resume", name, "--force", "--name", "fork", "--detach", "--restart", "on-failure")
    assert r.returncode == 0 and f"{name} is still running: forking it (--force)" in r.stderr, r.stderr
    (gate / "go").write_text("")  # both go on and end
    fork = work / "runs" / r.stdout.strip().splitlines()[-1]
    for d in (run, fork):
        assert wait_for(lambda d=d: json.loads(rlctl("status", d.name, "--json").stdout)["status"] == "finished")
    assert "step 3 |" in (fork / "stdout.log").read_text() and "step 1 |" not in (fork / "stdout.log").read_text()
    # its first attempt started from the parent's checkpoint, said as such (it blamed the recipe's checkpoint.resume,
    # which the user's recipe does not have)
    shown = rlctl("status", fork.name).stdout
    assert f"launch, from {name}'s checkpoint at step 2 ->" in shown and "the recipe's" not in shown, shown
    first = json.loads(rlctl("status", fork.name, "--json").stdout)["attempts"][0]
    assert first["from_step"] == 2 and first["from_run"] == name and not first.get("from_recipe"), first


# ---- a script named in eval.command is the recipe's, as its other paths are ----------------------------------------
PROBE = '''import json, sys
json.dump({"primary": int(sys.argv[1]) / 10}, open(sys.argv[2], "w"))
'''


def test_eval_command_script_is_found_next_to_the_recipe(user):
    """eval.command = "python probe.py {step} {output}" in exp/c.toml (probe.py beside it): the checkpoint evals run
    in <run>/evals, where `probe.py` was looked up before (every eval failed: "No such file"); now it is the recipe
    file's probe.py, as data and reward files are, in the run and by hand."""
    work, rlctl = user
    (work / "exp").mkdir()
    counter_project(work / "exp", extra=f'''[eval]
evaluator = "command"
command = "{sys.executable} probe.py {{step}} {{output}}"
primary = "probe"
baseline = false
[eval.sets.probe]
data = "prompts.jsonl"
''')
    (work / "exp" / "probe.py").write_text(PROBE)
    r = rlctl("launch", "exp/c.toml", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    name = next((work / "runs").iterdir()).name
    d = json.loads(rlctl("status", name, "--json").stdout)
    assert not d.get("eval_failures"), d.get("eval_failures")
    values = {rec["step"]: rec["eval/probe/greedy_pass@1"] for rec in map(json.loads, (
        work / "runs" / name / "metrics.jsonl").read_text().splitlines()) if "eval/probe/greedy_pass@1" in rec}
    assert values == {2: 0.2, 4: 0.4, 6: 0.6}, values
    r = rlctl("eval", name, "--step", "4", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["results"][0]["metrics"]["eval/probe/greedy_pass@1"] == 0.4, r
    shown = json.loads(rlctl("recipe", "show", "exp/c.toml", "--json").stdout)
    assert str(work / "exp" / "probe.py") in shown["eval"]["command"], shown["eval"]


# ---- resume when the new supervisor dies at once ------------------------------------------------------------------

def test_resume_says_when_the_new_supervisor_dies_at_once(user):
    """A stopped run whose executor is gone (a plugin executor uninstalled since): `rlctl resume RUN` starts a
    supervisor that dies at once. Exit 1 and the end of its supervisor.log (the error itself, not only its last
    line), not exit 2 with a `fix:` line out of context."""
    work, rlctl = user
    run = held_run(work, rlctl)
    name = run.name
    assert rlctl("stop", name).returncode == 0
    spec = json.loads((run / ".launch.json").read_text())
    (run / ".launch.json").write_text(json.dumps({**spec, "executor": "k8s"}))  # a plugin's, not installed here
    r = rlctl("resume", name)
    assert r.returncode == 1 and "Traceback" not in r.stderr.split("  | ")[0], r.stdout + r.stderr
    assert "the supervisor exited (code 1) before it took the run up" in r.stderr, r.stderr
    assert "unknown executor 'k8s'" in r.stderr and f"see {run / 'supervisor.log'}" in r.stderr, r.stderr
    assert "stopped" not in r.stdout and "running" not in r.stdout, r.stdout


# ---- TRL colocates vLLM by default: the trainer runs on every GPU -------------------------------------------------

def test_trl_colocated_vllm_trains_on_every_gpu(user):
    """TRL 1.16's GRPOConfig colocates vLLM by default (vllm_mode "colocate"): on 2 GPUs without
    resources.colocate the trainer still runs on both (data parallel 2), so a train batch of 32 in micro batches of
    8 takes 2 accumulation steps, not 4 (which trained on 64 samples per step). With vllm_mode = "server" vLLM has a
    GPU of its own and the trainer the other one."""
    from tests.conftest import RECIPES

    work, rlctl = user
    (work / "t.toml").write_text(f'''extends = "{RECIPES / 'quickstart.toml'}"
[model]
path = "Qwen/Qwen2.5-0.5B"
[train]
train_batch_size = 32
micro_batch_size = 8
[backend.trl.extra]
use_vllm = true
[resources]
gpus_per_node = 2
gpu = "H100"
''')
    for mode, accum in ((None, 2), ("server", 4)):
        sets = ["--set", f"backend.trl.extra.vllm_mode={mode}"] if mode else []
        out = work / f"out-{mode}"
        r = rlctl("render", "t.toml", *sets, "--out", str(out))
        assert r.returncode == 0, r.stderr
        grpo = json.loads((out / "trl_config.json").read_text())["grpo"]
        assert grpo["per_device_train_batch_size"] * grpo["gradient_accumulation_steps"] * (2 if accum == 2 else 1) \
            == 32 and grpo["gradient_accumulation_steps"] == accum, (mode, grpo)


# ---- a SIGKILLed custom trainer is recorded as killed, not as the runner's own error --------------------------------

def test_a_sigkilled_command_trainer_is_recorded_with_its_signal(user):
    """The command backend's runner re-raised the trainer's signal with signal.signal(SIGKILL, SIG_DFL), which Linux
    refuses (EINVAL): the attempt was recorded `exit code 1` with the cause `OSError: [Errno 22] Invalid argument`
    (new-user trial). Now it dies of the same SIGKILL: -9, as the OOM killer's victim is shown."""
    import os
    import signal

    import psutil

    work, rlctl = user
    run = held_run(work, rlctl, timeout=60)
    st = json.loads((run / "state.json").read_text())
    trainer = next(p for p in psutil.Process(st["pid"]).children(recursive=True)
                   if "counter_trainer.py" in " ".join(p.cmdline()))
    os.kill(trainer.pid, signal.SIGKILL)
    assert wait_for(lambda: json.loads((run / "state.json").read_text()).get("status") == "failed", timeout=60)
    a1 = json.loads((run / "state.json").read_text())["attempts"][0]
    assert a1["exit_code"] == -signal.SIGKILL, a1
    assert "Invalid argument" not in (run / "stdout.log").read_text()
    shown = rlctl("status", run.name).stdout
    assert "OSError" not in shown, shown


def test_logs_of_the_supervisor_after_a_prune(user):
    """`rlctl logs RUN --component supervisor` of any run that pruned a checkpoint: `internal error: KeyError:
    'time'` (the prune event had no time; new-user trial). An event written so by an older rlctl is shown too."""
    work, rlctl = user
    counter_project(work, extra="keep_last = 1\n")  # appended under [checkpoint]
    r = rlctl("launch", "c.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    run = next((work / "runs").glob("counter-*"))
    r = rlctl("logs", run.name, "--component", "supervisor")
    assert r.returncode == 0 and "pruned" in r.stdout, r.stdout + r.stderr
    with (run / "rlctl-events.jsonl").open("a") as fh:
        fh.write('{"event": "pruned", "steps": [1]}\n')
    r = rlctl("logs", run.name, "--component", "supervisor")
    assert r.returncode == 0 and "(no time) pruned" in r.stdout, r.stdout + r.stderr


def test_a_foreground_launch_tells_the_restart_and_the_last_step_once(user):
    """`rlctl launch` in the foreground printed `step 13/20`, then `step 17/20`, nothing of the crash and restart in
    between (only stdout.log had it), and its final `step 20/20` line twice (new-user trial)."""
    work, rlctl = user
    (work / "crash_once.py").write_text(  # the counter trainer, whose first attempt dies after step 3
        "import os, runpy, sys\n"
        "flag = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'crashed')\n"
        "first = '--resume' not in sys.argv and not os.path.exists(flag)\n"
        "if first:\n"
        "    open(flag, 'w').close()\n"
        "    sys.argv[sys.argv.index('--steps') + 1] = '3'\n"
        "try:\n"
        f"    runpy.run_path({str(COUNTER)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.exit(1 if first else 0)\n")
    counter_project(work)
    text = (work / "c.toml").read_text().replace(str(COUNTER), str(work / "crash_once.py"))
    (work / "c.toml").write_text(text + '[run]\nrestart = "on-failure"\nmax_restarts = 1\n')
    r = rlctl("launch", "c.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "rlctl: attempt 1 failed" in out and "as attempt 2" in out, out
    steps = [ln.split()[1] for ln in out.splitlines() if ln.startswith("step ")]
    assert steps.count("6/6") == 1, out
