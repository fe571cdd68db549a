"""Backend adapters. Each registers under the `rlctl.backends` entry-point group; a third-party backend plugs in
the same way (a class with the attributes and methods of `rlctl.backends.base.Backend`)."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from rlctl.errors import RlctlError

BUILTIN = {
    "openrlhf": "rlctl.backends.openrlhf:OpenRLHFBackend",
    "prime_rl": "rlctl.backends.prime_rl:PrimeRLBackend",
    "verl": "rlctl.backends.verl:VerlBackend",
    "trl": "rlctl.backends.trl:TRLBackend",
    "command": "rlctl.backends.command:CommandBackend",
}


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def available() -> dict[str, str]:
    """name -> 'module:Class' for every registered backend (entry points first, then the bundled ones)."""
    found = dict(BUILTIN)
    try:
        for ep in entry_points(group="rlctl.backends"):
            found[ep.name] = ep.value
    except Exception:  # a broken third-party distribution must not break rlctl
        pass
    return found


def get_backend(name: str) -> Any:
    registry = available()
    if name not in registry:
        raise RlctlError(f"unknown backend {name!r}; installed backends: {', '.join(sorted(registry))}.")
    return _load(registry[name])()


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
