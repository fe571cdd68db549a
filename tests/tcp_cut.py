"""A loopback TCP forwarder a test can cut: the way to one host of the suite's one sshd (`python -m tests.tcp_cut
LISTEN TARGET` forwards 127.0.0.1:LISTEN to 127.0.0.1:TARGET). Killing it is the host going away for everyone who
reaches it through that port (every connection through it is reset, new ones are refused) while what runs on the host
goes on; starting it again on the same port brings the host back (a spot pod resumed)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(1 << 16):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def serve(listen: int, target: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen))
    srv.listen(64)
    print("ready", flush=True)
    while True:
        client, _ = srv.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target), timeout=10)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()


def _quiet_port() -> int:
    """A free port below the kernel's ephemeral range: while the forwarder is down, no outgoing connection can take
    it as its own source port (which would keep the forwarder from listening there again)."""
    import random

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class Cut:
    """The forwarder as a process: up() starts it (on the same port each time), down() kills it."""

    def __init__(self, target: int):
        self.target = target
        self.port = _quiet_port()
        self.proc: subprocess.Popen | None = None

    def up(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return  # up already
        deadline = time.time() + 20
        while True:  # the port may linger a moment after down()
            self.proc = subprocess.Popen([sys.executable, __file__, str(self.port), str(self.target)],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if self.proc.stdout.readline().strip() == "ready":
                return
            self.proc.wait()
            if time.time() > deadline:
                raise RuntimeError(f"the forwarder could not listen on {self.port}")
            time.sleep(0.2)

    def down(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
