"""The rlctl command line. `main` is the entry point; the Typer app and its command modules are imported only when a
command needs them (rlctl/cli/_main.py), so that the command people run most, `rlctl status`, and `rlctl attach`
of a big log answer without paying for the CLI framework's import (rlctl/cli/_fast.py).

Heavy libraries (torch, ray, vllm, deepspeed, wandb, scipy) are never imported here: `rlctl --help`, render,
preflight and status stay fast.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["app", "main", "os_error_message"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error becomes a message and an exit code (0 ok, 1 a check failed, 2 usage or input
    error), never a traceback."""
    from rlctl.cli._fast import fast_path

    code = fast_path(sys.argv[1:] if argv is None else list(argv))
    if code is not None:
        sys.exit(code)
    from rlctl.cli._main import main as full

    full(argv)


def __getattr__(name: str) -> Any:  # `from rlctl.cli import app`: the Typer app, built on first use
    if name in ("app", "os_error_message"):
        from rlctl.cli import _main

        return getattr(_main, name)
    raise AttributeError(f"module 'rlctl.cli' has no attribute {name!r}")
