"""The command backend: a trainer rlctl does not know, run from the recipe's own command.

The end-to-end tests launch a real torchrun trainer (tests/fixtures/command/tiny_trainer.py: torch.distributed with
gloo on the CPU, 2 processes) through the CLI, then status, logs, doctor, ckpt list/prune, --resume and a restart
after a crash work on it through the adapter alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.backends import get_backend
from rlctl.backends.command import runner
from rlctl.recipe.loader import load
from tests.conftest import ROOT, run_cli

TRAINER = Path(__file__).resolve().parents[1] / "fixtures" / "command" / "tiny_trainer.py"
LOG_PATTERN = r"step (?P<step>\d+) \| loss (?P<loss>\S+) \| reward (?P<reward>\S+) \| lr (?P<lr>\S+)"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def recipe_text(*, metrics: str = "log", extra_args: tuple[str, ...] = (), steps: int = 6, every: int = 2) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TRAINER),
           "--steps", "{steps}", "--save-every", "{checkpoint_every}", "--out", "{checkpoint_dir}", "--lr", "{lr}",
           *extra_args]
    if metrics == "log":
        source = f"log_pattern = '{LOG_PATTERN}'\n"
        mapping = 'metrics_map = {loss = "policy_loss", reward = "reward/mean", lr = "lr"}\n'
    else:
        cmd += ["--metrics", "{metrics_file}"]
        source = 'metrics_file = "train_log.jsonl"\n'
        mapping = 'metrics_map = {loss = "policy_loss", reward = "reward/mean", "optim/lr" = "lr"}\n'
    return f"""
name = "tiny-torchrun"
[backend]
name = "command"
[backend.command]
command = {json.dumps(cmd)}
{source}{mapping}checkpoint_pattern = "step_{{step}}"
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
[optim]
lr = 0.05
[resources]
gpus_per_node = 0
gpu = "cpu"
[checkpoint]
dir = "training_state"
every = {every}
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    runs = tmp_path / "runs"
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(runs))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    yield {"dir": tmp_path, "runs": runs, "env": env}
    _kill_runs(runs)


def _kill_runs(runs: Path) -> None:
    """Whatever a failed test left running goes (each run's process group and supervisor)."""
    if not runs.is_dir():
        return
    for run in runs.iterdir():
        try:
            state = json.loads((run / "state.json").read_text())
        except (OSError, ValueError):
            continue
        pids = [state.get("pgid"), state.get("supervisor_pid"), (state.get("handle") or {}).get("ref", {}).get("pgid")]
        for pid in filter(None, pids):
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(pid, signal.SIGKILL)


def rlctl(w, *args, timeout=120):
    """A separate rlctl process (launch: it starts and supervises real processes)."""
    return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], cwd=w["dir"], env=w["env"],
                          capture_output=True, text=True, timeout=timeout)


def cli(w, *args):
    """rlctl in this process (status, logs, ckpt, render: cheaper than a new interpreter on a busy machine)."""
    r = run_cli(*args, cwd=w["dir"])
    return SimpleNamespace(returncode=r.code, stdout=r.out, stderr=r.err)


def write_recipe(w, name="r.toml", **kw) -> Path:
    p = w["dir"] / name
    p.write_text(recipe_text(**kw))
    return p


def logs_of(w) -> str:
    """The end of every run's stdout.log, for an assertion message."""
    out = []
    for run in sorted(w["runs"].glob("*/stdout.log")):
        out.append(f"--- {run.parent.name}\n" + run.read_text(errors="replace")[-2000:])
    return "\n".join(out)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def ckpt_list(w, run: str) -> list[dict]:
    data = json.loads(cli(w, "ckpt", "list", run, "--json").stdout)
    return data["checkpoints"] if isinstance(data, dict) else data


def run_named(w, prefix: str) -> Path:
    found = [d for d in w["runs"].iterdir() if d.name.startswith(prefix + "-")]
    assert len(found) == 1, found
    return found[0]


# ---- render, options, parse, checkpoints (no process) -------------------------------------------------------------
def test_render_fills_the_command_from_the_recipe(workdir):
    recipe = write_recipe(workdir)
    rec = load(recipe, ["train.steps=9", "checkpoint.every=3"]).recipe
    plan = get_backend("command").render(rec)
    assert plan.argv == ["python3", "command_runner.py", "command.json"] and plan.total_steps == 9
    cfg = json.loads(plan.files["command.json"])
    argv = cfg["argv"]
    assert argv[argv.index("--steps") + 1] == "9" and argv[argv.index("--save-every") + 1] == "3"
    assert argv[argv.index("--out") + 1] == "training_state" and argv[argv.index("--lr") + 1] == "0.05"
    assert cfg["checkpoint"] == {"dir": "training_state", "pattern": "step_{step}", "marker": "training_info.json",
                                 "resume_args": ["--resume", "{path}"], "resume": "off", "total_steps": 9}
    assert cfg["metrics"]["map"]["loss"] == "policy_loss"
    assert plan.files["command_runner.py"] == Path(runner.__file__).read_text()  # the run directory is self-contained
    assert get_backend("command").validate(plan, None) == []
    assert get_backend("command").prune_during_run(rec)  # the trainer may keep everything: rlctl prunes to keep_last
    # the CLI shows the same, with the command spelled out
    r = cli(workdir, "render", str(recipe))
    assert r.returncode == 0, r.stderr
    assert "command_runner.py command.json" in r.stdout and "tiny_trainer.py --steps 6" in r.stdout


def test_render_applies_the_resume_template(workdir, tmp_path):
    root = tmp_path / "ckpts"
    for step, marker in ((2, True), (4, True), (6, False)):
        (root / f"step_{step}").mkdir(parents=True)
        if marker:
            (root / f"step_{step}" / "training_info.json").write_text("{}")
    recipe = write_recipe(workdir)
    backend = get_backend("command")
    rec = load(recipe, [f'checkpoint.dir="{root}"', "checkpoint.resume=latest"]).recipe
    plan = backend.render(rec)
    # the newest *complete* checkpoint: step_6 has no marker yet
    assert any(n.endswith(f"--resume {root / 'step_4'}") for n in plan.notes), plan.notes
    assert "resumes from checkpoint step 4" in " ".join(plan.notes)
    cfg = json.loads(plan.files["command.json"])
    assert runner.command_argv(cfg, runner.pick_resume(cfg))[-2:] == ["--resume", str(root / "step_4")]
    rec = load(recipe, [f'checkpoint.dir="{root}"', "checkpoint.resume=2"]).recipe
    assert "step 2" in " ".join(backend.render(rec).notes)
    rec = load(recipe, [f'checkpoint.dir="{root}"', "checkpoint.resume=6"]).recipe
    # said, not raised: preflight's checkpoint.resume check fails on it with the key's line and the steps there are
    assert "no complete checkpoint of step 6" in " ".join(backend.render(rec).notes)
    # a whole other command to resume with
    cfg["resume_argv"] = ["resume.py", "--from-step", "{step}", "--dir", "{dir}"]
    assert runner.command_argv(cfg, (4, str(root / "step_4"))) == ["resume.py", "--from-step", "4", "--dir",
                                                                    str(root)]


@pytest.mark.parametrize(("key", "value", "message"), [
    ("log_pattern", "'step (?P<step>\\d+'", "is not a regex"),
    ("log_pattern", "'step (\\d+)'", "no named group"),
    ("metrics_map", '{loss = "policy-loss"}', "Did you mean policy_loss"),
    ("checkpoint_pattern", '"ckpt/step_{step}"', "one folder"),
    ("resume_args", '["--resume", "{where}"]', "unknown placeholder {where}"),
    ("comand", '["x"]', "unknown key `backend.command.comand`"),
])
def test_bad_options_are_reported_with_the_file(workdir, key, value, message):
    text = "\n".join(line for line in recipe_text().splitlines() if not line.startswith(f"{key} ="))
    text = text.replace("[backend.command]\n", f"[backend.command]\n{key} = {value}\n", 1)
    (workdir["dir"] / "bad.toml").write_text(text)
    r = cli(workdir, "render", "bad.toml")
    assert r.returncode == 2 and "bad.toml" in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_placeholder_and_missing_value(workdir):
    text = recipe_text().replace('"{lr}"', '"{learning_rate}"')
    (workdir["dir"] / "p.toml").write_text(text)
    r = cli(workdir, "render", "p.toml")
    assert r.returncode == 2 and "unknown placeholder {learning_rate}" in r.stderr and "{lr}" in r.stderr
    text = recipe_text().replace('"{lr}"', '"{eval_data}"')
    (workdir["dir"] / "q.toml").write_text(text)
    r = cli(workdir, "render", "q.toml")
    assert r.returncode == 2 and "{eval_data} is used" in r.stderr
    # a smoke run (no checkpoints) still renders: unset counts are 0
    cfg = json.loads(get_backend("command").render(_smoke(workdir)).files["command.json"])
    assert cfg["argv"][cfg["argv"].index("--save-every") + 1] == "0"


def _smoke(w):
    from rlctl.runs.launch import smoke

    rec = load(write_recipe(w)).recipe
    smoke(rec)
    return rec


def test_validate_says_what_rlctl_cannot_see(workdir):
    text = recipe_text()
    for key in ("log_pattern", "metrics_map", "checkpoint_pattern", "checkpoint_marker", "resume_args"):
        text = "\n".join(line for line in text.splitlines() if not line.startswith(key))
    text = text.replace(json.dumps(sys.executable), '"no-such-trainer-xyz"')
    (workdir["dir"] / "blind.toml").write_text(text)
    r = cli(workdir, "preflight", "blind.toml", "--json")
    findings = {(x["verdict"], x["figure"].split(":")[0]) for x in json.loads(r.stdout)["results"]
                if x["check"] == "env.flags"}
    assert ("fail", "`no-such-trainer-xyz` is not on PATH") in findings
    assert any(v == "warn" and "no metrics" in f for v, f in findings)
    assert any(v == "warn" and "cannot see this command's checkpoints" in f for v, f in findings)
    assert r.returncode == 1


def test_parse_reads_the_runners_records_only():
    b = get_backend("command")
    assert b.parse('{"rlctl_command": {"step": 3, "policy_loss": 0.5, "command/x": "nan"}}') == \
        {"step": 3, "policy_loss": 0.5, "command/x": None}
    assert b.parse('{"rlctl_command": {"reward/mean": 1}}') == {"reward/mean": 1}  # no step: counted
    assert b.parse('{"step": 3, "loss": 0.5}') is None  # the trainer's own JSON on stdout is not ours
    assert b.parse("step 3 | loss 0.5") is None
    tr = runner.Translator({"patterns": [LOG_PATTERN], "map": {"loss": "policy_loss"}, "step_key": "step"})
    assert tr.line("step 7 | loss 0.25 | reward 0.5 | lr 0.01 | grad_norm 1") == \
        {"step": 7, "policy_loss": 0.25, "command/reward": 0.5, "command/lr": 0.01}
    assert tr.line("warming up") is None
    assert tr.json_line('{"step": "final", "loss": 0.1}') == {"step": None, "policy_loss": 0.1}  # the step in progress
    assert tr.json_line('{"step": 2, "loss": 1.5, "optim": {"lr": 0.1}, "tags": [1]}') == \
        {"step": 2, "policy_loss": 1.5, "command/optim/lr": 0.1}


def test_checkpoints_follow_the_descriptor(tmp_path):
    root = tmp_path / "ck"
    runner.write_descriptor({"checkpoint": {"dir": str(root), "pattern": "re:^ckpt-(\\d+)$", "marker": "done"}})
    for step in (10, 20, 30):
        (root / f"ckpt-{step}").mkdir()
    (root / "ckpt-10" / "done").write_text("")
    (root / "ckpt-20" / "done").write_text("")
    (root / "ckpt-99").symlink_to(root / "ckpt-20")  # a link is never a checkpoint
    (root / "other-5").mkdir()
    found = get_backend("command").checkpoints(root)
    assert [(c.step, c.path.name, c.complete) for c in found] == [(10, "ckpt-10", True), (20, "ckpt-20", True),
                                                                  (30, "ckpt-30", False)]
    assert get_backend("command").checkpoints(tmp_path) == []  # no descriptor: nothing claimed


# ---- a real torchrun trainer through the CLI ----------------------------------------------------------------------
@needs_torch
@pytest.mark.slow
def test_launch_status_ckpt_prune_resume(workdir):
    recipe = write_recipe(workdir)
    r = rlctl(workdir, "launch", str(recipe), "--name", "first")
    assert r.returncode == 0, r.stderr[-1500:] + logs_of(workdir)
    first = run_named(workdir, "first")
    assert [m["step"] for m in metrics(first)] == [1, 2, 3, 4, 5, 6]
    assert all("policy_loss" in m and "reward/mean" in m and m["lr"] == 0.05 for m in metrics(first))
    for f in ("command.json", "command_runner.py", "launch.sh", "stdout.log", "state.json"):
        assert (first / f).is_file(), f

    st = json.loads(cli(workdir, "status", first.name, "--json").stdout)
    assert st["status"] == "finished" and st["step"] == 6 and st["total_steps"] == 6
    assert st["metrics"]["reward/mean"]["latest"] is not None
    rows = json.loads(cli(workdir, "status", "--json").stdout)
    assert rows[0]["backend"] == "command" and rows[0]["step"] == 6
    logs = rlctl(workdir, "logs", first.name, "--metrics")  # writes to the real stdout
    assert [json.loads(line)["step"] for line in logs.stdout.splitlines()] == [1, 2, 3, 4, 5, 6]
    assert cli(workdir, "doctor", first.name).returncode in (0, 1)

    # a checkpoint being written (no marker yet) shows as incomplete and is never resumed from nor pruned
    (first / "training_state" / "step_8").mkdir()
    (first / "training_state" / "step_8" / "model.pt").write_text("half")
    listed = ckpt_list(workdir, first.name)
    assert [(c["step"], c["complete"]) for c in listed] == [(2, True), (4, True), (6, True), (8, False)]
    dry = cli(workdir, "ckpt", "prune", first.name, "--keep-last", "1", "--dry-run")
    assert dry.returncode == 0 and (first / "training_state" / "step_2").is_dir()
    pr = cli(workdir, "ckpt", "prune", first.name, "--keep-last", "1")
    assert pr.returncode == 0, pr.stderr
    left = sorted(p.name for p in (first / "training_state").iterdir() if p.is_dir())
    assert left == ["step_6", "step_8"]

    r = rlctl(workdir, "launch", str(recipe), "--name", "second", "--resume", first.name, "--set", "train.steps=8")
    assert r.returncode == 0, r.stderr[-1500:] + logs_of(workdir)
    second = run_named(workdir, "second")
    assert [m["step"] for m in metrics(second)] == [7, 8]  # continued after the last complete checkpoint
    log = (second / "stdout.log").read_text()
    assert "resuming from checkpoint step 6" in log and "resumed from" in log and "at step 7" in log
    assert (first / "training_state" / "step_6").is_dir()  # the parent is only read
    done = ckpt_list(workdir, second.name)
    assert [(c["step"], c["complete"]) for c in done if c["complete"]][-1] == (8, True)


@needs_torch
@pytest.mark.slow
def test_restart_after_a_crash_resumes_from_the_checkpoint(workdir):
    """JSONL metrics file as the source; the trainer dies at step 5 and the supervisor restarts it from step 4."""
    recipe = write_recipe(workdir, metrics="jsonl", extra_args=("--fail-at", "5"))
    r = rlctl(workdir, "launch", str(recipe), "--name", "crashy", "--restart", "on-failure")
    assert r.returncode == 0, r.stderr[-1500:] + logs_of(workdir)
    run = run_named(workdir, "crashy")
    recs = metrics(run)
    assert [m["step"] for m in recs] == [1, 2, 3, 4, 5, 6]  # each step once: the repeat after the restart dropped
    assert all(m["lr"] == 0.05 and "policy_loss" in m for m in recs)
    log = (run / "stdout.log").read_text()
    assert "simulated crash at step 5" in log and "resuming from checkpoint step 4" in log
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "finished"
    attempts = state["attempts"]
    # the simulated crash costs exactly one restart; on a loaded machine gloo can also abort a rank while the resumed
    # attempt shuts down, and the supervisor rightly restarts once more from the newest complete checkpoint
    assert len(attempts) >= 2 and attempts[1]["restart"] and attempts[1]["reason"] == "failed", attempts
    extra = attempts[2:]
    assert all(a["restart"] and a["reason"] == "failed" for a in extra), attempts
    assert log.count("simulated crash at step 5") == 1  # every restart resumed from a checkpoint (no second crash)


def test_example_recipe_renders(workdir):
    example = ROOT / "recipes" / "command-torchrun-dr-grpo.toml"
    if not example.is_file():
        pytest.skip("no example recipe")
    shutil.copy(example, workdir["dir"] / "ex.toml")
    r = cli(workdir, "render", "ex.toml")
    assert r.returncode == 0, r.stderr
    assert "rl_runner.py" in r.stdout


FAKE = """
import json, os, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
start = 1
if "--resume" in args:
    start = json.load(open(os.path.join(args["--resume"], "done.json")))["step"] + 1
os.makedirs("runs_here/run_%d" % int(time.time() * 1000), exist_ok=True)
log = sorted(os.listdir("runs_here"))[-1]
for step in range(start, int(args["--steps"]) + 1):
    with open(f"runs_here/{log}/log.jsonl", "a") as fh:
        fh.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
    ck = os.path.join(args["--save"], f"ckpt-{step}")
    os.makedirs(ck, exist_ok=True)
    json.dump({"step": step}, open(os.path.join(ck, "done.json"), "w"))
print("trained", start, "to", args["--steps"], "in", os.getcwd(), flush=True)
"""


def test_runner_in_another_directory_with_a_glob_metrics_file(workdir, tmp_path):
    """No torch: the runner itself, a command with its own cwd, checkpoints in the run directory, a metrics file
    named after its start time, resume from the newest complete checkpoint, translated records."""
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text(FAKE)
    text = f"""
[backend]
name = "command"
[backend.command]
command = ["{sys.executable}", "train.py", "--steps", "{{steps}}", "--save", "{{checkpoint_dir}}"]
cwd = "{elsewhere}"
metrics_file = "runs_here/run_*/log.jsonl"
metrics_map = {{loss = "policy_loss"}}
checkpoint_pattern = "ckpt-{{step}}"
checkpoint_marker = "done.json"
resume_args = ["--resume", "{{path}}"]
[model]
path = "random:qwen2?hidden=64&layers=2"
[data]
train = "prompts.jsonl"
[train]
steps = 3
[checkpoint]
dir = "ck"
resume = "latest"
"""
    (workdir["dir"] / "e.toml").write_text(text)
    plan = get_backend("command").prepare_launch(get_backend("command").render(load(workdir["dir"] / "e.toml").recipe),
                                                 tmp_path)
    cfg = json.loads(plan.files["command.json"])
    assert cfg["argv"][-1] == "${RLCTL_RUN_DIR}/ck" and plan.argv[0] == sys.executable
    run = tmp_path / "run"
    plan.write(run)
    env = {**workdir["env"], "RLCTL_METRICS_FILE": str(run / "backend_metrics.jsonl")}

    def attempt(steps: int) -> str:
        cfg["argv"][cfg["argv"].index("--steps") + 1] = str(steps)
        cfg["checkpoint"]["total_steps"] = steps  # the run's length as the recipe would say it (the runner reads it)
        (run / "command.json").write_text(json.dumps(cfg))
        with open(run / "stdout.log", "ab") as out:
            code = subprocess.run(plan.argv, cwd=run, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=60)
        assert code.returncode == 0, (run / "stdout.log").read_text()
        return (run / "stdout.log").read_text()

    log = attempt(3)
    assert f"trained 1 to 3 in {elsewhere}" in log and (run / "ck" / "ckpt-3" / "done.json").is_file()
    assert json.loads((run / "ck" / ".rlctl-checkpoints.json").read_text())["pattern"] == "ckpt-{step}"
    assert [c.step for c in get_backend("command").checkpoints(run / "ck")] == [1, 2, 3]
    log = attempt(5)  # restarted: resumes after the newest complete checkpoint
    assert f"--resume {run / 'ck' / 'ckpt-3'}" in log and "trained 4 to 5" in log
    recs = [get_backend("command").parse(line) for line in (run / "backend_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["policy_loss"]) for r in recs] == [(s, 1.0 / s) for s in range(1, 6)]


def test_shell_commands_keep_their_quoting(workdir):
    text = recipe_text().replace("[backend.command]\n", "[backend.command]\nshell = true\n", 1)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("command ="))
    text = text.replace("shell = true\n", "shell = true\ncommand = \"python t.py --tag 'a b' --steps {steps} "
                        "2>&1 | tee -a t.log\"\nresume_command = \"python t.py --from {path} | tee -a t.log\"\n")
    (workdir["dir"] / "sh.toml").write_text(text)
    cfg = json.loads(get_backend("command").render(load(workdir["dir"] / "sh.toml").recipe).files["command.json"])
    assert runner.command_argv(cfg, None) == ["/bin/sh", "-c", "python t.py --tag 'a b' --steps 6 2>&1 | tee -a t.log"]
    resumed = runner.command_argv(cfg, (4, "/c k/step_4"))
    assert resumed == ["/bin/sh", "-c", "python t.py --from '/c k/step_4' | tee -a t.log"]


# ---- placement: only the processes the command starts -------------------------------------------------------------
@pytest.mark.parametrize("gpus", [1, 2])
def test_placement_counts_no_engine_the_command_does_not_start(gpus):
    """The command backend starts no vLLM engine: all the recipe's GPUs are its own, none is set aside for one."""
    from rlctl import preflight as pf
    from rlctl.recipe.planning import prepare

    example = ROOT / "recipes" / "command-torchrun-dr-grpo.toml"
    prepared = prepare(example, [f"resources.gpus_per_node={gpus}", "resources.colocate=false"])
    assert prepared.recipe.trainer_gpu_count == gpus
    res = [r for r in pf.run(prepared, ["placement.gpus"]) if r.check == "placement.gpus"]
    assert [r.verdict for r in res] == ["ok"], res
    assert "engine(s)" not in res[0].figure and "no inference engine" in res[0].figure
    assert f"on {gpus} GPU(s)" in res[0].figure


# ---- a final checkpoint saved without a step number (seed 003's step_final/) --------------------------------------
FINAL_TRAINER = """
import json, os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
start = 1
if "--resume" in args:
    start = json.load(open(os.path.join(args["--resume"], "training_info.json")))["step"] + 1
    print("resumed from", args["--resume"], flush=True)

def save(name, step):
    ck = os.path.join(args["--save"], name)
    os.makedirs(ck, exist_ok=True)
    json.dump({"step": step}, open(os.path.join(ck, "training_info.json"), "w"))

steps = int(args["--steps"])
for step in range(start, steps + 1):
    print(f"step {step} | loss {1.0 / step}", flush=True)
    if step % 2 == 0 and step < steps:
        save(f"step_{step}", step)
save("step_final", steps)
print("trained", start, "to", steps, flush=True)
"""


def test_checkpoints_count_a_final_folder_as_the_last_step(tmp_path):
    root = tmp_path / "training_state"
    for name in ("step_1", "step_2", "step_final"):
        (root / name).mkdir(parents=True)
        (root / name / "training_info.json").write_text("{}")
    (root / "step_latest").symlink_to(root / "step_2")  # a link is never a checkpoint
    cfg = {"checkpoint": {"dir": str(root), "pattern": "step_{step}", "marker": "training_info.json",
                          "total_steps": 3, "resume": "latest"}}
    runner.write_descriptor(cfg)
    ad = get_backend("command")
    assert [(c.step, c.path.name, c.complete) for c in ad.checkpoints(root)] == \
        [(1, "step_1", True), (2, "step_2", True), (3, "step_final", True)]  # the total, before the run logged
    runner.write_descriptor(cfg, final_step=2)  # the trainer ended having logged step 2
    assert [(c.step, c.path.name) for c in ad.checkpoints(root)][-1] == (2, "step_final")
    assert runner.pick_resume(cfg) == (2, str(root / "step_final"))
    runner.write_descriptor(cfg)  # a later attempt's start keeps the step the last one recorded
    assert [(c.step, c.path.name) for c in ad.checkpoints(root)][-1] == (2, "step_final")


@pytest.mark.slow
def test_launch_resume_continues_after_a_final_checkpoint(workdir):
    """`launch --resume` from a run whose last checkpoint is `step_final/` continues after its last step."""
    (workdir["dir"] / "final_trainer.py").write_text(FINAL_TRAINER)
    text = f"""
[backend]
name = "command"
[backend.command]
command = ["{sys.executable}", "final_trainer.py", "--steps", "{{steps}}", "--save", "{{checkpoint_dir}}"]
cwd = "{workdir['dir']}"
log_pattern = 'step (?P<step>\\d+) \\| loss (?P<loss>\\S+)'
metrics_map = {{loss = "policy_loss"}}
checkpoint_pattern = "step_{{step}}"
checkpoint_marker = "training_info.json"
resume_args = ["--resume", "{{path}}"]
[model]
path = "random:qwen2?hidden=64&layers=2"
[data]
train = "prompts.jsonl"
[train]
steps = 5
[resources]
gpus_per_node = 0
gpu = "cpu"
[checkpoint]
dir = "training_state"
"""
    recipe = workdir["dir"] / "final.toml"
    recipe.write_text(text)
    r = rlctl(workdir, "launch", str(recipe), "--name", "first")
    assert r.returncode == 0, r.stderr[-1500:] + logs_of(workdir)
    first = run_named(workdir, "first")
    assert [m["step"] for m in metrics(first)] == [1, 2, 3, 4, 5]
    listed = ckpt_list(workdir, first.name)
    assert [(c["step"], Path(c["path"]).name) for c in listed] == [(2, "step_2"), (4, "step_4"), (5, "step_final")]
    r = rlctl(workdir, "launch", str(recipe), "--name", "second", "--resume", first.name, "--set", "train.steps=7")
    assert r.returncode == 0, r.stderr[-1500:] + logs_of(workdir)
    second = run_named(workdir, "second")
    log = (second / "stdout.log").read_text()
    assert "resuming from checkpoint step 5" in log and "step_final" in log and "trained 6 to 7" in log, log
    assert [m["step"] for m in metrics(second)] == [6, 7]  # no step redone
