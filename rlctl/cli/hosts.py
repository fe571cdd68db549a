"""Hosts: the user's SSH GPU machines (add, list, remove, check, install), and the hidden commands a host's own
rlctl answers for the laptop (facts, remote-*: one JSON request on stdin, one JSON answer on stdout)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from rlctl.cli._app import JsonOpt, Typer, _echo, app
from rlctl.core.sizes import human_bytes
from rlctl.errors import EXIT_CHECK_FAILED, RlctlError

hosts_app = Typer(help="SSH hosts where runs can go (rlctl launch RECIPE --on HOST).", no_args_is_help=True)
app.add_typer(hosts_app, name="hosts")


@hosts_app.command("add", epilog="Example: rlctl hosts add h100a rlu@10.202.0.3 --workdir /mnt/data/rlctl "
                                 "--python '~/venvs/rft/bin/python'")
def hosts_add(
    name: Annotated[str, typer.Argument(help="A short name for the host.")],
    ssh: Annotated[str, typer.Argument(help="How ssh reaches it: an alias from ~/.ssh/config, or user@host.")],
    workdir: Annotated[str, typer.Option("--workdir", help="Remote directory for runs and the sync cache.")]
    = "~/rlctl",
    python: Annotated[str, typer.Option("--python", help="Remote Python that has rlctl (and the backend).")]
    = "python3",
    option: Annotated[list[str] | None, typer.Option("--ssh-option", metavar="ARG",
                                                     help="Extra ssh argument (repeatable), e.g. "
                                                     "--ssh-option=-p --ssh-option=2222.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", metavar="NAME=VALUE",
                                                  help="NAME=VALUE for the remote rlctl (never a "
                                                  "secret).")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite a host of that name.")] = False,
) -> None:
    """Add a host to rlctl's user config (hosts.toml)."""
    from rlctl.core.host import Host, save_host

    pairs = {}
    for e in env or []:
        k, sep, v = e.partition("=")
        if not sep or not k:
            raise RlctlError(f"--env {e!r}: expected NAME=VALUE.")
        pairs[k] = v
    path = save_host(Host(name, ssh, workdir, python, tuple(option or ()), pairs), replace=replace)
    _echo(f"added {name} ({ssh}) to {path}; check it with: rlctl hosts check {name}")


@hosts_app.command("list")
def hosts_list(as_json: JsonOpt = False) -> None:
    """The configured hosts."""
    from rlctl.core.host import hosts_file, load_hosts

    hosts = load_hosts()
    if as_json:
        _echo(json.dumps({n: h.to_table() for n, h in hosts.items()}, indent=2))
        return
    if not hosts:
        _echo(f"no hosts in {hosts_file()} (rlctl hosts add NAME USER@HOST)")
    for n, h in hosts.items():
        _echo(f"{n:<12} {h.ssh:<24} workdir {h.workdir}  python {h.python}")


@hosts_app.command("remove")
def hosts_remove(name: Annotated[str, typer.Argument(help="Host name.")]) -> None:
    """Remove a host from the config (nothing on the host is touched)."""
    from rlctl.core.host import remove_host

    _echo(f"removed {name} from {remove_host(name)}")


@hosts_app.command("check")
def hosts_check(
    name: Annotated[str | None, typer.Argument(help="Host name (default: every host).")] = None,
    as_json: JsonOpt = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for each host.")] = 30.0,
) -> None:
    """Reachable? Remote rlctl version, GPUs, free disk at the workdir, installed backends and their patch state.
    Exit 1 when a host fails."""
    from rlctl import executors
    from rlctl.core.host import get_host, load_hosts

    host_facts = executors.get("ssh").host_facts

    hosts = [get_host(name)] if name is not None else list(load_hosts().values())  # `""` is no host, not all
    if not hosts:
        raise RlctlError("no hosts to check.", hint="rlctl hosts add NAME USER@HOST --workdir DIR --python PATH")
    report, failed = {}, False
    for h in hosts:
        try:
            report[h.name] = {"ok": True, "facts": host_facts(h, timeout=timeout)}
        except RlctlError as e:
            failed = True
            report[h.name] = {"ok": False, "error": e.message, "fix": e.hint}
    if as_json:
        _echo(json.dumps(report, indent=2))
    else:
        for n, r in report.items():
            if not r["ok"]:
                _echo(f"{n}: FAIL {r['error']}" + (f"\n  fix: {r['fix']}" if r.get("fix") else ""))
                continue
            f = r["facts"]
            _echo(f"{n}: ok  ({f['machine']}, rlctl {f['rlctl_version']}, {f['python']})")
            if f["gpus"] is None:
                _echo(f"  gpus: none ({f.get('gpu_note')})")
            else:
                _echo("  gpus: " + (", ".join(f"{g['index']}: {g['name']} {g['memory_used_gib']:.0f}/"
                                              f"{g['memory_total_gib']:.0f} GiB used" for g in f["gpus"]) or "none"))
            _echo(f"  disk: {human_bytes(f['disk_free'])} free at {f['disk_path']}")
            for b, info in sorted((f.get("backends") or {}).items()):
                _echo(f"  {b}: {info['package']} {info['installed'] or 'not installed'}"
                      + (f"; patches: {info['patches']}" if info.get("patches") else ""))
    if failed:
        raise typer.Exit(EXIT_CHECK_FAILED)


@hosts_app.command("install")
def hosts_install(
    name: Annotated[str, typer.Argument(help="Host name.")],
    spec: Annotated[str | None, typer.Option("--spec", help="What to pip-install (default: rlctl==<this "
                                             "version>).")] = None,
) -> None:
    """Install this rlctl version on the host, with its python's pip (the only command that installs anything
    there)."""
    from rlctl import __version__, executors
    from rlctl.core.host import get_host

    host = get_host(name)
    p = executors.get("ssh").install(host, spec or f"rlctl=={__version__}")
    if p.returncode != 0:
        source = None if spec else _source_tree()
        hint = (f"this rlctl was installed from a source tree ({source}), which pip cannot find by version there: "
                f"copy it to the host (e.g. `rsync -a {source}/ {name}:rlctl-src/`) and run `rlctl hosts install "
                f"{name} --spec ~/rlctl-src`" if source else
                "give what pip can install there with --spec (a version, a wheel or a directory on the host)")
        raise RlctlError(f"{name}: pip install failed: {(p.stderr or p.stdout).strip()[-400:]}", hint=hint)
    _echo(f"{name}: installed {spec or f'rlctl=={__version__}'}")


def _source_tree() -> str | None:
    """The directory this rlctl was pip-installed from (`pip install -e .` of a clone), or None (from an index)."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution
    from urllib.parse import unquote, urlparse

    try:
        raw = distribution("rlctl").read_text("direct_url.json")
    except PackageNotFoundError:
        return None
    try:
        url = json.loads(raw or "null") or {}
    except ValueError:
        return None
    u = urlparse(str(url.get("url") or ""))
    return unquote(u.path) if u.scheme == "file" and "dir_info" in url else None


# ---- what a host's rlctl answers for the laptop (hidden) -------------------------------------------------------
@app.command("facts", hidden=True)
def facts(as_json: JsonOpt = False,
          path: Annotated[str, typer.Option("--path", help="Where free disk is measured.")] = ".") -> None:
    """This machine's facts: rlctl version, GPUs, free disk, backends and patch state."""
    from rlctl.facts import local_facts

    f = local_facts(path)
    _echo(json.dumps(f.to_dict()) if as_json else json.dumps(f.to_dict(), indent=2))
