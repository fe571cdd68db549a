"""Commands answered without the CLI framework (typer imports pydantic and builds every command: ~0.13 s of CPU):
the plain forms of `rlctl status` (the table of runs, the command people run most) and of `rlctl attach PATH
[--backend B] [--name N]` (whose time users measure on big logs), parsed here and answered by the same code as the
full command (rlctl.runs.status.render; rlctl.runs.attach). Anything else (a run name, --watch, --follow, --help,
an option this parser does not know or a value it does not accept) goes to the full CLI. Status prints nothing
unless it answers (any error: the full CLI answers instead); attach, once it starts, ends here, its errors said by
the full CLI's one error policy (rlctl.cli._errors)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path

_VALUED = {"--experiment": "experiment", "-e": "experiment", "--timeout": "timeout", "--stall-after": "stall_after"}


def _parse(args: list[str]) -> dict[str, object] | None:
    if not args or args[0] != "status":
        return None
    opts: dict[str, object] = {"as_json": False, "experiment": None, "timeout": 5.0, "stall_after": 1800.0}
    rest = args[1:]
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--json":
            opts["as_json"] = True
            i += 1
            continue
        key, value = (a.split("=", 1) + [None])[:2] if a.startswith("--") and "=" in a else (a, None)
        if key not in _VALUED:
            return None  # a run name, --watch, -h, ...: the full CLI
        if value is None:
            if i + 1 >= len(rest):
                return None
            value = rest[i + 1]
            i += 2
        else:
            i += 1
        field = _VALUED[key]
        if field == "experiment":
            if not value or value.startswith("-"):
                return None
            opts[field] = value
        else:
            try:
                seconds = float(value)
            except ValueError:
                return None
            if not math.isfinite(seconds) or seconds <= 0:
                return None
            opts[field] = seconds
    return opts


def fast_path(args: list[str]) -> int | None:
    """The exit code of a command answered here; None when the full CLI must answer."""
    if args[:1] == ["attach"]:
        return _attach(args[1:])
    opts = _parse(args)
    if opts is None:
        return None
    try:
        from rlctl.runs.status import render

        os.environ["RLCTL_SSH_TIMEOUT"] = str(opts["timeout"])  # the SSH executor's wait, as the full command sets it
        text = render(None, bool(opts["as_json"]), float(opts["stall_after"]),  # type: ignore[arg-type]
                      opts["experiment"], float(opts["timeout"]))  # type: ignore[arg-type]
    except Exception:  # let the full CLI answer, with its error messages
        return None
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `rlctl status | head`
        pass
    return 0


_ATTACH_OPTS = ("--backend", "--name")


def _parse_attach(args: list[str]) -> dict[str, str] | None:
    """PATH, --backend B and --name N (each at most once, `--opt V` or `--opt=V`), PATH an existing local file or
    directory (so never HOST:PATH, nor a Ray job id); else None."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        if key in _ATTACH_OPTS:
            if not eq:
                if i + 1 >= len(args):
                    return None
                value = args[i + 1]
                i += 1
            if key in opts or not value or value.startswith("-"):
                return None
            opts[key] = value
        elif a.startswith("-") or "path" in opts or not a:
            return None
        else:
            opts["path"] = a
        i += 1
    if "path" not in opts or not Path(opts["path"]).expanduser().exists():
        return None
    return opts


def _attach(args: list[str]) -> int | None:
    opts = _parse_attach(args)
    if opts is None:
        return None
    tolerant_streams()
    try:
        from rlctl.runs.attach import attach, report

        text, code = report(attach(opts["path"], backend=opts.get("--backend", "auto"), name=opts.get("--name")))
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return code
    except BaseException as e:  # noqa: BLE001 - exit_code re-raises what it does not handle (SystemExit, ...)
        from rlctl.cli._errors import exit_code

        return exit_code(e)


def tolerant_streams() -> None:
    """stdout and stderr replace what the terminal cannot encode: an ASCII-only terminal (LANG=C) gets '?' for a
    sparkline, not a crash."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure):
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="replace")
