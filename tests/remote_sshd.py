"""A real OpenSSH server on a loopback port, standing in for a remote GPU machine (one per test session).

Host and user keys are generated here (ssh-keygen); sshd runs with its own sshd_config (PidFile, AuthorizedKeysFile,
StrictModes no, UsePAM no, PermitRootLogin prohibit-password: tests run as root). The client side is a separate
home holding .ssh/config with a Host alias (`rlctl-test`), its key and known_hosts (StrictHostKeyChecking yes): rlctl
reaches it through `$RLCTL_SSH_CONFIG`, i.e. through an ssh config file exactly as the user's own. If sshd is missing
and we are root, `apt-get install -y openssh-server rsync` is run; otherwise the tests skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
ALIAS = "rlctl-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_openssh() -> str | None:
    """None when sshd, ssh, ssh-keygen and rsync are there (installing them as root if needed), else why not."""
    need = [SSHD, "ssh", "ssh-keygen", "rsync"]
    if all(shutil.which(x) or Path(x).exists() for x in need):
        return None
    if os.geteuid() != 0:
        return "openssh-server/rsync missing and not root (apt-get install -y openssh-server rsync)"
    p = subprocess.run(["apt-get", "install", "-y", "openssh-server", "openssh-client", "rsync"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return f"apt-get install openssh-server rsync failed: {p.stderr[-300:]}"
    return None


@dataclass
class Sshd:
    root: Path
    port: int
    config: Path  # sshd_config
    client_config: Path  # the client's ~/.ssh/config
    known_hosts: Path
    host_key: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        Path("/run/sshd").mkdir(exist_ok=True)
        log = open(self.root / "sshd.log", "ab")  # noqa: SIM115 - lives as long as sshd
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log,
                                     start_new_session=True)
        deadline = time.time() + 20
        while time.time() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.1)
        raise RuntimeError("sshd did not listen in 20 s")

    def stop(self) -> None:
        """sshd and every connection it serves (as a host that went down): its session processes go too."""
        if self.proc is None:
            return
        import psutil

        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(self.proc.pid)
            for child in parent.children(recursive=False):  # one sshd per connection
                if child.name().startswith("sshd"):
                    with contextlib.suppress(psutil.Error):
                        child.kill()
        self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def make_sshd(root: Path) -> Sshd:
    root.mkdir(parents=True, exist_ok=True)
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    os.chmod(home / ".ssh", 0o700)
    host_key = root / "ssh_host_ed25519_key"
    user_key = home / ".ssh" / "id_ed25519"
    for k in (host_key, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True, timeout=30)
    auth = root / "authorized_keys"
    auth.write_text(Path(f"{user_key}.pub").read_text())
    port = _free_port()
    config = root / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {root}/sshd.pid
AuthorizedKeysFile {auth}
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PrintMotd no
MaxSessions 100
MaxStartups 100:30:200
""")
    known = home / ".ssh" / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {' '.join(Path(f'{host_key}.pub').read_text().split()[:2])}\n")
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    client = home / ".ssh" / "config"
    client.write_text(f"""Host {ALIAS}
  HostName 127.0.0.1
  Port {port}
  User {user}
  IdentityFile {user_key}
  IdentitiesOnly yes
  UserKnownHostsFile {known}
  StrictHostKeyChecking yes
  LogLevel ERROR
""")
    # the same server under a second alias whose known_hosts holds another key: a changed host key
    other = root / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    bad_known = home / ".ssh" / "known_hosts_changed"
    bad_known.write_text(f"[127.0.0.1]:{port} {' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n")
    with client.open("a") as fh:
        fh.write(f"""Host {ALIAS}-changed
  HostName 127.0.0.1
  Port {port}
  User {user}
  IdentityFile {user_key}
  IdentitiesOnly yes
  UserKnownHostsFile {bad_known}
  StrictHostKeyChecking yes
  LogLevel ERROR
""")
    return Sshd(root, port, config, client, known, host_key)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    why = ensure_openssh()
    if why:
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("the test sshd logs in as root (PermitRootLogin prohibit-password); not root here")
    s = make_sshd(tmp_path_factory.mktemp("sshd"))
    s.start()
    yield s
    s.stop()


def ssh_home(sshd: Sshd, home: Path, aliases: list[str]) -> Path:
    """A machine's HOME as its user has it: ~/.ssh/config naming the loopback sshd under each alias (with the test
    key and known_hosts; StrictHostKeyChecking yes), and HOME/bin/ssh. Returns HOME/bin: put it first on PATH.

    OpenSSH reads ~/.ssh from the passwd entry, never from $HOME (root's is /root here); HOME/bin/ssh is the real
    OpenSSH client given `-F $HOME/.ssh/config`, so a test that isolates HOME gets the ssh config of that HOME, as a
    user whose HOME is their passwd home does. rsync's `-e ssh` finds it on PATH too. Nothing else changes."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    key = sshd.root / "home" / ".ssh" / "id_ed25519"
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    (ssh_dir / "config").write_text("".join(f"""Host {alias}
  HostName 127.0.0.1
  Port {sshd.port}
  User {user}
  IdentityFile {key}
  IdentitiesOnly yes
  UserKnownHostsFile {sshd.known_hosts}
  StrictHostKeyChecking yes
  LogLevel ERROR
""" for alias in aliases))
    bin_dir = home / "bin"
    bin_dir.mkdir(exist_ok=True)
    real = shutil.which("ssh", path=os.defpath + ":/usr/bin:/bin")
    (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec {real} -F "$HOME/.ssh/config" "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    return bin_dir
