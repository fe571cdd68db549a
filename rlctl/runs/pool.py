"""Pools: several places a run may go (`[run] on = ["box1", "box2"]`, `--on box1,box2`), and whether one fits the
plan, judged from the facts it reports (rlctl.core.facts.MachineFacts: GPUs with their memory, free disk where runs
go, as `rlctl hosts check` shows them). Which places exist and how their facts are read is the executor's business;
this module knows only the plan and the facts."""

from __future__ import annotations

from typing import Any

from rlctl.core.sizes import human_bytes

GiB = 1024**3


def plan_needs(prep: Any) -> dict[str, Any]:
    """What a place must offer for this plan: GPUs on one machine, each GPU's memory for the trainer (the memory
    plan, when rlctl could compute it), and disk for the checkpoints kept (with the recipe's headroom); None where
    the plan cannot say."""
    from rlctl import preflight as pf

    r = prep.recipe
    needs: dict[str, Any] = {"gpus": int(r.resources.gpus_per_node) if r.resources.gpus_per_node else 0,
                             "gpu_bytes": None, "disk_bytes": None,
                             "disk_headroom": float(r.preflight.disk_headroom)}
    try:
        results = pf.run(prep, only=["disk", "memory"])
    except Exception:  # the plan says what it can: a place is then judged on what is known
        return needs
    for res in results:
        data = res.data or {}
        if res.check == "disk.checkpoints" and data.get("count") and data.get("per_checkpoint"):
            needs["disk_bytes"] = int(data["per_checkpoint"] * data["count"])
        if res.check == "memory.trainer" and data.get("per_gpu_bytes"):
            needs["gpu_bytes"] = int(data["per_gpu_bytes"])
    return needs


_size = human_bytes  # the one formatter (rlctl.core.sizes)


def misfit(facts: dict[str, Any], needs: dict[str, Any]) -> str | None:
    """Why a place with these facts cannot take the plan (GPUs, their memory, disk), or None when it fits."""
    want = int(needs.get("gpus") or 0)
    gpus = facts.get("gpus")
    if want:
        have = len(gpus or [])
        if have < want:
            note = f" ({facts['gpu_note']})" if not gpus and facts.get("gpu_note") else ""
            return f"{have} GPU(s){note}, the plan needs {want}"
        per = needs.get("gpu_bytes")
        if per:
            big = [g for g in gpus or [] if (g.get("memory_total_gib") or 0) * GiB >= per]
            if len(big) < want:
                return (f"{len(big)} GPU(s) with {per / GiB:.1f} GiB or more, the plan needs {want} "
                        f"(its memory plan: {per / GiB:.1f} GiB per GPU)")
    disk = needs.get("disk_bytes")
    free = facts.get("disk_free")
    if disk and free is not None:
        usable = free * (1 - float(needs.get("disk_headroom") or 0))
        if disk > usable:
            return (f"{_size(free)} free in {facts.get('disk_path') or 'its workdir'}, the plan's checkpoints need "
                    f"{_size(disk)}")
    return None
