"""A new user at a terminal: every journey types the README's commands, as strings, from a project directory.

What is the user's and nothing else:
- `rlctl` is the console script the install put next to this Python, found through PATH; each command is its own
  process, run in the user's project directory. Every default holds: runs go to the relative `./runs`, no `RLCTL_*`
  (nor `XDG_*`) variable is set; only HOME is the user's own, a fresh directory (hosts.toml, caches, models).
- SSH hosts are aliases in the user's `~/.ssh/config`, reaching the project's real loopback sshd
  (tests/remote_sshd.py); each host is a machine of its own: a workdir and a home (`hosts add --env HOME=...`, its
  model cache and Hugging Face cache live there), the same rlctl install (`--python`, as `hosts install` gives).
  OpenSSH reads `~/.ssh/config` from the passwd entry, never from $HOME, so the user's PATH starts with a two-line
  `ssh` that adds `-F "$HOME/.ssh/config"`: what ssh does for a user whose home that is. Nothing else differs.

Each journey module keeps its runs across its steps (module-scoped fixtures), as a user's runs outlive a command;
whatever it started is stopped at the end (runs' process groups and supervisors here and on the hosts, experiment
queues, ssh ControlMasters).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.remote_sshd import (
    Sshd,
    sshd,  # noqa: F401 - the session's real OpenSSH server
)

BIN = Path(sys.executable).parent  # where `pip install -e .` put the `rlctl` console script
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
RECIPES = ROOT / "recipes"
FIXTURES = ROOT / "tests" / "fixtures"


class User:
    """One user: a home, a project directory, a shell environment, and what they type."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.cwd = root / "project"
        self.home.mkdir(parents=True)
        self.cwd.mkdir(parents=True)
        shim = root / "bin"
        shim.mkdir()
        (shim / "ssh").write_text('#!/bin/sh\nexec /usr/bin/ssh -F "$HOME/.ssh/config" "$@"\n')
        (shim / "ssh").chmod(0o755)
        assert (BIN / "rlctl").exists(), f"no rlctl console script next to {sys.executable}: pip install -e ."
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RLCTL_", "XDG_", "PYTEST_"))}
        env.pop("PYTHONPATH", None)
        env.update(HOME=str(self.home), PATH=f"{shim}{os.pathsep}{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}")
        self.env = env
        self.hosts: dict[str, Path] = {}  # name -> the host's workdir
        self.aliases: list[str] = []

    def __call__(self, command: str, timeout: float = 600, input: str | None = None) -> subprocess.CompletedProcess:
        """`command` exactly as typed at the prompt (shell words, no shell features)."""
        return subprocess.run(shlex.split(command), cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, input=input)

    def ok(self, command: str, timeout: float = 600) -> subprocess.CompletedProcess:
        p = self(command, timeout=timeout)
        assert p.returncode == 0, f"$ {command}\nexit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        return p

    def json(self, command: str, timeout: float = 600):
        return json.loads(self.ok(command, timeout=timeout).stdout)

    def write(self, rel: str, text: str) -> Path:
        p = self.cwd / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def copy_quickstart(self) -> None:
        """The quickstart recipe and its files, copied into the project (`cp -r recipes/quickstart* .`)."""
        import shutil

        shutil.copy(QUICKSTART, self.cwd / "quickstart.toml")
        shutil.copytree(RECIPES / "quickstart", self.cwd / "quickstart")

    # ---- ssh ------------------------------------------------------------------------------------------------
    def ssh_alias(self, alias: str, server: Sshd) -> None:
        """A Host block in ~/.ssh/config for the server, with the user's own key (ssh-keygen once, then copied to
        the server's authorized keys, as ssh-copy-id does) and known_hosts."""
        ssh = self.home / ".ssh"
        if not ssh.is_dir():
            ssh.mkdir(mode=0o700)
        key = ssh / "id_ed25519"
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
        pub = Path(f"{key}.pub").read_text()
        authorized = server.root / "authorized_keys"
        if pub not in authorized.read_text():
            with authorized.open("a") as fh:
                fh.write(pub)
        known = ssh / "known_hosts"
        with known.open("a") as fh:
            fh.write(server.known_hosts.read_text())
        import pwd

        with (ssh / "config").open("a") as fh:
            fh.write(f"Host {alias}\n  HostName 127.0.0.1\n  Port {server.port}\n"
                     f"  User {pwd.getpwuid(os.getuid()).pw_name}\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                     f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
        self.aliases.append(alias)

    def add_host(self, name: str, alias: str, server: Sshd, extra: str = "") -> Path:
        """`rlctl hosts add NAME ALIAS --workdir W --python P --env HOME=H`: a machine with a home of its own."""
        self.ssh_alias(alias, server)
        machine = self.root / "machines" / name
        (machine / "home").mkdir(parents=True)
        work = machine / "work"
        self.ok(f"rlctl hosts add {name} {alias} --workdir {work} --python {sys.executable} "
                f"--env HOME={machine / 'home'} {extra}")
        self.hosts[name] = work
        return work

    # ---- what the user looks at ----------------------------------------------------------------------------
    def run_dir(self, name: str) -> Path:
        """The local run directory of the run called `name` (its stamped directory under ./runs)."""
        found = [d for d in (self.cwd / "runs").iterdir() if d.is_dir() and d.name.rsplit("-", 2)[0] == name]
        assert len(found) == 1, (name, sorted(p.name for p in (self.cwd / "runs").iterdir()))
        return found[0]

    def host_run_dir(self, host: str, name: str) -> Path:
        found = [d for d in (self.hosts[host] / "runs").iterdir() if d.is_dir() and d.name.rsplit("-", 2)[0] == name]
        assert len(found) == 1, (host, name)
        return found[0]

    def cleanup(self) -> None:
        """Stop everything this user started: runs here and on the hosts, experiment queues, ssh masters."""
        dirs = [self.cwd / "runs", *(w / "runs" for w in self.hosts.values())]
        for runs in dirs:
            for state_file in runs.glob("*/state.json") if runs.is_dir() else []:
                kill_recorded(state_file)
            for queue in runs.glob("_experiments/*/*.json") if runs.is_dir() else []:
                kill_recorded(queue)
        for alias in self.aliases:
            with contextlib.suppress(Exception):
                subprocess.run(["/usr/bin/ssh", "-F", str(self.home / ".ssh" / "config"), "-o",
                                f"ControlPath=/tmp/rlctl-ssh-{os.getuid()}/%C", "-O", "exit", alias],
                               capture_output=True, timeout=10)


def kill_recorded(state_file: Path) -> None:
    """SIGKILL the process groups and pids a state or queue file records (what a failed step left running)."""
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(state, dict) or state.get("status") in ("finished", "failed", "stopped") or \
            state.get("state") not in (None, "running"):
        return  # settled: its ids may belong to someone else by now
    for key in ("pgid", "supervisor_pid", "pid"):
        pid = state.get(key)
        if isinstance(pid, int) and pid > 1 and pid != os.getpid():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL) if key == "pgid" else os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def new_user(tmp_path_factory) -> Iterator[Callable[[str], User]]:
    """A factory of users (one per journey, sometimes two machines' worth); all cleaned up with the module."""
    made: list[User] = []

    def make(name: str = "user") -> User:
        u = User(tmp_path_factory.mktemp(name))
        made.append(u)
        return u

    yield make
    for u in made:
        u.cleanup()


def wait_for(pred: Callable[[], object], timeout: float = 120, interval: float = 0.5) -> object:
    deadline = time.time() + timeout
    while True:
        got = pred()
        if got or time.time() > deadline:
            return got
        time.sleep(interval)


def stream(run: Path) -> list[dict]:
    """The run's unified metrics stream (every line must be JSON)."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def evals_by_step(run: Path) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for m in stream(run):
        ev = {k: v for k, v in m.items() if k.startswith("eval/")}
        if ev:
            out.setdefault(m["step"], {}).update(ev)
    return out
