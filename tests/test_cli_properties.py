"""CLI-wide property test: every command and option of `rlctl` (found by walking the Typer app, so new commands are
covered the day they are added), driven with generated argv, recipe files, run directories and state files —
damaged, huge, binary, FIFOs, devices, symlink loops, wrong types, NaN — must answer with a message and an exit
code in {0, 1, 2}, never a traceback, within a bounded time.

Runs in-process through `rlctl.cli.main(argv)` (fast: thousands of cases in CI), with a temporary runs root, HOME
and caches. Nothing real is started or touched: creating a run directory for a launch, a patch transaction, a
process spawn other than read-only lookups, a signal, and making a model raise a sentinel that counts as "input
accepted" and ends the case. A small sample also runs as real subprocesses. RLCTL_NIGHTLY=1 runs 20x more cases.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import RECIPES

NIGHTLY = os.environ.get("RLCTL_NIGHTLY") == "1"
SCALE = 20 if NIGHTLY else 1
CASE_SECONDS = 30.0  # one command on one input; the slowest honest case (preflight of a valid recipe) takes < 2 s
LOOPING = {"--follow", "--watch", "-f", "-w"}  # run until interrupted by design


# ---- sentinels: reaching one means the input was accepted and something real would now happen ------------------

class WouldAct(BaseException):  # noqa: N818 - a signal, not an error; BaseException so nothing swallows it
    pass


class CaseTimeout(BaseException):  # noqa: N818
    pass


_real_popen = subprocess.Popen


class GuardedPopen(_real_popen):
    """Read-only lookups run (the interpreter asked where a package is, `patch --dry-run`, git, nvidia-smi);
    anything else would start something real."""

    def __init__(self, args, *a, **kw):
        argv = [str(x) for x in (args if isinstance(args, (list, tuple)) else [args])]
        base = os.path.basename(argv[0]) if argv else ""
        read_only = (base in ("git", "nvidia-smi") or (len(argv) > 1 and argv[1] == "-c")
                     or (base == "patch" and ("--dry-run" in argv or "--version" in argv)))
        if not read_only:
            raise WouldAct(f"spawn {argv[:3]}")
        super().__init__(args, *a, **kw)


def _no_signal(pid, sig):
    if sig != 0:
        raise WouldAct(f"signal {sig} to {pid}")
    return os_kill(pid, 0)


os_kill = os.kill


def _refuse_connect(self, address):
    if self.family == socket.AF_UNIX:
        return _real_connect(self, address)
    raise ConnectionRefusedError(111, "refused by the property test")


_real_connect = socket.socket.connect


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """Environment and guards for in-process runs; restored afterwards."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    for k, v in {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "RLCTL_MODEL_CACHE": str(home / "m"),
                 "WANDB_MODE": "disabled", "RLCTL_DEBUG": ""}.items():
        mp.setenv(k, v)
    mp.delenv("RLCTL_DEBUG")
    import psutil

    import rlctl.patching
    import rlctl.recipe.tiny_model
    import rlctl.runs.rundir

    def act(what):
        def f(*a, **k):
            raise WouldAct(what)
        return f

    mp.setattr(subprocess, "Popen", GuardedPopen)
    mp.setattr(os, "kill", _no_signal)
    mp.setattr(os, "killpg", act("killpg"))
    mp.setattr(psutil.Process, "send_signal", act("psutil signal"))
    mp.setattr(psutil.Process, "terminate", act("psutil terminate"))
    mp.setattr(psutil.Process, "kill", act("psutil kill"))
    mp.setattr(socket.socket, "connect", _refuse_connect)
    mp.setattr(rlctl.runs.rundir, "create_run_dir", act("create a run directory"))
    mp.setattr(rlctl.patching, "_transaction", act("patch transaction"))
    mp.setattr(rlctl.recipe.tiny_model, "make_tiny", act("make a model"))
    with contextlib.suppress(ImportError):
        import rlctl.runs.attach

        mp.setattr(rlctl.runs.attach, "create_run_dir", act("create a run directory"))
    yield home
    mp.undo()


# ---- the hostile world: recipes and runs ---------------------------------------------------------------------

QUICK = (RECIPES / "quickstart.toml").read_text()

BAD_RECIPES = {
    "empty.toml": "",
    "garbage.toml": "[[[ =\n",
    "inf.toml": QUICK.replace("temperature = 1.0", "temperature = inf"),
    "nan-kl.toml": QUICK.replace("kl_coef = 0.0", "kl_coef = nan"),
    "unknown-key.toml": QUICK + "\n[rollout2]\nn = 3\n",
    "no-reward.toml": QUICK.replace('function = "quickstart/reward.py"', 'function = "missing.py"'),
    "no-data.toml": QUICK.replace('train = "quickstart/prompts.jsonl"', 'train = "missing.jsonl"'),
    "secret-extra.toml": QUICK + '\n[backend.trl.extra]\nhub_token = "hf_x"\n',
    "cycle-a.toml": 'extends = "cycle-b.toml"\n',
    "cycle-b.toml": 'extends = "cycle-a.toml"\n',
    "extends-dev.toml": 'extends = "/dev/zero"\n',
    "extends-missing.toml": 'extends = "nope.toml"\n',
    "wrong-types.toml": QUICK.replace("group_size = 8", 'group_size = "eight"').replace("steps = 80", "steps = -1"),
    "model-list.toml": QUICK.replace('path = "random:qwen2?hidden=64&layers=2"', 'path = "model-list"'),
    "model-zero-heads.toml": QUICK.replace('path = "random:qwen2?hidden=64&layers=2"', 'path = "model-zero"'),
    "data-fifo.toml": QUICK.replace('train = "quickstart/prompts.jsonl"', 'train = "fifo.jsonl"'),
    "data-trunc.toml": QUICK.replace('train = "quickstart/prompts.jsonl"', 'train = "trunc.parquet"'),
    "patches.toml": QUICK + '\n[patches]\nset = "openrlhf/0.9.3"\n',
    "nul.toml": 'name = "a\\u0000b"\n' + QUICK.split("\n", 3)[3],
    "deep.toml": "a = " + "[" * 5000 + "]" * 5000 + "\n",
}


def build_world(root: Path) -> dict[str, list[str]]:
    """Recipes, data, models and a runs root full of damaged runs; returns the pools argv values come from."""
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(RECIPES / "quickstart", root / "quickstart", dirs_exist_ok=True)
    (root / "good.toml").write_text(QUICK)
    for name, text in BAD_RECIPES.items():
        (root / name).write_text(text)
    (root / "binary.toml").write_bytes(bytes(range(256)) * 8)
    (root / "huge.toml").write_bytes(b"# " + b"x" * (5 * 1024 * 1024))
    (root / "latin1.toml").write_bytes("name = 'caf\xe9'\n".encode("latin-1"))
    os.mkfifo(root / "fifo.toml")
    os.mkfifo(root / "fifo.jsonl")
    (root / "loop-a.toml").symlink_to(root / "loop-b.toml")
    (root / "loop-b.toml").symlink_to(root / "loop-a.toml")
    (root / "dev.toml").symlink_to("/dev/zero")
    (root / "adir.toml").mkdir()
    (root / "afile").write_text("x")
    (root / "model-list").mkdir()
    (root / "model-list" / "config.json").write_text("[1, 2]")
    (root / "model-zero").mkdir()
    (root / "model-zero" / "config.json").write_text(json.dumps(
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 0, "vocab_size": 10}))
    (root / "trunc.parquet").write_bytes(b"PAR1\x15\x04" + b"\x00" * 50)
    runs = root / "runs"
    runs.mkdir()
    states = {
        "good": {"name": "good", "status": "finished", "backend": "trl", "started_at": 1.0, "exit_code": 0,
                 "total_steps": 3},
        "running-self": {"status": "running", "backend": "trl", "pid": os.getpid(), "started_at": time.time()},
        "running-init": {"status": "running", "backend": "trl", "pid": 1, "pgid": 1, "supervisor_pid": 1},
        "ray": {"status": "running", "backend": "openrlhf", "executor": "ray", "ray_job_id": "raysubmit_x",
                "ray_address": "http://127.0.0.1:9", "started_at": 5},
        "wrong-types": {"status": 5, "backend": ["trl"], "pid": "abc", "started_at": "yesterday",
                        "total_steps": "many", "exit_code": 1.5},
        "nan": {"status": "running", "started_at": float("nan"), "pid": 2**70},
        "unknown-backend": {"status": "failed", "backend": "nope", "started_at": 3},
    }
    for name, st_ in states.items():
        (runs / name).mkdir()
        (runs / name / "state.json").write_text(json.dumps(st_))
    good = runs / "good"
    (good / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": s, "reward/mean": s / 3,
                                                            "eval/x/acc": 0.1 * s}) + "\n" for s in (1, 2, 3)))
    (good / "stdout.log").write_text("step 1\nstep 2\n")
    (good / "recipe.toml").write_text(QUICK)
    for s in (1, 2, 3):
        d = good / "checkpoints" / f"checkpoint-{s}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text("{}")
    (good / "checkpoints" / "checkpoint-9").symlink_to(good / "checkpoints" / "checkpoint-1")
    for name, content in {"binary": bytes(range(256)) * 100, "list": b"[1,2,3]", "empty": b"",
                          "truncated": b'{"status": "runn', "deep": b"[" * 100000}.items():
        (runs / name).mkdir()
        (runs / name / "state.json").write_bytes(content)
    (runs / "fifo").mkdir()
    os.mkfifo(runs / "fifo" / "state.json")
    (runs / "loop").mkdir()
    (runs / "loop" / "state.json").symlink_to(runs / "loop" / "state.json")
    (runs / "fifo-logs").mkdir()
    (runs / "fifo-logs" / "state.json").write_text(json.dumps({"status": "finished", "backend": "trl"}))
    os.mkfifo(runs / "fifo-logs" / "stdout.log")
    os.mkfifo(runs / "fifo-logs" / "metrics.jsonl")
    (runs / "bad-metrics").mkdir()
    (runs / "bad-metrics" / "state.json").write_text(json.dumps({"status": "finished", "backend": "trl"}))
    (runs / "bad-metrics" / "metrics.jsonl").write_bytes(b'{"step": "x"}\n\xff\xfe\n[1]\n{"step": 1e400}\n'
                                                         + b'{"step": 2, "reward/mean": NaN}\n' + b"x" * 100000)
    (runs / "bad-metrics" / "recipe.toml").write_text("checkpoint = 3\n")
    (runs / "outside-ckpt").mkdir()
    (runs / "outside-ckpt" / "state.json").write_text(json.dumps({"status": "finished", "backend": "trl"}))
    (runs / "outside-ckpt" / "recipe.toml").write_text(f'[checkpoint]\ndir = "{good / "checkpoints"}"\n')
    (runs / "no-state").mkdir()
    recipes = [str(root / n) for n in ("good.toml", *BAD_RECIPES, "binary.toml", "huge.toml", "latin1.toml",
                                       "fifo.toml", "loop-a.toml", "dev.toml", "adir.toml", "afile")]
    run_refs = [p.name for p in runs.iterdir()] + [str(p) for p in runs.iterdir()] + ["g", "r", "", "-", "nope"]
    return {"recipe": recipes + ["quickstart", "quickstart.toml", "/dev/null", "/nonexistent.toml", "x" * 300],
            "run": run_refs,
            "path": [str(root / "out"), str(root / "afile" / "x"), str(root / "afile"), "/dev/null", str(root),
                     str(root / "loop-a.toml"), str(root / "p.png"), str(root / "p.xyz"),
                     str(root / "no" / "dir" / "p.png"), str(root / ("y" * 300)), str(root / "out" / "sub")],
            "set": ["rollout.group_size=16", "rollout.temperature=inf", "algorithm.kl_coef=nan", "env.DB_PASSWORD=x",
                    "train.steps=0", "x", "=", "a..b=1", "env=3", "backend.trl.extra.hub_token=t",
                    'model.path="/dev/zero"', "data.train=fifo.jsonl", "rollout=[1]", "a.b.c.d.e=1",
                    "reward.function=/etc/passwd", "checkpoint.dir=/", "optim.lr=1e400"],
            "number": ["0", "-1", "1", "3", "nan", "inf", "-inf", "1e400", "abc", "", "99999999999999999999999",
                       "0.5", "-0"],
            "name": ["openrlhf/0.9.3", "nope/1.0", "", "../..", str(root), "openrlhf"]}


_STATE_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.sampled_from(["running", "finished", "failed", "stopped", "starting", "stopping", "lost", "trl",
                     "openrlhf", "verl", "prime_rl", "ray", "local", "http://127.0.0.1:9"]))
STATE_KEYS = ["status", "backend", "executor", "pid", "pgid", "supervisor_pid", "pid_create_time",
              "supervisor_create_time", "started_at", "ended_at", "exit_code", "total_steps", "ray_job_id",
              "ray_address", "name", "version", "attempts", "restarts", "resumed_from", "wandb_run_id"]
states = st.dictionaries(st.sampled_from(STATE_KEYS), _STATE_VALUES, max_size=8)

toml_noise = st.text(alphabet=st.sampled_from(list("[]=.\"'#\n abcdegknrtz_0123456789-{},:\\")), max_size=120)


def recipe_texts():
    """Recipes a person could write: the quickstart with a line changed, added or broken."""
    keys = ["rollout.group_size", "rollout.temperature", "rollout.max_tokens", "model.max_model_len",
            "train.steps", "train.train_batch_size", "optim.lr", "algorithm.kl_coef", "checkpoint.keep_last",
            "data.train", "model.path", "reward.function", "env.HF_TOKEN", "backend.name", "resources.gpus_per_node",
            "logging.rlctl_sinks", "checkpoint.dir", "preflight.lr_check_step"]
    values = st.one_of(st.integers(-5, 10**12).map(str), st.sampled_from(["inf", "nan", "-inf", "1e400", "true",
                                                                          '""', '"x"', "[]", "{}", '"/dev/zero"']),
                       st.floats(allow_nan=False, allow_infinity=False).map(repr))
    line = st.builds(lambda k, v: "\n[{}]\n{} = {}\n".format(*k.rsplit(".", 1), v), st.sampled_from(keys), values)
    return st.one_of(
        line.map(lambda extra: QUICK + extra),
        st.builds(lambda cut: QUICK[:cut], st.integers(0, len(QUICK))),
        toml_noise,
        st.builds(lambda a, b: a + b, line, toml_noise),
    )


# ---- argv from the app itself ----------------------------------------------------------------------------------

def commands() -> list[tuple[list[str], list]]:
    import typer.main

    from rlctl.cli import app

    out: list[tuple[list[str], list]] = []

    def walk(cmd, path):
        sub = getattr(cmd, "commands", None)
        if sub:
            for n, c in sorted(sub.items()):
                walk(c, [*path, n])
        else:
            out.append((path, list(cmd.params)))

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = commands()
NUMERIC = ("--grace", "--lines", "-n", "--interval", "--stall-after", "--keep-last", "--max-restarts", "--idle-exit")


def pool_for(param) -> str:
    names = set(param.opts)
    if param.param_type_name == "argument":
        n = param.name or ""
        return "recipe" if n == "recipe" else "run" if n in ("run", "runs") else "name" if n == "name" else "path"
    if names & set(NUMERIC):
        return "number"
    if "--set" in names:
        return "set"
    if names & {"--plot", "--out", "--dir", "--python"}:
        return "path"
    return "mixed"


@st.composite
def argvs(draw, pools, only: list[str] | None = None):
    cmds = [c for c in COMMANDS if only is None or c[0][0] in only]
    path, params = draw(st.sampled_from(cmds))
    # generated text stays relative: whatever a command writes lands in the world's temporary directory
    text = st.text(max_size=20).map(lambda t: t.lstrip("/~"))
    mixed = st.one_of(*(st.sampled_from(v) for v in pools.values()), text)
    argv = list(path)
    args = []
    for p in params:
        pool = pool_for(p)
        strat = mixed if pool == "mixed" else st.one_of(st.sampled_from(pools[pool]), text)
        if p.param_type_name == "argument":
            if p.required or draw(st.booleans()):
                n = draw(st.integers(1, 3)) if p.nargs == -1 else 1
                args += [draw(strat) for _ in range(n)]
            continue
        if set(p.opts) & LOOPING:
            continue
        if draw(st.integers(0, 3)) == 0 and not p.required:
            continue
        if getattr(p, "is_flag", False):
            argv.append(p.opts[0])
        else:
            for _ in range(draw(st.integers(1, 2)) if p.multiple else 1):
                argv += [draw(st.sampled_from(p.opts)), draw(strat)]
    argv += args
    if draw(st.integers(0, 9)) == 0:  # an option that does not exist, or a stray value
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--bogus", "-z", "--", "--json=1",
                                                                            "extra", "--help"])))
    return argv


# ---- running one case ----------------------------------------------------------------------------------------

def run_main(argv: list[str], cwd: Path) -> tuple[int | None, str, str, str | None]:
    """(exit code, stdout, stderr, what it would have done) of `rlctl ARGV`, in-process, bounded in time."""
    from rlctl.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace")  # `logs` writes to .buffer
    err = io.StringIO()
    old_cwd = os.getcwd()
    acted = None
    code: int | None = None

    def on_alarm(signum, frame):
        raise CaseTimeout()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except WouldAct as e:
                acted = str(e)
    except CaseTimeout:
        pytest.fail(f"rlctl {argv!r} ran longer than {CASE_SECONDS} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(old_cwd)
    out.flush()
    return code, out.buffer.getvalue().decode("utf-8", "replace"), err.getvalue(), acted


CASES = {"run": 0, "accepted": 0}  # how many cases ran, and how many reached a sentinel (input accepted)


def check(argv: list[str], cwd: Path) -> None:
    CASES["run"] += 1
    code, out, err, acted = run_main(argv, cwd)
    CASES["accepted"] += acted is not None
    text = out + err
    assert "Traceback (most recent call last)" not in text, (argv, text[-3000:])
    assert "internal error" not in text, (argv, text[-3000:])
    if acted is None:
        assert code in (0, 1, 2), (argv, code, text[-2000:])
        if code == 2:
            assert err.strip(), (argv, "exit 2 without saying why")


@pytest.fixture(scope="module")
def world(tmp_path_factory, sandbox):
    root = tmp_path_factory.mktemp("world")
    pools = build_world(root)
    top_before = set(os.listdir("/"))
    repo_runs = Path(__file__).resolve().parents[1] / "runs"
    runs_before = sorted(repo_runs.iterdir()) if repo_runs.is_dir() else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLCTL_RUNS_DIR", str(root / "runs"))
        yield root, pools
    assert set(os.listdir("/")) <= top_before, "the property test wrote outside its temporary world"
    assert (sorted(repo_runs.iterdir()) if repo_runs.is_dir() else None) == runs_before, "it touched the repo's runs/"
    sys.stderr.write(f"\ntest_cli_properties: {CASES['run']} in-process cases, {CASES['accepted']} reached a "
                     "sentinel (input accepted, nothing real started)\n")


SMALL = os.environ.get("RLCTL_PROPERTY_SMALL") == "1"  # a quick look while developing
PROFILE = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=not NIGHTLY, database=None)


def _examples(n: int) -> int:
    return max(5, n // 20) if SMALL else n * SCALE


GROUPS = {  # commands not named here (added later) go with the last group
    "recipes": (["preflight", "render", "recipe", "launch"], 800),
    "runs": (["status", "logs", "doctor", "ckpt", "metrics", "stop", "resume", "supervise"], 800),
    "rest": ([], 400),  # patch (each asks the interpreter where the package is: slower), model, attach, ...
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_every_command_on_hostile_argv(world, group):
    root, pools = world
    names, n = GROUPS[group]
    named = {c for g, _ in GROUPS.values() for c in g}
    only = names or sorted({c[0][0] for c in COMMANDS if c[0][0] not in named})

    @settings(max_examples=_examples(n), **PROFILE)
    @given(argvs(pools, only))
    def prop(argv):
        check(argv, root)

    prop()


@settings(max_examples=_examples(700), **PROFILE)
@given(text=recipe_texts(), cmd=st.sampled_from([["preflight"], ["render"], ["recipe", "show"], ["launch"]]),
       sets=st.lists(st.sampled_from(["rollout.group_size=4", "env.API_KEY=k", "train.steps=2"]), max_size=2))
def test_generated_recipe_files(world, text, cmd, sets):
    root, _ = world
    p = root / "gen.toml"
    p.write_text(text)
    argv = [*cmd, str(p)]
    for s in sets:
        argv += ["--set", s]
    check(argv, root)


@settings(max_examples=_examples(300), **PROFILE)
@given(state=st.one_of(states.map(lambda d: json.dumps(d, default=str).encode()), st.binary(max_size=200)),
       metrics=st.lists(st.one_of(st.binary(max_size=60),
                                  st.dictionaries(st.sampled_from(["step", "time", "reward/mean", "eval/x/acc", "kl"]),
                                                  _STATE_VALUES, max_size=4).map(
                                      lambda d: json.dumps(d, default=str).encode())), max_size=6),
       cmd=st.sampled_from([["status"], ["status", "--json"], ["logs"], ["logs", "--metrics", "-n", "2"], ["doctor"],
                            ["ckpt", "list"], ["ckpt", "prune", "--keep-last", "1", "--dry-run"],
                            ["ckpt", "prune", "--keep-last", "1"], ["metrics", "--csv"], ["stop", "--dry-run"]]))
def test_generated_run_directories(world, state, metrics, cmd):
    root, _ = world
    run = root / "runs" / "gen-run"
    run.mkdir(exist_ok=True)
    (run / "state.json").write_bytes(state)
    (run / "metrics.jsonl").write_bytes(b"\n".join(metrics))
    (run / "stdout.log").write_bytes(b"\n".join(metrics[:2]))
    for f in (".ingest.json",):
        with contextlib.suppress(OSError):
            (run / f).unlink()
    argv = [*cmd, "gen-run"] if cmd != ["status"] or metrics else ["status"]
    check(argv, root)


SUBPROCESS_SAMPLE = [
    [], ["frobnicate"], ["status", "--bogus"], ["logs"], ["logs", "x", "-n", "abc"], ["render", "/nonexistent.toml"],
    ["preflight", "x" * 300 + ".toml"], ["preflight", "fifo.toml"], ["preflight", "dev.toml"],
    ["preflight", "loop-a.toml"], ["preflight", "good.toml", "--only", "nope"],
    ["preflight", "good.toml", "--plot", "p.xyz"], ["preflight", "good.toml", "--plot", "nodir/p.png"],
    ["render", "good.toml", "--out", "afile/x"], ["status"], ["status", "binary"], ["doctor", "wrong-types"],
    ["ckpt", "prune", "outside-ckpt", "--keep-last", "1", "--dry-run"], ["metrics", "good", "bad-metrics"],
    ["preflight", "inf.toml"], ["preflight", "model-list.toml"], ["preflight", "data-trunc.toml"],
    ["recipe", "show", "secret-extra.toml"], ["patch", "status", "--python", "/nonexistent/python"],
]


CHECK_FAILS = {"model-list.toml": {1}}  # readable recipes whose preflight fails a check (exit 1), not bad input


@pytest.mark.parametrize("argv", SUBPROCESS_SAMPLE, ids=lambda a: " ".join(a)[:40] or "(none)")
def test_subprocess_sample(world, argv):
    """The console entry point itself (stdout/stderr wiring, exit status), on a sample of the hostile inputs."""
    root, _ = world
    env = dict(os.environ, RLCTL_RUNS_DIR=str(root / "runs"))
    env.pop("RLCTL_DEBUG", None)
    with _real_popen([sys.executable, "-m", "rlctl.cli", *argv], cwd=root, env=env, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True) as proc:
        out, err = proc.communicate(timeout=60)
    text = out + err
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    assert proc.returncode in (0, 1, 2), (proc.returncode, text[-2000:])
    if argv and argv != ["status"]:
        expected = {0, 1, 2} if argv[0] in ("doctor", "metrics", "status") else CHECK_FAILS.get(argv[-1], {2})
        assert proc.returncode in expected, (proc.returncode, text[-1000:])


# ---- patch --dir contents: any manifest text and types, any tree -------------------------------------------------

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not isinstance(v, float) or v == v and abs(v) != float("inf") else \
            ("nan" if v != v else "inf" if v > 0 else "-inf")
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


_ANY = st.recursive(
    st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(max_size=12),
              st.sampled_from(["openrlhf", "0.9.3", "0001.patch", "../0001.patch", "/etc/passwd", "", "a/b",
                               "openrlhf/x.py", "open-rlhf"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)
_ENTRY = st.dictionaries(st.sampled_from(["file", "targets", "purpose", "bogus"]),
                         st.one_of(_ANY, st.sampled_from(["0001.patch", "missing.patch"]),
                                   st.lists(st.sampled_from(["openrlhf/x.py", "../x", ""]), max_size=2)), max_size=4)
_MANIFEST = st.builds(
    lambda top, patches, style: "\n".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in top.items()) + "\n" + (
        "".join("\n[[patch]]\n" + "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in p.items())
                for p in patches) if style == "tables" else f"patch = {_toml_value(patches)}\n"),
    st.dictionaries(st.sampled_from(["backend", "package", "version", "description", "extra"]),
                    st.one_of(_ANY, st.sampled_from(["openrlhf", "9.9.9"])), max_size=5),
    st.lists(_ENTRY, max_size=3), st.sampled_from(["tables", "inline"]))
_DIFF = "--- a/openrlhf/x.py\n+++ b/openrlhf/x.py\n@@ -1 +1 @@\n-a\n+b\n"
_PLACES = ["openrlhf/9.9.9/manifest.toml", "openrlhf/9.9.9/0001.patch", "openrlhf/manifest.toml", "manifest.toml",
           "x/y/z/manifest.toml", "junk.txt", "b/junk", "b/v", "openrlhf/9.9.9/sub", ".hidden"]


@settings(max_examples=_examples(120), **PROFILE)
@given(manifest=st.one_of(_MANIFEST, toml_noise), tree=st.lists(
    st.tuples(st.sampled_from(_PLACES), st.sampled_from(["manifest", "diff", "garbage", "dir", "empty", "fifo",
                                                         "loop"])), max_size=5),
    cmd=st.sampled_from([["patch", "list"], ["patch", "status", "openrlhf/9.9.9", "--python", "/nonexistent/py"],
                         ["patch", "apply", "--backend", "openrlhf", "--python", "/nonexistent/py"]]))
def test_generated_patch_dirs(world, manifest, tree, cmd):
    """Any --dir: a clear error naming what it found (exit 2), or the sets listed and anything else warned about;
    never a traceback, never silence about the directory."""
    import shutil

    root, _ = world
    d = root / "gen-patches"
    shutil.rmtree(d, ignore_errors=True)
    (d / "openrlhf" / "9.9.9").mkdir(parents=True)
    for place, kind in tree:
        p = d / place
        with contextlib.suppress(OSError):
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.exists() or p.is_symlink():
                continue
            if kind == "dir":
                p.mkdir()
            elif kind == "fifo":
                os.mkfifo(p)
            elif kind == "loop":
                p.symlink_to(p)
            else:
                p.write_bytes({"manifest": manifest.encode(), "diff": _DIFF.encode(), "garbage": bytes(range(256)),
                               "empty": b""}[kind])
    argv = [*cmd, "--dir", str(d)]
    code, out, err, acted = run_main(argv, root)
    text = out + err
    assert "Traceback (most recent call last)" not in text and "internal error" not in text, (argv, text[-3000:])
    if acted is None:
        assert code in (0, 1, 2), (argv, code, text[-2000:])
        assert err.strip() or "(user:" in out, (argv, "the --dir was neither used nor refused", text[-2000:])


# ---- absurd numbers for every numeric key of the schema: bounded time, a clear answer ----------------------------

def _numeric_keys() -> list[str]:
    import typing

    from pydantic import BaseModel

    from rlctl.recipe import schema

    def walk(model, prefix: str) -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            args = typing.get_args(f.annotation) or (f.annotation,)
            subs = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            if subs:
                if subs[0] is not schema.DoctorSection:
                    out += walk(subs[0], f"{prefix}{name}.")
                continue
            flat = [x for a in args for x in (typing.get_args(a) or (a,))]
            if int in flat or float in flat:
                out.append(prefix + name)
        return out

    return walk(schema.Recipe, "")


NUMERIC_KEYS = _numeric_keys()
ABSURD = ["1000000000000", "99999999999999999999999", str(2**63), "-1", "0", "-0", "nan", "inf", "-inf", "1e308",
          "-1e308", "1.5", "1e400", "0.0000001", "1000001", "16777217"]
NUMBER_CASE_CPU_S = 10.0  # CPU seconds of this process for one command (an honest preflight takes < 1.5 s)


@settings(max_examples=_examples(100), **PROFILE)
@given(key=st.sampled_from(NUMERIC_KEYS), value=st.sampled_from(ABSURD),
       recipe=st.sampled_from(sorted(p.name for p in RECIPES.glob("*.toml"))),
       cmd=st.sampled_from(["preflight", "render"]))
def test_absurd_numbers_for_every_numeric_key(world, key, value, recipe, cmd):
    root, _ = world
    argv = [cmd, str(RECIPES / recipe), "--set", f"{key}={value}"]
    t = time.process_time()
    code, out, err, acted = run_main(argv, root)
    cpu = time.process_time() - t
    text = out + err
    assert "Traceback (most recent call last)" not in text and "internal error" not in text, (argv, text[-3000:])
    assert acted is None and code in (0, 1, 2), (argv, code, text[-2000:])
    if code == 2:
        assert err.strip(), (argv, "exit 2 without saying why")
    assert cpu < NUMBER_CASE_CPU_S, (argv, f"{cpu:.1f} CPU seconds")


def test_the_numeric_keys_are_found():
    assert {"train.steps", "train.episodes", "checkpoint.every", "rollout.group_size", "rollout.max_tokens",
            "train.train_batch_size", "resources.nodes", "resources.gpus_per_node"} <= set(NUMERIC_KEYS)


def _upper_limits() -> dict[str, int]:
    """Numeric key -> its upper limit (`le`) where the schema has one."""
    import typing

    from rlctl.recipe import schema

    def le_of(obj, depth=0):
        if depth > 6:
            return None
        if isinstance(getattr(obj, "le", None), int):
            return obj.le
        for m in getattr(obj, "metadata", []) or []:
            v = le_of(m, depth + 1)
            if v is not None:
                return v
        for a in typing.get_args(obj):
            v = le_of(a, depth + 1)
            if v is not None:
                return v
        return None

    out = {}
    for key in NUMERIC_KEYS:
        model = schema.Recipe
        *path, leaf = key.split(".")
        for p in path:
            ann = model.model_fields[p].annotation
            # the section's model (a union may have a str arm too)
            model = next(a for a in (typing.get_args(ann) or (ann,))
                         if isinstance(a, type) and hasattr(a, "model_fields"))
        f = model.model_fields[leaf]
        v = le_of(f) or le_of(f.annotation)
        if v is not None and v >= 1000:
            out[key] = v
    return out


LIMITS = _upper_limits()


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_every_numeric_key_at_its_limit_and_above(world, key):
    """At its upper limit a key plans in bounded time (exit 0/1/2); one above is refused naming the limit."""
    root, _ = world
    for value, codes in ((LIMITS[key], (0, 1, 2)), (LIMITS[key] + 1, (2,))):
        argv = ["preflight", str(RECIPES / "quickstart.toml"), "--set", f"{key}={value}"]
        t = time.process_time()
        code, out, err, acted = run_main(argv, root)
        assert time.process_time() - t < NUMBER_CASE_CPU_S, (argv, "too slow")
        assert acted is None and code in codes and "Traceback" not in out + err, (argv, code, (out + err)[-2000:])
        if value > LIMITS[key]:
            assert str(LIMITS[key]) in err, (argv, err)


def test_the_limits_are_found():
    assert LIMITS["train.steps"] == 1_000_000 and LIMITS["resources.gpus_per_node"] == 1024
