"""The executor protocol: the same verbs for a local process group and a Ray job (SkyPilot's Backend, Ray's
job-id-keyed verbs).

One *attempt* is one start of the backend's command; a run may have several (restarts). The supervisor
(`rlctl.runs.supervisor`) drives attempts through `start` / `poll` / `signal_stop` / `kill`; any other process —
`rlctl status`, `stop`, `logs -f`, possibly after the supervisor died — reattaches through the `RunHandle`
persisted in state.json and calls `status` / `stop` / `catch_up_logs`. None of these import a heavy library.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from rlctl.core.state import ATTEMPTS, EXIT_RECORD, RunHandle, attempt_dir, read_exit_record

__all__ = ["ATTEMPTS", "EXIT_RECORD", "Executor", "RunHandle", "attempt_dir", "local_argv", "read_exit_record"]

def local_argv(plan: Any, backend: Any) -> list[str]:
    """A runtime that must be installed where rlctl runs is started with rlctl's own interpreter."""
    import sys

    argv = list(plan.argv)
    if getattr(backend, "needs_local_install", False) and argv and argv[0] in ("python3", "python"):
        argv[0] = sys.executable
    return argv


class Executor:
    """Base class of executors. Subclasses set `name` and implement the attempt verbs and the reattach verbs."""

    name: ClassVar[str]
    copies_working_dir: ClassVar[bool] = False  # the job runs in a copy of the run directory (paths must be absolute)
    remote: ClassVar[bool] = False  # the job runs on other machines: their packages and GPUs, not this one's
    # the run's metrics.jsonl is written where the run lives and copied here with its log: parsed there, never here
    mirrored: ClassVar[bool] = False
    checks: ClassVar[tuple[str, ...]] = ()  # the preflight check names `preflight` reports (for --only)
    gives_ray_cluster: ClassVar[bool] = False  # the job finds a Ray cluster over its nodes (RAY_ADDRESS is set)
    queues_jobs: ClassVar[bool] = False  # the place has a queue of its own (a batch scheduler): a sweep hands it
    # every variant at once unless --parallel caps how many it holds

    pools: ClassVar[bool] = False  # runs can go to one of several places and fail over between them (below)

    # ---- checks ------------------------------------------------------------------------------------------------
    def preflight(self, ctx: Any) -> list[Any]:
        """This executor's own preflight checks (preflight Results), e.g. that its cluster answers. Default: none."""
        del ctx  # Unused
        return []

    # ---- launch ------------------------------------------------------------------------------------------------
    def prepare(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], plan: Any, recipe: Any,
                opts: Any) -> dict[str, Any]:
        """Executor-specific additions to the supervisor spec (e.g. a cluster address). Default: none."""
        del run_dir, env, plan, recipe, opts  # Unused
        return spec

    def submit(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], detach: bool = False,
               on_tick: Any = None) -> int:
        """Start the run under a supervisor: in this process (returns the exit code) or detached (returns 0 once
        the first attempt runs)."""
        from rlctl.runs.supervisor import Supervisor, start_detached

        if detach:
            start_detached(run_dir, env)
            return 0
        sup = Supervisor(run_dir, spec, env, executor=self, on_tick=on_tick)
        sup.install_signal_handlers()
        return sup.run()

    # ---- one attempt (the supervisor's side) ----------------------------------------------------------------------
    def open(self, run_dir: Path, spec: dict[str, Any]) -> None:
        """Acquire what the run needs for all its attempts (e.g. a Ray head). Default: nothing."""

    def close(self) -> None:
        """Release what open() acquired."""

    def start(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], attempt: int) -> RunHandle:
        raise NotImplementedError

    def attach(self, run_dir: Path, handle: RunHandle) -> None:
        """Adopt an attempt another (dead) supervisor started. Default: nothing to do."""

    def poll(self, run_dir: Path, handle: RunHandle) -> int | None:
        """None while the attempt runs; its exit code once it ended (-N: killed by signal N)."""
        raise NotImplementedError

    def wait(self, run_dir: Path, handle: RunHandle, timeout: float) -> None:
        """Return after `timeout` seconds, or sooner once the attempt ended where the executor hears of it at once
        (its own child): the supervisor's next poll then sees the end without waiting out its interval. Default:
        sleep."""
        del run_dir, handle  # Unused
        time.sleep(timeout)

    def signal_stop(self, run_dir: Path, handle: RunHandle) -> None:
        """Ask the attempt to stop (checkpoint and exit where the backend can)."""
        raise NotImplementedError

    def kill(self, run_dir: Path, handle: RunHandle) -> None:
        """Stop the attempt now, with everything it started."""
        raise NotImplementedError

    def terminate(self, run_dir: Path, handle: RunHandle, grace: float) -> int | None:
        """signal_stop, wait up to `grace` seconds, then kill. Returns the exit code if known."""
        self.signal_stop(run_dir, handle)
        deadline = time.time() + grace
        while time.time() < deadline:
            code = self.poll(run_dir, handle)
            if code is not None:
                return code
            time.sleep(0.1)
        self.kill(run_dir, handle)
        deadline = time.time() + 15
        while time.time() < deadline:
            code = self.poll(run_dir, handle)
            if code is not None:
                return code
            time.sleep(0.1)
        return None

    def leftovers(self, run_dir: Path, state: dict[str, Any], grace: float) -> str | None:
        """Stop what the run's ended attempts left running (what a dead supervisor could not); what was done."""
        del run_dir, state, grace  # Unused
        return None

    def cleanup(self, run_dir: Path, handle: RunHandle, grace: float) -> None:
        """After an attempt ended: nothing it started may outlive it. Default: nothing to do."""

    def command(self, plan: Any, backend: Any, spec: dict[str, Any]) -> list[str]:
        """The argv this executor runs for a rendered plan."""
        del spec  # Unused
        return local_argv(plan, backend)

    def pids(self, run_dir: Path, handle: RunHandle) -> list[int]:
        """Local processes of the attempt (for py-spy evidence). Default: none known."""
        return []

    def pump_logs(self, run_dir: Path, handle: RunHandle) -> None:
        """Bring what the attempt printed into stdout.log (when the executor does not write there itself)."""

    # ---- any process (reattach through the handle) ------------------------------------------------------------
    def status(self, run_dir: Path, state: dict[str, Any]) -> str:
        """The run's true status from its recorded state and the processes or job behind it."""
        raise NotImplementedError

    def stop(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        """Stop a run from another shell; returns a line for the user."""
        raise NotImplementedError

    def resume_there(self, run_dir: Path, state: dict[str, Any]) -> str | None:
        """`rlctl resume RUN` for a run whose supervisor lives on another machine: pick it up there and return a
        line for the user. None (the default): a supervisor on this machine picks it up."""
        del run_dir, state  # Unused: runs supervised here
        return None

    def supervised_on(self, state: dict[str, Any]) -> tuple[str, str] | None:
        """(machine, run directory there) when the run's supervisor lives on another machine, else None; the
        directory is "" when no process of a machine one can log in to supervises it (a batch job's own rlctl)."""
        del state  # Unused: runs supervised here
        return None

    def path_here(self, run_dir: Path, state: dict[str, Any], path: str, host: str | None = None) -> str:
        """A path the run recorded where it runs (an attempt's evidence file, an eval's log) as it is read from here;
        `host`: the machine that wrote it, when not the run's own (a pool run's earlier attempts). Default: the same
        path (this machine, or a filesystem shared with it)."""
        del run_dir, state, host  # Unused: the run's files are here
        return path

    def stop_plan(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        """What stop() would do, for `rlctl stop --dry-run`; nothing is signalled."""
        return f"would stop {run_dir.name} through the {self.name} executor, waiting up to {grace:g} s."

    def catch_up_logs(self, run_dir: Path, state: dict[str, Any]) -> None:
        """Nobody follows the run: copy what it printed since into stdout.log. Default: the child writes there."""

    # ---- pools (rlctl.runs.failover asks these of an executor whose `pools` is true) ------------------------------
    def pick_place(self, places: list[str], needs: dict[str, Any], exclude: Any = (), out: Any = None
                   ) -> tuple[str | None, list[str]]:
        """The first of `places` (not in `exclude`) whose facts fit `needs` (rlctl.runs.pool), and why the others
        before it did not."""
        raise NotImplementedError

    def probe(self, run_dir: Path, ref: dict[str, Any], current: bool = False) -> dict[str, Any]:
        """One look at an attempt: {"state": alive | ended | unreachable | gone, "why", "status", "step", "outcome",
        "superseded_by", "running"}; gone with "running": its place answers and its processes live there, but it
        cannot progress (the GPUs it was placed on are gone): failover stops it. For the run's `current` attempt,
        the local record is refreshed from it."""
        raise NotImplementedError

    def relaunch(self, run_dir: Path, place: str, lineage: dict[str, Any], source: dict[str, Any],
                 out: Any = None) -> dict[str, Any]:
        """Start the run's next attempt on `place` from `source`; the local record follows it. Returns its ref."""
        raise NotImplementedError

    def attempt_ref(self, run_dir: Path, place: str, generation: int) -> dict[str, Any]:
        """Where relaunch puts attempt #generation on `place` (to find it after a watcher died mid-launch)."""
        raise NotImplementedError

    def stop_attempt(self, ref: dict[str, Any], grace: float = 10.0) -> str:
        """Stop an earlier attempt where it still runs."""
        raise NotImplementedError
