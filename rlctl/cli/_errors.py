"""The command line's one error policy: what rlctl says about an exception that ended a command, and its exit code
(0 ok, 1 a check failed, 2 usage or input error, 130 interrupted), for the full CLI (rlctl/cli/_main.py) and its
fast path (rlctl/cli/_fast.py) alike. Never a traceback, unless RLCTL_DEBUG=1 for an internal error."""

from __future__ import annotations

import typer

from rlctl.errors import EXIT_CHECK_FAILED, EXIT_USAGE, RlctlError

__all__ = ["exit_code", "os_error_message"]


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """Click's exception classes, wherever this typer keeps them: typer >= 0.29 vendors click as `typer._click`
    (its exceptions derive from `typer.exceptions.TyperException`); older typer uses the `click` package."""
    types: list[type[BaseException]] = []
    for mod, attr in (("typer.exceptions", "TyperException"), ("typer._click.exceptions", "ClickException"),
                      ("click.exceptions", "ClickException")):
        try:
            types.append(getattr(__import__(mod, fromlist=[attr]), attr))
        except (ImportError, AttributeError):
            continue
    return tuple(types)


def _exit_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(Exit classes, Abort classes) of typer and of whichever click it uses."""
    exits: list[type[BaseException]] = [typer.Exit]
    aborts: list[type[BaseException]] = [typer.Abort]
    for mod in ("typer._click.exceptions", "click.exceptions"):
        try:
            m = __import__(mod, fromlist=["Exit", "Abort"])
        except ImportError:
            continue
        exits += [c for c in (getattr(m, "Exit", None),) if c]
        aborts += [c for c in (getattr(m, "Abort", None),) if c]
    return tuple(exits), tuple(aborts)


def os_error_message(e: OSError) -> str:
    """An OSError as a person reads it: the path, what went wrong, what to do."""
    import errno as _errno

    where = e.filename if e.filename is not None else ""
    if e.filename2 is not None:
        where = f"{where} -> {e.filename2}"
    what = e.strerror or str(e) or type(e).__name__
    hints = {
        _errno.ENAMETOOLONG: "use a shorter file name (most file systems allow 255 bytes per name).",
        _errno.EACCES: "check the permissions of the file and its directory.",
        _errno.EPERM: "check the permissions of the file and its directory.",
        _errno.ELOOP: "a symlink points (indirectly) at itself; fix or remove it.",
        _errno.ENOTDIR: "a part of the path is a file, not a directory.",
        _errno.ENOENT: "check the path; create the missing directory first.",
        _errno.EISDIR: "name a file, not a directory.",
        _errno.ENOSPC: "free disk space (rlctl ckpt prune RUN --keep-last N --dry-run shows what can go).",
        _errno.EROFS: "the file system is read-only; choose another location.",
        _errno.EEXIST: "choose another name, or remove the existing file.",
    }
    hint = hints.get(e.errno or -1)
    msg = f"{where}: {what}." if where else f"{what}."
    return msg + (f"\n  fix: {hint}" if hint else "")


def exit_code(e: BaseException) -> int:
    """What rlctl says about an exception that ended a command (on stderr), and its exit code. Re-raises what is no
    error of a command (SystemExit, ...)."""
    import os

    usage_types = _usage_error_types()
    exit_types, abort_types = _exit_types()
    if isinstance(e, RlctlError):
        typer.echo(f"rlctl: {e}", err=True)
        return e.exit_code
    if isinstance(e, exit_types):
        return int(getattr(e, "exit_code", 1) or 0)
    if isinstance(e, abort_types):
        typer.echo("rlctl: aborted", err=True)
        return 130
    if isinstance(e, KeyboardInterrupt):
        return 130
    if isinstance(e, usage_types):  # usage errors: unknown command/option, missing argument, bad value
        try:
            e.show()  # type: ignore[attr-defined]
        except Exception:  # a typer/click pair that cannot format its own usage line: the message alone
            fmt = getattr(e, "format_message", None)
            typer.echo(f"rlctl: {fmt() if callable(fmt) else e}\n  fix: rlctl --help lists the commands and "
                       "options.", err=True)
        return EXIT_USAGE
    if isinstance(e, BrokenPipeError):  # `rlctl ... | head`
        return 0
    if isinstance(e, OSError):
        typer.echo(f"rlctl: {os_error_message(e)}", err=True)
        return EXIT_USAGE
    if isinstance(e, RecursionError):
        typer.echo("rlctl: input nested too deeply to read.", err=True)
        return EXIT_USAGE
    if not isinstance(e, Exception):
        raise e
    if isinstance(e, ValueError) and ("null byte" in str(e) or "null character" in str(e)):
        typer.echo("rlctl: a path or name contains a NUL character (\\0), which no file name can hold.\n"
                   "  fix: check the value for stray escape sequences such as \\u0000.", err=True)
        return EXIT_USAGE
    if os.environ.get("RLCTL_DEBUG"):  # a bug in rlctl: still no traceback, but say so plainly
        raise e
    typer.echo(f"rlctl: internal error: {type(e).__name__}: {e}\n  fix: this is a bug in rlctl; rerun "
               "with RLCTL_DEBUG=1 for the traceback and report it.", err=True)
    return EXIT_CHECK_FAILED
