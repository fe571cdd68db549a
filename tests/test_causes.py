"""A dead (or hung) run says why, from evidence it shows (issue 32.3), and each component's own log is one command
away (`rlctl logs RUN --component inference|trainer|orchestrator|ray|supervisor`, here and on an SSH host).

The logs are real: tests/fixtures/causes/ (a torchrun trainer's NCCL timeout, a CUDA illegal memory access; see its
README), tests/fixtures/oom/ (an H100's torch OutOfMemoryError); vLLM's request validation is vLLM 0.26.0's own code
from the released wheel, its log lines its own formatter's, and Ray's way of printing an engine actor's lines Ray's
own `print_worker_logs`. Every command is typed as a user types it: from a working directory with every default
(./runs, no RLCTL_* variables), only HOME isolated.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import io
import json
import logging
import os
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest

from rlctl.core.state import read_state, write_state
from rlctl.runs.status import state_cell
from tests.conftest import FIXTURES, replay_recipe_file, run_cli
from tests.remote_sshd import ssh_home, sshd  # noqa: F401 - the session fixture

cli = run_cli
CAUSES = FIXTURES / "causes"
REPLAY = "import sys, time\nfor line in open(sys.argv[1]):\n    print(line, end='', flush=True)\nsys.exit(1)\n"


@pytest.fixture
def user(shell):
    return shell  # tests/conftest.py


def command_recipe(work: Path, log: Path) -> Path:
    """A trainer rlctl does not know (seed 003): it prints its steps, then what it printed when it died."""
    return replay_recipe_file(work, "r.toml", "dies", REPLAY, [str(log)], r"step (?P<step>\d+) loss (?P<loss>\S+)",
                              'loss = "policy_loss"', 5)


CASES = {
    "nccl timeout": (CAUSES / "nccl_timeout.log",
                     "NCCL timeout: ALLREDUCE (SeqNum 412) ran 600043 ms, limit 600000 ms, rank 1",
                     "Watchdog caught collective operation timeout"),
    "cuda illegal memory access": (CAUSES / "illegal_memory_access.log",
                                   "CUDA illegal memory access (cudaErrorIllegalAddress)",
                                   "CUDA error: an illegal memory access was encountered"),
    "exception": (CAUSES / "reward_exception.log", "RuntimeError: simulated reward server crash (raised in reward, "
                  "tmp/rx/reward.py:2)", "RuntimeError: simulated reward server crash"),
    # the command backend's runner, asked to resume from a step that is not there: exit 2 before the trainer starts
    "resume checkpoint missing": (CAUSES / "resume_missing.log", "no complete checkpoint of step 2 to resume from",
                                  "rlctl-command: no complete checkpoint of step 2 in "),
    "out of memory": (FIXTURES / "oom" / "stdout.log",
                      "out of memory (torch OutOfMemoryError: tried to allocate 8.00 GiB on GPU 0 (79.18 GiB, "
                      "6.66 GiB free))", "torch.OutOfMemoryError: CUDA out of memory"),
}


@pytest.mark.parametrize("what", list(CASES))
def test_a_dead_run_says_why_with_its_evidence(user, what):
    log, summary, sign = CASES[what]
    r = cli("launch", str(command_recipe(user, log)))
    assert r.code != 0, r.out + r.err
    run = next((user / "runs").iterdir())
    table = cli("status")
    assert state_cell({"status": "failed", "reason": summary}) in table.out, table.out  # whole below
    d = json.loads(cli("status", run.name, "--json").out)
    assert d["status"] == "failed" and d["reason"] == summary and d["cause"]["what"] == what, d
    ev = d["cause"]["evidence"]
    assert ev and any(sign in e for e in ev), ev
    # each evidence line names where it is: stdout.log:N is the run's log line N
    lines = (run / "stdout.log").read_text().splitlines()
    for e in ev:
        where, _, text = e.partition(": ")
        n = int(where.split(":")[1])
        assert lines[n - 1].strip().startswith(text[:60]), (e, lines[n - 1])
    shown = cli("status", run.name).out
    assert f"cause: {summary}" in shown and f"evidence: {ev[0]}" in shown and "fix: " in shown, shown
    doc = cli("doctor", run.name)
    assert doc.code == 1 and f"[critical] cause: the run failed: {summary}" in doc.out, doc.out
    assert f"evidence: {ev[0]}" in doc.out
    assert json.loads(cli("doctor", run.name, "--json").out)["findings"][0]["evidence"]["cause"]["what"] == what


def test_every_cause_log_is_written_by_the_script(tmp_path):
    """scripts/gen_cause_logs.py writes every log of tests/fixtures/causes (its README says so): the reward-function
    exception's log was recorded by hand and the script could not write it again. Written afresh, it is the committed
    one but for the temporary directory the trainer ran in."""
    import importlib.util
    import re

    script = Path(__file__).resolve().parents[1] / "scripts" / "gen_cause_logs.py"
    spec = importlib.util.spec_from_file_location("gen_cause_logs", script)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert set(gen.CASES) == {p.stem for p in CAUSES.glob("*.log")}
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--only", "reward_exception"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["reward_exception.log"]

    def same(text: str) -> str:
        return re.sub(r'File "[^"]*/', 'File "', text)

    assert same((tmp_path / "reward_exception.log").read_text()) == same((CAUSES / "reward_exception.log").read_text())
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--only", "resume_missing"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "command runner exit code 2" in r.stdout, r.stdout + r.stderr

    def tmp(text: str) -> str:
        return re.sub(r" in /\S+/ck$", " in TMP/ck", text, flags=re.M)

    assert tmp((tmp_path / "resume_missing.log").read_text()) == tmp((CAUSES / "resume_missing.log").read_text())


def test_the_fixtures_hold_cudas_own_text():
    """What the illegal-memory-access fixture says is what CUDA's runtime says for error 700, wherever one is
    installed (the fixture was written from libcudart.so.13's cudaGetErrorString)."""
    text = (CAUSES / "illegal_memory_access.log").read_text()
    assert "CUDA error: an illegal memory access was encountered" in text and "cudaErrorIllegalAddress" in text
    for lib in ("/usr/local/cuda/lib64/libcudart.so", "/usr/local/cuda-13.0/lib/libcudart.so.13"):
        if Path(lib).exists():
            rt = ctypes.CDLL(lib)
            rt.cudaGetErrorString.restype = rt.cudaGetErrorName.restype = ctypes.c_char_p
            assert rt.cudaGetErrorString(700).decode() in text and rt.cudaGetErrorName(700).decode() in text


# ---- vLLM's own text and formatter, Ray's own printing -----------------------------------------------------------
# the released wheels' cache, as the other conformance tests find it (taken before a test isolates HOME)
WHEELS = Path(os.environ.get("RLCTL_TEST_WHEELS", Path.home() / ".cache" / "rlctl-tests" / "wheels"))


@functools.cache
def _wheel(path: str) -> str:
    cache = WHEELS
    wheels = sorted(cache.glob("vllm-0.26.0-*.whl"))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
                            "vllm==0.26.0"], capture_output=True, text=True)
        wheels = sorted(cache.glob("vllm-0.26.0-*.whl"))
        assert r.returncode == 0 and wheels, f"cannot download vllm==0.26.0: {r.stderr.strip()[-300:]}"
    with zipfile.ZipFile(wheels[0]) as zf:
        return zf.read(path).decode()


def _node(path: str, name: str, inside: str | None = None) -> ast.AST:
    tree = ast.parse(_wheel(path))
    body = tree.body
    if inside is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == inside).body
    return next(n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name)


def _exec(node: ast.AST, path: str, ns: dict) -> object:
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), ns)
    return ns[node.name]


def vllm_logger(stream: io.StringIO) -> logging.Logger:
    """A logger printing as vLLM 0.26.0 does: its _FORMAT and _DATE_FORMAT (vllm/logger.py) through its
    NewLineFormatter (vllm/logging_utils/formatter.py)."""
    envs = types.SimpleNamespace(VLLM_LOGGING_PREFIX="", VLLM_LOGGING_LEVEL="INFO")
    ns: dict = {"envs": envs, "logging": logging, "Path": Path}
    tree = ast.parse(_wheel("vllm/logger.py"))
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") in ("_FORMAT", "_DATE_FORMAT") for t in n.targets):
            exec(compile(ast.Module(body=[n], type_ignores=[]), "vllm/logger.py", "exec"), ns)
    fmt = _exec(_node("vllm/logging_utils/formatter.py", "NewLineFormatter"), "formatter.py", ns)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(fmt(ns["_FORMAT"], datefmt=ns["_DATE_FORMAT"]))
    log = logging.getLogger(f"vllm.test.{id(stream)}")
    log.handlers, log.propagate, log.level = [handler], False, logging.INFO
    return log


def vllm_refusal(prompt_tokens: int = 1297, max_tokens: int = 4000, max_model_len: int = 4096) -> Exception:
    """The error vLLM 0.26.0 raises for a prompt that leaves no room for max_tokens: its own
    TokenizeParams._token_len_check (vllm/renderers/params.py) raising its own VLLMValidationError."""
    from typing import Any

    ns: dict = {"Any": Any}
    err = _exec(_node("vllm/exceptions.py", "VLLMValidationError"), "vllm/exceptions.py", ns)
    ns.update(VLLMValidationError=err, TokenizerLike=object, _S=list)
    check = _exec(_node("vllm/renderers/params.py", "_token_len_check", "TokenizeParams"), "params.py", ns)
    me = types.SimpleNamespace(max_input_tokens=max_model_len - max_tokens, max_total_tokens=max_model_len,
                               max_output_tokens=max_tokens)
    try:
        check(me, None, list(range(prompt_tokens)))
    except err as e:
        return e
    raise AssertionError("vLLM's check let the request through")


def logged_exception(log: logging.Logger, message: str, exc: Exception) -> None:
    try:
        raise exc
    except Exception:
        log.exception(message)


def hung_process() -> subprocess.Popen:
    """A real process that hangs (the trainer waiting for rollouts that never come)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)


def live_run(work: Path, name: str, recipe: str, proc: subprocess.Popen, steps: int = 6, backend: str = "prime_rl",
             age: float = 3600.0) -> Path:
    """A run as its supervisor leaves it while the trainer hangs: running, its process alive, its last step long
    ago."""
    from rlctl.backends import get_backend
    from rlctl.recipe.loader import load
    from rlctl.runs.components import write_components

    run = work / "runs" / name
    run.mkdir(parents=True)
    (run / "recipe.toml").write_text(recipe)
    write_components(run, get_backend(backend), load(run / "recipe.toml").recipe)  # as launch records them
    t0 = time.time() - age
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": t0 + s, "reward/mean": 0.1}) + "\n"
                                               for s in range(1, steps + 1)))
    write_state(run, name=name, status="running", backend=backend, executor="local", started_at=t0 - 60,
                handle={"executor": "local", "ref": {"pid": proc.pid, "pgid": proc.pid}, "attempt": 1},
                pid=proc.pid, pgid=proc.pid, total_steps=1000)
    return run


PRIME = """name = "bs4"
[backend]
name = "prime_rl"
version = "0.8.0"
[model]
path = "Qwen/Qwen2.5-7B-Instruct"
max_model_len = 4096
[data]
train = "prompts.jsonl"
[rollout]
max_tokens = 4000
[train]
steps = 1000
[checkpoint]
dir = "outputs"
"""


@pytest.mark.parametrize("vllm", ["0.26.0", "seed 002"])
def test_a_rollout_error_only_the_inference_log_shows(user, vllm):
    """Seed 002: rollouts hang at 0/8 with no error in the main log; the inference server refuses every request
    (max_tokens 4000 + a 1297-token prompt > max_model_len 4096). status says so from prime-rl's inference log,
    and `rlctl logs RUN --component inference|orchestrator|trainer` shows each component's own file."""
    proc = hung_process()
    try:
        run = live_run(user, "bs4-20261127-000000", PRIME, proc)
        logs = run / "outputs" / "logs"
        logs.mkdir(parents=True)
        stream = io.StringIO()
        log = vllm_logger(stream)
        log.info("Starting vLLM API server 0 on http://0.0.0.0:8000")
        if vllm == "0.26.0":
            exc = vllm_refusal()
            want = str(exc)
        else:  # as seed 002 recorded it from an older vLLM's log
            want = ("'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length "
                    "is 4096 tokens and your request has 1297 input tokens (4000 > 4096 - 1297).")
            exc = ValueError(want)
        for _ in range(8):
            logged_exception(log, "Error in preprocessing prompt inputs", exc)
        (logs / "inference.log").write_text(stream.getvalue())
        (logs / "orchestrator.log").write_text("INFO Starting orchestrator\nGenerating rollouts (train): 0/8\n")
        (logs / "trainer.log").write_text("INFO Starting trainer on GPU(s) 1\nINFO Waiting for rollouts of step 7\n")
        (run / "stdout.log").write_text("Generating rollouts (train): 0/8\n")  # rl tails the orchestrator's log

        d = json.loads(cli("status", run.name, "--json", "--stall-after", "600").out)
        assert d["status"] == "stalled" and d["cause"]["what"] == "rollout requests refused", d
        assert want[:120] in d["reason"], d["reason"]
        assert all(e.startswith("outputs/logs/inference.log:") for e in d["cause"]["evidence"]), d["cause"]
        assert "max_model_len" in d["cause"]["fix"]
        assert state_cell(d) in cli("status", "--stall-after", "600").out  # the table's cell; status RUN: whole
        shown = cli("logs", run.name, "--component", "inference")
        assert shown.code == 0 and shown.out == stream.getvalue(), shown.err
        assert cli("logs", run.name, "--component", "orchestrator", "-n", "1").out == \
            "Generating rollouts (train): 0/8\n"
        assert "Waiting for rollouts" in cli("logs", run.name, "--component", "trainer").out
        bad = cli("logs", run.name, "--component", "vllm")
        assert bad.code == 2 and "has no component 'vllm'; it has: trainer, inference, orchestrator" in bad.err, \
            bad.err
    finally:
        proc.kill()
        proc.wait()


RAY_BACKENDS = {  # backend: (its recipe, the vLLM engine's Ray actor, a training actor)
    "openrlhf": ('[backend]\nname = "openrlhf"\nversion = "0.9.3"\n', "LLMRayActor", "PolicyModelActor"),
    "verl": ('[backend]\nname = "verl"\nversion = "0.9.1"\n', "vLLMHttpServer", "WorkerDict"),
}


@pytest.mark.parametrize("backend", list(RAY_BACKENDS))
def test_vllm_engine_lines_under_ray_are_the_inference_component(user, backend):
    """OpenRLHF and verl: the vLLM engines are Ray actors; Ray's driver prints their lines into the run's output
    prefixed with the actor (Ray's own print_worker_logs, colours and all). `--component inference` is those lines,
    `--component trainer` the rest; an engine that died (vLLM's own "EngineCore encountered a fatal error.") is the
    cause, read from them; `--component ray` names where Ray's own logs are."""
    from ray._private.worker import print_worker_logs

    out = io.StringIO()
    print("global_step 1: policy_loss=0.41, reward=0.10", file=out)
    stream = io.StringIO()
    log = vllm_logger(stream)
    log.info("Initializing a V1 LLM engine (v0.26.0)")
    logged_exception(log, "EngineCore encountered a fatal error.", RuntimeError("CUDA driver error: unknown error"))
    recipe, engine, trainer_actor = RAY_BACKENDS[backend]
    print_worker_logs({"pid": 40213, "ip": "10.0.0.2", "localhost": "10.0.0.2", "actor_name": engine,
                       "lines": stream.getvalue().splitlines()}, out)
    print_worker_logs({"pid": 40101, "ip": "10.0.0.2", "localhost": "10.0.0.2", "actor_name": trainer_actor,
                       "lines": ["Waiting for rollouts"]}, out)
    proc = hung_process()
    try:
        run = live_run(user, f"{backend}-20261127-000000", recipe + '[model]\npath = "Qwen/Qwen2.5-0.5B"\n'
                       '[data]\ntrain = "p.jsonl"\n', proc, backend=backend)
        (run / "stdout.log").write_text(out.getvalue())
        inference = cli("logs", run.name, "--component", "inference").out
        assert "EngineCore encountered a fatal error." in inference and "global_step" not in inference
        assert f"({engine} pid=40213)" in inference and "Waiting for rollouts" not in inference
        trainer = cli("logs", run.name, "--component", "trainer").out
        assert "global_step 1" in trainer and f"({trainer_actor} pid=40101)" in trainer and "EngineCore" not in trainer
        assert "/tmp/ray/session_latest" in cli("logs", run.name, "--component", "ray").out + \
            cli("logs", run.name, "--component", "nope").err
        d = json.loads(cli("status", run.name, "--json", "--stall-after", "600").out)
        assert d["cause"]["what"] == "inference engine failed", d  # vLLM said so: its own line, with the root cause
        assert any(f"({engine} pid=40213)" in e and "EngineCore encountered a fatal error." in e
                   for e in d["cause"]["evidence"]), d["cause"]
    finally:
        proc.kill()
        proc.wait()


def test_unknown_component_names_what_there_is(user):
    r = cli("launch", str(command_recipe(user, CAUSES / "illegal_memory_access.log")))
    run = next((user / "runs").iterdir())
    bad = cli("logs", run.name, "--component", "inference")
    assert bad.code == 2 and "has no component 'inference'; it has: trainer, supervisor" in bad.err, (r.err, bad.err)
    sup = cli("logs", run.name, "--component", "supervisor")
    assert sup.code == 0 and "failed" in sup.out, sup.out
    trainer = cli("logs", run.name, "--component", "trainer", "-n", "2")
    assert trainer.code == 0 and trainer.out.splitlines() == (run / "stdout.log").read_text().splitlines()[-2:]


# ---- on an SSH host ------------------------------------------------------------------------------------------------
def test_component_logs_of_a_run_on_a_host(sshd, user, tmp_path):  # noqa: F811
    """A prime-rl run on host `box`: its components' logs are there; `rlctl logs RUN --component inference` asks
    the host's rlctl (one round trip); an unknown component is its exit 2, naming what there is."""
    bin_dir = ssh_home(sshd, Path(os.environ["HOME"]), ["box"])
    box_home = tmp_path / "box-home"
    ssh_home(sshd, box_home, [])
    os.environ["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    try:
        r = cli("hosts", "add", "box", "box", "--workdir", str(tmp_path / "box-work"), "--python", sys.executable,
                "--env", f"HOME={box_home}")
        assert r.code == 0, r.err
        there = tmp_path / "box-work" / "runs" / "bs4-20261127-000000"
        (there / "outputs" / "logs").mkdir(parents=True)
        (there / "recipe.toml").write_text(PRIME)
        (there / "outputs" / "logs" / "inference.log").write_text("INFO vLLM API server on :8000\nERROR boom\n")
        write_state(there, name=there.name, status="failed", backend="prime_rl", executor="local", exit_code=1)
        here = user / "runs" / there.name
        here.mkdir(parents=True)
        # two failed attempts: the first one's evidence was mirrored here, the second one's not yet
        attempts = [{"attempt": n, "started_at": 1.0e9 + n, "ended_at": 1.0e9 + n + 1, "reason": "launch",
                     "outcome": "failed", "exit_code": 1, "evidence": str(there / "attempts" / str(n) / "evidence.txt")}
                    for n in (1, 2)]
        write_state(here, name=there.name, status="failed", backend="prime_rl", executor="ssh", host="box",
                    remote_run_dir=str(there), handle={"executor": "ssh", "ref": {"host": "box",
                                                                                   "run_dir": str(there)}},
                    restart={"mode": "on-failure", "max_restarts": 1}, attempts=attempts)
        (here / "attempts" / "1").mkdir(parents=True)
        (here / "attempts" / "1" / "evidence.txt").write_text("## last log lines\n")
        shown = cli("logs", there.name, "--component", "inference", "-n", "1")
        assert shown.code == 0 and shown.out == "ERROR boom\n", shown.err
        # a host's evidence path is said where it can be read: the mirror's copy here, else HOST:PATH (as ckpt list)
        want = [str(here / "attempts" / "1" / "evidence.txt"), f"box:{there / 'attempts' / '2' / 'evidence.txt'}"]
        st = cli("status", there.name).out
        assert f"evidence: {want[0]}\n" in st and f"evidence: {want[1]}\n" in st, st
        assert [a["evidence"] for a in json.loads(cli("status", there.name, "--json").out)["attempts"]] == want
        bad = cli("logs", there.name, "--component", "ray")
        assert bad.code == 2 and "box: " in bad.err and "it has: trainer, inference, orchestrator" in bad.err, bad.err
    finally:
        os.environ["PATH"] = os.environ["PATH"].split(":", 1)[1]
        with contextlib.suppress(Exception):
            subprocess.run([str(bin_dir / "ssh"), "-o", f"ControlPath=/tmp/rlctl-ssh-{os.getuid()}/%C", "-O", "exit",
                            "box"], capture_output=True, timeout=10)


def test_each_attempt_names_its_cause(user):
    """A failed attempt's record names its cause, and status shows it per attempt."""
    r = cli("launch", str(command_recipe(user, CAUSES / "nccl_timeout.log")), "--restart", "on-failure",
            "--max-restarts", "1")
    assert r.code != 0
    run = next((user / "runs").iterdir())
    st = read_state(run)
    assert [a["cause"]["what"] for a in st["attempts"]] == ["nccl timeout", "nccl timeout"], st["attempts"]
    shown = cli("status", run.name).out
    assert shown.count("cause: NCCL timeout") >= 2, shown


def test_the_supervisor_component_is_one_history_by_time(tmp_path, monkeypatch, capsys):
    """supervisor.log and the recorded events were printed one after the other, so `-n 3` showed the events of an
    earlier attempt rather than the newest lines (new-user trial): one history, by their timestamps."""
    from rlctl.core.state import write_state
    from rlctl.runs.logs import show_component

    run = tmp_path / "run"
    run.mkdir()
    write_state(run, status="finished", backend="command", supervisor_pid=1)
    (run / "supervisor.log").write_text("2026-11-27 04:18:00 rlctl supervisor: attempt 1 started (launch)\n"
                                        "2026-11-27 04:18:53 rlctl supervisor: attempt 2 started (resume)\n")
    t = time.mktime(time.strptime("2026-11-27 04:18:06", "%Y-%m-%d %H:%M:%S"))
    (run / "rlctl-events.jsonl").write_text(json.dumps({"time": t, "event": "eval_done", "step": 10}) + "\n"
                                            + json.dumps({"time": t + 10, "event": "eval_done", "step": 20}) + "\n")
    show_component(run, "supervisor", lines=3)
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[-1] for ln in out] == ["step=10", "step=20", "(resume)"], out


@pytest.mark.parametrize("where", ["log", "attempt"])
def test_a_ray_run_says_its_cause_from_the_same_place_as_any_run(user, where):
    """`rlctl status RUN` of a Ray-executor run read its cause only from state.json: a run whose cause is in its log
    (or in the attempt the supervisor recorded) said none. Every executor's cause comes from causes.settle."""
    run = user / "runs" / "r-20260101-000000"
    run.mkdir(parents=True)
    log, summary, _ = CASES["nccl timeout"]
    attempts = [{"n": 1, "exit_code": 1}]
    if where == "log":
        (run / "stdout.log").write_text(log.read_text())
    else:
        (run / "stdout.log").write_text("")
        attempts[0]["cause"] = {"what": "nccl timeout", "summary": summary, "evidence": [], "fix": "raise it"}
    write_state(run, name=run.name, status="failed", backend="command", executor="ray", exit_code=1,
                attempts=attempts, handle={"executor": "ray", "ref": {"address": "127.0.0.1:1", "job": "j"}})
    d = json.loads(cli("status", run.name, "--json").out)
    assert d["cause"] and d["cause"]["what"] == "nccl timeout" and d["reason"] == summary, d
