"""`rlctl eval RUN --executor slurm`: each eval job by hand is a batch job of its own (one node, one task, one GPU
when the recipe trains on GPUs), submitted from the login node with the run's `[executor.slurm]` placement
(partition, account, qos, constraint, setup, python; `--partition/--account/--time` override). The jobs of
`--all` are submitted at once, so SLURM runs them side by side as nodes free up; each writes its results next to
its spec in the run's evals/ (the shared filesystem) and the login node records them as a local eval by hand does.

The run's own checkpoint evals (the supervisor's) are not this: they run inside the run's allocation, on the GPU
the memory plan gives the evaluator, as on any machine (docs/slurm.md).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlctl.executors.slurm import queue
from rlctl.executors.slurm.options import SlurmOptions
from rlctl.executors.slurm.script import sbatch_lines

POLL_S = 1.0
SILENT_S = 300.0  # how long SLURM may not answer before `rlctl eval` gives up waiting (the jobs go on)


def _gres(opts: SlurmOptions, gpus: int) -> str | None:
    """One GPU of the kind the run asks for (`gpu:h100:8` -> `gpu:h100:1`), none for a CPU recipe."""
    if not gpus:
        return None
    m = re.match(r"^gpu(:[A-Za-z0-9_.-]+)?:\d+$", opts.gres or "")
    return f"gpu{m.group(1) or ''}:1" if m else "gpu:1"


def job_options(opts: SlurmOptions, gpus: int, timeout_s: float, time_given: bool) -> SlurmOptions:
    """The run's placement for one eval job: one node, one GPU at most, no requeue or signal (a job by hand that
    fails is said and run again by hand), and a time limit from eval.timeout_s unless --time was given."""
    limit = opts.time if time_given else str(math.ceil((timeout_s + 600) / 60))  # minutes, with loading the model
    return opts.model_copy(update={"gres": _gres(opts, gpus), "requeue": False, "signal_before": 0, "time": limit})


def render(step: int, name: str, spec_file: Path, log: Path, opts: SlurmOptions, python: str) -> str:
    from rlctl.executors.slurm.script import JobShape

    q = shlex.quote
    shape = JobShape(f"eval-{name}-step-{step}")
    lines = ["#!/bin/bash", f"# rendered by rlctl: eval job of step {step} of {name} (docs/slurm.md)"]
    lines += [f"#SBATCH {x}" for x in sbatch_lines(shape, opts, str(log.parent))
              if not x.startswith("--output=")]
    lines += [f"#SBATCH --output={log}", "set -uo pipefail", f"SPEC={q(str(spec_file))}",
              'if [ ! -f "$SPEC" ]; then',
              '  echo "rlctl: $SPEC is not visible on node ${SLURMD_NODENAME:-$(hostname)}: the run directory must be '
              'on a filesystem shared by the login and compute nodes" >&2',
              "  exit 2", "fi", 'cd "$(dirname "$SPEC")"']
    if opts.setup:
        lines += ["", "# ---- setup ([executor.slurm] setup)", opts.setup]
    lines += ["export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false",
              f'exec {python} -m rlctl.evals.job "$SPEC"', ""]
    return "\n".join(lines)


def eval_jobs(ev: dict[str, Any], jobs: list[tuple[int, str]], out_dir: Path, run_dir: Path | None,
              recipe: Any, placement: dict[str, str | None], out: Any = None) -> Iterator[dict[str, Any]]:
    """Submit one batch job per (step, model), all at once, and yield each one's answer as it ends:
    {step, model, metrics, error, log_tail, job}. Ctrl-C cancels the jobs still queued or running."""
    from rlctl.errors import RlctlError
    from rlctl.evals.loop import log_tail, read_result, write_job
    from rlctl.executors.slurm.options import options_of, python_of

    out = out or sys.stderr
    for key, value in placement.items():
        if value is not None:
            recipe.executor.place("slurm", key, value, f"--{key}")
    opts = job_options(options_of(recipe), recipe.resources.gpus_per_node, float(ev.get("timeout_s") or 3600),
                       placement.get("time") is not None)
    name = run_dir.name if run_dir is not None else Path(jobs[0][1]).name
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    submitted: dict[str, tuple[int, str, Path, Path, int]] = {}
    try:
        for step, model in jobs:
            spec_file, out_file, log = write_job(out_dir, ev, step, model, ev["sets"], run_dir)
            before = log.stat().st_size if log.is_file() else 0  # the job appends: grown once it ran there
            script = spec_file.with_suffix(".sbatch")
            script.write_text(render(step, name, spec_file, log, opts, python_of(opts)))
            try:
                job = queue.submit(str(script), env, str(spec_file.parent))
            except RuntimeError as e:
                raise RlctlError(f"sbatch refused the eval job of step {step}: {e}", hint=f"see {script}") from None
            submitted[job] = (step, model, out_file, log, before)
            print(f"rlctl: step {step}: SLURM job {job} ({script})", file=out, flush=True)
        answered = time.time()
        while submitted:
            for job, (step, model, out_file, log, before) in list(submitted.items()):
                info = queue.job_info(job)
                if info is None:  # SLURM did not answer this time
                    if time.time() - answered > SILENT_S:
                        raise RlctlError(f"SLURM has not answered for {SILENT_S:.0f} s (scontrol show job {job}); the "
                                         f"eval job(s) {', '.join(submitted)} may still run",
                                         hint="check the cluster (scontrol ping), then run the command again")
                    continue
                answered = time.time()
                if info is not False and not info.ended:
                    continue  # queued or running
                del submitted[job]
                code = info.exit_code if info else None
                metrics, failure = read_result(out_file, log, code)
                if failure and info and info.state != "COMPLETED":
                    words = queue.ENDED.get(info.state, ("failed", f"the job ended {info.state}"))[1]
                    reached = log.is_file() and log.stat().st_size > before
                    failure = f"SLURM job {job}: {words}" + ("" if reached else (
                        f"; it never wrote {log}: the run directory must be on a filesystem the compute nodes "
                        "share")) + f" ({failure})"
                yield {"step": step, "model": model, "metrics": metrics, "error": failure, "job": f"SLURM job {job}",
                       "log_tail": log_tail(log) if failure else ""}
            if submitted:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        for job in submitted:
            queue.scancel(job)
        print(f"\nrlctl: cancelled SLURM job(s) {', '.join(submitted)}", file=out)
        raise
