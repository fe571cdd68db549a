"""Executors: where a run's processes live (a local process group, a Ray job), behind one protocol.

The registry maps names to "module:Class" strings and imports lazily, so the core names no executor and importing
this package imports none of them. Third-party executors register under the `rlctl.executors` entry-point group.
"""

from __future__ import annotations

import importlib
import warnings
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from rlctl.errors import RlctlError

if TYPE_CHECKING:
    from rlctl.executors.base import Executor

GROUP = "rlctl.executors"
BUILTIN = {
    "local": "rlctl.executors.local:LocalExecutor",
    "ray": "rlctl.executors.ray:RayExecutor",
    "ssh": "rlctl.executors.ssh_pool:SSHPoolExecutor",  # rlctl.executors.ssh's, with its pools
    "slurm": "rlctl.executors.slurm:SlurmExecutor",
}


@cache
def registry() -> dict[str, str]:
    """name -> "module:Class": the built-ins, then entry points (a clash is reported, the built-in kept)."""
    found = dict(BUILTIN)
    try:
        eps = list(entry_points(group=GROUP))
    except Exception:  # a broken third-party distribution must not break rlctl
        eps = []
    for ep in eps:
        if found.setdefault(ep.name, ep.value) != ep.value:
            warnings.warn(f"executor {ep.name!r}: {ep.value} ignored, built-in kept", stacklevel=2)
    return found


def available() -> list[str]:
    return sorted(registry())


def executor_class(name: str | None) -> type[Executor]:
    """The class registered as `name` (default: local), not instantiated."""
    name = name or "local"
    target = registry().get(name)
    if target is None:
        raise RlctlError(f"unknown executor {name!r}; known: {', '.join(available())}.",
                         hint="resources.executor (or --executor) takes one of those names")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def get(name: str | None) -> Executor:
    """The executor registered as `name` (default: local)."""
    return executor_class(name)()
