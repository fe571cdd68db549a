"""env.slurm: the cluster answers, the partition exists, and its nodes can hold resources.nodes x gpus_per_node."""

from __future__ import annotations

import re
import shutil
from typing import Any

from rlctl.executors.slurm import queue


def _gpus(gres: str) -> int:
    """GPUs of a node from sinfo's %G ("gpu:8", "gpu:h100:8(S:0-1)", "(null)")."""
    total = 0
    for part in gres.split(","):
        m = re.match(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", part.strip())
        if m:
            total += int(m.group(1))
    return total


def partition_nodes(partition: str | None) -> list[dict[str, Any]] | None:
    """[{name, gpus, state}] of the partition's nodes (the default partition when None); None when sinfo fails."""
    argv = ["sinfo", "-h", "-N", "-o", "%N|%G|%T|%P"]
    if partition:
        argv += ["-p", partition]
    p = queue._run(argv)
    if p is None or p.returncode != 0:
        return None
    out: dict[str, dict[str, Any]] = {}
    for line in p.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4:
            continue
        if not partition and not parts[3].endswith("*"):
            continue  # the default partition is marked with *
        out.setdefault(parts[0], {"name": parts[0], "gpus": _gpus(parts[1]), "state": parts[2]})
    return list(out.values())


# SLURM sends --signal's signal at its periodic check (every 30 s) once the limit is less than N + 30 s away; the job's
# rlctl needs some seconds to start and install its handler, and the attempt its first steps
SIGNAL_EARLY = 30
START_S = 10


def signal_timing(opts: Any) -> tuple[str, str, int] | None:
    """(what, fix, signal_before that fits) when the time limit leaves the job no time before SLURM's signal."""
    from rlctl.executors.slurm.options import time_seconds

    if not opts.signal_before or not opts.time:
        return None
    limit = time_seconds(opts.time)
    if limit is None or limit >= opts.signal_before + SIGNAL_EARLY + START_S:
        return None
    fits = max(limit - SIGNAL_EARLY - START_S, 0)
    return (f"executor.slurm.signal_before = {opts.signal_before} s with a time limit of {opts.time} ({limit} s): "
            f"SLURM sends USR1 up to {SIGNAL_EARLY} s before it is due, so at the job's start, and every allocation "
            "would stop and requeue itself at once",
            f"--set executor.slurm.signal_before={fits} (or a longer --time)", fits)


def preflight(ctx: Any) -> list[Any]:
    from rlctl.executors.slurm.options import options_of
    from rlctl.preflight import FAIL, OK, Result

    early = signal_timing(options_of(ctx.recipe))
    if early is not None:
        return [Result("env.slurm", FAIL, early[0], early[1], set={"executor.slurm.signal_before": early[2]})]
    if shutil.which("sbatch") is None:
        return [Result("env.slurm", FAIL, "sbatch is not on PATH: this is not a SLURM login node",
                       "launch on the login node, or from here through it: --on LOGIN --executor slurm "
                       "(rlctl hosts add LOGIN ...)")]
    ping = queue._run(["scontrol", "ping"])
    if ping is None or ping.returncode != 0 or "DOWN" in ping.stdout:
        said = (ping.stdout + ping.stderr).strip() if ping else "no answer"
        return [Result("env.slurm", FAIL, f"slurmctld does not answer: {said[-200:]}",
                       "check the cluster (scontrol ping) or SLURM_CONF")]
    r = ctx.recipe
    opts = options_of(r)
    nodes = partition_nodes(opts.partition)
    where = f"partition {opts.partition}" if opts.partition else "the default partition"
    if nodes is None or not nodes:
        return [Result("env.slurm", FAIL, f"{where} has no nodes (sinfo)",
                       "name an existing partition: [executor.slurm] partition or --partition (sinfo lists them)")]
    need_nodes, need_gpus = r.resources.nodes, r.resources.gpus_per_node
    fit = [n for n in nodes if n["gpus"] >= need_gpus] if need_gpus else nodes
    figure = f"{where}: {len(nodes)} node(s), GPUs per node {sorted({n['gpus'] for n in nodes})}"
    if len(fit) < need_nodes:
        return [Result("env.slurm", FAIL, f"{figure}; the recipe needs {need_nodes} node(s) x {need_gpus} GPU(s) "
                       "(resources.nodes x gpus_per_node)",
                       "choose a partition with such nodes, or lower resources.nodes / gpus_per_node")]
    return [Result("env.slurm", OK, f"{figure}; the job asks for {need_nodes} x {need_gpus} GPU(s)")]
