"""`rlctl.cli.main` called again and again in one process (what the test suite does: tests/conftest.py run_cli, the
CLI property tests' thousands of cases; any Python that embeds rlctl's CLI).

Prints, in milliseconds (median of --n calls, after one warm-up call):
- the click command typer makes of rlctl's app (`typer.main.get_command(app)`): what every call paid before the
  command was made once per process (rlctl/cli/_main.py command());
- one in-process call of a few commands that answer at once (a usage error, a missing recipe file, `status --help`),
  as they cost now;
- the same calls through typer's own `app(...)`, which makes the command anew each time (the old path).
A single `rlctl ...` from a shell makes the command once either way: its time is unchanged.

Usage: python bench/cli_inprocess.py [--n 50]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = [["frobnicate"], ["render", "/nonexistent.toml"], ["status", "--help"]]


def _quiet(fn) -> None:
    with (contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()),
          contextlib.suppress(BaseException)):
        fn()


def median_ms(fn, n: int) -> float:
    _quiet(fn)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        _quiet(fn)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    a = ap.parse_args()
    from typer.main import get_command

    from rlctl.cli import main as cli_main
    from rlctl.cli._main import app

    print(f"load average {os.getloadavg()[0]:.2f}; median of {a.n} calls, ms")
    print(f"  typer.main.get_command(app) (made once per process now): {median_ms(lambda: get_command(app), a.n):7.1f}")
    for argv in CASES:
        now = median_ms(lambda argv=argv: cli_main(argv), a.n)
        old = median_ms(lambda argv=argv: app(args=argv, prog_name="rlctl", standalone_mode=False), a.n)
        print(f"  rlctl {' '.join(argv):28s} now {now:7.1f}   typer's app(...) each call {old:7.1f}")


if __name__ == "__main__":
    main()
