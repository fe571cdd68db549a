"""A host: a machine the user's OpenSSH already reaches, where rlctl runs work (a name, how ssh reaches it, the
remote working directory and the remote Python).

Hosts live in rlctl's user config, `hosts.toml` in `$RLCTL_CONFIG_DIR` (else `$XDG_CONFIG_HOME/rlctl`, else
`~/.config/rlctl`), read and written with tomlkit so that the user's comments survive `rlctl hosts add/remove`:

    [hosts.h100a]
    ssh = "h100a"                      # an alias from ~/.ssh/config, or user@host
    options = ["-p", "2222"]           # extra ssh options (optional)
    workdir = "~/rlctl"                # runs, the sync cache and staged recipes live under it
    python = "~/venvs/rft/bin/python"  # the remote interpreter that has rlctl (and the backend)
    env = { PYTHONPATH = "/opt/rlctl" }  # non-secret variables for remote rlctl (never secrets: they are sent
                                         # through the remote process's stdin)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.core.secrets import is_secret_name
from rlctl.errors import RlctlError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Host:
    name: str
    ssh: str  # ssh destination: an alias from the user's ssh config, or user@host
    workdir: str = "~/rlctl"
    python: str = "python3"
    options: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def to_table(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ssh": self.ssh, "workdir": self.workdir, "python": self.python}
        if self.options:
            out["options"] = list(self.options)
        if self.env:
            out["env"] = dict(self.env)
        return out


def config_dir() -> Path:
    if os.environ.get("RLCTL_CONFIG_DIR"):
        return Path(os.environ["RLCTL_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "rlctl"


def hosts_file() -> Path:
    return config_dir() / "hosts.toml"


def _read_doc() -> Any:
    import tomlkit
    from tomlkit.exceptions import ParseError

    path = hosts_file()
    if not path.exists():
        return tomlkit.document()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RlctlError(f"{path}: cannot be read ({e}).", hint="fix or remove the file") from None
    try:
        return tomlkit.parse(text)
    except ParseError as e:
        raise RlctlError(f"{path}:{e.line}: not valid TOML ({e.args[0] if e.args else e}).",
                         hint="fix that line, or remove the file and add the hosts again (rlctl hosts add)") from None


def _line_of(path: Path, name: str) -> str:
    try:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(rf"\s*\[\s*hosts\.\"?{re.escape(name)}\"?\s*\]", line):
                return f"{path}:{i}"
    except OSError:
        pass
    return str(path)


def _host(name: str, table: Any) -> Host:
    where = _line_of(hosts_file(), name)
    if not isinstance(table, dict):
        raise RlctlError(f"{where}: hosts.{name} must be a table.", hint="rlctl hosts add NAME SSH_TARGET")
    data = {k: (v.unwrap() if hasattr(v, "unwrap") else v) for k, v in table.items()}
    unknown = set(data) - {"ssh", "workdir", "python", "options", "env"}
    if unknown:
        raise RlctlError(f"{where}: hosts.{name}: unknown key(s) {', '.join(sorted(unknown))}.",
                         hint="known keys: ssh, workdir, python, options, env")
    if not isinstance(data.get("ssh"), str) or not data["ssh"]:
        raise RlctlError(f"{where}: hosts.{name}.ssh must be a non-empty string (an ssh alias or user@host).")
    if data["ssh"].startswith("-") or any(c.isspace() or c == "\0" for c in data["ssh"]):
        raise RlctlError(f"{where}: hosts.{name}.ssh = {data['ssh']!r} is not an ssh destination.",
                         hint="an alias from ~/.ssh/config or user@host; ssh options go in `options`")
    for key in ("workdir", "python"):
        if key in data and not isinstance(data[key], str):
            raise RlctlError(f"{where}: hosts.{name}.{key} must be a string.")
    opts = data.get("options", [])
    if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
        raise RlctlError(f"{where}: hosts.{name}.options must be a list of strings, e.g. [\"-p\", \"2222\"].")
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise RlctlError(f"{where}: hosts.{name}.env must be a table of strings.")
    secret = [k for k in env if is_secret_name(k)]
    if secret:
        raise RlctlError(f"{where}: hosts.{name}.env holds {', '.join(secret)}, a secret, in a file.",
                         hint="remove it: rlctl sends secrets from your environment to the remote process")
    return Host(name, data["ssh"], data.get("workdir", "~/rlctl"), data.get("python", "python3"), tuple(opts),
                dict(env))


def load_hosts() -> dict[str, Host]:
    doc = _read_doc()
    hosts = doc.get("hosts", {})
    if not isinstance(hosts, dict):
        raise RlctlError(f"{hosts_file()}: `hosts` must be a table of [hosts.NAME] tables.")
    return {name: _host(name, t) for name, t in hosts.items()}


def check_on(value: str | None, option: str = "--on", pool: bool = True, command: str = "this command") -> str | None:
    """A host, or a pool (`HOST[,HOST...]`) where the command takes one, as given to --on: an empty or blank one
    (`--on "$HOST"` with HOST unset) or an empty element (`--on a,,b`) is an error, never "no host given" (which
    means this machine); so is a host named twice in a pool (as `run.on = [...]` refuses it), and a list where the
    command runs on one host."""
    if value is None:
        return value
    names = [n.strip() for n in value.split(",")]
    one = f"{option} HOST (rlctl hosts list)"
    if not all(names):
        raise RlctlError(f"{option} {value!r}: an empty host name.",
                         hint=(f"{one}, or {option} HOST1,HOST2 for a pool" if pool else one)
                         + "; in a script, check that the variable holding it is set (drop the option to run on this "
                           "machine)")
    if not pool and len(names) > 1:
        raise RlctlError(f"{option} {value!r}: {command} runs on one host, not a pool.",
                         hint=f"{option} {names[0]} (one of {', '.join(names)})")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RlctlError(f"{option} {value!r}: a host is named twice ({', '.join(twice)}).",
                         hint=f"{option} {','.join(dict.fromkeys(names))} (each host of the pool once)")
    return value


def unknown_hosts(names: list[str]) -> list[str]:
    """The names of `names` that hosts.toml does not hold (a pool's, a recipe's `[run] on`)."""
    known = load_hosts()
    return [n for n in names if n not in known]


def check_hosts_known(names: list[str], where: str) -> None:
    """Every host a recipe or --on names is in hosts.toml, else an error saying where it was named (`r.toml:12:
    run.on`, `--on`) and how to add it, before anything is asked of any host."""
    missing = unknown_hosts(names)
    if missing:
        known = ", ".join(sorted(load_hosts())) or "none"
        raise RlctlError(f"{where} names {', '.join(repr(n) for n in missing)}: no such host in {hosts_file()} "
                         f"(known: {known}).",
                         hint=" and ".join(f"rlctl hosts add {n} USER@HOST" for n in missing)
                         + " (--workdir DIR --python PATH as that host needs)")


def get_host(name: str) -> Host:
    if not name.strip():  # `rlctl hosts add  USER@HOST` is no fix for an empty name
        raise RlctlError(f"{name!r}: an empty host name.", hint="name a host of `rlctl hosts list`")
    hosts = load_hosts()
    if name not in hosts:
        known = ", ".join(sorted(hosts)) or "none"
        raise RlctlError(f"no host {name!r} in {hosts_file()} (known: {known}).",
                         hint=f"rlctl hosts add {name} USER@HOST --workdir DIR --python PATH")
    return hosts[name]


def save_host(host: Host, replace: bool = False) -> Path:
    import tomlkit

    if not NAME.fullmatch(host.name):
        raise RlctlError(f"host name {host.name!r}: use letters, digits, '.', '_' and '-'.")
    doc = _read_doc()
    if "hosts" not in doc:
        doc["hosts"] = tomlkit.table(is_super_table=True)
    if host.name in doc["hosts"] and not replace:
        raise RlctlError(f"host {host.name!r} exists in {hosts_file()}.",
                         hint=f"rlctl hosts remove {host.name} first, or add --replace")
    _host(host.name, host.to_table())  # the same rules as reading
    table = tomlkit.table()
    for k, v in host.to_table().items():
        table[k] = v
    doc["hosts"][host.name] = table
    path = hosts_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(tomlkit.dumps(doc))
    os.replace(tmp, path)
    return path


def remove_host(name: str) -> Path:
    import tomlkit

    doc = _read_doc()
    if name not in doc.get("hosts", {}):
        raise RlctlError(f"no host {name!r} in {hosts_file()}.", hint="rlctl hosts list")
    del doc["hosts"][name]
    path = hosts_file()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(tomlkit.dumps(doc))
    os.replace(tmp, path)
    return path
