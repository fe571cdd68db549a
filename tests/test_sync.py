"""Checkpoint sync against a real S3-compatible server started here (moto in server mode): only complete
checkpoints, files before their manifest, `latest` last, and a download on "another machine"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.runs.sync import CheckpointSync, fetch_latest, read_latest

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


@pytest.fixture
def s3(tmp_path):
    """A real S3-compatible server (moto in server mode) on a free loopback port, with one bucket."""
    import s3fs  # noqa: F401 - the [sync] extra, part of the dev install: a missing one is a failure, not a skip

    from rlctl.core.environ import environ
    from rlctl.executors.ray import free_port

    port = free_port()
    proc = subprocess.Popen([moto_python(), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    try:
        with environ(**creds):  # restored (unset ones unset) when the test ends
            import s3fs

            deadline = time.time() + 30
            while True:
                try:
                    fs = s3fs.S3FileSystem(skip_instance_cache=True)
                    fs.mkdir("rlctl-test")
                    break
                except Exception:
                    if time.time() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.3)
            yield {"url": "s3://rlctl-test", "env": creds, "fs": fs}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def trl_checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    d = root / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(4096) + bytes([step]))
    (d / "optimizer.pt").write_bytes(os.urandom(1024))
    if complete:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_only_complete_checkpoints_are_synced_and_latest_moves_last(tmp_path, s3):
    run = tmp_path / "run"
    trl_checkpoint(run, 2)
    partial = trl_checkpoint(run, 4, complete=False)  # being written
    url = f"{s3['url']}/run-a"
    sync = CheckpointSync(run, "trl", url)
    sync.tick(final=True)
    fs = s3["fs"]
    assert read_latest(url)["step"] == 2
    assert not fs.exists("rlctl-test/run-a/checkpoints/checkpoint-4")  # incomplete: never uploaded
    (partial / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    sync.tick()  # in the background, as the supervisor does
    sync.thread.join(timeout=60)
    assert read_latest(url)["step"] == 4 and sync.error is None
    assert json.loads((run / ".sync.json").read_text())["steps"] == [2, 4]
    again = CheckpointSync(run, "trl", url)  # a new supervisor (restart) does not upload twice
    assert again.pending() == []
    # resume on another machine: the files come back, byte for byte
    got = fetch_latest(url, tmp_path / "other")
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        assert (tmp_path / "other" / got["path"] / name).read_bytes() == (partial / name).read_bytes()


def test_a_sync_cut_off_half_way_is_not_a_checkpoint(tmp_path, s3):
    run = tmp_path / "run"
    trl_checkpoint(run, 2)
    url = f"{s3['url']}/run-b"
    CheckpointSync(run, "trl", url).tick(final=True)
    fs = s3["fs"]
    fs.rm("rlctl-test/run-b/checkpoints/checkpoint-2/optimizer.pt")  # a file the manifest promises is gone
    assert read_latest(url) is None
    fs.rm("rlctl-test/run-b/latest")
    assert read_latest(url) is None
    with pytest.raises(Exception, match="no complete synced checkpoint"):
        fetch_latest(url, tmp_path / "x")
