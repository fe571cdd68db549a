"""Scoped stubs: whatever a stubbed import leaves in this interpreter is taken back when the scope ends.

A backend's released code runs in-process with its heavy imports stubbed (sys.modules stubs served by a meta-path
finder). Real libraries imported inside the scope bind those stubs too (transformers' training_args took accelerate's
stub `AcceleratorState`; TRL's GRPOConfig, run later in the same pytest process, died on `int * num_processes`), and
availability checks cache the answers stubs gave (transformers' `is_*_available()` are lru caches: a stub is a spec
found for a package that may not be installed). Test order would then decide what a test sees.

`ModuleScope(discard, is_stub)`, on exit:
- every module loaded inside the scope that `discard(name, module)` names (the stubs, the code under test) is removed,
  and so is every other new module holding one of them, a value from one, or a stub in its globals (to a fixpoint);
  new real modules holding none stay loaded, as if imported before (torch cannot be imported twice);
- every sys.modules entry from before the scope is the same object again; on the packages above the modules the
  scope added, an attribute set to something removed goes (a parent's submodule attribute, a lazy package's cache)
  or is the module from before again;
- every `functools.lru_cache` in a loaded module that computed an answer inside the scope is emptied;
- if any module the scope added or touched still holds a stub, the scope raises and names it.
`discarded_real` lists the real modules removed for holding a stub: the caller imports them for real before its next
scope, so they are loaded once, clean (transformers' trainer costs seconds to import).
Cost: no copy of module namespaces; a scope costs a few milliseconds beside ~4000 loaded modules.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

_LRU = functools._lru_cache_wrapper
_caches_of: dict[str, tuple[Any, dict[str, Any], int, list[Any]]] = {}  # name -> (module, namespace, size, caches)


def _namespace(m: Any) -> dict[str, Any] | None:
    d = getattr(m, "__dict__", None)
    return d if type(d) is dict and issubclass(type(m), types.ModuleType) else None


def _origin(v: Any) -> str | None:
    """The module a value comes from: a class's or function's module, an instance's class's. type() and not
    isinstance(): some objects' __class__ warns or raises when read."""
    t = type(v)
    owner = v if t is types.FunctionType or issubclass(t, type) else t
    m = owner.__dict__.get("__module__") if issubclass(type(owner), type) else getattr(owner, "__module__", None)
    return m if type(m) is str else None


def _lru_caches() -> list[Any]:
    """Every lru cache held by a loaded module's globals (a module is looked through again when its size changed)."""
    global _caches_of
    out: list[Any] = []
    seen = {}
    for n, m in list(sys.modules.items()):
        memo = _caches_of.get(n)
        if memo is None or memo[0] is not m or memo[2] != len(memo[1]):
            d = _namespace(m)
            if d is None:
                continue
            memo = (m, d, len(d), [v for v in list(d.values()) if type(v) is _LRU])
        seen[n] = memo
        if memo[3]:
            out += memo[3]
    _caches_of = seen
    return out


class ModuleScope:
    def __init__(self, discard: Callable[[str, Any], bool], is_stub: Callable[[Any], bool]):
        self.discard = discard
        self.is_stub = is_stub
        self.discarded_real: list[str] = []

    def __enter__(self) -> ModuleScope:
        self.before = dict(sys.modules)
        self.misses = {id(c): (c, c.cache_info().misses) for c in _lru_caches()}
        return self

    def __exit__(self, *exc: Any) -> None:
        new = {n: m for n, m in sys.modules.items() if self.before.get(n) is not m}
        doomed = {n for n, m in new.items() if self.discard(n, m)}

        def tainted(v: Any) -> bool:
            if self.is_stub(v):
                return True
            if issubclass(type(v), types.ModuleType):
                return v.__name__ in doomed and new.get(v.__name__) is v
            # by name only where the name is new: a stub that took a real module's name (accelerate) does not make
            # the real module's classes, held from before, the stub's
            origin = _origin(v)
            return origin in doomed and origin not in self.before

        grew = True
        while grew:  # a module holding something removed goes too
            grew = False
            for n, m in new.items():
                d = _namespace(m)
                if n not in doomed and d is not None and any(tainted(v) for v in list(d.values())):
                    doomed.add(n)
                    grew = True
        self.discarded_real = sorted(n for n in doomed if not self.discard(n, new[n]))
        for n in doomed:
            sys.modules.pop(n, None)
        for n, m in self.before.items():
            if sys.modules.get(n) is not m:
                sys.modules[n] = m
        parents = {n.rsplit(".", i)[0] for n in new for i in range(1, n.count(".") + 1)} & set(self.before)
        touched: list[tuple[str, str, Any]] = []
        for p in sorted(parents):
            d = _namespace(self.before[p]) or {}
            for k, v in list(d.items()):
                if not tainted(v):
                    touched.append((p, k, v))
                elif f"{p}.{k}" in self.before:
                    d[k] = self.before[f"{p}.{k}"]
                else:
                    del d[k]
        touched += [(n, k, v) for n, m in new.items() if n not in doomed for k, v in (_namespace(m) or {}).items()]
        for c in _lru_caches():
            if c.cache_info().misses != self.misses.get(id(c), (c, 0))[1]:
                c.cache_clear()
        left = sorted(f"{n}.{k}" for n, k, v in touched if tainted(v))
        if left and exc[0] is None:  # never hide the failure that ended the scope
            raise RuntimeError(f"stubs outlived their scope: {', '.join(left[:10])}")
