"""Checkpoint sync against a real S3-compatible server started here (moto in server mode): only complete
checkpoints, files before their manifest, `latest` last, and a download on "another machine"."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlctl.runs.sync import CheckpointSync, fetch_latest, read_latest


@pytest.fixture
def s3(s3_server):
    """The session's S3 server, its credentials in this test's environment, and one bucket."""
    from rlctl.core.environ import environ

    fs = s3_server.bucket("rlctl-test")
    with environ(**s3_server.env):  # restored (unset ones unset) when the test ends
        yield {"url": "s3://rlctl-test", "env": s3_server.env, "fs": fs}


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
