"""The Typer application: one module per command group (registered here by import); the work is in the
modules they call.

Heavy libraries (torch, ray, vllm, deepspeed, wandb, scipy) are never imported here: `rlctl --help`, render,
preflight and status stay fast.
"""

from __future__ import annotations

import sys
from typing import Any

# Each module registers its commands on the app when imported; the order is the order of `rlctl --help`.
from rlctl.cli import ckpt, model, patch, recipes, runs  # noqa: F401  # isort: skip
from rlctl.cli import evals, experiments, hosts  # noqa: F401  # isort: skip  (after runs in --help)
from rlctl.cli._app import app
from rlctl.cli._errors import exit_code, os_error_message
from rlctl.cli._fast import tolerant_streams

__all__ = ["app", "main", "os_error_message"]

_built: Any = None


def command() -> Any:
    """The click command typer makes of `app` (every command's parameters: ~0.03 s of CPU), made once per process.
    `app(...)` makes it anew on every call, which in-process callers of main() (the test suite: thousands of calls)
    paid each time; the app's pretty exceptions are off, so typer's own call adds nothing else."""
    global _built
    if _built is None:
        from typer.main import get_command

        _built = get_command(app)
    return _built


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error becomes a message and an exit code (0 ok, 1 a check failed, 2 usage or input
    error), never a traceback. Set RLCTL_DEBUG=1 to see the traceback of an internal error (rlctl/cli/_errors.py)."""
    tolerant_streams()
    try:
        rc = command()(args=argv, prog_name="rlctl", standalone_mode=False)
        code = rc if isinstance(rc, int) else 0
    except BaseException as e:  # noqa: BLE001 - exit_code re-raises what it does not handle (SystemExit, ...)
        code = exit_code(e)
    sys.exit(code)
