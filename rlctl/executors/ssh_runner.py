"""The one command runner for SSH hosts: "run this there" and "move these files", over the system `ssh` and `rsync`
(never an SSH library), so the user's ~/.ssh/config, agent, ProxyJump and known_hosts decide how a host is reached.

Every connection to a host shares one ControlMaster (ControlPath under `$RLCTL_SSH_CONTROL_DIR`, else
/tmp/rlctl-ssh-<uid>; ControlPersist 5 min), so many commands cost one handshake. BatchMode=yes (never a password
prompt), ConnectTimeout and ServerAliveInterval are set; StrictHostKeyChecking is left to the user's config, and a
changed host key is refused with its fix. Every remote command is shlex-quoted; every call has a timeout.

API for other parts of rlctl (evals, experiments):

    from rlctl.core.host import get_host
    from rlctl.executors.ssh_runner import Runner, run_remote, sync_to, HostUnreachable

    host = get_host("spare")
    p = run_remote(host, ["nvidia-smi", "-L"], timeout=20)          # CompletedProcess (text), raises on ssh errors
    p = run_remote(host, ["python", "-m", "rlctl.cli", "facts", "--json"], env={"HF_TOKEN": "..."})
        # env: sent over the remote command's stdin and exported there, never on a command line
    sync_to(host, [Path("data/eval.jsonl")], "cache/evals")          # rsync into <workdir>/cache/evals
    Runner(host).rlctl(["status", "--json"])                         # the remote rlctl (host.python -m rlctl.cli)
    call_remote(Runner(host), "poll", {"run_dirs": [...]}, timeout=10)  # one verb of the host's rlctl, JSON both ways

`$RLCTL_SSH_CONFIG` names an ssh config file to use instead of ssh's default (`ssh -F`); tests use it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlctl.core.host import Host
from rlctl.errors import CheckFailed, RlctlError, Unreachable

CONNECT_TIMEOUT = 10
DEFAULT_TIMEOUT = 60.0


class HostUnreachable(Unreachable):
    """The host did not answer (refused, timed out, name unknown, connection lost)."""

    exit_code = 1


class HostKeyChanged(RlctlError):
    pass


def control_dir() -> Path:
    d = Path(os.environ.get("RLCTL_SSH_CONTROL_DIR") or f"/tmp/rlctl-ssh-{os.getuid()}")
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def remote_path(p: str) -> str:
    """A remote path as a shell word: `~/x` becomes "$HOME"/'x' (tilde does not expand inside quotes)."""
    if p == "~":
        return '"$HOME"'
    if p.startswith("~/"):
        return '"$HOME"/' + shlex.quote(p[2:])
    return shlex.quote(p)


def env_prelude(env: dict[str, str] | None) -> tuple[str, bytes]:
    """Shell text that reads NAME=base64(VALUE) lines from stdin and exports them, and that stdin: values never
    appear on a command line (the remote `ps` shows only `read` and `export NAME`)."""
    if not env:
        return "", b""
    import base64

    lines = []
    for k in env:
        if not k.isidentifier():
            raise RlctlError(f"environment variable name {k!r} is not valid.")
    data = "".join(f"{k}={base64.b64encode(v.encode()).decode()}\n" for k, v in env.items()).encode()
    for k in env:
        lines.append(f'IFS= read -r _l; export {k}="$(printf %s "${{_l#*=}}" | base64 -d)"')
    return "; ".join(lines) + "; unset _l; ", data


class Runner:
    """Runs commands on one host and moves files to and from it."""

    def __init__(self, host: Host, connect_timeout: float = CONNECT_TIMEOUT):
        self.host = host
        self.connect_timeout = max(1, int(connect_timeout))
        self._workdir: str | None = None

    # ---- ssh -------------------------------------------------------------------------------------------------
    def ssh_options(self) -> list[str]:
        opts = []
        if os.environ.get("RLCTL_SSH_CONFIG"):
            opts += ["-F", os.environ["RLCTL_SSH_CONFIG"]]
        opts += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                 "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3",
                 "-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir()}/%C", "-o", "ControlPersist=300"]
        return opts + list(self.host.options)

    def try_ssh(self) -> str:
        """The ssh a person can try to see why the host does not answer: as rlctl calls it (the host's options, -F
        where rlctl gives one), and, where HOME is not the account's home, the caveat docs/remote.md gives: OpenSSH
        reads ~/.ssh/config of the account's home (the password database's), not of $HOME, so the ssh that works in
        the user's shell may read another config than rlctl's."""
        import pwd

        cfg = ["-F", os.environ["RLCTL_SSH_CONFIG"]] if os.environ.get("RLCTL_SSH_CONFIG") else []
        cmd = shlex.join(["ssh", *cfg, *self.host.options, self.host.ssh, "true"])
        home = os.environ.get("HOME")
        try:
            account = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            account = None
        if cfg or "-F" in self.host.options or not home or account is None or \
                Path(home).absolute() == Path(account).absolute():
            return f"`{cmd}` works"
        again = shlex.join(["rlctl", "hosts", "add", self.host.name, self.host.ssh, "--replace",
                            *(f"--ssh-option={o}" for o in self.host.options)])
        return (f"`{cmd}` works (HOME is {home}, but OpenSSH reads the ssh config of your account's home, {account}: "
                f"if yours is in $HOME, give it to rlctl: {again} --ssh-option=-F --ssh-option=$HOME/.ssh/config)")

    def ssh_argv(self, command: str, tty: bool = False) -> list[str]:
        return ["ssh", *self.ssh_options(), "-t" if tty else "-T", self.host.ssh, command]

    def run_shell(self, command: str, *, stdin: bytes | None = None, timeout: float = DEFAULT_TIMEOUT,
                  check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell command line (already quoted) there. ssh failures raise; with check, so does a non-zero
        exit of the command (its stderr in the message)."""
        argv = self.ssh_argv(command)
        try:
            p = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HostUnreachable(f"{self.host.name}: no answer within {timeout:g} s ({self.host.ssh}).",
                                  hint=f"check the host is up and {self.try_ssh()} "
                                  f"(then rlctl hosts check {self.host.name})"
                                  ) from None
        except FileNotFoundError:
            raise RlctlError("ssh is not installed on this machine.", hint="install the OpenSSH client") from None
        out = subprocess.CompletedProcess(argv, p.returncode, p.stdout.decode(errors="replace"),
                                          p.stderr.decode(errors="replace"))
        if p.returncode == 255:
            raise self.ssh_error(out.stderr)
        if check and p.returncode != 0:
            raise RlctlError(f"{self.host.name}: remote command failed (exit {p.returncode}): "
                             f"{_last_lines(out.stderr or out.stdout)}")
        return out

    def run(self, argv: Sequence[str], *, env: dict[str, str] | None = None, stdin: bytes | None = None,
            timeout: float = DEFAULT_TIMEOUT, check: bool = True, cwd: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run argv there (each word quoted), in `cwd` (default: the host's workdir, created if missing), with
        `env` exported from stdin (secrets stay off every command line). `stdin` must be None when env is given."""
        prelude, data = env_prelude(env)
        if env and stdin is not None:
            raise ValueError("stdin and env cannot both be given")
        wd = cwd or self.host.workdir
        plain = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.host.env.items())
        cmd = (f"mkdir -p {remote_path(self.host.workdir)} && cd {remote_path(wd)} && {prelude}"
               f"exec {'env ' + plain + ' ' if plain else ''}{' '.join(_word(a) for a in argv)}")
        return self.run_shell(cmd, stdin=data if env else stdin, timeout=timeout, check=check)

    def python_argv(self) -> list[str]:
        return shlex.split(self.host.python)

    def rlctl(self, args: Sequence[str], **kw) -> subprocess.CompletedProcess[str]:
        """The remote rlctl: `<host python> -m rlctl.cli ARGS` in the workdir."""
        return self.run([*self.python_argv(), "-m", "rlctl.cli", *args], **kw)

    def ssh_error(self, stderr: str) -> RlctlError:
        err = stderr.strip()
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "Host key verification failed" in err:
            target = self.host.ssh.rsplit("@", 1)[-1]
            return HostKeyChanged(
                f"{self.host.name}: ssh refused the host key of {self.host.ssh} (changed or unknown): "
                f"{_last_lines(err, 2)}",
                hint=f"if you know why it changed (a reinstalled machine), remove the old key with `ssh-keygen -R "
                     f"{target}` (for a port other than 22: ssh-keygen -R '[{target}]:PORT'), then `ssh "
                     f"{self.host.ssh}` once to accept the new one; otherwise do not connect")
        if "Permission denied" in err:
            return RlctlError(f"{self.host.name}: ssh login refused: {_last_lines(err, 2)}",
                              hint=f"check that {self.try_ssh()} without a password (ssh-add your key)")
        return HostUnreachable(f"{self.host.name}: unreachable: {_last_lines(err, 2) or 'ssh failed'}",
                               hint=f"check the host is up and {self.try_ssh()}")

    def close(self) -> None:
        """Stop this host's shared connection (the next command opens a new one)."""
        subprocess.run(["ssh", *self.ssh_options(), "-O", "exit", self.host.ssh], capture_output=True, timeout=10)

    # ---- files -----------------------------------------------------------------------------------------------
    def workdir(self, timeout: float = DEFAULT_TIMEOUT) -> str:
        """The absolute remote workdir (created if missing)."""
        if self._workdir is None:
            self._workdir = self.run(["pwd"], timeout=timeout).stdout.strip()
        return self._workdir

    def abs(self, rel: str) -> str:
        return rel if rel.startswith("/") else f"{self.workdir()}/{rel}"

    def rsync(self, sources: Sequence[str], dest: str, *, up: bool, extra: Sequence[str] = (),
              timeout: float = 3600.0) -> subprocess.CompletedProcess[str]:
        """rsync -a (+extra) with this host's ssh options; remote paths are absolute or relative to the workdir.
        A full remote disk, a lost connection or a timeout raise with what to do."""
        ssh = shlex.join(["ssh", *self.ssh_options()])
        if up:
            argv = ["rsync", "-a", "-e", ssh, *extra, *sources, f"{self.host.ssh}:{self.abs(dest)}"]
        else:
            argv = ["rsync", "-a", "-e", ssh, *extra, *(f"{self.host.ssh}:{self.abs(s)}" for s in sources), dest]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HostUnreachable(f"{self.host.name}: rsync did not finish within {timeout:g} s.",
                                  hint="run it again: transfers resume where they stopped") from None
        except FileNotFoundError:
            raise RlctlError("rsync is not installed on this machine.", hint="apt-get install rsync") from None
        if p.returncode == 0 or (p.returncode == 24 and not up):  # 24: files vanished while reading (a live run)
            return p
        err = p.stderr
        if "No space left on device" in err or "Disk quota exceeded" in err:
            raise RlctlError(f"{self.host.name}: the disk is full where rsync writes ({dest}): "
                             f"{_last_lines(err, 1)}",
                             hint=f"free space on {self.host.name} (rlctl hosts check {self.host.name} shows it), "
                                  "then run the command again: finished files are not sent twice")
        if "REMOTE HOST IDENTIFICATION" in err or "Host key verification failed" in err or p.returncode == 255:
            raise self.ssh_error(err)
        raise RlctlError(f"{self.host.name}: rsync failed (exit {p.returncode}): {_last_lines(err, 2)}")


def _word(a: str) -> str:
    return remote_path(a) if a.startswith("~") else shlex.quote(a)


def _last_lines(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("@@@")]
    return " | ".join(lines[-n:])


def run_remote(host: Host, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run argv on `host` in its workdir; env (secrets allowed) goes through stdin. See the module docstring."""
    return Runner(host).run(argv, env=env, timeout=timeout, check=check)


def sync_to(host: Host, paths: Sequence[Path], remote_dir: str, timeout: float = 3600.0) -> None:
    """Copy files/directories into `remote_dir` (relative to the host's workdir), resumably (--partial)."""
    r = Runner(host)
    r.run(["mkdir", "-p", remote_dir], timeout=60)
    r.rsync([str(p) for p in paths], remote_dir.rstrip("/") + "/", up=True, extra=["--partial"], timeout=timeout)


# ---- the host's rlctl: its verbs (rlctl.executors.ssh_remote), one JSON round trip each ---------------------------
def remote_rlctl_error(host: Host, p: subprocess.CompletedProcess[str]) -> RlctlError | None:
    """A remote rlctl that is missing or cannot answer, as a clear error with the one install command."""
    text = (p.stderr or "") + (p.stdout or "")
    if "No module named rlctl" in text or "No module named 'rlctl'" in text:
        return RlctlError(f"{host.name}: rlctl is not installed for {host.python} there.",
                          hint=f"rlctl hosts install {host.name} (pip-installs rlctl {local_version()} there), or set "
                               f"the host's python to an interpreter that has it")
    if f"{host.python}: No such file or directory" in text or f"{host.python}: command not found" in text:
        return RlctlError(f"{host.name}: there is no {host.python} there (the host's python).",
                          hint=f"make that venv there (python3 -m venv ...) and run rlctl hosts install {host.name}, "
                               f"or `rlctl hosts add {host.name} ... --python PATH` with an interpreter that exists")
    if "No module named rlctl.executors.ssh_remote" in text or "usage: python -m rlctl.executors.ssh_remote" in text:
        return RlctlError(f"{host.name}: its rlctl is older than this one ({local_version()}) and does not know the "
                          "remote commands.", hint=f"rlctl hosts install {host.name}")
    return None


def local_version() -> str:
    """This rlctl's version (what `rlctl hosts install` puts on a host)."""
    from rlctl import __version__

    return __version__


def call_remote(runner: Runner, verb: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One round trip to the host's rlctl: `python -m rlctl.executors.ssh_remote VERB` there, a JSON request on
    stdin, a JSON answer on stdout."""
    p = runner.run([*runner.python_argv(), "-m", "rlctl.executors.ssh_remote", verb],
                   stdin=json.dumps(request).encode(), timeout=timeout, check=False)
    if p.returncode != 0:
        err = remote_rlctl_error(runner.host, p)
        if err:
            raise err
        msg = (p.stderr.strip() or f"exit {p.returncode}").removeprefix("rlctl: ")
        if p.stdout.strip():  # e.g. the preflight table of a launch that failed there
            msg += "\n" + p.stdout.strip()
        cls = CheckFailed if p.returncode == 1 else RlctlError
        raise cls(f"{runner.host.name}: {msg}")
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RlctlError(f"{runner.host.name}: the remote rlctl answered {p.stdout.strip()[-200:]!r}, not JSON.",
                         hint=f"rlctl hosts check {runner.host.name}") from None
