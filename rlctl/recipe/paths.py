"""The paths a recipe references, resolved once, when it is loaded: preflight, render, the run and `recipe show` all
read the same absolute path.

A path written in a recipe file is relative to that file's directory (an extended file's to its own directory); a
path given with `--set` is relative to the directory the command was typed in. A script named in `eval.command`
(`python eval.py {step} {output}`) is such a path too. A value left relative after this is
not a local path (a Hub model id, a dataset name). Where a run writes (checkpoint.dir, checkpoint.final_dir,
logging.tensorboard, a command's cwd) is not an input: those stay relative to the run directory.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

# How a value is told from an id:
FILE = "file"  # always a path (a reward file, a patch directory, a checkout)
DATA = "data"  # a path when it exists, starts with ./ ../ ~ or /, or has a data file's suffix; else a dataset id
MODEL = "model"  # a path when it exists or starts with ./ ../ ~ or /; else a Hub id

COMMAND = "command"  # a command line: each word naming a script (SCRIPT_SUFFIXES) is a FILE; the rest as written

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow")
SCRIPT_SUFFIXES = (".py", ".sh")

# the recipe's own path keys (`*`: any name); each backend adds the path keys of its `[backend.<name>]` table.
# eval.command runs in <run>/evals (a job's own directory): a script it names is found where the recipe is.
KEYS: dict[str, str] = {
    "data.train": DATA, "data.eval": DATA, "eval.sets.*.data": DATA,
    "model.path": MODEL, "reward.function": FILE, "patches.dir": FILE, "eval.command": COMMAND,
}


def _backend_keys(data: dict[str, Any]) -> dict[str, str]:
    """`backend.<name>.<key>` for each path key a backend's table declares (Backend.table_paths)."""
    from rlctl.backends import available, get_backend

    tables = data.get("backend") if isinstance(data.get("backend"), dict) else {}
    out: dict[str, str] = {}
    for name, table in tables.items():
        if not isinstance(table, dict) or name not in available():
            continue
        try:
            declared = get_backend(name).table_paths
        except Exception:  # a broken plugin: its table is not resolved (its own checks say why)
            continue
        out.update({f"backend.{name}.{k}": FILE for k in declared})
    return out


def path_items(data: dict[str, Any]) -> list[tuple[str, dict[str, Any], str, str]]:
    """(dotted key, the table holding it, its name there, kind) of each path key set to a string in `data`."""
    patterns = {**KEYS, **_backend_keys(data)}
    out = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for k, v in node.items():
            dotted = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                walk(v, dotted)
            elif isinstance(v, str):
                kind = next((kd for pat, kd in patterns.items() if fnmatch.fnmatchcase(dotted, pat)
                             and dotted.count(".") == pat.count(".")), None)
                if kind:
                    out.append((dotted, node, k, kind))

    walk(data, "")
    return out


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except (OSError, ValueError):  # a name too long, a NUL: not a usable path (preflight says why)
        return False


def is_id(value: str) -> bool:
    """Values that are never a local path: URLs, `random:` model sources, `${VAR}` references."""
    return "://" in value or value.startswith("random:") or "${" in value or not value.strip()


def resolve_value(value: str, kind: str, base: Path) -> str:
    """`value` as an absolute path when it names one (see the kinds), against `base`; else as written."""
    if kind == COMMAND:
        return _resolve_command(value, base)
    if is_id(value):
        return value
    p = Path(value).expanduser() if value.startswith("~") else Path(value)
    if p.is_absolute():
        return str(p)
    candidate = base / p
    local = (kind == FILE or value.startswith(("./", "../")) or _exists(candidate)
             or (kind == DATA and p.suffix.lower() in DATA_SUFFIXES))
    if not local:
        return value
    try:
        return str(candidate.resolve())
    except (OSError, RuntimeError):  # a symlink loop: absolute at least; preflight says why it cannot be used
        return str(candidate.absolute())


def script_words(command: str) -> list[str]:
    """The words of a command line that name a script file (`python eval.py {step}`: eval.py); none when the line
    does not split (unbalanced quotes: the command evaluator says so when it runs)."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        return []
    return [w for w in words if w.endswith(SCRIPT_SUFFIXES) and "{" not in w and not is_id(w)]


def _resolve_command(command: str, base: Path) -> str:
    """The command with each relative script word made absolute against `base` (when it is there, or is written
    ./ or ../); the line as written when nothing changes."""
    import shlex

    scripts = set(script_words(command))
    if not scripts:
        return command
    words = shlex.split(command)
    out = []
    for w in words:
        p = Path(w).expanduser() if w.startswith("~") else Path(w)
        if w in scripts and not p.is_absolute() and (w.startswith(("./", "../")) or _exists(base / p)):
            w = resolve_value(w, FILE, base)
        elif w in scripts and w.startswith("~"):
            w = str(p)
        out.append(w)
    return command if out == words else shlex.join(out)


def command_scripts(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(dotted key, absolute path) of each local script a command key of a resolved recipe's data names."""
    return [(dotted, w) for dotted, table, name, kind in path_items(data) if kind == COMMAND
            for w in script_words(table[name]) if Path(w).is_absolute()]


def resolve(data: dict[str, Any], base: Path) -> None:
    """Make every path key of `data` (one recipe file's table, or a `--set` fragment) absolute against `base`."""
    base = base.absolute()
    for _, table, name, kind in path_items(data):
        table[name] = resolve_value(table[name], kind, base)


def local_paths(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(dotted key, absolute path) of each path key of a resolved recipe's data that names a local path."""
    return [(dotted, table[name]) for dotted, table, name, kind in path_items(data)
            if kind != COMMAND and not is_id(table[name]) and Path(table[name]).is_absolute()]
