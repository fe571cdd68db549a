"""`rlctl status` answered without the CLI framework (rlctl/cli/_fast.py) says exactly what the full command says, and
leaves everything it does not parse (and every error) to the full command."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from rlctl.runs.state import write_state


def _full(argv: list[str]) -> tuple[int, str, str]:
    from rlctl.cli._main import main as full

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            full(argv)
        except SystemExit as e:
            return int(e.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def _fast(argv: list[str]) -> tuple[bool, str]:
    from rlctl.cli._fast import fast_path

    out = io.StringIO()
    with redirect_stdout(out):
        answered = fast_path(argv) is not None
    return answered, out.getvalue()


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    for i, status in enumerate(("finished", "failed", "stopped")):
        d = root / f"r{i}-20260101-00000{i}"
        d.mkdir(parents=True)
        write_state(d, name=d.name, backend="trl", status=status, started_at=1.0e9 + i, ended_at=1.0e9 + 60 + i,
                    exit_code=0 if status == "finished" else 1)
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n"
                                                 for s in range(1, 6)))
    (root / "not-a-run").mkdir()
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(root))
    return root


@pytest.mark.parametrize("argv", [["status"], ["status", "--json"], ["status", "--json", "--timeout=3"],
                                  ["status", "--timeout", "2"],
                                  ["status", "--stall-after=60"]])
def test_fast_status_says_what_the_full_command_says(runs, argv):
    answered, text = _fast(argv)
    assert answered
    code, out, err = _full(argv)
    assert code == 0 and not err
    assert text == out


@pytest.mark.parametrize("argv", [["status", "r0"], ["status", "--watch"], ["status", "-h"], ["status", "--timeout"],
                                  ["status", "--timeout", "nan"], ["status", "--timeout", "-1"], ["status", "-e"],
                                  ["status", "--bogus"], ["logs", "x"], [], ["status", "--stall-after", "inf"],
                                  ["status", "-e", "none"], ["status", "--experiment=none", "--json"]])
def test_everything_else_goes_to_the_full_command(runs, argv):
    answered, text = _fast(argv)
    assert not answered and text == ""


def test_an_unknown_experiment_is_the_full_commands_error(runs):
    assert _fast(["status", "-e", "none"]) == (False, "")
    code, out, err = _full(["status", "-e", "none"])
    assert code == 2 and "no experiment 'none'" in err


def test_the_fast_path_imports_no_cli_framework(runs, tmp_path):
    import subprocess

    code = ("import sys; from rlctl.cli import main\n"
            "try:\n    main(['status'])\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('typer', 'click', 'pydantic', 'torch') if m in sys.modules]\n"
            "print('IMPORTED', bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "IMPORTED []" in r.stdout, r.stdout + r.stderr


def test_a_record_whose_time_is_null_does_not_break_status(tmp_path, monkeypatch):
    """Found by tests/test_cli_properties.py: `{"step": 0, "time": null}` in metrics.jsonl."""
    root = tmp_path / "runs"
    run = root / "gen-run"
    run.mkdir(parents=True)
    (run / "state.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 0, "time": null}\n')
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(root))
    code, out, err = _full(["status", "gen-run"])
    assert code == 0 and "gen-run" in out and "Traceback" not in err
