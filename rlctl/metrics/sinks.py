"""Sinks: rlctl forwards its unified metrics stream to W&B and/or TensorBoard (`logging.rlctl_sinks`).

metrics.jsonl is always written; these are optional extras (`[wandb]`, `[tensorboard]`), imported only by the
process that follows a run. One W&B run per rlctl run, with a stable id (a resumed run continues it); the API key
is read by wandb from the environment and never written by rlctl.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError
from rlctl.metrics.stream import METRICS

SINK_STATE = ".sinks.json"


def _numbers(rec: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in rec.items()
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)}


class WandbSink:
    def __init__(self, run_dir: Path, cfg: dict[str, Any]):
        try:
            import wandb
        except ImportError:
            raise RlctlError("logging.rlctl_sinks has wandb but wandb is not installed.",
                             hint='pip install "rlctl[wandb]"') from None
        import sys

        from rlctl.runs.rundir import mask_argv, masked_recipe_data

        self.wandb = wandb
        config = masked_recipe_data(cfg.get("config") or {})  # the one secret rule, again at the sink's door
        sys.argv = mask_argv(sys.argv)  # W&B records this process's argv (`rlctl launch --set env.X_TOKEN=...`)
        self.run = wandb.init(project=cfg.get("project"), entity=cfg.get("entity"), name=cfg.get("name"),
                              id=cfg["id"], resume="allow", dir=str(run_dir),
                              mode="offline" if cfg.get("offline") else "online", config=config)
        self.last_step = -1

    def write(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        if step < self.last_step:
            return  # W&B only takes non-decreasing steps
        self.last_step = step
        self.run.log(_numbers(rec), step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardSink:
    def __init__(self, run_dir: Path, logdir: str | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise RlctlError("logging.rlctl_sinks has tensorboard but no TensorBoard writer is installed.",
                                 hint='pip install "rlctl[tensorboard]"') from None
        path = Path(logdir) if logdir else run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(path if path.is_absolute() else run_dir / path))

    def write(self, rec: dict[str, Any]) -> None:
        for k, v in _numbers(rec).items():
            self.writer.add_scalar(k, v, rec["step"])

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def _saved_offset(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / SINK_STATE).read_text())["offset"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def skip_to_end(run_dir: Path) -> None:
    """The records metrics.jsonl holds now were sent by an earlier attempt (on another host): none goes again."""
    try:
        size = (run_dir / METRICS).stat().st_size
    except OSError:
        size = 0
    (run_dir / SINK_STATE).write_text(json.dumps({"offset": size}))


class Forwarder:
    """Sends the records metrics.jsonl gains to the sinks; remembers its offset so nothing goes twice."""

    def __init__(self, run_dir: Path, spec: dict[str, Any]):
        self.run_dir = run_dir
        self.sinks: list[Any] = []
        for name in spec.get("names", []):
            if name == "wandb":
                self.sinks.append(WandbSink(run_dir, spec.get("wandb") or {}))
            elif name == "tensorboard":
                self.sinks.append(TensorBoardSink(run_dir, spec.get("tensorboard")))
        self.offset = _saved_offset(run_dir)

    def pump(self) -> int:
        path = self.run_dir / METRICS
        if not self.sinks or not path.exists():
            return 0
        with path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        cut = data.rfind(b"\n")
        if cut < 0:
            return 0
        n = 0
        for line in data[: cut + 1].decode("utf-8", errors="replace").split("\n"):  # not splitlines: U+0085
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                for s in self.sinks:
                    s.write(rec)
                n += 1
        self.offset += cut + 1
        (self.run_dir / SINK_STATE).write_text(json.dumps({"offset": self.offset}))
        return n

    def close(self) -> None:
        self.pump()
        for s in self.sinks:
            s.close()


class SinkPump:
    """What a run's follower calls each tick: makes the Forwarder on first use and never lets a sink (a W&B
    outage, a missing package) stop the follower — the first error is recorded and the sinks are switched off."""

    def __init__(self, run_dir: Path, spec: dict[str, Any] | None):
        self.run_dir = run_dir
        self.spec = spec or {}
        self.forwarder: Forwarder | None = None
        self.off = not self.spec.get("names")

    def backlog(self) -> bool:
        """Records in metrics.jsonl the sinks have not been sent yet (what the next pump would write)."""
        if self.off:
            return False
        offset = self.forwarder.offset if self.forwarder is not None else _saved_offset(self.run_dir)
        try:
            return (self.run_dir / METRICS).stat().st_size > offset
        except OSError:
            return False

    def pump(self, close: bool = False) -> None:
        if self.off:
            return
        try:
            if self.forwarder is None:
                self.forwarder = Forwarder(self.run_dir, self.spec)
            if close:
                self.forwarder.close()
                self.off = True
            else:
                self.forwarder.pump()
        except Exception as e:
            self.off = True
            with open(self.run_dir / "rlctl-events.jsonl", "a") as fh:
                fh.write(json.dumps({"event": "sink_error", "error": str(e)}) + "\n")
