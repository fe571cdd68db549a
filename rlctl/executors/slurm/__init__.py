"""The SLURM executor: a run is one batch job on a SLURM cluster, submitted from the login node (or from a laptop
through the login node as an SSH host: `--on login --executor slurm`).

The job runs rlctl's own supervisor on its first node (`rlctl.executors.slurm.job`), so restarts inside an
allocation, metrics, checkpoints, pruning and evals are the same as anywhere; each attempt there is a local process
group (this class inherits the local executor's attempt verbs). The run directory lives on a filesystem shared by the
login and compute nodes: the supervisor writes state.json, stdout.log and metrics there, and `status`, `logs`,
`metrics`, `doctor`, `ckpt` on the login node read them as for a local run. What only SLURM knows — queued, and how a
job that left the queue ended (completed, failed, cancelled, timeout, preempted, node failure) — comes from
`scontrol` (and `sacct` when the cluster keeps accounting); see queue.py. Requeue (preemption, a failed node,
`scontrol requeue`, the job's own USR1 before its time limit) brings the job back from the last complete checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from rlctl.core.state import ACTIVE, read_state, update_state, write_state
from rlctl.errors import RlctlError
from rlctl.executors.base import RunHandle
from rlctl.executors.local import LocalExecutor
from rlctl.executors.slurm import queue
from rlctl.executors.slurm.options import SlurmOptions, options_of, python_of
from rlctl.executors.slurm.script import SCRIPT, render, shape_of

NAME = "slurm"
ALLOCATIONS = "slurm_allocations"  # state.json: one record per allocation the job ran in


def render_script(recipe: Any, backend: Any, run_dir: str) -> str:
    opts = options_of(recipe)
    return render(shape_of(recipe, backend), opts, run_dir, python_of(opts))


def _job_id(state: dict[str, Any]) -> str | None:
    handle = state.get("handle") or {}
    ref = handle.get("ref") or {} if isinstance(handle, dict) else {}
    return str(ref.get("job_id") or state.get("slurm_job_id") or "") or None


def _unchanged(seen: dict[str, Any], now: dict[str, Any]) -> bool:
    """The run's own record is as it was when the login node asked SLURM: the job's rlctl wrote nothing since (a new
    allocation, a new status), so SLURM's answer is still news."""
    return now.get("status") == seen.get("status") and \
        len(now.get(ALLOCATIONS) or []) == len(seen.get(ALLOCATIONS) or [])


class SlurmExecutor(LocalExecutor):
    name: ClassVar[str] = NAME
    remote: ClassVar[bool] = True  # the job runs on compute nodes: their GPUs and packages, not the login node's
    gives_ray_cluster: ClassVar[bool] = True
    queues_jobs: ClassVar[bool] = True  # a sweep hands SLURM every variant at once: its queue decides what runs when
    checks: ClassVar[tuple[str, ...]] = ("env.slurm",)
    table_model: ClassVar[type] = SlurmOptions

    # ---- checks ------------------------------------------------------------------------------------------------
    def preflight(self, ctx: Any) -> list[Any]:
        from rlctl.executors.slurm.checks import preflight

        return preflight(ctx)

    def render_files(self, recipe: Any, backend: Any) -> dict[str, str]:
        """What `rlctl render` shows besides the backend's plan: the sbatch script (with RUN_DIR as a placeholder)."""
        return {SCRIPT: render_script(recipe, backend, "RUN_DIR")}

    # ---- launch (the login node) --------------------------------------------------------------------------------
    def command(self, plan: Any, backend: Any, spec: dict[str, Any]) -> list[str]:
        argv = super().command(plan, backend, spec)
        job = spec.get("slurm") or {}
        if job.get("nodes", 1) > 1 and job.get("cluster") == "torchrun":
            # one copy on every node, each its own torchrun (PET_* from the job script: rendezvous on the first node,
            # which hosts the rendezvous store: said outright, as torch's guess from the hostname misses a node whose
            # name resolves to another of its addresses); only node 0's copy of the runner writes records
            argv = ["srun", "--overlap", f"--nodes={job['nodes']}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                    "bash", "-c", 'RLCTL_NODE_RANK=$SLURM_NODEID PET_RDZV_CONF=is_host=$((SLURM_NODEID == 0)) '
                    'exec "$@"', "rlctl", *argv]
        return argv

    def prepare(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], plan: Any, recipe: Any,
                opts: Any) -> dict[str, Any]:
        from rlctl.backends import get_backend

        backend = get_backend(plan.backend)
        shape = shape_of(recipe, backend)
        spec = {**spec, "slurm": {"nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node,
                                  "cluster": shape.cluster}}
        spec["argv"] = self.command(plan, backend, spec)
        (run_dir / SCRIPT).write_text(render_script(recipe, backend, str(run_dir.resolve())))
        write_state(run_dir, executor=NAME)
        return spec

    def submit(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], detach: bool = False,
               on_tick: Any = None) -> int:
        run_dir = run_dir.resolve()
        try:
            job_id = queue.submit(str(run_dir / SCRIPT), env, str(run_dir))
        except RuntimeError as e:
            write_state(run_dir, status="failed", ended_at=time.time(), error=f"sbatch: {e}")
            raise RlctlError(f"sbatch refused the job of {run_dir.name}: {e}", hint=f"see {run_dir / SCRIPT}") from None
        write_state(run_dir, status="queued", slurm_job_id=job_id, handle=RunHandle(NAME, {"job_id": job_id}).to_dict())
        print(f"rlctl: {run_dir.name} submitted as SLURM job {job_id} ({run_dir / SCRIPT})", file=sys.stderr)
        if detach:
            return 0
        return self.follow(run_dir, on_tick)

    def follow(self, run_dir: Path, on_tick: Any = None) -> int:
        """Attached: follow the job until its run ends (Ctrl-C leaves it running: it is SLURM's now)."""
        from rlctl.metrics.stream import ingest

        said = None
        try:
            while True:
                state = read_state(run_dir)
                status = self.status(run_dir, state)
                if status != said and status == "queued":
                    st = read_state(run_dir)
                    print(f"rlctl: job {_job_id(st)} queued ({st.get('slurm_reason') or 'pending'})", file=sys.stderr)
                said = status
                with contextlib.suppress(Exception):
                    ingest(run_dir, state.get("backend") or "", final=status not in ACTIVE)
                if on_tick is not None:
                    with contextlib.suppress(OSError):
                        on_tick(run_dir)
                if status not in ACTIVE:
                    break
                time.sleep(1.0)
        except KeyboardInterrupt:
            print(f"\nrlctl: no longer following; job {_job_id(read_state(run_dir))} goes on (rlctl status "
                  f"{run_dir.name}; rlctl stop {run_dir.name})", file=sys.stderr)
            return 130
        st = read_state(run_dir)
        if st.get("status") != "finished":
            for line in self.status_lines(run_dir, st):
                print(f"rlctl: {line.strip()}", file=sys.stderr)
        return 0 if st.get("status") == "finished" else int(st.get("exit_code") or 1) or 1

    # ---- any process (the login node) --------------------------------------------------------------------------
    def status(self, run_dir: Path, state: dict[str, Any]) -> str:
        """What the run's record says while its job runs; the queue's word while it waits; how it ended, from SLURM,
        when the job left the queue without the run recording its end (timeout, preemption, a failed node,
        scancel)."""
        status = state.get("status", "unknown")
        job_id = _job_id(state)
        if status not in ACTIVE or not job_id:
            return status
        info = queue.job_info(job_id)
        if info is None:
            return status  # SLURM did not answer: the record is all we know
        if info is False:
            return self._settle(run_dir, state, "lost", None, f"SLURM no longer knows job {job_id} (it keeps an ended "
                                "job MinJobAge seconds, and this cluster keeps no accounting for sacct) and the run "
                                "did not record how it ended")
        if info.waiting:
            def waiting(now: dict[str, Any]) -> dict[str, Any]:
                updates = {"slurm_state": info.state, "slurm_reason": info.reason, "slurm_restarts": info.restarts}
                if status != "queued" and info.restarts and _unchanged(state, now):
                    updates["status"] = "queued"  # requeued: its next allocation resumes from the last checkpoint
                return updates

            update_state(run_dir, waiting)
            return "queued"
        if info.running:
            if state.get("slurm_state") != info.state:
                write_state(run_dir, slurm_state=info.state, slurm_reason=None, slurm_nodes=info.nodes)
            return status if status != "queued" else "starting"
        return self._ended(run_dir, state, info)

    def _ended(self, run_dir: Path, state: dict[str, Any], info: queue.JobInfo) -> str:
        # the run's own record may have been written a moment after SLURM's state changed
        fresh = read_state(run_dir)
        if fresh.get("status") not in ACTIVE:
            return str(fresh.get("status"))
        outcome, words = queue.ENDED.get(info.state, ("failed", f"the job ended {info.state}"))
        reached = any(str(a.get("job_id")) == info.job_id for a in fresh.get(ALLOCATIONS) or [])
        if not reached and outcome in ("failed", "finished"):
            return self._settle(run_dir, fresh, "failed", info,
                                f"SLURM job {info.job_id} ended ({info.state}) without reaching the run directory "
                                f"{run_dir}: it must be on a filesystem the compute nodes share (see "
                                f"{run_dir}/slurm-{info.job_id}.out)")
        if outcome == "cancelled" and fresh.get("stop_requested_at"):
            outcome, words = "stopped", "stopped (rlctl stop)"
        if outcome == "finished" and info.exit_code not in (0, None):
            outcome = "failed"
        return self._settle(run_dir, fresh, outcome, info, words)

    def _settle(self, run_dir: Path, state: dict[str, Any], outcome: str, info: queue.JobInfo | None,
                words: str) -> str:
        from rlctl.runs.checkpoints import latest_complete

        ckpt = None
        with contextlib.suppress(Exception):
            ckpt = latest_complete(state.get("backend") or "", run_dir)
        step = ckpt.step if ckpt is not None else None
        said = words + (f"; last complete checkpoint: step {step}" if step is not None else "; no complete checkpoint")
        updates: dict[str, Any] = {"status": outcome, "ended_at": time.time(), "settled_by": "SLURM",
                                   "slurm_end": {"state": info.state if info else None, "said": said,
                                                 "reason": info.reason if info else None,
                                                 "last_checkpoint": step, "source": info.source if info else None}}
        if info is not None and info.exit_code is not None and state.get("exit_code") is None:
            updates["exit_code"] = info.exit_code
        if outcome == "failed":
            updates.setdefault("error", said)
        def settle(now: dict[str, Any]) -> dict[str, Any] | None:
            return updates if now.get("status") in ACTIVE else None  # the run's own record came first: it stands

        with contextlib.suppress(OSError):
            now = update_state(run_dir, settle)
            if now.get("status") not in ACTIVE:
                return str(now.get("status"))
        return outcome

    def status_lines(self, run_dir: Path, state: dict[str, Any]) -> list[str]:
        """The job as SLURM has it, for `rlctl status RUN`."""
        job_id = _job_id(state)
        if not job_id:
            return []
        live = state.get("status") in ACTIVE  # the queue's word of while it ran is not how it stands now
        out = [f"  slurm: job {job_id}" + (f", {state['slurm_state']}" if live and state.get("slurm_state") else "")
               + (f" ({state['slurm_reason']})" if live and state.get("slurm_reason") not in (None, "", "None")
                  else "")
               + (f", on {state['slurm_nodes']}" if state.get("slurm_nodes") else "")
               + (f", requeued {state['slurm_restarts']} time(s)" if state.get("slurm_restarts") else "")]
        end = state.get("slurm_end")
        if isinstance(end, dict) and end.get("said"):
            out.append(f"  ended: {end['said']}")
        return out

    def eval_jobs(self, ev: dict[str, Any], jobs: list[tuple[int, str]], out_dir: Path, run_dir: Path | None,
                  recipe: Any, placement: dict[str, str | None]) -> Any:
        """`rlctl eval ... --executor slurm`: each eval job a batch job of its own (evals.py)."""
        from rlctl.executors.slurm.evals import eval_jobs

        return eval_jobs(ev, jobs, out_dir, run_dir, recipe, placement)

    def supervised_on(self, state: dict[str, Any]) -> tuple[str, str] | None:
        job_id = _job_id(state)
        return (f"SLURM job {job_id}", "") if job_id else None  # the job's own rlctl: no process to log in to

    def resume_there(self, run_dir: Path, state: dict[str, Any]) -> str | None:
        """`rlctl resume RUN`: the job is SLURM's; a run whose job ended is submitted again (the same script: it
        resumes from the last complete checkpoint)."""
        status = self.status(run_dir, state)
        if status in ACTIVE:
            return f"{run_dir.name}: {status} (SLURM job {_job_id(state)}); nothing to resume"
        if status == "finished":
            return f"{run_dir.name}: finished; nothing to resume"
        # queued before sbatch returns: the job's rlctl may start (and write `running`) before this process writes
        # again, and its record must win
        was = {k: state.get(k) for k in ("status", "stop_requested_at", "slurm_end")}
        write_state(run_dir, status="queued", stop_requested_at=None, slurm_end=None)
        try:
            job_id = queue.submit(str(run_dir.resolve() / SCRIPT), dict(os.environ), str(run_dir))
        except RuntimeError as e:
            write_state(run_dir, **was)
            raise RlctlError(f"sbatch refused the job of {run_dir.name}: {e}",
                             hint=f"see {run_dir / SCRIPT}") from None
        write_state(run_dir, slurm_job_id=job_id, handle=RunHandle(NAME, {"job_id": job_id}).to_dict())
        return f"{run_dir.name}: submitted again as SLURM job {job_id}; it resumes from the last complete checkpoint"

    def stop_plan(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        job = _job_id(state)
        return (f"would send SIGTERM to the batch script of SLURM job {job} ({run_dir.name}: scancel --batch "
                f"--signal=TERM), then scancel it after {grace:g} s.")

    def stop(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        """scancel: TERM to the job's rlctl (which stops the attempt as `rlctl stop` does locally), scancel after the
        grace period."""
        job = _job_id(state)
        if not job:
            return super().stop(run_dir, state, grace)
        write_state(run_dir, status="stopping", stop_requested_at=time.time())
        info = queue.job_info(job)
        if info and not isinstance(info, bool) and info.waiting:
            queue.scancel(job)
        else:
            queue.scancel(job, "--batch", "--signal=TERM")
        deadline = time.time() + grace
        while time.time() < deadline:
            info = queue.job_info(job)
            if info is None or info is False or (not isinstance(info, bool) and info.ended):
                break
            time.sleep(0.5)
        else:
            queue.scancel(job)
            end = time.time() + 30
            while time.time() < end:
                info = queue.job_info(job)
                if info is None or info is False or (not isinstance(info, bool) and info.ended):
                    break
                time.sleep(0.5)
        status = self.status(run_dir, read_state(run_dir))
        if status in ACTIVE:  # the job is gone but nothing recorded it
            write_state(run_dir, status="stopped", ended_at=time.time())
            status = "stopped"
        return f"{run_dir.name}: {status} (SLURM job {job})"
