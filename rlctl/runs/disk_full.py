"""A run that ended because its disk filled, told from what a full disk leaves behind: less than 1 MiB free where the
run writes (what `status` reads for a running run too), rlctl's own writes refused (state.json's `disk_full`), or
the trainer's "No space left on device" at the end of its log while a checkpoint was being saved. Such a run is
`failed` (not `lost`, which is what a full disk makes of a run whose outcome could not be written), with the cause
"disk full on HOST while saving checkpoint-N".

The evidence is read here; rlctl.runs.causes (the one place that names causes) decides and says it. The cause is
found where the run lives (on its host for a run on an SSH host: the host's status answer carries it) and kept in
state.json as `cause` as soon as it can be written (here, and in the laptop's record of a remote run), so that it is
said for as long as the run is listed, its host reachable, removed or not.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

LOW = 1 << 20  # bytes free below which a disk counts as full (nothing a run writes fits any more)
SIGNS = ("No space left on device", "Disk quota exceeded", "os error 28", "[Errno 28]", "[Errno 122]")
TAIL = 64 * 1024  # a write that fails ends the attempt: its message is in the last lines


def low_disk(run_dir: Path) -> str | None:
    """"N bytes free at PATH" when the disk where the run (or its checkpoint directory) writes is full, else None."""
    from rlctl.runs.checkpoints import checkpoint_dir

    return low_disk_at(run_dir, checkpoint_dir(run_dir))


def low_disk_at(*paths: Path) -> str | None:
    """"N bytes free at PATH" for the first of these whose disk is full, else None."""
    for where in paths:
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            continue
        if free < LOW:
            return f"{free} bytes free at {where}"
    return None


def log_sign(log: Path) -> str | None:
    """The last line of the log's tail that says a write found no space, or None."""
    if not log.is_file():  # missing, or a FIFO/device that would block
        return None
    try:
        with log.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(fh.tell() - TAIL, 0))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    hits = [ln.strip() for ln in text.splitlines() if any(s in ln for s in SIGNS)]
    return hits[-1][:300] if hits else None


def saving(run_dir: Path, backend: str) -> str | None:
    """The checkpoint being saved when the run ended: the newest one, incomplete and newer than every complete one
    (its folder's name, e.g. checkpoint-4), or None."""
    from rlctl.runs.checkpoints import find_checkpoints

    try:
        ckpts = find_checkpoints(backend, run_dir)
    except Exception:  # a damaged layout: no checkpoint named
        return None
    done = max((c.step for c in ckpts if c.complete), default=-1)
    pending = [c for c in ckpts if not c.complete and c.step > done]
    return Path(pending[-1].path).name if pending else None


def find_cause(run_dir: Path, state: dict[str, Any]) -> dict[str, Any] | None:
    """{"what": "disk full", "checkpoint": name or None, "evidence": [...]} for a run that ended (failed, or lost:
    its outcome never written) because its disk filled; None when nothing says so."""
    evidence = []
    low = low_disk(run_dir)
    if low:
        evidence.append(low)
    if state.get("disk_full"):
        evidence.append(f"rlctl could not write {state['disk_full']}")
    ckpt = saving(run_dir, str(state.get("backend") or ""))
    sign = log_sign(run_dir / "stdout.log")
    if sign and (low or ckpt):  # a message alone may be another disk's (/dev/shm): with a save cut short, it is ours
        evidence.append(f"the log: {sign}")
    if not evidence:
        return None
    return {"what": "disk full", "checkpoint": ckpt, "evidence": evidence}


def full_while(doing: str, host: str | None) -> str:
    """"disk full on HOST while DOING", as `say` words a run's cause (HOST: the host's name as hosts.toml has it,
    when the laptop said it, else this machine's name)."""
    return f"disk full on {host or socket.gethostname()} while {doing}"
