"""The paths a recipe references, resolved once, when it is loaded: preflight, render, the run and `recipe show` all
read the same absolute path.

A path written in a recipe file is relative to that file's directory (an extended file's to its own directory); a
path given with `--set` is relative to the directory the command was typed in. A value left relative after this is
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

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow")

# the recipe's own path keys (`*`: any name); each backend adds the path keys of its `[backend.<name>]` table
KEYS: dict[str, str] = {
    "data.train": DATA, "data.eval": DATA, "eval.sets.*.data": DATA,
    "model.path": MODEL, "reward.function": FILE, "patches.dir": FILE,
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


def resolve(data: dict[str, Any], base: Path) -> None:
    """Make every path key of `data` (one recipe file's table, or a `--set` fragment) absolute against `base`, and
    the scripts `eval.command` names."""
    base = base.absolute()
    for _, table, name, kind in path_items(data):
        table[name] = resolve_value(table[name], kind, base)
    ev = data.get("eval")
    if isinstance(ev, dict) and isinstance(ev.get("command"), str):
        ev["command"] = resolve_command(ev["command"], base)


SCRIPT_SUFFIXES = (".py", ".sh")  # a word of an eval command that names a script of the user's


def command_scripts(command: str) -> list[str]:
    """The words of a command template that name scripts (`python eval_posthoc.py {checkpoint} ...`)."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the evaluator's own error says so when it runs
        return []
    return [w for w in words if w.endswith(SCRIPT_SUFFIXES) and not w.startswith(("-", "{")) and not is_id(w)]


def resolve_command(command: str, base: Path) -> str:
    """`command` with each script it names beside `base` made absolute: the evaluator runs in its job's own
    directory (<run>/evals), not where the recipe is."""
    import shlex

    scripts = {w for w in command_scripts(command) if not Path(w).is_absolute() and _exists(base / w)}
    if not scripts:
        return command
    return shlex.join(str((base / w).resolve()) if w in scripts else w for w in shlex.split(command))


def local_paths(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(dotted key, absolute path) of each path key of a resolved recipe's data that names a local path."""
    return [(dotted, table[name]) for dotted, table, name, _ in path_items(data)
            if not is_id(table[name]) and Path(table[name]).is_absolute()]
