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


def test_a_synced_checkpoint_names_its_wandb_run_and_a_resume_from_the_store_continues_it(tmp_path, s3):
    """`launch --resume s3://...` started a fresh W&B run (the id lived only in the source run's state.json, on
    another machine): each manifest names the run's W&B id, which launch gives the resumed run."""
    from rlctl.core.state import write_state

    run = tmp_path / "run"
    trl_checkpoint(run, 2)
    write_state(run, backend="trl", wandb_run_id="qs-20261127-010203")
    url = f"{s3['url']}/run-w"
    CheckpointSync(run, "trl", url).tick(final=True)
    assert read_latest(url)["wandb_run_id"] == "qs-20261127-010203"  # launch --resume URL takes it from there


def test_a_sync_that_fails_is_seen_at_preflight_and_in_status_and_doctor(user):
    """`checkpoint.sync = "nosuchscheme://x/y"`: preflight said all OK, the run 'finished (exit code 0)', status,
    status --json and doctor said nothing; only rlctl-events.jsonl had the sync_error. Preflight now fails on the
    URL; a run launched anyway shows its sync errors and the newest checkpoint not in the store."""
    import shutil

    work, rlctl = user
    shutil.copytree(Path(__file__).resolve().parents[1] / "recipes", work / "recipes")
    bad = ["--set", "checkpoint.sync=nosuchscheme://x/y", "--set", "train.steps=2", "--set", "checkpoint.every=2"]
    r = rlctl("preflight", "recipes/quickstart.toml", *bad)
    line = next((x for x in r.stdout.splitlines() if "checkpoint.sync" in x), "")
    assert r.returncode != 0 and "FAIL" in line and "nosuchscheme" in line, r.stdout + r.stderr
    r = rlctl("launch", "recipes/quickstart.toml", *bad, "--force", "--name", "lost")
    run = next((work / "runs").glob("lost*"))
    d = json.loads(rlctl("status", run.name, "--json").stdout)
    assert d["sync"]["errors"] >= 1 and d["sync"]["behind"] and d["sync"]["newest_checkpoint"] == 2, d.get("sync")
    shown = rlctl("status", run.name).stdout
    assert "checkpoint sync to nosuchscheme://x/y: nothing synced" in shown and "sync error" in shown, shown
    doc = rlctl("doctor", run.name).stdout
    assert "checkpoint.sync" in doc and "not in the store" in doc, doc
