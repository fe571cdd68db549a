"""Every command's help, and the usage line a missing argument prints, read as a user reads them: no unformatted
`{name}` placeholder anywhere (a new-user trial met `Usage: rlctl logs [OPTIONS] {run}`: typer 0.29 writes a required
argument's name in braces). The commands are found by walking the Typer app, so a new one is covered the day it is
added."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_cli

PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


def _paths() -> list[tuple[list[str], bool]]:
    """(argv path, whether it takes a required argument) of every group and command."""
    import typer.main

    from rlctl.cli import app

    out: list[tuple[list[str], bool]] = []

    def walk(cmd, path):
        out.append((path, any(p.param_type_name == "argument" and p.required for p in cmd.params)))
        for n, c in sorted((getattr(cmd, "commands", None) or {}).items()):
            walk(c, [*path, n])

    walk(typer.main.get_command(app), [])
    return out


PATHS = _paths()


@pytest.mark.parametrize("path", [p for p, _ in PATHS], ids=lambda p: " ".join(p) or "rlctl")
def test_help_has_no_unformatted_placeholder(path, tmp_path):
    r = run_cli(*path, "--help", cwd=tmp_path)
    assert r.code == 0, r.out + r.err
    assert r.out.startswith("Usage: rlctl"), r.out
    assert not PLACEHOLDER.findall(r.out + r.err), r.out


@pytest.mark.parametrize("path", [p for p, required in PATHS if required], ids=" ".join)
def test_a_missing_argument_shows_a_plain_usage_line(path, tmp_path):
    r = run_cli(*path, cwd=tmp_path)
    assert r.code == 2 and "Missing argument" in r.err, r.out + r.err
    usage = next(line for line in r.err.splitlines() if line.startswith("Usage:"))
    assert not PLACEHOLDER.findall(usage), usage
    assert re.search(r" [A-Z][A-Z_]*(\.\.\.)?( |$)", usage), usage  # the argument in capitals, as click writes it


@pytest.mark.parametrize("path", [p for p, required in PATHS if required], ids=" ".join)
def test_a_missing_argument_is_named_as_the_usage_line_names_it(path, tmp_path):
    """A new-user trial: `Error: Missing argument 'run'.` under `Usage: rlctl logs [OPTIONS] RUN`."""
    r = run_cli(*path, cwd=tmp_path)
    usage = next(line for line in r.err.splitlines() if line.startswith("Usage:"))
    m = re.search(r"Missing argument '([^']+)'", r.err)
    assert m and m[1] == m[1].upper(), r.err
    assert re.search(rf" \[?{re.escape(m[1])}\]?( |$)", usage), (m[1], usage)
