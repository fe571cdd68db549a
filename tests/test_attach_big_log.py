"""`rlctl attach` of a big log costs its ingestion, not what surrounds it (issue 30.4; figures in docs/performance.md):

- `rlctl attach PATH [--backend B] [--name N]` is answered without the CLI framework (rlctl/cli/_fast.py; typer
  imports pydantic): it says exactly what the full command says, errors included, and leaves every other form to the
  full command; loading an adapter to read its logs imports no pydantic either;
- `--backend auto` guesses from the logs' ends, a first short look deciding when it is clear, never a parse per line
  of the backend's own lines (its bulk reader scores them).

Run as a user runs it: from a working directory, the default ./runs."""

from __future__ import annotations

import io
import os
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


@pytest.mark.parametrize("backend", ["verl", "prime_rl", "command", "openrlhf", "trl", "auto"])
def test_the_fast_attach_imports_no_cli_framework(user, backend):
    """Nor pydantic: an adapter's recipe table (prime_rl's, command's) is imported only where recipes are read."""
    code = ("import sys; from rlctl.cli import main\n"
            f"try:\n    main(['attach', 'train.log', '--backend', '{backend}'])\nexcept SystemExit as e:\n"
            "    print('EXIT', e.code)\n"
            "bad = [m for m in ('typer', 'click', 'pydantic', 'torch') if m in sys.modules]\n"
            "print('IMPORTED', bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=user)
    assert "EXIT " in r.stdout and "IMPORTED []" in r.stdout, r.stdout + r.stderr


# ---- --backend auto: a first short look, deeper only when it is not clear ---------------------------------------

NOISE = "INFO 01-06 09:20:11 vllm_engine.py:112] Avg prompt throughput: 1523.4 tokens/s, Running: 64 reqs\n"


def _rchar() -> int:
    from pathlib import Path

    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_a_clear_log_is_guessed_from_a_short_look(user):
    """A 10 MB verl log: the guess reads the first and last FIRST_SAMPLE bytes, once (it read 2 x 4 MB)."""
    from rlctl.runs.attach import FIRST_SAMPLE, detect_backend, find_sources

    log = user / "big.log"
    with log.open("w") as fh:
        for i in range(1, 10 * 1024 * 1024 // len(VERL.format(99999)) + 1):
            fh.write(VERL.format(i))
    src = find_sources(log)
    assert src.logs == [log]  # once (a .log given as PATH was listed twice: sampled twice)
    detect_backend(find_sources(user / "train.log"), {})  # every adapter imported (their modules are read)
    before = _rchar()
    found, scores, _ = detect_backend(src, {})
    read = _rchar() - before
    assert found == "verl" and scores["verl"] > 0
    assert read < 2 * FIRST_SAMPLE + 256 * 1024, read
    code, out, err = fast(["attach", "big.log"])
    assert code == 0 and "backend guessed from the logs: verl" in out, out + err


def test_metrics_past_the_short_look_are_still_found(user):
    """Metrics only deeper than the first look (a long startup, a long crash dump), and one stray dict a TRL reader
    half understands in the first look: the deeper look decides, as before."""
    from rlctl.runs.attach import FIRST_SAMPLE

    noise = NOISE * (int(1.5 * FIRST_SAMPLE) // len(NOISE))
    (user / "deep.log").write_text("{'learning_rate': 1e-06, 'epoch': 0.1}\n" + noise
                                   + "".join(VERL.format(i) for i in range(1, 301)) + noise)
    code, out, err = fast(["attach", "deep.log"])
    assert code == 0 and "backend guessed from the logs: verl" in out and "300 records" in out, out + err
    (user / "none.log").write_text(noise * 3)
    code, out, err = fast(["attach", "none.log"])
    assert code == 1 and "no installed backend adapter understands it" in err, out + err


def test_a_custom_trainers_json_lines_are_taken_from_a_short_look(user):
    """No adapter recognises them: the command backend's generic reader takes them (as before), decided at once."""
    lines = "".join(f'{{"step": {i}, "loss": 0.5, "acc": 0.25}}\n' for i in range(1, 20001))
    (user / "custom.jsonl").write_text(lines)
    code, out, err = fast(["attach", "custom.jsonl"])
    assert code == 0 and "read as a custom trainer's JSON lines by the `command` backend" in out, out + err
    assert "20000 records" in out
