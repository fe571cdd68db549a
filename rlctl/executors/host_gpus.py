"""The GPUs a run was placed on at its launch on a host, against what the host's `nvidia-smi` says now: an attempt
whose host answers and whose processes live, but whose GPUs are gone (fallen off the bus, Xid 79; a rented pod's
GPUs taken back while its container lives), cannot progress, and failover treats it as gone (docs/resilience.md).

Host side (rlctl.executors.ssh_remote): `record(run_dir)` at launch writes `host_gpus.json` into the run directory
(nothing for a CPU run or a host without GPUs: such an attempt is never judged); `check(run_dir)` at a poll answers
which of them are gone, with what nvidia-smi said. UUIDs decide (indices shift when a GPU drops out), else the bus id.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

RECORD = "host_gpus.json"
# the same query as recorded on a real 2 x H100 pod (docs/gpu/gpu_placement_h100x2.json: nvidia_smi_uuid_raw)
QUERY = ("--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader")
ASK_TIMEOUT_S = 10.0


def ask(timeout: float = ASK_TIMEOUT_S) -> tuple[str, int | None]:
    """(what `nvidia-smi` printed, its exit status): 127 when it is not installed, None when it did not answer in
    time (a driver in trouble can hang it: not evidence either way)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi: not found on PATH", 127
    try:
        p = subprocess.run([exe, *QUERY], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"nvidia-smi did not answer within {timeout:g} s", None
    except OSError as e:
        return f"nvidia-smi: {e}", 127
    return (p.stdout + p.stderr), p.returncode


def parse(text: str) -> list[dict[str, Any]]:
    """The rows of `nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader`; other lines (its error
    messages) are skipped."""
    rows = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and parts[1].startswith(("GPU-", "MIG-")):
            rows.append({"index": int(parts[0]), "uuid": parts[1], "bus_id": parts[2]})
    return rows


def placed(gpus_per_node: int, visible: str | None, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the GPUs the run takes: CUDA_VISIBLE_DEVICES of its environment (indices or UUID prefixes, as
    CUDA reads them) when set, else the first gpus_per_node; none for a CPU run (no GPU asked for, none named)."""
    if visible is None:
        return rows[:gpus_per_node] if gpus_per_node > 0 else []
    out = []
    for tok in (t.strip() for t in visible.split(",")):
        if not tok:
            continue
        hit = next((r for r in rows if (tok.isdigit() and r["index"] == int(tok))
                    or (not tok.isdigit() and r["uuid"].startswith(tok))), None)
        if hit is None:
            break  # CUDA stops at the first id it does not know
        out.append(hit)
    return out[:gpus_per_node] if gpus_per_node > 0 else out


def gone(recorded: list[dict[str, Any]], said: str, rc: int | None) -> dict[str, Any] | None:
    """{"missing": the recorded GPUs nvidia-smi no longer lists, "said": its words} or None (all there, nothing
    recorded, or no answer in time)."""
    if not recorded or rc is None:
        return None
    now = parse(said)
    uuids, buses = {r["uuid"] for r in now}, {r["bus_id"] for r in now}
    missing = [g for g in recorded if (g.get("uuid") not in uuids if g.get("uuid") else g.get("bus_id") not in buses)]
    if not missing:
        return None
    lines = [ln.strip() for ln in said.splitlines() if ln.strip() and not parse(ln)]
    words = "; ".join(lines[:3]) or f"it lists {len(now)} GPU(s) (exit {rc})"
    return {"missing": missing, "said": words}


def why(found: dict[str, Any]) -> str:
    """How status and the watcher name it: "its GPUs gone: GPU 1 (GPU-61af..., 00000000:00:07.0); nvidia-smi: ..."."""
    gpus = ", ".join(f"GPU {g.get('index')} ({g.get('uuid')}, {g.get('bus_id')})" for g in found["missing"])
    return f"its GPUs gone: {gpus}; nvidia-smi: {found['said']}"


def record(run_dir: Path, gpus_per_node: int, visible: str | None) -> list[dict[str, Any]]:
    """At launch on this host: the GPUs the run was placed on, as nvidia-smi lists them now, kept in the run
    directory (nothing is written when there are none)."""
    said, rc = ask()
    rows = placed(gpus_per_node, visible, parse(said) if rc == 0 else [])
    if rows:
        (run_dir / RECORD).write_text(json.dumps({"gpus": rows, "visible": visible}, indent=1))
    return rows


def check(run_dir: Path) -> dict[str, Any] | None:
    """At a poll: the run's recorded GPUs that are gone now (see gone), None when all are there or none recorded."""
    try:
        recorded = json.loads((run_dir / RECORD).read_text()).get("gpus") or []
    except (OSError, ValueError):
        return None
    if not recorded:
        return None
    return gone(recorded, *ask())
