"""The backend registry: the bundled adapters and those other distributions register under the `rlctl.backends`
entry-point group (docs/plugins.md).

A plugin is a class deriving from `rlctl.backends.base.Backend`, named in its distribution's metadata:

    [project.entry-points."rlctl.backends"]
    toy = "rlctl_toy:ToyBackend"

Names map to "module:Class" strings and adapters are imported only when asked for, so listing names imports no
adapter. A plugin that takes a bundled name is reported and ignored (the bundled adapter is kept); a plugin that
cannot be loaded breaks only recipes that use it (`rlctl backends` shows why). RLCTL_NO_PLUGINS=1 loads the bundled
adapters only.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

from rlctl.errors import RlctlError

GROUP = "rlctl.backends"
BUILTIN = {
    "openrlhf": "rlctl.backends.openrlhf:OpenRLHFBackend",
    "prime_rl": "rlctl.backends.prime_rl:PrimeRLBackend",
    "verl": "rlctl.backends.verl:VerlBackend",
    "trl": "rlctl.backends.trl:TRLBackend",
    "command": "rlctl.backends.command:CommandBackend",
}
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")  # usable as `[backend.<name>]` and in `--set backend.<name>.x=`


class UnknownBackend(RlctlError):
    """A backend name nobody registered."""


class BackendLoadError(RlctlError):
    """A registered backend whose adapter cannot be loaded (a broken plugin)."""


@dataclass(frozen=True)
class Registration:
    name: str
    target: str  # "module:Class"
    dist: str  # the distribution that registers it ("rlctl" for the bundled ones)
    dist_version: str | None = None


def _rlctl_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlctl")
    except PackageNotFoundError:
        return None


def _entry_points() -> list[Any]:
    from importlib.metadata import entry_points

    return list(entry_points(group=GROUP))


@cache
def _scan() -> tuple[dict[str, Registration], tuple[str, ...]]:
    """(name -> registration, problems found while reading the entry points), once per process."""
    found = {name: Registration(name, target, "rlctl", _rlctl_version()) for name, target in BUILTIN.items()}
    problems: list[str] = []
    if os.environ.get("RLCTL_NO_PLUGINS", "").strip() not in ("", "0"):
        return found, ()
    try:
        eps = _entry_points()
    except Exception as e:  # broken distribution metadata must not break rlctl
        return found, (f"could not read the {GROUP} entry points: {type(e).__name__}: {e}",)
    for ep in eps:
        try:
            dist = ep.dist.name if getattr(ep, "dist", None) is not None else "?"
            dist_version = ep.dist.version if getattr(ep, "dist", None) is not None else None
            name, target = ep.name, ep.value
        except Exception as e:
            problems.append(f"an unreadable {GROUP} entry point ignored: {type(e).__name__}: {e}")
            continue
        if dist == "rlctl":
            continue  # the bundled adapters come from BUILTIN (also in a checkout without installed metadata)
        if not NAME.match(name) or ":" not in target:
            problems.append(f"backend {name!r} from {dist}: ignored, an entry point must be `name = \"module:Class\"` "
                            "with a name of letters, digits, '_' and '-'")
            continue
        have = found.get(name)
        if have is None:
            found[name] = Registration(name, target, dist, dist_version)
        elif have.target != target:
            kept = "the bundled adapter is kept" if have.dist == "rlctl" else f"{have.target} from {have.dist} is kept"
            problems.append(f"backend {name!r} from {dist} ({target}) ignored: the name is taken; {kept}")
    return found, tuple(problems)


def registry() -> dict[str, Registration]:
    """Every registered backend by name: the bundled ones, then plugins (a clash is reported once, the first kept)."""
    found, problems = _scan()
    _report(problems)
    return found


@cache
def _report(problems: tuple[str, ...]) -> None:
    for p in problems:
        print(f"rlctl: warning: {p}", file=sys.stderr)


def problems() -> list[str]:
    return list(_scan()[1])


def reset() -> None:
    """Forget what was read (tests that install or fake a plugin)."""
    _scan.cache_clear()
    _report.cache_clear()
    _load.cache_clear()


def available() -> dict[str, str]:
    """name -> 'module:Class' for every registered backend."""
    return {name: reg.target for name, reg in registry().items()}


@cache
def _load(name: str, target: str, dist: str) -> type:
    from rlctl.backends.base import Backend

    module, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # ImportError, a plugin's own bug at import time, a missing attribute
        raise BackendLoadError(f"backend {name!r} ({target}, from {dist}) cannot be loaded: {type(e).__name__}: {e}",
                               hint=f"reinstall or fix {dist}, or remove it (pip uninstall {dist})") from None
    if not (isinstance(obj, type) and issubclass(obj, Backend)):
        raise BackendLoadError(f"backend {name!r} ({target}, from {dist}) is not a subclass of "
                               "rlctl.backends.base.Backend", hint=f"fix {dist}")
    if getattr(obj, "name", None) != name:
        raise BackendLoadError(f"backend {name!r} ({target}, from {dist}) calls itself "
                               f"{getattr(obj, 'name', None)!r}", hint=f"set `name = {name!r}` on {obj.__name__}")
    return obj


def get_backend(name: str) -> Any:
    reg = registry().get(name)
    if reg is None:
        raise UnknownBackend(f"unknown backend {name!r}; installed backends: {', '.join(sorted(registry()))}.",
                             hint="`rlctl backends` lists them; a third-party backend is a pip-installed plugin")
    try:
        return _load(reg.name, reg.target, reg.dist)()
    except RlctlError:
        raise
    except Exception as e:  # the adapter's constructor failed
        raise BackendLoadError(f"backend {name!r} ({reg.target}, from {reg.dist}) cannot be created: "
                               f"{type(e).__name__}: {e}", hint=f"fix {reg.dist}") from None


def listing() -> list[dict[str, Any]]:
    """What `rlctl backends` shows: each backend's source distribution, known versions, installed runtime, or why it
    cannot be loaded; then the registrations that were ignored."""
    from rlctl.backends._static import installed_version

    rows = []
    for name, reg in sorted(registry().items()):
        row: dict[str, Any] = {"name": name, "dist": reg.dist, "dist_version": reg.dist_version,
                               "target": reg.target, "builtin": reg.dist == "rlctl"}
        try:
            adapter = get_backend(name)
        except RlctlError as e:
            row.update(status="broken", error=e.message, known_versions=[], runtime=None, installed=None)
        else:
            pkgs = tuple(getattr(adapter, "packages", ()) or ())
            runtime = pkgs[0] if pkgs else None
            row.update(status="ok", known_versions=list(getattr(adapter, "known_versions", ()) or ()),
                       runtime=runtime, installed=installed_version(runtime) if runtime else None)
        rows.append(row)
    return rows


def cpu_backends() -> list[str]:
    """Backends whose runs need no GPU."""
    out = []
    for name in sorted(available()):
        try:
            if get_backend(name).runs_on_cpu:
                out.append(name)
        except Exception:  # a broken plugin is not a CPU backend
            continue
    return out


def _versions(known: list[str]) -> str:
    if not known:
        return "any"
    return ", ".join(known) if len(known) <= 3 else f"{known[0]} .. {known[-1]} ({len(known)})"


def listing_text(rows: list[dict[str, Any]]) -> str:
    """`rlctl backends` as a table, then what was ignored."""
    table = [("backend", "from", "known versions", "runtime")]
    for r in rows:
        src = f"{r['dist']} {r['dist_version'] or ''}".strip() + ("" if r["builtin"] else " (plugin)")
        if r["status"] != "ok":
            table.append((r["name"], src, "-", f"BROKEN: {r['error']}"))
            continue
        runtime = "-" if not r["runtime"] else f"{r['runtime']} {r['installed'] or '(not installed)'}"
        table.append((r["name"], src, _versions(r["known_versions"]), runtime))
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3] for row in table]
    lines += [f"ignored: {p}" for p in problems()]
    return "\n".join(lines)
