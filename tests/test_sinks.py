"""rlctl's own sinks: the unified stream forwarded to TensorBoard and to W&B (offline), with a stable run id."""

from __future__ import annotations

import json

import pytest

from rlctl.metrics.sinks import Forwarder
from tests.conftest import RECIPES


def write_metrics(run, recs):
    with (run / "metrics.jsonl").open("a") as fh:
        for r in recs:
            fh.write(json.dumps(r) + "\n")


def test_tensorboard_sink_round_trip(tmp_path):
    pytest.importorskip("tensorboard")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    write_metrics(tmp_path, [{"step": s, "time": 0, "reward/mean": s / 10, "trl/name": "x"} for s in range(1, 4)])
    fwd = Forwarder(tmp_path, {"names": ["tensorboard"], "tensorboard": None})
    assert fwd.pump() == 3
    write_metrics(tmp_path, [{"step": 4, "time": 0, "reward/mean": 0.4}])
    assert fwd.pump() == 1  # only what is new
    fwd.close()
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    vals = [(e.step, round(e.value, 6)) for e in acc.Scalars("reward/mean")]
    assert vals == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert Forwarder(tmp_path, {"names": []}).pump() == 0


def test_wandb_offline_sink_keeps_one_run_id(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_metrics(tmp_path, [{"step": s, "time": 0, "reward/mean": s / 10} for s in range(1, 4)])
    spec = {"names": ["wandb"], "wandb": {"project": "p", "name": "n", "offline": True, "id": "rlctl-run-123"}}
    fwd = Forwarder(tmp_path, spec)
    assert fwd.pump() == 3
    fwd.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*-rlctl-run-123"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_launch_forwards_to_tensorboard(cli, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RLCTL_MODEL_CACHE", str(tmp_path / "models"))
    res = cli("launch", str(RECIPES / "quickstart.toml"), "--smoke", "--set", 'logging.rlctl_sinks=["tensorboard"]')
    assert res.code == 0, res.err[-2000:]
    run = next((tmp_path / "runs").iterdir())
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert not (run / "rlctl-events.jsonl").exists() or "sink_error" not in (run / "rlctl-events.jsonl").read_text()


def test_wandb_sink_needs_a_wandb_table(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "runs"))
    res = cli("launch", str(RECIPES / "quickstart.toml"), "--smoke", "--set", 'logging.rlctl_sinks=["wandb"]')
    assert res.code == 2 and "[logging.wandb]" in res.err
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_a_failing_sink_is_recorded_and_switched_off(tmp_path, monkeypatch):
    from rlctl.metrics import sinks

    write_metrics(tmp_path, [{"step": 1, "time": 0, "reward/mean": 0.1}])

    def broken(*a, **k):
        raise RuntimeError("W&B is down")

    monkeypatch.setattr(sinks, "Forwarder", broken)
    pump = sinks.SinkPump(tmp_path, {"names": ["wandb"]})
    pump.pump()
    pump.pump(close=True)  # never raises: the follower keeps following the run
    assert pump.off
    events = [json.loads(x) for x in (tmp_path / "rlctl-events.jsonl").read_text().splitlines()]
    assert events == [{"event": "sink_error", "error": "W&B is down"}]
    assert sinks.SinkPump(tmp_path, None).off


def test_a_record_whose_text_holds_u0085_reaches_the_sink(tmp_path):
    """metrics.jsonl lines end at "\\n" only: a string value may hold U+0085 unescaped (orjson writes it so); the
    record is sent, not split there and dropped."""
    pytest.importorskip("tensorboard")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    with (tmp_path / "metrics.jsonl").open("w", encoding="utf-8") as fh:
        for s in (1, 2):
            fh.write(json.dumps({"step": s, "time": 0, "reward/mean": s / 10, "note": "a\x85b"},
                                ensure_ascii=False) + "\n")
    fwd = Forwarder(tmp_path, {"names": ["tensorboard"], "tensorboard": None})
    assert fwd.pump() == 2
    fwd.close()
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]
