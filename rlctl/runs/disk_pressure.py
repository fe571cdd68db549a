"""Disk pressure during a run: prune before a checkpoint would not fit, and stop cleanly when pruning is not enough.

Seed 004 saved 47 GB checkpoints onto 65 GB of free disk, found that prime-rl's own keep-last deleted nothing, and ran
a cleanup daemon deleting the oldest checkpoint at 85% full. Here that daemon is one line of recipe,
`[checkpoint] min_free_gb`, and a rule the supervisor applies every housekeeping tick:

- the next checkpoint needs as much as the newest complete one takes on disk (less what a save in progress has
  written already), and `min_free_gb` must stay free beside it;
- when it would not fit, checkpoints beyond `keep_last` are pruned — never the best-eval checkpoint (the one rule of
  rlctl.runs.checkpoints, applied by `prune`), never the newest one synced to object storage (checkpoint.sync's
  `latest`), never one rlctl has still to evaluate;
- only if it still would not fit, the run is stopped after its last complete checkpoint (the supervisor kills the
  attempt: a graceful stop would make the backend save once more) and a save that had begun is removed, so the newest
  checkpoint on disk is always a complete one, the one `rlctl resume RUN` starts from once there is room.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.core.checkpoint import Checkpoint
from rlctl.core.sizes import human_bytes
from rlctl.errors import RlctlError

GB = 1e9
_SIZES: dict[tuple[str, int], int] = {}  # (checkpoint path, mtime) -> bytes on disk: a 47 GB folder is walked once


def on_disk(c: Checkpoint) -> int:
    """Bytes the checkpoint takes on its filesystem (allocated blocks; a file's size where blocks are not known)."""
    key = (str(c.path), _mtime(c.path))
    if c.complete and key in _SIZES:
        return _SIZES[key]
    total = 0
    for top in c.paths():
        if top.is_symlink() or not top.exists():
            continue
        for p in [top] if top.is_file() else top.rglob("*"):
            with contextlib.suppress(OSError):
                st = p.lstat()
                if not p.is_symlink() and p.is_file():
                    total += max(st.st_blocks * 512, 0) or st.st_size
    if c.complete:
        _SIZES[key] = total
    return total


def _mtime(p: Path) -> int:
    try:
        return p.stat().st_mtime_ns
    except OSError:
        return 0


@dataclass
class Pressure:
    """The next checkpoint would not fit even after pruning: what the supervisor says and records."""

    root: Path
    free: int
    need: int
    floor: int
    next_bytes: int | None
    newest: int | None  # the newest complete checkpoint's step (where a resume starts)
    saving: list[Checkpoint] = field(default_factory=list)  # a save in progress, removed when the run stops
    pruned: list[int] = field(default_factory=list)
    kept: dict[str, int] = field(default_factory=dict)  # why some were not pruned: {"best": step, "synced": step}

    def message(self) -> str:
        gb = _size
        nxt = f"the next checkpoint (~{gb(self.next_bytes)}, as large as the last)" if self.next_bytes else \
            "checkpoints"
        floor = f" + checkpoint.min_free_gb {gb(self.floor)}" if self.floor else ""
        kept = ", ".join(f"the {k} (step {v})" for k, v in self.kept.items())
        return (f"{nxt}{floor} would not fit: {gb(self.free)} free at {self.root}"
                + (f" after pruning steps {', '.join(map(str, self.pruned))}" if self.pruned else "")
                + (f"; kept {kept}" if kept else "")
                + (f"; stopped after checkpoint step {self.newest}" if self.newest is not None else ""))

    def to_cause(self, host_fix: str = "") -> dict[str, Any]:
        ck = f"step {self.newest}" if self.newest is not None else "the start"
        return {"what": "disk pressure", "summary": self.message(), "component": "disk",
                "evidence": [f"{self.free} bytes free at {self.root}, {self.need} needed"],
                "fix": f"free space there (or lower keep_last / checkpoint.min_free_gb), then rlctl resume RUN: it "
                       f"resumes from {ck}{host_fix}"}


_size = human_bytes  # the one formatter (rlctl.core.sizes)


def room_needed(checkpoints: float | None, min_free_gb: float | None) -> int:
    """The rule: bytes that must be free before checkpoints of this size are written, `checkpoint.min_free_gb`
    beside them (the supervisor's every tick, for the next one; preflight's disk.checkpoints, for every copy kept)."""
    return int((checkpoints or 0) + float(min_free_gb or 0) * GB)


def still_short(run_dir: Path, spec: dict[str, Any]) -> str | None:
    """For a run the rule stopped: why it would stop again at once (nothing pruned, nothing written), or None once
    there is room."""
    from rlctl.runs.checkpoints import checkpoint_dir, find_checkpoints

    root = checkpoint_dir(run_dir, spec.get("checkpoint_dir"))
    probe = root if root.exists() else run_dir
    complete = [c for c in find_checkpoints(str(spec.get("backend") or ""), run_dir, root) if c.complete]
    next_bytes = on_disk(complete[-1]) if complete else None
    need, free = room_needed(next_bytes, spec.get("min_free_gb")), shutil.disk_usage(probe).free
    if free >= need:
        return None
    floor = f" + checkpoint.min_free_gb {_size(room_needed(0, spec.get('min_free_gb')))}" \
        if spec.get("min_free_gb") else ""
    nxt = f"the next checkpoint (~{_size(next_bytes)})" if next_bytes else "checkpoints"
    return f"{nxt}{floor} would still not fit: {_size(free)} free at {probe}"


def latest_synced(run_dir: Path) -> int | None:
    from rlctl.runs.sync import latest_synced as synced

    return synced(run_dir)


def _pending_evals(run_dir: Path, spec: dict[str, Any], ckpts: list[Checkpoint]) -> set[int]:
    if not (spec.get("evals") or {}).get("sets"):
        return set()
    from rlctl.evals.ledger import read_ledger

    done = read_ledger(run_dir).get("done") or {}
    return {c.step for c in ckpts if str(c.step) not in done}


def check(run_dir: Path, spec: dict[str, Any]) -> Pressure | None:
    """None when the next checkpoint fits (after pruning beyond keep_last if it had to); else why the run must
    stop."""
    from rlctl.runs.checkpoints import best_checkpoint, checkpoint_dir, find_checkpoints, prune

    backend = str(spec.get("backend") or "")
    root = checkpoint_dir(run_dir, spec.get("checkpoint_dir"))
    probe = root if root.exists() else run_dir
    floor = room_needed(0, spec.get("min_free_gb"))
    ckpts = find_checkpoints(backend, run_dir, root)
    complete = [c for c in ckpts if c.complete]
    newest = complete[-1] if complete else None
    saving = [c for c in ckpts if not c.complete and (newest is None or c.step > newest.step)]
    next_bytes = on_disk(newest) if newest is not None else None
    free = shutil.disk_usage(probe).free
    if free >= room_needed(next_bytes, spec.get("min_free_gb")):  # the common case: no save in progress is walked
        return None
    need = max((next_bytes or 0) - sum(on_disk(c) for c in saving), 0) + floor
    if free >= need:
        return None
    event: dict[str, Any] = {"event": "disk_pressure", "free": free, "need": need}
    pruned: list[int] = []
    kept: dict[str, int] = {}
    keep = spec.get("keep_last")
    synced = latest_synced(run_dir)
    if synced is not None:
        kept["newest synced"] = synced
    with contextlib.suppress(Exception):
        best = best_checkpoint(run_dir)
        step = best.get("step") if isinstance(best, dict) else best[0] if best else None
        if isinstance(step, int) and step > 0:
            kept["best"] = step
    if keep:
        try:
            doomed = prune(backend, run_dir, int(keep), keep_best=True, root=root,
                           keep_steps=({synced} if synced is not None else set()) | _pending_evals(run_dir, spec,
                                                                                                  ckpts))
            pruned = [c.step for c in doomed]
            free = shutil.disk_usage(probe).free
        except (RlctlError, OSError) as e:
            event["error"] = str(e)
    event["pruned"] = pruned
    _event(run_dir, event)
    if free >= need:
        return None
    return Pressure(root, free, need, floor, next_bytes, newest.step if newest else None, saving, pruned,
                    {k: v for k, v in kept.items() if any(c.step == v for c in complete)})


def remove_partial(run_dir: Path, spec: dict[str, Any]) -> list[int]:
    """After the run stopped: saves newer than the newest complete checkpoint are removed (a half-written checkpoint
    is never the newest)."""
    from rlctl.runs.checkpoints import _safe_to_delete, checkpoint_dir, find_checkpoints, prunable_root

    backend = str(spec.get("backend") or "")
    root = prunable_root(run_dir, checkpoint_dir(run_dir, spec.get("checkpoint_dir")))
    ckpts = find_checkpoints(backend, run_dir, root)
    done = max((c.step for c in ckpts if c.complete), default=-1)
    gone = []
    for c in ckpts:
        if c.complete or c.step <= done:
            continue
        for p in c.paths():
            if not p.exists():
                continue
            _safe_to_delete(p, root)
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        gone.append(c.step)
    if gone:
        _event(run_dir, {"event": "removed_partial", "steps": gone})
    return gone


def _event(run_dir: Path, rec: dict[str, Any]) -> None:
    with contextlib.suppress(OSError), (run_dir / "rlctl-events.jsonl").open("a") as fh:
        fh.write(json.dumps({"time": time.time(), **rec}) + "\n")
