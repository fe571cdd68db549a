"""`rlctl status` (the table of runs) without the CLI framework: the plain forms of the command most often run,
parsed here, answered by the same code (rlctl.runs.status.render) as the full command. Anything else (a run name,
--watch, --help, an option this parser does not know or a value it does not accept) goes to the full CLI, which
also owns every error message: the fast path prints nothing unless it answers."""

from __future__ import annotations

import math
import os
import sys

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


def fast_path(args: list[str]) -> bool:
    """True when the command was answered here."""
    opts = _parse(args)
    if opts is None:
        return False
    try:
        from rlctl.runs.status import render

        os.environ["RLCTL_SSH_TIMEOUT"] = str(opts["timeout"])  # the SSH executor's wait, as the full command sets it
        text = render(None, bool(opts["as_json"]), float(opts["stall_after"]),  # type: ignore[arg-type]
                      opts["experiment"], float(opts["timeout"]))  # type: ignore[arg-type]
    except Exception:  # let the full CLI answer, with its error messages
        return False
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `rlctl status | head`
        pass
    return True
