"""Preflight: a registry of checks that run before a GPU is touched.

Each check is a function `(ctx) -> Result | list[Result]` registered with `@check("family.name")` in one of the
modules of this package; every module here is loaded, so adding a check is adding one file. No check imports
torch, vllm, ray or deepspeed.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
ORDER = {FAIL: 0, WARN: 1, OK: 2, SKIP: 3}


@dataclass
class Result:
    check: str
    verdict: str
    figure: str
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    # the fix in machine-readable form where rlctl computed one: recipe keys -> values, as `--set key=value` would
    # give them (`rlctl preflight R --set k=v` for each closes this check without failing another: a property test)
    set: dict[str, Any] | None = None
    # other computed fixes, best first, as (text, set): offered instead of `set` when it would newly fail or warn
    # another check (_fixes.vet); not in --json, where only the fix that holds is
    other_fixes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["other_fixes"]
        return d


CheckFn = Callable[["Context"], "Result | list[Result] | None"]
REGISTRY: dict[str, CheckFn] = {}
# family -> the registered check that runs the backend's checks of that family (Backend.preflight(ctx, family))
HOSTS: dict[str, str] = {}
# what a check returning nothing means (check(silent=...)): said when --only selected nothing that answered
SILENT: dict[str, str] = {}


def check(name: str, hosts: str | None = None, silent: str | None = None) -> Callable[[CheckFn], CheckFn]:
    """Register a check; `hosts`: it also runs the backend's own checks of that family (Backend.checks names them);
    `silent`: when it returns nothing (no such thing in the recipe), said when --only selected nothing else."""
    def register(fn: CheckFn) -> CheckFn:
        REGISTRY[name] = fn
        if silent:
            SILENT[name] = silent
        if hosts:
            HOSTS[hosts] = name
        return fn

    return register


def _load_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


class Context:
    """What checks share: the prepared recipe and lazily computed facts (architecture, schedule)."""

    def __init__(self, prepared: Any, reads: dict[str, Any] | None = None, effective: bool = True):
        self.prepared = prepared
        # what the checks read of this machine, asked once per preflight: the re-runs that vet fixes share it
        self.reads: dict[str, Any] = {} if reads is None else reads
        self.backend = prepared.backend
        # the checks read the values that would run: where the backend's pass-through options override what it
        # renders from the recipe, those (Backend.effective), each said in the results it changes (run());
        # `effective=False`: the recipe as written, what those results are compared with
        eff = prepared.backend.effective(prepared.recipe) if effective else None
        self.recipe = eff.recipe if eff else prepared.recipe
        self.overridden: dict[str, str] = eff.replaced if eff else {}
        self.held: set[str] = eff.held | set(eff.replaced) if eff else set()
        self.dataset_size: int | None = prepared.dataset_size

    @cached_property
    def arch(self):
        """The model architecture, or the RlctlError saying why it is unknown."""
        from rlctl.recipe.models import resolve_arch

        try:
            return resolve_arch(self.recipe.model.path)
        except RlctlError as e:
            return e

    @cached_property
    def machine(self) -> str:
        """The machine whose facts the machine-dependent checks (disk, installed backend) read: this one, which for
        `launch --on HOST` is that host (its rlctl runs preflight)."""
        import socket

        return socket.gethostname()

    def gpus(self) -> tuple[list[dict[str, Any]] | None, str | None]:
        """This machine's GPUs (rlctl.core.gpus.list_gpus: NVML, else nvidia-smi), read once per preflight. env.gpus
        says them; other checks (which GPU is free for the evaluator) read them here."""
        if "gpus" not in self.reads:
            from rlctl.core.gpus import list_gpus

            self.reads["gpus"] = list_gpus()
        return self.reads["gpus"]

    @cached_property
    def total_steps(self) -> int | None:
        return self.backend.total_steps(self.recipe, self.dataset_size)

    @cached_property
    def lrs(self) -> list[float]:
        """The LR of every optimizer step; empty when the count is unknown or above MAX_STEPS (schedule.steps
        fails then: the curve is a list of that length)."""
        from rlctl.recipe.schema import MAX_STEPS

        if self.total_steps is not None and self.total_steps > MAX_STEPS:
            return []
        return self.backend.schedule(self.recipe, self.dataset_size)


def families() -> list[str]:
    _load_all()
    return sorted({name.split(".")[0] for name in REGISTRY})


def emitted() -> dict[str, str]:
    """Checks that a plug-in runs inside one registered check: their name -> the registered check that runs them
    (an executor's checks run inside env.executor; a backend's, declared in its `checks` by family, inside the check
    that hosts that family)."""
    from rlctl.backends import available as backends
    from rlctl.backends import get_backend
    from rlctl.executors import available, get

    _load_all()
    out: dict[str, str] = {}
    for name in available():
        try:
            for c in get(name).checks:
                out[c] = "env.executor"
        except Exception:  # a broken third-party executor must not break preflight
            continue
    for name in backends():
        try:
            declared = dict(get_backend(name).checks)
        except Exception:  # a broken third-party backend is `rlctl backends`' finding
            continue
        for family, names in declared.items():
            for c in names:
                if family in HOSTS and c not in REGISTRY:
                    out[c] = HOSTS[family]
    return out


def _selects(name: str, o: str, aliases: dict[str, str]) -> bool:
    return name == o or name.startswith(o + ".") or aliases.get(o) == name


def check_only(only: list[str] | None) -> None:
    """`--only` names families or checks that exist; anything else is a usage error listing them."""
    if not only:
        return
    _load_all()
    aliases = emitted()
    unknown = [o for o in only if not any(_selects(n, o, aliases) for n in REGISTRY)]
    if unknown:
        raise RlctlError(f"--only {', '.join(unknown)}: no such check or family.",
                         hint=f"families: {', '.join(families())} (or a check, e.g. schedule.warmup)")


def none_ran(only: list[str]) -> str:
    """Why `--only` gave no result: each selected check found nothing of its kind in the recipe (never a silent
    pass)."""
    _load_all()
    aliases = emitted()
    names = [n for n in [*REGISTRY, *aliases] if any(_selects(n, o, aliases) for o in only)]
    whys = "; ".join(f"{n}: {SILENT.get(n, 'nothing it checks is in this recipe')}" for n in dict.fromkeys(names))
    sel = ", ".join(o if o in REGISTRY or o in aliases else f"{o}.*" for o in only)
    return f"0 checks ran: {sel}: no check applies to this recipe ({whys})"


def run(prepared: Any, only: list[str] | None = None, vet: bool = True,
        reads: dict[str, Any] | None = None) -> list[Result]:
    """The selected checks' results; `vet`: each computed fix (`Result.set`) is one that, applied, closes its check
    without another check newly failing or warning (_fixes.vet), else it is said why not and not offered. `reads`:
    the machine's facts already read (Context.reads), shared by the vetting re-runs."""
    check_only(only)
    _load_all()
    ctx = Context(prepared, reads)
    written: list[Context] = []  # the recipe as written, made when an override is to be said
    results: list[Result] = []
    aliases = emitted() if only else {}
    for name, fn in REGISTRY.items():
        if only and not any(_selects(name, o, aliases) for o in only):
            continue
        out = _call(name, fn, ctx)
        if not out:
            continue
        said: set[tuple[str, str, str]] | None = None  # what the check says of the recipe as written
        for r in out:
            if r.set:
                r.set = ctx.backend.complete_fix(ctx.prepared.recipe, r.set)
            if ctx.overridden and r.verdict in (FAIL, WARN):
                # computed from an overriding value: named where the override changes what the check says
                if said is None:
                    written = written or [Context(prepared, ctx.reads, effective=False)]
                    said = {(x.check, x.verdict, x.figure) for x in _call(name, fn, written[0])}
                if (r.check, r.verdict, r.figure) not in said:
                    r.figure += f" (checked with what would run: {'; '.join(ctx.overridden.values())})"
            if r.set and set(r.set) & ctx.held:
                # setting a key a pass-through option sets changes nothing that runs: no machine-readable fix
                keys = ", ".join(sorted(set(r.set) & ctx.held))
                r.fix = f"{r.fix or ''} (first remove the backend option that sets {keys}: until then, setting it " \
                        "changes nothing that runs)".strip()
                r.set = None
        if only:  # a check that runs others (env.executor) returns only those asked for
            out = [r for r in out if any(_selects(name, o, aliases) and (o not in aliases or r.check == o)
                                         for o in only)]
        results.extend(out)
    if vet:
        from rlctl.preflight._fixes import UNVETTED
        from rlctl.preflight._fixes import vet as vet_fixes

        vetted = [name for name in REGISTRY if name not in UNVETTED]  # not run again: they would ask a cluster
        vet_fixes(prepared, results, lambda p: run(p, vetted, vet=False, reads=ctx.reads), FAIL, WARN)
    return results


def _call(name: str, fn: CheckFn, ctx: Context) -> list[Result]:
    """One check's results; an error in it is its FAIL, never a traceback that hides the others' answers."""
    try:
        out = fn(ctx)
    except RlctlError as e:
        out = Result(name, FAIL, e.message, e.hint)
    except Exception as e:  # a bug in one check must not hide the others' answers, nor print a traceback
        if os.environ.get("RLCTL_DEBUG"):
            raise
        out = Result(name, FAIL, f"internal error in this check: {type(e).__name__}: {e}",
                     "a bug in rlctl: report it (RLCTL_DEBUG=1 shows the traceback)")
    return [] if out is None else out if isinstance(out, list) else [out]


def failed(results: list[Result]) -> bool:
    return any(r.verdict == FAIL for r in results)


def existing_parent(p: Path) -> Path:
    """The path itself or its nearest existing ancestor: where free space and permissions are decided."""
    p = p.absolute()
    while not p.exists():
        p = p.parent
    return p


def gib(x: float) -> str:
    return f"{x / 1024**3:.1f} GiB"
