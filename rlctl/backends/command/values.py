"""What `[backend.command]` values mean, for the recipe's model of the table (options.py) and the adapter alike:
command lines, their `{name}` placeholders, and metrics-map names."""

from __future__ import annotations

import shlex
import string

RESUME_FIELDS = ("step", "path", "dir")


def _argv(value: list[str] | str) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else list(value)


def _fields(template: str) -> list[str]:
    """The `{name}` placeholders of a template (`{{`/`}}` are literal braces)."""
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"{template!r}: {e}") from None


def check_unified(v: dict[str, str], where: str = "metrics_map") -> dict[str, str]:
    """Every value of a metrics map is one of rlctl's unified names (or eval/<set>/<metric>)."""
    import difflib

    from rlctl.metrics import UNIFIED

    for key, name in v.items():
        if name not in UNIFIED and not name.startswith("eval/"):
            close = difflib.get_close_matches(name, UNIFIED, n=1)
            hint = f" Did you mean {close[0]}?" if close else f" Known: {', '.join(UNIFIED)}, eval/<set>/<metric>."
            raise ValueError(f"{where}.{key} = {name!r} is not one of rlctl's metric names.{hint}")
    return v
