"""Patch sets: list, status, apply, revert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from rlctl.cli._app import BackendOpt, DirOpt, JsonOpt, PythonOpt, SetArg, _echo, on_host_option, patch_app
from rlctl.errors import RlctlError

OnOpt = Annotated[str | None, typer.Option("--on", callback=on_host_option,
                                           help="Do it on this SSH host, with its rlctl (same journal "
                                           "and atomicity there).")]


def _on_host(host: str, verb: str, name: str | None, backend: str | None, python: str | None,
             user_dir: Path | None, flags: list[str]) -> None:
    """Run `rlctl patch VERB ...` with the host's own rlctl; --dir is synced there first."""
    from rlctl import executors

    run_remote_rlctl = executors.get("ssh").run_remote_rlctl
    args = ["patch", verb, *([name] if name else []), *(["--backend", backend] if backend else []),
            *(["--python", python] if python else []), *flags]
    code, out, err = run_remote_rlctl(host, args, sync_dir=user_dir)
    if out:
        _echo(out)
    if err:
        import sys

        sys.stderr.write(err if err.endswith("\n") else err + "\n")
    raise typer.Exit(code)


def _pick_set(name: str | None, backend: str | None, user_dir: Path | None, python: str | None):
    from rlctl import patching

    if name:
        return patching.find_set(name, user_dir)
    if not backend:
        raise RlctlError("name a patch set (rlctl patch list) or give --backend.")
    sets = [s for s in patching.discover(user_dir) if s.backend == backend]
    if not sets:
        raise RlctlError(f"no patch set for backend {backend!r}.")
    inst = patching.locate(sets[0].package, python, tuple(s.version for s in sets))
    exact = [s for s in sets if s.version == inst.version]
    return exact[0] if exact else sets[-1]


@patch_app.command("list")
def patch_list(user_dir: DirOpt = None) -> None:
    """The patch sets shipped with rlctl and those in --dir."""
    from rlctl import patching

    for ps in patching.discover(user_dir):
        shadowed = ", shadowed by the one in --dir: not used" if ps.shadowed else ""
        _echo(f"{ps.name}  ({ps.source}: {ps.root}{shadowed})  {ps.description}")
        for i, e in enumerate(ps.patches, 1):
            _echo(f"  {i}. {e.file.name}: {e.purpose}")
            _echo(f"     targets: {', '.join(e.targets)}")


@patch_app.command("status")
def patch_status(name: SetArg = None, backend: BackendOpt = None, python: PythonOpt = None,
                 user_dir: DirOpt = None, as_json: JsonOpt = False, on: OnOpt = None) -> None:
    """Each patch of a set against the installed package: applied, not applied, partly applied, conflicting."""
    from rlctl import patching

    if on:
        _on_host(on, "status", name, backend, python, user_dir, ["--json"] if as_json else [])

    ps = _pick_set(name, backend, user_dir, python)
    inst = patching.locate(ps.package, python, (ps.version,))
    states, note = patching.status(ps, inst)
    if as_json:
        _echo(json.dumps({"set": ps.name, "installed": inst.version, "site": str(inst.site), "note": note,
                          "patches": [s.__dict__ for s in states]}, indent=2))
        return
    _echo(f"{ps.name} against {ps.package} {inst.version} in {inst.site}")
    if note:
        _echo(f"  ! {note}")
    for s in states:
        _echo(f"  {s.state:<15} {s.patch}" + (f"  ({s.note})" if s.note else ""))


@patch_app.command("apply")
def patch_apply(name: SetArg = None, backend: BackendOpt = None, python: PythonOpt = None, user_dir: DirOpt = None,
                dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change.")] = False,
                allow_version_mismatch: Annotated[bool, typer.Option("--allow-version-mismatch")] = False,
                on: OnOpt = None) -> None:
    """Apply a set in order, skipping what is applied; all or nothing."""
    from rlctl import patching

    if on:
        _on_host(on, "apply", name, backend, python, user_dir, ["--dry-run"] * dry_run
                 + ["--allow-version-mismatch"] * allow_version_mismatch)

    ps = _pick_set(name, backend, user_dir, python)
    inst = patching.locate(ps.package, python, (ps.version,))
    out = patching.apply(ps, inst, dry_run=dry_run, allow_version_mismatch=allow_version_mismatch)
    verb = "would apply" if dry_run else "applied"
    _echo(f"{ps.name}: {verb} {len(out.changed)} ({', '.join(out.changed) or '-'}); already applied "
          f"{len(out.skipped)}")
    if out.dry_run_output:
        _echo(out.dry_run_output)


@patch_app.command("revert")
def patch_revert(name: SetArg = None, backend: BackendOpt = None, python: PythonOpt = None, user_dir: DirOpt = None,
                 dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change.")] = False,
                 on: OnOpt = None) -> None:
    """Undo a set (reverse order); all or nothing."""
    from rlctl import patching

    if on:
        _on_host(on, "revert", name, backend, python, user_dir, ["--dry-run"] * dry_run)

    ps = _pick_set(name, backend, user_dir, python)
    inst = patching.locate(ps.package, python, (ps.version,))
    out = patching.revert(ps, inst, dry_run=dry_run)
    _echo(f"{ps.name}: {'would revert' if dry_run else 'reverted'} {len(out.changed)} "
          f"({', '.join(out.changed) or '-'})")
