from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.s3_server import s3_server  # noqa: F401 - the session's one S3 server (a fixture)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(*args: str, cwd: Path | None = None) -> Result:
    """Run the rlctl entry point in-process, as the console script does, and capture what it prints. stdout and
    stderr are text streams over bytes, as a console's are: a command that writes bytes (`rlctl logs` copies the log
    through sys.stdout.buffer) works here as it does for a user."""
    from rlctl.cli import main

    out, err = _console_stream(), _console_stream()
    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["rlctl", *args]
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
    return Result(code, _text(out), _text(err))


def _console_stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8", errors="replace")  # type: ignore[attr-defined]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(autouse=True, scope="session")
def _own_state_dir(tmp_path_factory):
    """rlctl records the runs directories a user launches in (rlctl.core.run_places, under $XDG_STATE_HOME): the
    tests' runs go to a record of the session's own, never to the real user's. A test playing a user (the `user`
    fixture) drops it again, so that its HOME's ~/.local/state is used, as a user's is."""
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _own_state_record(tmp_path_factory, monkeypatch):
    """Each test its own record of runs directories: a run of another test is never found by name."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))


@pytest.fixture
def write(tmp_path):
    """Write a text file under tmp_path and return its path."""

    def _write(name: str, text: str) -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    return _write


MINIMAL = """
[backend]
name = "trl"

[model]
path = "Qwen/Qwen2.5-0.5B"

[data]
train = "prompts.jsonl"
"""


@pytest.fixture
def minimal_recipe(write):
    return write("recipe.toml", MINIMAL)


@pytest.fixture(scope="session")
def released_source(tmp_path_factory):
    """A released backend wheel from PyPI, unpacked: {(dist, version): Path of its purelib root}."""
    import subprocess
    import zipfile

    # the wheels are kept between sessions (the cache every conformance test shares), unpacked per session
    cache = Path(os.environ.get("RLCTL_TEST_WHEELS", Path.home() / ".cache" / "rlctl-tests" / "wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    unpacked = tmp_path_factory.mktemp("wheels")
    done: dict = {}

    def get(dist: str, version: str) -> Path:
        if (dist, version) in done:
            return done[(dist, version)]
        pattern = f"{dist.replace('-', '_')}-{version}-*.whl"
        if not any(cache.glob(pattern)):
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
                                f"{dist}=={version}"], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot download {dist}=={version} from PyPI: {r.stderr.strip()[-200:]}")
        wheel = next(cache.glob(pattern))
        out = unpacked / f"{dist}-{version}"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(out)
        # wheels with a .data/purelib layout (OpenRLHF) vs plain layout
        purelib = next(out.glob("*.data/purelib"), out)
        done[(dist, version)] = purelib
        return purelib

    return get


@pytest.fixture
def user(tmp_path):
    """A working directory with every default: `rlctl` on PATH, runs under ./runs, a HOME of its own."""
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCTL_") and k != "XDG_STATE_HOME"}
    env["HOME"] = str(home)
    exe = shutil.which("rlctl", path=str(Path(sys.executable).parent)) or shutil.which("rlctl")
    assert exe, "the rlctl console script (pip install -e .)"

    def rlctl(*args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([exe, *args], cwd=cwd or work, env=env, capture_output=True, text=True,
                              timeout=timeout)

    rlctl.env = env  # type: ignore[attr-defined]  # e.g. the ssh config a test's sshd needs (RLCTL_SSH_CONFIG)

    yield work, rlctl
    from tests.test_experiments import _kill_all

    _kill_all(work / "runs")  # what a failed test left running: queues, supervisors, trainers


@pytest.fixture
def shell(tmp_path, monkeypatch):
    """A user's shell for tests that call rlctl in-process: a working directory (runs go to ./runs), a HOME of its
    own, no RLCTL_* variables; what a failed test left running there is killed."""
    import contextlib

    import psutil

    for k in list(os.environ):
        if k.startswith("RLCTL_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work
    for p in psutil.process_iter(["cmdline"]):
        if any(str(work) in a for a in p.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                p.kill()


def replay_recipe_file(work: Path, file: str, name: str, replay: str, args: list[str], log_pattern: str,
                       metrics_map: str, steps: int, tail: str = "", comment: str = "", command_extra: str = "",
                       resources: str = 'gpus_per_node = 0\ngpu = "cpu"\n') -> Path:
    """A command-backend recipe whose trainer is `replay` (written to work/replay.py) run with `args`: a recorded log
    played back as a trainer prints it, on the CPU, prompts in work/prompts.jsonl. `command_extra`: more lines of
    [backend.command] (logs, processes); `resources`: the [resources] table's lines; `tail`: TOML after them."""
    import json

    (work / "replay.py").write_text(replay)
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    command = ", ".join(json.dumps(a) for a in [sys.executable, "replay.py", *args])
    r = work / file
    r.write_text(f"""name = "{name}"
[backend]
name = "command"
[backend.command]
command = [{command}]
cwd = {json.dumps(str(work))}
{comment}log_pattern = '{log_pattern}'
metrics_map = {{{metrics_map}}}
{command_extra}[model]
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
{resources}{tail}""")
    return r
