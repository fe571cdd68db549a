"""Inside a SLURM allocation: `python -m rlctl.executors.slurm.job RUN_DIR` (the last line of the sbatch script).

Runs rlctl's supervisor on the job's first node, as `rlctl supervise` would: restarts inside the allocation are its
own. What is SLURM's:
- a requeued job (SLURM_RESTART_COUNT > 0, or a run that already ran attempts) resumes from the last complete
  checkpoint, as a local restart does;
- USR1 (sbatch --signal=B:USR1@N, N seconds before the time limit): the attempt is asked to stop (a backend that saves
  on SIGTERM saves; any other stops at its last complete checkpoint), then the job requeues itself
  (`scontrol requeue`), so a long run spans many allocations;
- SIGTERM that `rlctl stop` did not ask for (preemption, the time limit, a requeue, a failed node): the attempt is
  stopped the same way, and the run is recorded as not over — SLURM then requeues the job, or says how it ended
  (timeout, preempted, node failure), which `rlctl status` reads.

`python -m rlctl.executors.slurm.job wait-ray RUN_DIR --address URL --nodes-file F --timeout S`: wait until every
node of the allocation has joined the job's Ray cluster; fail naming the nodes that did not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlctl.core.state import read_state, write_state
from rlctl.metrics.stream import LOG
from rlctl.runs.supervisor import Supervisor, read_spec

ALLOCATIONS = "slurm_allocations"


def _say(run_dir: Path, text: str) -> None:
    """A line in the run's log (what `rlctl logs` shows) and in the job's own output."""
    print(f"rlctl: {text}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError), (run_dir / LOG).open("a") as fh:
        fh.write(f"rlctl: {text}\n")


class JobSupervisor(Supervisor):
    """The supervisor of one allocation: a stop SLURM asked for ends the allocation, not the run."""

    lost: str | None = None  # why the allocation ends (SLURM's signal), None for a run that ends here
    requeue: bool = False  # USR1: requeue the job once the attempt stopped

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_term(self, signum: int, frame: Any = None) -> None:
        asked = read_state(self.run_dir).get("stop_requested_at")
        if not (isinstance(asked, (int, float)) and asked >= self.began) and self.lost is None:
            self.lost = f"SLURM sent {signal.Signals(signum).name}"  # preemption, time limit, requeue, node
        self.request_stop(signum, frame)

    def _on_usr1(self, signum: int, frame: Any = None) -> None:
        if self.lost is None:
            self.lost = "the time limit is near (SLURM's USR1)"
            self.requeue = True
            self._mark_log("the job's time limit is near: stopping at a checkpoint, then requeueing the job")
        self.request_stop(signal.SIGTERM, frame)

    began: float = 0.0

    def finish(self, code: int, why: str, gave_up: str | None = None) -> int:
        if self.lost is None:
            return super().finish(code, why, gave_up)
        # the allocation ends, the run does not: what a finished run does, except record an outcome
        self._ingest(final=True, wait=True)
        self.evals_hook("kill")
        self.sink_pump(close=True)
        if self.spec.get("sync"):
            self._sync(final=True)
        if self.attempts:
            self.attempts[-1]["outcome"] = "allocation ended"
        self.state(status="queued" if self.requeue else "stopping", stop_requested_at=None, attempts=self.attempts,
                   exit_code=code, slurm_interrupted={"why": self.lost, "at": time.time(),
                                                      "job_id": os.environ.get("SLURM_JOB_ID")})
        return code


def _record_allocation(run_dir: Path) -> dict[str, Any]:
    entry = {"job_id": os.environ.get("SLURM_JOB_ID"), "restart": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
             "node": os.environ.get("SLURMD_NODENAME"), "nodes": os.environ.get("SLURM_JOB_NODELIST"),
             "started_at": time.time()}
    allocs = list(read_state(run_dir).get(ALLOCATIONS) or [])
    allocs.append(entry)
    write_state(run_dir, **{ALLOCATIONS: allocs[-50:]}, slurm_state="RUNNING", slurm_nodes=entry["nodes"],
                slurm_reason=None)
    return entry


def _check_allocation(run_dir: Path, spec: dict[str, Any]) -> str | None:
    """The allocation against the recipe: its nodes, and GPUs per node when the recipe uses them."""
    want = spec.get("slurm") or {}
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    if want.get("nodes") and nodes != want["nodes"]:
        return (f"the allocation has {nodes} node(s), the recipe places its work on {want['nodes']} "
                "(resources.nodes)")
    gpus = want.get("gpus_per_node") or 0
    if gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        have = len([x for x in (visible or "").split(",") if x.strip()]) if visible is not None else None
        if have is not None and have < gpus:
            return (f"node {os.environ.get('SLURMD_NODENAME')} gives the job {have} GPU(s) (CUDA_VISIBLE_DEVICES="
                    f"{visible}); the recipe needs {gpus} per node (resources.gpus_per_node): ask for them with "
                    "[executor.slurm] gres")
    return None


def run(run_dir: Path) -> int:
    spec = read_spec(run_dir)
    entry = _record_allocation(run_dir)
    problem = _check_allocation(run_dir, spec)
    if problem:
        _say(run_dir, problem)
        write_state(run_dir, status="failed", ended_at=time.time(), error=problem)
        return 2
    state = read_state(run_dir)
    if state.get("status") == "finished":  # requeued after the run recorded its end (a node lost at the very end)
        _say(run_dir, f"SLURM job {entry['job_id']} allocation {entry['restart'] + 1}: the run has finished already")
        return 0
    again = entry["restart"] > 0 or bool(state.get("attempts"))
    if again:
        # the processes of the last allocation are gone with it: the next attempt starts from the last complete
        # checkpoint (the supervisor's resume), never adopts. Said as starting (a status of a run that goes on:
        # `rlctl status`, `resume` and a following `launch` see it as active) until the supervisor restarts it
        why = (state.get("slurm_interrupted") or {}).get("why") or "requeued"
        write_state(run_dir, status="starting", stop_requested_at=None)
        _say(run_dir, f"SLURM job {entry['job_id']} allocation {entry['restart'] + 1} on {entry['node']} "
                      f"(the last one ended: {why})")
    sup = JobSupervisor(run_dir, spec, dict(os.environ))
    sup.began = entry["started_at"]
    sup.install_signal_handlers()
    try:
        code = sup.resume(gone="requeued") if again else sup.run()
    except Exception as e:  # an error rlctl can name: the run failed, said where `rlctl status` looks
        _say(run_dir, f"{type(e).__name__}: {e}")
        write_state(run_dir, status="failed", ended_at=time.time(), error=str(e))
        return 1
    if sup.requeue:
        _say(run_dir, f"requeueing SLURM job {entry['job_id']}: the next allocation resumes from the last complete "
                      "checkpoint")
        p = subprocess.run(["scontrol", "requeue", str(entry["job_id"])], capture_output=True, text=True)
        if p.returncode != 0:
            _say(run_dir, f"scontrol requeue failed: {(p.stderr or p.stdout).strip()} (the job needs --requeue: "
                          "[executor.slurm] requeue = true)")
            write_state(run_dir, status="stopping")  # SLURM ends it at the limit: said as timeout
            return code
        time.sleep(60)  # SLURM ends this allocation now
    return code


def wait_ray(run_dir: Path, address: str, nodes_file: Path, timeout: float) -> int:
    """Every node of the allocation in the Ray cluster, or a failure naming those that are not (never a hang)."""
    from rlctl.errors import RlctlError
    from rlctl.executors.ray import cluster_info

    deadline = time.time() + timeout
    nodes: dict[str, str] = {}
    joined: set[str] = set()
    head_up = False
    while time.time() < deadline:
        with contextlib.suppress(OSError):
            nodes = dict(line.split()[:2] for line in nodes_file.read_text().splitlines() if len(line.split()) >= 2)
        try:
            info = cluster_info(address, timeout=5)
            head_up = True
            joined = {n["ip"] for n in info["nodes"]}
        except RlctlError:
            pass
        if nodes and all(ip in joined for ip in nodes.values()):
            _say(run_dir, f"Ray cluster up: {len(nodes)} node(s) joined ({', '.join(sorted(nodes))})")
            return 0
        time.sleep(2)
    missing = sorted(n for n, ip in nodes.items() if ip not in joined)
    job = os.environ.get("SLURM_JOB_ID", "")
    if not head_up:
        msg = f"the Ray head at {address} did not answer within {timeout:.0f} s"
    else:
        msg = (f"node(s) {', '.join(missing) or '?'} did not join the Ray cluster within {timeout:.0f} s "
               f"({len(joined)} of {len(nodes)} joined)")
    msg += f"; see {run_dir}/slurm-{job}.out"
    _say(run_dir, msg)
    write_state(run_dir, status="failed", ended_at=time.time(), error=msg)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "wait-ray":
        p = argparse.ArgumentParser(prog="rlctl.executors.slurm.job wait-ray")
        p.add_argument("run_dir")
        p.add_argument("--address", required=True)
        p.add_argument("--nodes-file", required=True)
        p.add_argument("--timeout", type=float, default=300)
        a = p.parse_args(args[1:])
        return wait_ray(Path(a.run_dir), a.address, Path(a.nodes_file), a.timeout)
    return run(Path(args[0]).resolve())


if __name__ == "__main__":
    sys.exit(main())
