"""One real S3-compatible server (moto in server mode) on a loopback port for the whole test session: started by the
first test that needs it, stopped at the end. Tests keep to their own bucket or prefix."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

MOTO_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlctl-tests" / "moto-venv"


def moto_python() -> str:
    """A Python with moto's S3 server. moto pins the newest boto3/botocore while s3fs's aiobotocore pins an older
    botocore, so the two cannot share rlctl's environment without pip backtracking for ages: the server gets a venv
    of its own (made once, from the package index, and cached)."""
    py = MOTO_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(MOTO_VENV)], check=True)
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "moto[server]"], capture_output=True, text=True)
        if r.returncode != 0:
            import shutil

            shutil.rmtree(MOTO_VENV, ignore_errors=True)
            raise RuntimeError(f"could not install moto[server] for the S3 test server:\n{r.stderr[-2000:]}")
    return str(py)


@dataclass
class S3Server:
    port: int
    proc: subprocess.Popen

    @property
    def env(self) -> dict[str, str]:
        """What a client needs, as a user exports it (credentials are moto's dummies)."""
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}"}

    def bucket(self, name: str, versioned: bool = False):
        """An s3fs filesystem with this bucket made (once); `versioned` keeps every version of each object."""
        import s3fs

        from rlctl.core.environ import environ

        with environ(**self.env):
            deadline = time.time() + 30
            while True:
                try:
                    fs = s3fs.S3FileSystem(skip_instance_cache=True, version_aware=versioned)
                    if not fs.exists(name):
                        fs.mkdir(name)
                    if versioned:
                        fs.make_bucket_versioned(name)
                    return fs
                except Exception:
                    if time.time() > deadline or self.proc.poll() is not None:
                        raise
                    time.sleep(0.3)


@pytest.fixture(scope="session")
def s3_server():
    import s3fs  # noqa: F401 - the [sync] extra, part of the dev install: a missing one is a failure, not a skip

    from rlctl.executors.ray import free_port

    port = free_port()
    proc = subprocess.Popen([moto_python(), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield S3Server(port, proc)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
