"""`rlctl attach PATH [--backend B] [--name N]` answered without the CLI framework (rlctl/cli/_fast.py): what a user
times on a big log is the ingestion, not typer's and pydantic's import. It says exactly what the full command says,
errors included, and leaves every other form to the full command. Run as a user runs it: from a working directory,
the default ./runs."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from tests.conftest import FIXTURES

VERL = "(TaskRunner pid=9) step:{} - actor/pg_loss:0.1 - critic/score/mean:0.5 - response_length/mean:288.7\n"


def _call(entry, argv: list[str]) -> tuple[int | None, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = entry(argv)
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def fast(argv: list[str]) -> tuple[int | None, str, str]:
    from rlctl.cli._fast import fast_path

    return _call(fast_path, argv)


def full(argv: list[str]) -> tuple[int | None, str, str]:
    from rlctl.cli._main import main

    return _call(main, argv)


def _same(text: str) -> str:
    """The output with the run directory's timestamp (and its -N suffix) taken out."""
    return re.sub(r"-\d{8}-\d{6}(-\d+)?", "-STAMP", text)


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A working directory with a verl log and an empty one; HOME isolated, every default (./runs)."""
    monkeypatch.delenv("RLCTL_RUNS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.log").write_text("".join(VERL.format(i) for i in range(1, 6)) + "step:x - a:1\n")
    (tmp_path / "empty.log").write_text("nothing to see\n")
    return tmp_path


@pytest.mark.parametrize("argv", [
    ["attach", "train.log", "--backend", "verl"],
    ["attach", "train.log", "--backend=verl", "--name=v1"],
    ["attach", "--name", "v2", "train.log"],  # auto: the guess is said
    ["attach", "empty.log", "--backend", "verl"],  # no record: exit 1
    ["attach", "train.log", "--backend", "nope"],  # unknown backend: exit 2
    ["attach", "train.log", "--backend", "verl", "--name", "bad/name"],
    ["attach", str(FIXTURES / "openrlhf/console-0.9.3.log")],
])
def test_fast_attach_says_what_the_full_command_says(user, argv):
    code, out, err = fast(argv)
    assert code is not None, "answered by the fast path"
    want = full(argv)
    assert (code, _same(out), err) == (want[0], _same(want[1]), want[2])
    assert "Traceback" not in err


def test_fast_attach_gives_the_records_of_the_full_command(user):
    fast(["attach", "train.log", "--backend", "verl", "--name", "a"])
    full(["attach", "train.log", "--backend", "verl", "--name", "b"])
    a, b = (next((user / "runs").glob(f"{n}-*")) for n in "ab")
    strip = re.compile(rb',"time":[0-9.]+')
    assert strip.sub(b"", (a / "metrics.jsonl").read_bytes()) == strip.sub(b"", (b / "metrics.jsonl").read_bytes())
    assert (a / "stdout.log").resolve() == (user / "train.log")


@pytest.mark.parametrize("argv", [
    ["attach", "train.log", "--follow"], ["attach", "train.log", "-f"], ["attach", "train.log", "--recipe", "r.toml"],
    ["attach", "train.log", "--metrics-map", "a=b"], ["attach", "train.log", "--idle-exit", "1"],
    ["attach", "-h"], ["attach", "--help"], ["attach"], ["attach", "missing.log"], ["attach", "box1:/data/x.log"],
    ["attach", "train.log", "empty.log"], ["attach", "train.log", "--name"], ["attach", "train.log", "--name", "-x"],
    ["attach", "train.log", "--name", "a", "--name", "b"], ["attach", "train.log", "--backend="],
    ["attach", "--", "train.log"], ["attach", "raysubmit_abc123", "--address", "http://x:8265"],
])
def test_every_other_form_goes_to_the_full_command(user, argv):
    code, out, err = fast(argv)
    assert code is None and out == "" and err == ""
    assert not (user / "runs").exists()


def test_the_fast_attach_imports_no_cli_framework(user):
    code = ("import sys; from rlctl.cli import main\n"
            "try:\n    main(['attach', 'train.log', '--backend', 'verl'])\nexcept SystemExit as e:\n"
            "    print('EXIT', e.code)\n"
            "bad = [m for m in ('typer', 'click', 'pydantic', 'torch') if m in sys.modules]\n"
            "print('IMPORTED', bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=user)
    assert "EXIT 0" in r.stdout and "IMPORTED []" in r.stdout, r.stdout + r.stderr
