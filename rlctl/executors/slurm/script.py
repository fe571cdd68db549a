"""The sbatch script of a run: what `rlctl render` shows and `rlctl launch --executor slurm` submits.

One script per run, the same for every allocation of it (a requeued job runs it again; SLURM_RESTART_COUNT tells
the in-job rlctl to resume from the last complete checkpoint). Its body: check the run directory is visible (a
filesystem shared by the login and compute nodes), the user's `setup` line, for a backend that runs on Ray a Ray
cluster over the allocation (head on the first node, a worker on each other through srun, then a wait that names
any node that did not join), then `python -m rlctl.executors.slurm.job RUN_DIR`: rlctl's supervisor on the first
node, which restarts within the allocation as anywhere, and checkpoints and requeues on SLURM's signal before the
time limit.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.executors.slurm.options import SlurmOptions

JOB_MODULE = "rlctl.executors.slurm.job"
SCRIPT = "slurm.sbatch"
NODES_FILE = "slurm-nodes-${SLURM_JOB_ID}.txt"  # "<node> <ip>" of each node of the allocation, written by the job


@dataclass
class JobShape:
    """What the recipe asks of the allocation, and how a multi-node run is brought up there."""

    name: str
    nodes: int = 1
    gpus_per_node: int = 0
    cluster: str | None = None  # "ray" | "torchrun" | None: what the backend needs across nodes
    extra_env: dict[str, str] = field(default_factory=dict)


def sbatch_lines(shape: JobShape, opts: SlurmOptions, run_dir: str) -> list[str]:
    lines = [f"--job-name=rlctl-{shape.name}"[:120], f"--output={run_dir}/slurm-%j.out", "--open-mode=append",
             f"--nodes={shape.nodes}", "--ntasks-per-node=1"]
    gres = opts.gres or (f"gpu:{shape.gpus_per_node}" if shape.gpus_per_node else None)
    if gres:
        lines.append(f"--gres={gres}")
    for key, flag in (("partition", "partition"), ("account", "account"), ("qos", "qos"), ("time", "time"),
                      ("mem", "mem"), ("constraint", "constraint")):
        value = getattr(opts, key)
        if value:
            lines.append(f"--{flag}={value}")
    if opts.cpus_per_node:
        lines.append(f"--cpus-per-task={opts.cpus_per_node}")
    if opts.requeue:
        lines.append("--requeue")
    if opts.signal_before and opts.time and opts.time.upper() not in ("UNLIMITED", "INFINITE"):
        lines.append(f"--signal=B:USR1@{opts.signal_before}")
    lines.append("--export=ALL")  # the environment rlctl resolved for the run (secrets never in this file)
    lines += list(opts.sbatch)
    return lines


def _ray_block(shape: JobShape, opts: SlurmOptions, python: str, run_dir: str) -> list[str]:
    """A Ray cluster over the allocation, the way the backends' own SLURM examples start one (verl's
    ray_on_slurm.slurm, OpenRLHF's train_ppo_llama_ray_slurm.sh), plus what they lack: a bounded wait that names a
    node that did not join."""
    g = shape.gpus_per_node
    ray = ray_cli(python)
    per_node = 'export RAY_TMPDIR=/tmp/rlctl-ray-$SLURM_JOB_ID-$SLURMD_NODENAME; mkdir -p "$RAY_TMPDIR"; '
    head = (f"{per_node}exec {ray} start --head --node-ip-address=$head_ip --port={opts.ray_port} --num-gpus={g} "
            "--include-dashboard=true --dashboard-host=0.0.0.0 --dashboard-port=8265 --disable-usage-stats --block")
    worker = (f"{per_node}exec {ray} start --address=$head_ip:{opts.ray_port} --num-gpus={g} "
              "--disable-usage-stats --block")
    return [
        "",
        f"# ---- a Ray cluster over the {shape.nodes} node(s): head on the first, a worker on each other (srun)",
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        'head_node=${nodes[0]}',
        "export head_ip=$(hostname -I | awk '{print $1}')  # seen by the srun steps below",
        f'nodes_file="{run_dir}/{NODES_FILE}"',
        "srun --overlap --nodes=$SLURM_JOB_NUM_NODES --ntasks=$SLURM_JOB_NUM_NODES --ntasks-per-node=1 "
        "bash -c 'echo $SLURMD_NODENAME $(hostname -I | cut -d\" \" -f1)' > \"$nodes_file\"",
        'echo "rlctl: Ray head on $head_node ($head_ip:' + str(opts.ray_port) + ')"',
        f'srun --overlap --nodes=1 --ntasks=1 -w "$head_node" bash -c {shlex.quote(head)} &',
        'for node in "${nodes[@]:1}"; do',
        f'  srun --overlap --nodes=1 --ntasks=1 -w "$node" bash -c {shlex.quote(worker)} &',
        "done",
        f'{python} -m {JOB_MODULE} wait-ray "$RUN_DIR" --address "http://$head_ip:8265" --nodes-file "$nodes_file" '
        f"--timeout {opts.join_timeout} || exit 1",
        f"export RAY_ADDRESS=$head_ip:{opts.ray_port}  # ray.init() and `ray job submit` of the backend use it",
    ]


def ray_cli(python: str) -> str:
    """`ray` beside the job's interpreter (a venv on the shared filesystem), else the one on PATH after setup."""
    p = Path(python)
    return str(p.with_name("ray")) if p.is_absolute() and p.with_name("ray").exists() else "ray"


def _torchrun_block(opts: SlurmOptions) -> list[str]:
    return [
        "",
        "# ---- torchrun on every node (srun), rendezvous on the first: torchrun reads PET_<OPTION> variables",
        'export PET_NNODES=$SLURM_JOB_NUM_NODES PET_RDZV_BACKEND=c10d PET_RDZV_ID=$SLURM_JOB_ID',
        f'export PET_RDZV_ENDPOINT=$(hostname -I | awk \'{{print $1}}\'):{opts.rdzv_port}',
    ]


def render(shape: JobShape, opts: SlurmOptions, run_dir: str, python: str) -> str:
    """The whole sbatch script."""
    q = shlex.quote
    lines = ["#!/bin/bash", f"# rendered by rlctl: the SLURM job of run {shape.name} (docs/slurm.md)"]
    lines += [f"#SBATCH {x}" for x in sbatch_lines(shape, opts, run_dir)]
    lines += [
        "set -uo pipefail",
        "# SLURM's USR1 before the time limit is for rlctl's handler; before it is in place (a Ray bring-up, Python's",
        "# start) it is ignored, not fatal (the default): the job then runs to its limit, said as timeout",
        "trap '' USR1",
        f"RUN_DIR={q(run_dir)}",
        "# the run directory as the login node wrote it must be visible here: a filesystem both share",
        'if [ ! -f "$RUN_DIR/.launch.json" ]; then',
        '  echo "rlctl: the run directory $RUN_DIR is not visible on node ${SLURMD_NODENAME:-$(hostname)}: rlctl '
        'needs a filesystem shared by the login and compute nodes (launch from a directory on it, or set '
        'RLCTL_RUNS_DIR)" >&2',
        "  exit 2",
        "fi",
        'cd "$RUN_DIR"',
    ]
    if opts.setup:
        lines += ["", "# ---- setup ([executor.slurm] setup)", opts.setup]
    for k, v in shape.extra_env.items():
        lines.append(f"export {k}={q(v)}")
    if shape.nodes > 1 and shape.cluster == "ray":
        lines += _ray_block(shape, opts, python, "$RUN_DIR")
    elif shape.nodes > 1 and shape.cluster == "torchrun":
        lines += _torchrun_block(opts)
    lines += ["", "# ---- rlctl's supervisor on the first node (restarts, metrics, checkpoints; requeue on USR1)",
              f'exec {python} -m {JOB_MODULE} "$RUN_DIR"', ""]
    return "\n".join(lines)


def shape_of(recipe: Any, backend: Any) -> JobShape:
    cluster = None
    ask = getattr(backend, "multi_node", None)
    if ask is not None:
        cluster = ask(recipe)
    return JobShape(recipe.name, recipe.resources.nodes, recipe.resources.gpus_per_node, cluster)
