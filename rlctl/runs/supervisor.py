"""The supervisor of a run, the same for every executor: starts attempts through the executor, follows the log into
the metrics stream, watches for stalls, restarts from the latest complete checkpoint as the restart policy says,
syncs complete checkpoints, forwards stop signals, and records every attempt and the outcome in state.json. An
attempt of a pool run holds a generation (rlctl.runs.fencing): superseded, it is stopped at once and writes nothing
more to the store or W&B.

Attached launches run it in the CLI process; detached ones, `rlctl resume` and `rlctl supervise` run
`python -m rlctl.runs.supervisor RUN_DIR [--resume]`. A full disk never crashes it: writes that fail are retried,
the run stays supervised, and metrics.jsonl is cut back to its last complete record.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.errors import CheckFailed, RlctlError
from rlctl.metrics.sinks import SinkPump
from rlctl.metrics.stream import LOG, METRICS, STEP_FLOOR, ingest
from rlctl.metrics.stream import STATE as INGEST_STATE
from rlctl.runs.stall import (
    InferenceWatch,
    StallConfig,
    StallDetector,
    gpus_busy,
    save_evidence,
    tail_lines,
    visible_gpus,
)
from rlctl.runs.state import (
    ACTIVE,
    RunHandle,
    attempt_dir,
    process_alive,
    process_create_time,
    read_exit_record,
    read_state,
    write_state,
)

if TYPE_CHECKING:
    from rlctl.executors.base import Executor

SPEC = ".launch.json"

POLL = 0.5
DISK_EVERY = 2.0  # seconds between looks at the free space where checkpoints go (a statvfs; sizes are cached)
POLICIES = ("never", "on-failure", "on-stall", "always")


@dataclass
class RestartPolicy:
    """never | on-failure (non-zero exit) | on-stall (stalled) | always (both, and a clean exit before the last
    step); at most `max_restarts` restarts."""

    mode: str = "never"
    max_restarts: int = 3

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> RestartPolicy:
        d = d or {}
        p = cls(str(d.get("mode") or "never"), int(d.get("max_restarts", 3)))
        if p.mode not in POLICIES:
            raise RlctlError(f"restart policy {p.mode!r}: expected one of {', '.join(POLICIES)}.")
        return p

    def wants(self, why: str, unnoticed: bool = False) -> bool:
        """`unnoticed`: the attempt stalled on a failure the trainer did not notice (vLLM said its engine failed, or
        the rollouts failed) and no step came after: restarted under on-failure too."""
        if unnoticed and why == "stalled" and self.mode == "on-failure":
            return True
        if self.mode == "always":
            return why in ("failed", "stalled", "exited early", "lost")
        if self.mode == "on-failure":
            return why in ("failed", "lost")
        if self.mode == "on-stall":
            return why == "stalled"
        return False


def write_spec(run_dir: Path, spec: dict[str, Any]) -> None:
    (run_dir / SPEC).write_text(json.dumps(spec, indent=2) + "\n")


def read_spec(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / SPEC).read_text())
    except (OSError, ValueError):
        raise RlctlError(f"{run_dir.name}: no readable {SPEC}; it was not started by this rlctl.") from None


def _max_step(run_dir: Path) -> int | None:
    """The newest step the trainer logged (rlctl's own GPU and eval records are none), None before its first."""
    from rlctl.metrics.stream import is_progress, tail_records

    recs = tail_records(run_dir / METRICS, max_bytes=1 << 20)
    return max((r["step"] for r in recs if is_progress(r)), default=None)


def _is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


class Supervisor:
    def __init__(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], executor: Executor | None = None,
                 on_tick: Callable[[Path], None] | None = None):
        from rlctl import executors

        self.run_dir = run_dir
        self.spec = spec
        self.env = env
        self.executor = executor or executors.get(spec.get("executor"))
        self.on_tick = on_tick
        self.grace = float(spec.get("grace_seconds", 30))
        self.policy = RestartPolicy.from_dict(spec.get("restart"))
        self.stall_cfg = StallConfig.from_dict(spec.get("stall"))
        self.watch_stalls = self.policy.mode in ("on-stall", "always")
        self.sinks = SinkPump(run_dir, spec.get("sinks"))
        self.handle: RunHandle | None = None
        self.stop_requested_at: float | None = None
        self.pending: dict[str, Any] = {}  # state updates a full disk refused, retried every tick
        self._best_marked: dict[str, Any] | None = None  # the last best mark written from the stream
        self.disk_full: str | None = None
        self.detector: StallDetector | None = None
        self.log_pos = 0
        self.syncer: Any = None
        state = read_state(run_dir)
        self.attempt = int(state.get("attempt") or 0)
        self.attempts: list[dict[str, Any]] = list(state.get("attempts") or [])
        self._last_housekeeping = 0.0
        self.gpu: Any = None  # rlctl.metrics.gpu.GpuSampler: per-GPU memory peaks (NVML), made at the first start
        from rlctl.runs.fencing import Fence

        self.fence = Fence.from_spec(spec.get("fence"))  # a pool run's attempt: its generation in the sync store
        self.superseded: dict[str, Any] | None = None  # the generation that took this run over
        self.watch: InferenceWatch | None = None  # the inference engine of the current attempt (its GPUs, process)
        self._watch_spec: tuple[list[int], list[int], str | None] | None = None
        self._watch_said: tuple[bool, bool] = (False, False)
        self._engine_failed_said: tuple[float, str] | None = None  # what state.json `engine_failed` says now
        self._rollouts_said: tuple[float, int] | None = None  # what state.json `rollouts_failed` says (at, count)
        self._rollouts_said_at = 0.0
        self._rollouts_told = False  # supervisor.log said this attempt's rollouts fail
        self._procs_at = 0.0
        self.disk_stop: Any = None  # rlctl.runs.disk_pressure.Pressure that stopped the run
        self._disk_at = 0.0
        self.evals: Any = None  # rlctl.evals.loop.CheckpointEvals (spec "evals"), False when the run has none
        self._resume_changes: list[str] = []  # what the restart point changed (rlctl.runs.checkpoints.restart_point)
        # a restart with no complete checkpoint: where the recipe rendered as launched starts (Backend.recipe_start)
        self._recipe_start: str | None = None
        self._launched_from: dict[str, Any] | None = None  # the first attempt of `launch --resume`: where it starts

    # ---- compatibility: the local executor's process of the current attempt ---------------------------------------
    @property
    def proc(self) -> Any:
        return getattr(self.executor, "procs", {}).get(self.attempt)

    # ---- state that survives a full disk ----------------------------------------------------------------------------
    def state(self, **updates: Any) -> None:
        self.pending.update(updates)
        try:
            write_state(self.run_dir, **self.pending)
        except OSError as e:
            if not _is_disk_full(e):
                raise
            self._disk_full(f"state.json: {e.strerror}")
            return
        self.pending = {}
        if self.disk_full:
            self.disk_full = None
            with contextlib.suppress(OSError):
                write_state(self.run_dir, disk_full=None, disk_full_cleared_at=time.time())

    def _disk_full(self, what: str) -> None:
        if self.disk_full is None:
            sys.stderr.write(f"rlctl: disk full ({what}); the run stays supervised and writes are retried\n")
            sys.stderr.flush()
        self.disk_full = what
        self.pending.setdefault("disk_full", what)
        self.pending.setdefault("disk_full_at", time.time())

    def event(self, **rec: Any) -> None:
        with contextlib.suppress(OSError), (self.run_dir / "rlctl-events.jsonl").open("a") as fh:
            fh.write(json.dumps({"time": time.time(), **rec}) + "\n")

    def say(self, text: str) -> None:
        """A line of the supervisor's own log (supervisor.log: `rlctl logs RUN --component supervisor`)."""
        with contextlib.suppress(OSError), (self.run_dir / "supervisor.log").open("a") as fh:
            fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} rlctl supervisor: {text}\n")

    # ---- signals ---------------------------------------------------------------------------------------------------
    def request_stop(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:  # noqa: ARG002
        """SIGTERM/SIGINT/SIGHUP: ask the backend to checkpoint and exit; SIGKILL after the grace period."""
        if self.stop_requested_at is None:
            self.stop_requested_at = time.time()
            self.state(status="stopping", stop_requested_at=self.stop_requested_at)
            if self.handle is not None:
                with contextlib.suppress(Exception):
                    self.executor.signal_stop(self.run_dir, self.handle)

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, self.request_stop)

    # ---- attempts --------------------------------------------------------------------------------------------------
    def start(self, reason: str = "launch", checkpoint: Any = None, restart: bool = False) -> RunHandle:
        self.attempt += 1
        entry: dict[str, Any] = {"attempt": self.attempt, "started_at": time.time(), "reason": reason,
                                 "restart": restart,
                                 "from_checkpoint": str(checkpoint.path) if checkpoint is not None else None,
                                 "from_step": checkpoint.step if checkpoint is not None else None}
        if self._resume_changes:  # what rlctl changed so that the backend loads that checkpoint
            entry["resume_changes"], self._resume_changes = self._resume_changes, []
        with contextlib.suppress(OSError):  # where this attempt's output begins: its own cause is read from there on
            entry["log_offset"] = (self.run_dir / LOG).stat().st_size
        if checkpoint is None and self._launched_from:  # `launch --resume RUN|URL`: that checkpoint, copied here
            entry.update(self._launched_from)
        elif checkpoint is None and self._recipe_start:  # no checkpoint of its own: where the recipe starts
            entry["from_recipe"] = self._recipe_start
        self._recipe_start = self._launched_from = None
        self.attempts.append(entry)
        self._mark_checkpoint_root()
        if self.gpu is not None and getattr(self.gpu, "active", False):  # a restart: is the card free for it?
            with contextlib.suppress(Exception):
                self.gpu.tick()
                entry["gpu_used_at_start_gib"] = {str(i): round(v, 3) for i, v in self.gpu.now.items()}
        with contextlib.suppress(OSError):
            attempt_dir(self.run_dir, self.attempt).mkdir(parents=True, exist_ok=True)
        try:
            self.handle = self.executor.start(self.run_dir, self.spec, self.env, self.attempt)
        except OSError as e:
            entry.update(ended_at=time.time(), exit_code=127, outcome="failed")
            self.state(status="failed", exit_code=127, ended_at=time.time(), attempts=self.attempts,
                       attempt=self.attempt, error=f"could not start {self.spec['argv'][0]!r}: {e.strerror or e}")
            raise
        except RlctlError as e:
            entry.update(ended_at=time.time(), exit_code=None, outcome="failed")
            self.state(status="failed", ended_at=time.time(), attempts=self.attempts, attempt=self.attempt,
                       error=str(e))
            raise
        base = None
        if restart or reason.startswith("resume"):
            base = checkpoint.step if checkpoint is not None else 0
        self._new_detector(base)
        if self.gpu is None:
            with contextlib.suppress(Exception):
                from rlctl.metrics.gpu import GpuSampler

                self.gpu = GpuSampler(self.run_dir, self.env)
        self.watch = self._new_watch()
        self._watch_said = (False, False)
        frm = f" from checkpoint step {checkpoint.step}" if checkpoint is not None else ""
        self.say(f"attempt {self.attempt} started ({reason}{frm})")
        ref = self.handle.ref
        self.state(status="stopping" if self.stop_requested_at else "running", attempt=self.attempt,
                   stop_requested_at=self.stop_requested_at, exit_code=None, ended_at=None, gave_up=None,
                   outcome=None, settled_by=None, error=None, cause=None, inference=None, stopped_by=None,
                   engine_failed=None, rollouts_failed=None, attempts=self.attempts, handle=self.handle.to_dict(),
                   executor=self.executor.name,
                   restart={"mode": self.policy.mode, "max_restarts": self.policy.max_restarts},
                   pid=ref.get("pid"), pgid=ref.get("pgid"), pid_create_time=ref.get("create_time"),
                   supervisor_pid=os.getpid(), supervisor_create_time=process_create_time(os.getpid()))
        return self.handle

    def _ingested_step(self) -> int | None:
        """The newest step the logs reported (before the restart floor drops repeats): progress of this attempt."""
        try:
            raw = json.loads((self.run_dir / INGEST_STATE).read_text())
        except (OSError, ValueError):
            return None
        # a log read that gave no record yet says no step (its last_step starts at 0): the first step is still to come
        steps = [st.get("last_step") for st in raw.values() if isinstance(st, dict) and st.get("records")]
        return max((s for s in steps if isinstance(s, int)), default=None)

    def _reset_ingested_step(self, base: int) -> None:
        """At a restart: counting continues from the checkpoint's step (what the new attempt repeats from)."""
        from rlctl.metrics.stream import ingest_lock, restart_steps

        with contextlib.suppress(OSError, ValueError), ingest_lock(self.run_dir, wait=10) as held:
            if not held:
                return
            raw = json.loads((self.run_dir / INGEST_STATE).read_text())
            for st in raw.values():
                if isinstance(st, dict):
                    restart_steps(st, base)
            tmp = self.run_dir / (INGEST_STATE + ".tmp")
            tmp.write_text(json.dumps(raw))
            os.replace(tmp, self.run_dir / INGEST_STATE)

    def _new_detector(self, base_step: int | None = None) -> None:
        previous = self.detector
        patterns: list[str] = []
        rollout_failure = None
        with contextlib.suppress(Exception):
            from rlctl.backends import get_backend

            backend = get_backend(self.spec["backend"])
            patterns = list(backend.stall_patterns())
            rollout_failure = getattr(backend, "rollout_failure", None)  # a plugin's adapter may not define it
        self.detector = StallDetector(self.stall_cfg, patterns, time.time(),
                                      (self.spec.get("checkpoint_every") or 0, self.spec.get("eval_every") or 0),
                                      rollout_failure)
        self.detector.last_step = base_step  # steps up to it are repeats of an earlier attempt, not progress
        if previous is not None:  # the run's step time outlives an attempt: a restart from the start replays
            # steps 1..N between two looks (one observation, no interval), and the next step would otherwise wait
            # first_step_s instead of k x the median step time
            self.detector.intervals = list(previous.intervals)
        self._engine_failed_said = self._rollouts_said = None
        self._rollouts_told = False
        with contextlib.suppress(OSError):
            self.log_pos = (self.run_dir / LOG).stat().st_size

    def _new_watch(self) -> InferenceWatch | None:
        """The attempt's inference engine to watch: the GPUs the recipe gives it alone (as the backend places the
        run: Backend.gpu_roles; by the run's CUDA_VISIBLE_DEVICES ids) and its process (the adapter's inference
        component). None when neither is known (colocated engines, Ray's placement, a trainer without one)."""
        if self._watch_spec is None:
            self._watch_spec = ([], [], None)
            with contextlib.suppress(Exception):
                from rlctl.backends import get_backend
                from rlctl.estimate.gpu_plan import run_devices
                from rlctl.recipe.loader import load

                recipe = load(self.run_dir / "recipe.toml").recipe
                backend = get_backend(recipe.backend.name)
                roles = backend.gpu_roles(recipe) if recipe.resources.gpus_per_node else None
                devices = run_devices(recipe, self.env)
                inf, trn = [], []
                for i, held in enumerate(roles or []):
                    if i < len(devices) and devices[i].isdigit():
                        if "vllm" in held and "trainer" not in held:
                            inf.append(int(devices[i]))
                        elif "trainer" in held:
                            trn.append(int(devices[i]))
                comp = backend.log_components(recipe).get("inference")
                self._watch_spec = (inf, trn, comp.process if comp is not None else None)
        inf, trn, proc = self._watch_spec
        watch = InferenceWatch(inf, trn, self.stall_cfg.gpu_busy_pct, proc)
        return watch if watch.active else None

    def _watch_inference(self) -> None:
        """Feed the watch this tick's NVML sample and (every second) the attempt's processes; record in state.json
        when the engine is seen gone or idle (rlctl.runs.causes names the cause from it)."""
        w = self.watch
        if w is None or self.handle is None:
            return
        now = time.time()
        if self.gpu is not None and getattr(self.gpu, "active", False) and w.inference_gpus:
            w.observe_gpus(now, dict(self.gpu.now), dict(self.gpu.util), dict(self.gpu.before))
        if w.process is not None and now - self._procs_at >= 1.0:
            self._procs_at = now
            import psutil

            cmds: dict[int, str] = {}
            for pid in self.executor.pids(self.run_dir, self.handle):
                with contextlib.suppress(psutil.Error):
                    cmds[pid] = " ".join(psutil.Process(pid).cmdline())
            w.observe_processes(now, cmds)
        said = (w.gone() is not None, w.idle() is not None)
        if said != self._watch_said:
            self._watch_said = said
            rec = w.record()
            self.state(inference=rec)
            if rec.get("gone"):
                self.event(event="inference_gone", attempt=self.attempt, summary=rec["gone"]["summary"])
                self.say(f"attempt {self.attempt}: the inference engine is gone ({rec['gone']['summary']})")

    def _gpus_busy(self) -> bool | None:
        """Any of the run's GPUs working (the sampler's last NVML sample; else asked now), None without NVML."""
        pct = self.stall_cfg.gpu_busy_pct
        util = [u for u in (getattr(self.gpu, "util", None) or {}).values() if u is not None]
        if util:
            return any(u > pct for u in util)
        return gpus_busy(pct, visible_gpus(self.env))

    def _prepare_restart(self, checkpoint: Any, from_plan_env: bool = False) -> None:
        """Render the command again, resuming from `checkpoint` (the backend's own resume keys), into the run
        directory; the recipe stays as launched. Without a checkpoint the recipe's own checkpoint.resume is rendered
        again: the attempt starts where the recipe does, and the adapter says where that is (recipe_start)."""
        from rlctl.recipe.planning import prepare
        from rlctl.runs.checkpoints import checkpoint_dir

        sets = [f"checkpoint.resume={checkpoint.step}"] if checkpoint is not None else []
        prep = prepare(self.run_dir / "recipe.toml", sets)
        self._recipe_start = None
        if checkpoint is None:
            with contextlib.suppress(Exception):  # a broken adapter answer must not stop the restart: the start
                self._recipe_start = prep.backend.recipe_start(prep.recipe, checkpoint_dir(self.run_dir))
        plan = prep.backend.prepare_launch(prep.plan, self.run_dir)
        for name, content in plan.files.items():
            p = self.run_dir / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)
        (self.run_dir / "launch.sh").write_text(plan.script())
        self.spec["argv"] = self.executor.command(plan, prep.backend, self.spec)
        if from_plan_env:
            from rlctl.runs.rundir import child_environment

            self.env = child_environment(plan.env, dict(self.spec.get("env_extra") or {}))
        with contextlib.suppress(OSError):
            write_spec(self.run_dir, self.spec)

    def _set_floor(self) -> None:
        step = _max_step(self.run_dir)
        if step is not None:
            with contextlib.suppress(OSError):
                tmp = self.run_dir / (STEP_FLOOR + ".tmp")
                tmp.write_text(str(step))
                os.replace(tmp, self.run_dir / STEP_FLOOR)

    def _mark_log(self, text: str) -> None:
        with contextlib.suppress(OSError), (self.run_dir / LOG).open("ab") as fh:
            if fh.tell() > 0:
                with (self.run_dir / LOG).open("rb") as rd:
                    rd.seek(-1, 2)
                    if rd.read(1) != b"\n":
                        fh.write(b"\n")
            fh.write(f"rlctl: {text}\n".encode())

    # ---- the loop --------------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.executor.open(self.run_dir, self.spec)
        try:
            self.evals_hook("before_start")  # the step-0 baseline
            if self.stop_requested_at is not None:
                return self.finish(0, "stopped")
            if self._fenced_out():
                return self.finish(0, "superseded")
            self._recipe_start = self._recipe_start_now()  # the recipe's own resume
            self._launched_from = self._resumed_from()  # `launch --resume RUN|URL`: another run's checkpoint
            if self._nothing_left(self.spec.get("resume_step")):
                return self._finish_at_end(self.spec["resume_step"])
            self.start()
            return self.loop()
        finally:
            self.executor.close()

    def resume(self, gone: str | None = None) -> int:
        """Pick a run up after its supervisor died (a reboot, a kill): adopt a live attempt, or start the next one
        from the latest complete checkpoint. A finished run stays as it is. `gone`: the run's last processes went
        with the machine they ran on (a requeued batch job's last allocation): nothing to adopt or ask about; the
        next attempt starts, said as resumed after the run was `gone`."""
        from rlctl.runs.state import last_sign_of_life, settled_status

        state = read_state(self.run_dir)
        if gone is None and process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time")) and \
                state.get("supervisor_pid") != os.getpid():
            raise RlctlError(f"{self.run_dir.name} is supervised already (pid {state['supervisor_pid']}).")
        status = gone or settled_status(self.run_dir, state)
        if state.get("status") == "finished" or status == "finished":
            return 0
        self.executor.open(self.run_dir, self.spec)
        try:
            handle = RunHandle.from_state(state)
            if status in ACTIVE and handle is not None:
                self.handle = handle
                self.attempt = handle.attempt
                self.executor.attach(self.run_dir, handle)
                self._new_detector()
                last = self.attempts[-1] if self.attempts else {}
                if type(last.get("log_offset")) is int:  # what the attempt printed while nobody watched is read too
                    self.log_pos = last["log_offset"]
                self.watch = self._new_watch()  # its engine's process, seen from the first look on
                self.state(status="running", supervisor_pid=os.getpid(),
                           supervisor_create_time=process_create_time(os.getpid()))
                self.event(event="adopted", attempt=self.attempt)
            else:
                last = self.attempts[-1] if self.attempts else None
                if last is not None and last.get("ended_at") is None:  # it ended while nobody watched
                    rec = read_exit_record(self.run_dir, self.attempt)
                    # with no exit record (lost: killed with everything else) it ended at its last sign of life,
                    # now at the latest: the time it ran never overlaps the next attempt's (status's elapsed)
                    ended = (rec or {}).get("ended_at") or last_sign_of_life(self.run_dir, last, until=time.time())
                    last.update(outcome=status, ended_at=ended,
                                exit_code=(rec or {}).get("exit_code"), exit_recorded=rec is not None)
                if self._fenced_out():
                    return self.finish(0, "superseded")
                with contextlib.suppress(Exception):  # an engine the dead attempt left must not meet the next one
                    left = self.executor.leftovers(self.run_dir, state, self.grace)
                    if left:
                        self.say(left)
                ckpt = self._restart_point()
                if ckpt is not None and self._nothing_left(ckpt.step):
                    return self._finish_at_end(ckpt.step, f"the run was {status}")
                self._prepare_restart(ckpt, from_plan_env=True)
                self._before_restart(f"rlctl resume (the run was {status})", ckpt)
                self.start(reason=f"resume ({status})", checkpoint=ckpt)
            return self.loop()
        finally:
            self.executor.close()

    def _resumed_from(self) -> dict[str, Any] | None:
        """A run launched with `--resume RUN|URL` starts from that run's (or store's) checkpoint, copied into its own
        checkpoint directory, at the step launch rendered as checkpoint.resume: its first attempt says so (from_run,
        from_step, from_checkpoint: the copy the backend loads), not the recipe, which names no such step."""
        src, step = read_state(self.run_dir).get("resumed_from"), self.spec.get("resume_step")
        if not isinstance(src, str) or not src or type(step) is not int:
            return None
        out: dict[str, Any] = {"from_step": step}
        if src != self.spec.get("sync"):  # the run's own store (a pool run's next host): its own checkpoint
            out["from_run"] = src if "://" in src else Path(src).name
        with contextlib.suppress(Exception):  # where the copy is, as the backend's checkpoint layout finds it
            from rlctl.runs.checkpoints import find_checkpoints

            copy = next(c for c in find_checkpoints(self.spec["backend"], self.run_dir) if c.step == step)
            out["from_checkpoint"] = str(copy.path)
        return out

    def _recipe_start_now(self) -> str | None:
        """Where the run's recipe, rendered as it is, starts (Backend.recipe_start); None: the start, or a run without
        a recipe (a test's) or one that no longer loads (the attempt says why)."""
        if not (self.run_dir / "recipe.toml").is_file():
            return None
        try:
            from rlctl.backends import get_backend
            from rlctl.recipe.loader import load
            from rlctl.runs.checkpoints import checkpoint_dir

            recipe = load(self.run_dir / "recipe.toml").recipe
            return get_backend(self.spec["backend"]).recipe_start(recipe, checkpoint_dir(self.run_dir))
        except Exception:
            return None

    def _nothing_left(self, step: Any) -> bool:
        """A start from a checkpoint at the run's last step (train.steps counts optimizer steps; checkpoints and
        total_steps count the step the backend logs) has nothing left to train: no attempt starts, whatever the
        backend would do with it (transformers' Trainer checks max_steps only after a step: it trained one more)."""
        total = self.spec.get("total_steps")
        return type(step) is int and type(total) is int and 0 < total <= step

    def _finish_at_end(self, step: int, after: str | None = None) -> int:
        """The run ends finished without starting the backend: said in its log, events and state."""
        note = f"nothing left to train: the checkpoint is at step {step} of {self.spec['total_steps']}"
        text = f"{after}; {note}" if after else note
        self._mark_log(text)
        self.say(text)
        self.event(event="nothing_left", step=step, **({"after": after} if after else {}))
        self.state(nothing_left=note, nothing_left_at=step)
        return self.finish(0, "finished")

    def _restart_point(self) -> Any:
        """The checkpoint the next attempt resumes from: the one its backend will load, made so where its resume reads
        a pointer (rlctl.runs.checkpoints.restart_point); what that changed goes into the attempt record."""
        from rlctl.runs.checkpoints import restart_point

        try:
            ckpt, self._resume_changes = restart_point(self.spec["backend"], self.run_dir)
        except Exception as e:
            self.say(f"could not tell which checkpoint the backend resumes from ({e}); restarting from the start")
            return None
        return ckpt

    def _mark_checkpoint_root(self) -> None:
        """What the backend's checkpoint layout must know of rlctl's rendering before its first save
        (Backend.mark_checkpoint_root), in the run's own checkpoint root; a run without a recipe (a test's) has none.
        Without the mark the layout falls back to what is on disk (OpenRLHF: any HF export there)."""
        if not (self.run_dir / "recipe.toml").is_file():
            return
        from rlctl.runs.checkpoints import checkpoint_dir, prunable_root

        root = checkpoint_dir(self.run_dir)
        try:
            prunable_root(self.run_dir, root)  # the run's own directory only: never a shared one (nor a cluster's path)
        except RlctlError:
            return
        try:
            from rlctl.backends import get_backend

            get_backend(self.spec["backend"]).mark_checkpoint_root(root)
        except Exception as e:
            self.say(f"could not mark the checkpoint directory ({e}): `ckpt list` may call a checkpoint complete "
                     "before all its parts are written")

    def _before_restart(self, why: str, ckpt: Any) -> None:
        self._ingest(final=True, wait=True)
        self._set_floor()
        self._reset_ingested_step(ckpt.step if ckpt is not None else 0)
        if ckpt is not None:
            frm = f"checkpoint step {ckpt.step}"
        elif self._recipe_start:
            frm = (f"the recipe's own starting point, {self._recipe_start} (no complete checkpoint yet: the recipe "
                   "is rendered as launched)")
        else:
            frm = "the start (no complete checkpoint yet)"
        if self._resume_changes:
            frm += f" (so that the backend loads it: {'; '.join(self._resume_changes)})"
        text = f"{why}; restarting from {frm} as attempt {self.attempt + 1}"
        self._mark_log(text)
        self.say(text)
        self.event(event="restart", attempt=self.attempt + 1, why=why, from_step=ckpt.step if ckpt else None,
                   **{"from": frm})
        self.state(status="restarting")

    def loop(self) -> int:
        assert self.handle is not None
        while True:
            code = self.executor.poll(self.run_dir, self.handle)
            self.tick()
            stalled = None
            if code is None and self.stop_requested_at is None:
                stalled = self._check_stall()
                if stalled:
                    evidence = self._evidence(stalled)
                    self.attempts[-1].update(stall=stalled, evidence=evidence)
                    self.event(event="stalled", attempt=self.attempt, reason=stalled)
                    code = self.executor.terminate(self.run_dir, self.handle, min(self.grace, 30))
                    if code is None:
                        code = -signal.SIGKILL
            if code is None:
                if self.stop_requested_at and time.time() - self.stop_requested_at > self.grace:
                    with contextlib.suppress(Exception):
                        self.executor.kill(self.run_dir, self.handle)
                self.executor.wait(self.run_dir, self.handle, POLL)  # an attempt's end is seen when it happens
                continue
            unnoticed = stalled is not None and self.detector is not None and \
                self.detector.failure_stall(time.time()) is not None
            why = self._end_attempt(code, stalled)
            if why != "stopped" and self.policy.wants(why, unnoticed):
                repeated = self._repeats_previous(why)
                if repeated is not None:  # the same failure again, nothing gained: a restart would repeat it
                    return self._finish_repeated(code, why, repeated)
                restarts = sum(1 for a in self.attempts if a.get("restart"))
                if restarts < self.policy.max_restarts:
                    ckpt = self._restart_point()
                    if ckpt is not None and self._nothing_left(ckpt.step):  # it ended after its last checkpoint
                        return self._finish_at_end(ckpt.step, f"attempt {self.attempt} {why} (exit code {code})")
                    try:
                        self._prepare_restart(ckpt)
                    except Exception as e:  # the recipe no longer renders: give up, say why
                        self.attempts[-1]["restart_error"] = str(e)
                        return self.finish(code, why, gave_up=f"could not prepare a restart: {e}")
                    if self.stop_requested_at is not None:  # stopped while preparing: no new attempt
                        return self.finish(code, "stopped")
                    if self._fenced_out():
                        return self.finish(code, "superseded")
                    self._before_restart(f"attempt {self.attempt} {why}", ckpt)
                    self.start(reason=why, checkpoint=ckpt, restart=True)
                    if self.stop_requested_at is not None:
                        with contextlib.suppress(Exception):
                            self.executor.signal_stop(self.run_dir, self.handle)
                    continue
                return self.finish(code, why, gave_up=f"{why} after {restarts} restart(s) (--max-restarts "
                                                      f"{self.policy.max_restarts})")
            return self.finish(code, why)

    def _repeats_previous(self, why: str) -> str | None:
        """Why not to restart: this attempt ended as the one before it did — the same cause (rlctl.runs.causes.
        signature: process ids, addresses and numbers aside) — and got no further (no newer step in the stream, no
        newer complete checkpoint). A deterministic failure (a bad config, a bug at step N) would only repeat."""
        from rlctl.runs.causes import signature

        if len(self.attempts) < 2:
            return None
        prev, cur = self.attempts[-2], self.attempts[-1]
        sig = signature(cur.get("cause"))
        if sig is None or sig != signature(prev.get("cause")):
            return None

        def reached(a: dict[str, Any], key: str) -> int:
            v = a.get(key)
            return v if type(v) is int else -1

        if any(reached(cur, k) > reached(prev, k) for k in ("last_step", "checkpoint_step")):
            return None
        step = reached(cur, "last_step")
        where = f"at step {step}" if step > 0 else "before its first step"
        return f"{why} twice the same way {where}: {cur['cause'].get('summary')}; restarting would repeat it"

    def _finish_repeated(self, code: int, why: str, said: str) -> int:
        """The run ends failed, saying why it was not restarted (status's `gave up`, doctor's repeated_failure)."""
        ids = [self.attempts[-2].get("attempt"), self.attempts[-1].get("attempt")]
        self.event(event="repeated_failure", attempts=ids, message=said)
        self._mark_log(f"attempt {self.attempt} {why} as attempt {ids[0]} did; not restarted: {said}")
        self.state(repeated_failure={"attempts": ids, "message": said, "cause": self.attempts[-1].get("cause")})
        return self.finish(code, why, gave_up=said)

    def _end_attempt(self, code: int, stalled: str | None) -> str:
        with contextlib.suppress(Exception):
            self.executor.cleanup(self.run_dir, self.handle, self.grace)
        self._ingest(final=True, wait=True)
        self.sink_pump()
        rec = read_exit_record(self.run_dir, self.attempt)
        died_of_full_disk = None
        if self.disk_stop is not None:  # the trainer may have hit ENOSPC before the disk stop reached it: its log says
            found = self._cause()
            if (found or {}).get("what") == "disk full" and any(
                    str(e).startswith("the log:") for e in found.get("evidence") or []):
                died_of_full_disk = found
        if died_of_full_disk is not None:  # what killed it was the full disk, not rlctl: the run failed of it
            why = "failed"
            self.state(cause=died_of_full_disk)
        elif self.superseded is not None:
            why = "superseded"
        elif self.stop_requested_at is not None:
            why = "stopped"
        elif stalled:
            why = "stalled"
        elif code != 0:
            why = "failed"
        else:
            total = self.spec.get("total_steps")
            step = _max_step(self.run_dir)
            why = "exited early" if (total and step is not None and step < total) else "finished"
        entry = self.attempts[-1]
        entry.update(ended_at=time.time(), exit_code=code, outcome=why,
                     exit_recorded=rec is not None, last_step=_max_step(self.run_dir))
        with contextlib.suppress(Exception):  # how far it got: a repeat of the same failure gets no further
            from rlctl.runs.checkpoints import latest_complete

            done = latest_complete(self.spec["backend"], self.run_dir)
            entry["checkpoint_step"] = done.step if done is not None else None
        if why in ("failed", "exited early") and "evidence" not in entry:
            entry["evidence"] = self._evidence(f"attempt {self.attempt} {why} (exit code {code})", live=False)
        if died_of_full_disk is not None:
            entry["cause"] = died_of_full_disk
        elif why in ("failed", "stalled", "exited early"):
            cause = self._cause()
            if cause is not None:
                entry["cause"] = cause
        if self.disk_stop is not None or (entry.get("cause") or {}).get("what") == "disk full":
            from rlctl.runs.disk_pressure import remove_partial

            with contextlib.suppress(Exception):  # the newest checkpoint on disk is a complete one
                gone = remove_partial(self.run_dir, self.spec)
                if gone:
                    entry["removed_partial"] = gone
                    self.say(f"removed the half-written checkpoint(s) of step {', '.join(map(str, gone))}")
        self.state(attempts=self.attempts)
        told = (entry.get("cause") or {}).get("summary")
        self.say(f"attempt {self.attempt} ended: {why}" + (f", exit code {code}" if code is not None else "")
                 + (f": {told}" if told else ""))
        return why

    def _cause(self) -> dict[str, Any] | None:
        """Why the attempt ended (rlctl.runs.causes: the one place that decides)."""
        from rlctl.runs.causes import find

        try:  # the attempts as this supervisor has them: the current one's end is not written yet
            return find(self.run_dir, {**read_state(self.run_dir), "attempts": self.attempts})
        except Exception:
            return None

    def _evidence(self, reason: str, live: bool = True) -> str | None:
        pids = []
        if live:
            with contextlib.suppress(Exception):
                pids = self.executor.pids(self.run_dir, self.handle)
        with contextlib.suppress(Exception):
            self.executor.pump_logs(self.run_dir, self.handle)
        path = save_evidence(attempt_dir(self.run_dir, self.attempt), self.run_dir / LOG, reason, pids,
                             self._evidence_extra())
        return str(path) if path else None

    def _evidence_extra(self) -> dict[str, str]:
        """The inference engine's own log (its last lines) and the NVML samples the watch decided on."""
        out: dict[str, str] = {}
        with contextlib.suppress(Exception):
            from rlctl.runs.components import files_of, run_components, tail

            comp = run_components(self.run_dir).get("inference")
            if comp is not None:
                files = files_of(self.run_dir, comp)
                text = tail_lines(files[-1]) if files and not comp.ray_actors else \
                    "".join(t + "\n" for _, _, t in tail(self.run_dir, comp, 256 * 1024)[-200:])
                out[f"inference log, last lines ({comp.where})"] = text or "(empty)\n"
        if self.watch is not None and self.watch.samples:
            out["NVML samples (inference engine's GPU beside the trainer's)"] = "\n".join(self.watch.samples)
        return out

    def _check_stall(self) -> str | None:
        det = self.detector
        if det is None:
            return None
        now = time.time()
        det.observe_step(self._ingested_step(), now)
        try:
            with (self.run_dir / LOG).open("rb") as fh:
                fh.seek(self.log_pos)
                data = fh.read(4 << 20)
            self.log_pos += len(data)
            det.observe_log(data.decode("utf-8", errors="replace"), now)
        except OSError:
            pass
        self._said_engine_failed(det)
        self._said_rollouts_failed(det, now)
        failed = det.failure_stall(now)
        if failed is not None:  # acted on by every policy that restarts (a failure the trainer did not notice)
            if self.policy.mode == "never":
                return None
            self._said_rollouts_failed(det, now, force=True)  # the count the cause names, up to date
            return failed
        if not self.watch_stalls:
            return None
        limit, _ = det.threshold()
        soonest = min(limit, det.cfg.floor_s, det.cfg.inference_idle_s if self.watch is not None else limit)
        if now - (det.last_step_at or det.started_at) < soonest:
            return None
        return det.check(now, self._gpus_busy(), self.watch)

    def _said_engine_failed(self, det: StallDetector) -> None:
        """vLLM's line that its engine failed, recorded once seen (state.json `engine_failed`: status says it at once
        and calls the run stalled after the limit, whatever the policy), and forgotten when a step follows."""
        seen = det.engine_failed
        if seen == self._engine_failed_said:
            return
        self._engine_failed_said = seen
        if seen is None:
            self.state(engine_failed=None)
            return
        at, line = seen
        limit = det.cfg.engine_failed_s
        self.state(engine_failed={"at": at, "line": line, "limit_s": limit})
        self.event(event="engine_failed", attempt=self.attempt, line=line, limit_s=limit)
        act = "then restarted as [run] restart says" if self.policy.mode != "never" else "not restarted (restart = " \
            "never)"
        self.say(f"attempt {self.attempt}: vLLM says its inference engine failed ({line}); stalled if no step comes "
                 f"within {limit:g}s (run.stall.engine_failed_s), {act}")

    def _said_rollouts_failed(self, det: StallDetector, now: float, force: bool = False) -> None:
        """Rollouts that failed since the last step, recorded once seen (state.json `rollouts_failed`: status and
        doctor say it at once, and status calls the run stalled after the limit, whatever the policy), their count
        brought up to date at most once a second, forgotten when a step follows."""
        seen = det.rollouts_failed
        said = (seen.at, seen.count) if seen is not None else None
        if said == self._rollouts_said or (not force and said and self._rollouts_said
                                           and said[0] == self._rollouts_said[0] and now - self._rollouts_said_at < 1):
            return
        first = self._rollouts_said is None or said is None or said[0] != self._rollouts_said[0]
        self._rollouts_said, self._rollouts_said_at = said, now
        if seen is None:
            self.state(rollouts_failed=None)
            return
        limit, key = det.rollouts_limit()
        self.state(rollouts_failed={"at": seen.at, "count": seen.count, "first": seen.first, "line": seen.line,
                                    "limit_s": limit, "limit": key, "late_s": det.rollouts_late_s()})
        if first and not self._rollouts_told:  # once an attempt: a run whose steps go on may see a few fail often
            self._rollouts_told = True
            self.event(event="rollouts_failed", attempt=self.attempt, error=seen.first, limit_s=limit)
            act = "then restarted as [run] restart says" if self.policy.mode != "never" else \
                "not restarted (restart = never)"
            self.say(f"attempt {self.attempt}: a rollout failed ({seen.first}); stalled if no step comes within "
                     f"{limit:g}s ({key}), {act}")

    # ---- each tick -------------------------------------------------------------------------------------------------
    def tick(self) -> None:
        with contextlib.suppress(Exception):
            self.executor.pump_logs(self.run_dir, self.handle)
        self._fence_tick()
        self._ingest()
        if self.gpu is not None:
            with contextlib.suppress(Exception):
                self.gpu.tick(eval_running=bool(getattr(self.evals, "running", False)))
        try:
            self._watch_inference()
        except Exception as e:  # the watch never breaks supervision; what broke it is recorded once
            if self.watch is not None:
                self.event(event="inference_watch_error", error=f"{type(e).__name__}: {e}")
                self.say(f"the inference watch stopped: {type(e).__name__}: {e}")
                self.watch = None
        self.evals_hook("tick")
        self.sink_pump()
        if time.time() - self._disk_at >= DISK_EVERY:
            self._disk_at = time.time()
            self._disk_pressure()
        self._housekeeping()
        if self.pending:
            self.state()
        if self.on_tick:
            with contextlib.suppress(OSError):
                self.on_tick(self.run_dir)

    def _fence_tick(self) -> None:
        """Every `every_s`: is this attempt's generation still the current one? If not, it stops now."""
        if self.fence is None or self.superseded is not None:
            return
        if self.fence.check() == "superseded":
            self._supersede(self.fence.superseded_by or {})

    def _fenced_out(self) -> bool:
        """Before an attempt starts: superseded already (a watcher moved the run while nobody supervised it here)?"""
        if self.fence is not None and self.superseded is None and self.fence.check_now() == "superseded":
            self._supersede(self.fence.superseded_by or {})
        return self.superseded is not None

    def _supersede(self, by: dict[str, Any]) -> None:
        """Another attempt holds the run (a watcher moved it while this host was unreachable): kill the trainer now,
        without letting it save (SIGKILL), and write nothing more to the store or W&B."""
        if self.superseded is not None:
            return
        self.superseded = by
        text = (f"superseded by #{by.get('generation')} on {by.get('host') or '?'}: this attempt stops now, before "
                "it writes a checkpoint, `latest` or a W&B record")
        sys.stderr.write(f"rlctl: {text}\n")
        self.event(event="superseded", attempt=self.attempt, by=by)
        self._mark_log(text)
        self.stop_requested_at = self.stop_requested_at or time.time()
        self.state(status="stopping", stop_requested_at=self.stop_requested_at,
                   superseded_by={k: by.get(k) for k in ("generation", "host", "run_dir", "claimed_at", "by")})
        if self.handle is not None:
            with contextlib.suppress(Exception):
                self.executor.kill(self.run_dir, self.handle)

    def sink_pump(self, close: bool = False) -> None:
        if self.fence is not None and self.sinks.backlog():
            if self.superseded is not None:
                return  # a superseded attempt sends no W&B record, nor closes the run it shares with its successor
            if time.time() - self.fence.checked_at >= 1.0:  # fresh, right before the batch
                self.fence.check_now()
            if self.fence.state == "superseded":
                self._supersede(self.fence.superseded_by or {})
                return
            if not self.fence.allows_writes():
                return  # the store did not confirm this attempt lately: the records wait in metrics.jsonl
        try:
            self.sinks.pump(close=close)
        except OSError as e:
            self._disk_full(f"sinks: {e.strerror}")

    def _ingest(self, final: bool = False, wait: bool = False) -> None:
        """Ingest the log; on a write error (a full disk) metrics.jsonl is cut back to where this call began — the
        ingest offsets were not saved either, so the same lines are parsed again once there is room."""
        path = self.run_dir / METRICS
        deadline = time.time() + (10 if wait else 0)
        while True:
            try:
                size = path.stat().st_size
            except OSError:
                size = None
            try:
                done = ingest(self.run_dir, self.spec["backend"], final=final)
            except OSError as e:
                if size is not None:
                    with contextlib.suppress(OSError), path.open("r+b") as fh:
                        fh.truncate(size)
                elif path.exists():
                    with contextlib.suppress(OSError):
                        path.unlink()
                if _is_disk_full(e):
                    self._disk_full(f"metrics.jsonl: {e.strerror}")
                    return
                raise
            if done is not None or time.time() >= deadline:
                return
            time.sleep(0.1)

    def _housekeeping(self) -> None:
        now = time.time()
        if now - self._last_housekeeping < float(self.spec.get("housekeeping_seconds", 10)):
            return
        self._last_housekeeping = now
        from rlctl.runs.checkpoints import prune_during_run

        keep = self.spec.get("keep_last")
        if not self.spec.get("evals"):  # evals in-loop only: the best mark comes from the backend's own evals
            with contextlib.suppress(Exception):
                self._mark_best_from_stream()
        with contextlib.suppress(Exception):
            if keep:
                prune_during_run(self.run_dir, self.spec, keep, self._synced())
        self.evals_hook("check_stop")
        if self.spec.get("sync"):
            self._sync()

    def _synced(self) -> set[int]:
        """The newest checkpoint synced to object storage: pruning keeps it here too (where a failover starts)."""
        from rlctl.runs.sync import latest_synced

        step = latest_synced(self.run_dir) if self.spec.get("sync") else None
        return {step} if step is not None else set()

    def _disk_pressure(self) -> None:
        """Prune before a checkpoint would not fit; when pruning is not enough, stop the run after its last complete
        checkpoint (rlctl.runs.disk_pressure). The attempt is killed, not asked to stop: asked, the backend would
        save once more into a disk that cannot hold it."""
        if self.stop_requested_at is not None or self.handle is None:
            return
        from rlctl.runs.disk_pressure import check

        try:
            short = check(self.run_dir, self.spec)
        except Exception as e:  # the watch never breaks supervision; it is recorded (once per kind of error)
            err = f"{type(e).__name__}: {e}"
            if err != getattr(self, "_disk_error", None):
                self._disk_error = err
                self.event(event="disk_pressure_error", error=err)
            return
        if short is None:
            return
        self.disk_stop = short
        msg = short.message()
        self.stop_requested_at = time.time()
        self.state(status="stopping", stop_requested_at=self.stop_requested_at, cause=short.to_cause(),
                   stopped_by={"rule": "checkpoint.min_free_gb", "by": "disk", "message": msg, "at": time.time()})
        self.event(event="disk_stop", message=msg)
        self._mark_log(f"disk: {msg}; stopping the run")
        self.say(f"disk: {msg}; stopping the run")
        with contextlib.suppress(Exception):
            self.executor.kill(self.run_dir, self.handle)

    def _sync(self, final: bool = False) -> None:
        from rlctl.runs.sync import CheckpointSync

        if self.superseded is not None:
            return
        try:
            if self.syncer is None:
                self.syncer = CheckpointSync(self.run_dir, self.spec["backend"], self.spec["sync"], self.fence)
            self.syncer.tick(final=final)
            if self.syncer.superseded is not None:
                self._supersede(self.syncer.superseded)
        except Exception as e:  # a sync problem never stops the run; it is recorded
            self.event(event="sync_error", error=str(e))

    def _mark_best_from_stream(self) -> None:
        """A run whose eval sets the backend evaluates in-loop (no rlctl checkpoint evals): the best checkpoint by
        the recipe's primary eval, read from the stream, marked in state.json as rlctl's own evals mark it, so that
        pruning, `ckpt prune` and `launch --resume` keep and find it (rlctl.runs.checkpoints.best_checkpoint)."""
        from rlctl.evals.loop import mark_best
        from rlctl.evals.sets import primary_key_from_run

        def write(**kw: Any) -> None:
            if kw["best_checkpoint"] != self._best_marked:
                self.state(**kw)
                self._best_marked = kw["best_checkpoint"]

        mark_best(self.run_dir, self.spec["backend"], primary_key_from_run(self.run_dir), write)

    def evals_hook(self, what: str, *args: Any) -> None:
        """rlctl.evals.loop (docs/eval.md): the baseline, checkpoint evals in their own processes, stop_when. A
        problem there is recorded and never breaks supervision."""
        if self.evals is None:
            from rlctl.evals.loop import attach

            self.evals = attach(self) or False
        if self.evals:
            try:
                getattr(self.evals, what)(*args)
            except Exception as e:
                self.event(event="eval_hook_error", hook=what, error=f"{type(e).__name__}: {e}")

    def finish(self, code: int, why: str, gave_up: str | None = None) -> int:
        self._ingest(final=True, wait=True)
        if why == "superseded":
            return self._finish_superseded(code)
        self.evals_hook("drain" if why in ("finished", "exited early") else "kill",
                        *([float((self.spec.get("evals") or {}).get("timeout_s") or 3600)]
                          if why in ("finished", "exited early") else []))
        self.evals_hook("mark_best")
        # the last prune: checkpoints saved or evaluated since the last housekeeping tick (keep_last + the best)
        if not self.spec.get("evals"):
            with contextlib.suppress(Exception):
                self._mark_best_from_stream()
        if self.spec.get("keep_last"):
            from rlctl.runs.checkpoints import prune_during_run

            with contextlib.suppress(Exception):
                prune_during_run(self.run_dir, self.spec, self.spec["keep_last"], self._synced())
        if self.gpu is not None:
            with contextlib.suppress(Exception):
                self.gpu.close()
        self.sink_pump(close=True)
        if self.spec.get("sync"):
            self._sync(final=True)
        if self.on_tick:
            with contextlib.suppress(OSError):
                self.on_tick(self.run_dir)
        status = {"stopped": "stopped", "finished": "finished", "exited early": "finished"}.get(why, "failed")
        updates: dict[str, Any] = {"status": status, "exit_code": code, "ended_at": time.time(),
                                   "attempts": self.attempts, "outcome": why}
        if gave_up:
            updates["gave_up"] = gave_up
        last = self.attempts[-1] if self.attempts else {}
        if status == "failed" and isinstance(last.get("cause"), dict):
            updates["cause"] = last["cause"]  # why the run died: its last attempt's cause
        self.say(f"run {status}" + (f": {gave_up}" if gave_up else ""))
        self.state(**updates)
        deadline = time.time() + 60
        while self.pending and time.time() < deadline:  # a full disk: keep trying to record the outcome
            time.sleep(1.0)
            self.state()
        return code


    def _finish_superseded(self, code: int) -> int:
        """The end of a superseded attempt: its evals killed, nothing synced, its sinks left as they are (the W&B run
        is its successor's now); recorded as stopped, with who took over."""
        self.evals_hook("kill")
        if self.gpu is not None:
            with contextlib.suppress(Exception):
                self.gpu.close()
        by = self.superseded or {}
        self.state(status="stopped", exit_code=code, ended_at=time.time(), attempts=self.attempts,
                   outcome="superseded", superseded_by={k: by.get(k) for k in ("generation", "host", "run_dir",
                                                                               "claimed_at", "by")})
        return code


def start_detached(run_dir: Path, env: dict[str, str], resume: bool = False, timeout: float = 180.0) -> None:
    """A supervisor in its own session (`python -m rlctl.runs.supervisor RUN_DIR`); returns once it runs an
    attempt (or failed to)."""
    # absolute: the child runs in the run directory, where a relative `runs/NAME` (the default ./runs) is no path
    run_dir = run_dir.absolute()
    args = [sys.executable, "-m", "rlctl.runs.supervisor", str(run_dir)] + (["--resume"] if resume else [])
    log_path = run_dir / "supervisor.log"
    start = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log:
        p = subprocess.Popen(args, env=env, cwd=run_dir, stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = read_state(run_dir)
        if st.get("supervisor_pid") == p.pid and st.get("status") not in ("starting", "restarting"):
            return
        if p.poll() is not None:
            break
        time.sleep(0.1)
    st = read_state(run_dir)
    said = _log_since(log_path, start)
    tail = "".join(f"\n  | {line}" for line in said[-8:])
    if st.get("status") == "failed" and st.get("error"):
        raise CheckFailed(f"{run_dir.name} failed to start: {st['error']}{tail}", hint=f"see {log_path}")
    if p.poll() is None:  # alive, yet it never took the run: said, not taken for the state as it was
        raise CheckFailed(f"{run_dir.name}: the supervisor (pid {p.pid}) did not take the run up within {timeout:g} s"
                          f"{tail}", hint=f"see {log_path}; rlctl status {run_dir.name}")
    if p.returncode != 0 and st.get("supervisor_pid") != p.pid:  # died before it took the run: its own last words
        raise CheckFailed(f"{run_dir.name}: the supervisor exited (code {p.returncode}) before it took the run up; "
                          f"the end of {log_path.name}:{tail or ' (nothing)'}", hint=f"see {log_path}")


def _log_since(log_path: Path, start: int) -> list[str]:
    """The lines a supervisor wrote to its log after `start` (its own start)."""
    with contextlib.suppress(OSError), open(log_path, "rb") as fh:
        fh.seek(start)
        return [x.rstrip() for x in fh.read().decode("utf-8", "replace").splitlines() if x.strip()]
    return []


def _pick_up_check(run_dir: Path) -> str | None:
    """Why a run cannot be picked up (supervised already, finished), or None."""
    from rlctl.runs.state import settled_status

    state = read_state(run_dir)
    if process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time")):
        return f"{run_dir.name}: supervised already (pid {state['supervisor_pid']}), {state.get('status')}"
    status = settled_status(run_dir, state)
    if status == "finished":
        return f"{run_dir.name}: finished (exit code {read_state(run_dir).get('exit_code')}); nothing to resume"
    spec = read_spec(run_dir)
    by = state.get("stopped_by") if isinstance(state.get("stopped_by"), dict) else {}
    if status == "stopped" and by.get("by") == "disk":
        from rlctl.runs.disk_pressure import still_short

        short = still_short(run_dir, spec)
        if short:  # resumed now, the same rule would stop it again within a tick
            raise RlctlError(f"{run_dir.name} was stopped for disk ({by.get('rule')}); resumed now it would stop "
                             f"again: {short}.",
                             hint=f"free space there (the run keeps checkpoint.min_free_gb = "
                                  f"{spec.get('min_free_gb') or 0} GB free), then rlctl resume {run_dir.name}")
    return None


def _not_attached(run_dir: Path, state: dict[str, Any], verb: str) -> None:
    """An attached run (`rlctl attach`) has no process rlctl started or could pick up: said, with what follows one."""
    if state.get("executor") == "attached" or state.get("status") == "attached":
        src = state.get("attached_from") or "the log it was attached from"
        raise RlctlError(f"{run_dir.name} is attached: rlctl reads {src} but did not start that run and holds no "
                         f"process of it, so there is nothing to {verb}.",
                         hint="to follow a log that still grows: rlctl attach PATH --follow (docs/commands.md)")


def _executor_of(state: dict[str, Any]) -> Executor | None:
    from rlctl import executors

    name = state.get("executor")
    return executors.get(name) if name in executors.registry() else None


def resume_detached(run_dir: Path) -> str:
    """`rlctl resume RUN`: a new supervisor in the background adopts the run or restarts it; a run whose supervisor
    lives on another machine (an SSH host) is picked up there by its executor."""
    state = read_state(run_dir)
    _not_attached(run_dir, state, "resume")
    ex = _executor_of(state)
    there = ex.resume_there(run_dir, state) if ex is not None else None
    if there is not None:
        return there
    why_not = _pick_up_check(run_dir)
    if why_not:
        return why_not
    start_detached(run_dir, dict(os.environ), resume=True)
    st = read_state(run_dir)
    return f"{run_dir.name}: {st.get('status')} (attempt {st.get('attempt')})"


def supervise_foreground(run_dir: Path) -> int:
    """`rlctl supervise RUN`: the same in this process, until the run ends. Only where the run's supervisor lives."""
    state = read_state(run_dir)
    _not_attached(run_dir, state, "supervise")
    ex = _executor_of(state)
    where = ex.supervised_on(state) if ex is not None else None
    if where is not None:
        host, remote_dir = where
        if not remote_dir:  # supervised by something else than a process of a machine (a batch job's own rlctl)
            raise RlctlError(f"{run_dir.name} is supervised by {host}, not by a process of this machine: nothing to "
                             "supervise here.",
                             hint=f"rlctl status {run_dir.name} follows it; once it has ended, `rlctl resume "
                                  f"{run_dir.name}` starts it there again")
        raise RlctlError(f"{run_dir.name} runs on {host}, and its supervisor runs there: supervise it on {host} "
                         f"(`rlctl supervise {remote_dir}`, e.g. as a systemd unit there).",
                         hint=f"from here, `rlctl resume {run_dir.name}` picks it up on {host} in the background")
    why_not = _pick_up_check(run_dir)
    if why_not:
        sys.stderr.write(why_not + "\n")
        return 0 if "finished" in why_not else 1
    sup = Supervisor(run_dir, read_spec(run_dir), dict(os.environ))
    sup.install_signal_handlers()
    return sup.resume()


def main(argv: list[str] | None = None) -> int:
    """`python -m rlctl.runs.supervisor RUN_DIR [--resume]`: the child's environment is ours."""
    args = argv if argv is not None else sys.argv[1:]
    run_dir = Path(args[0]).resolve()
    try:
        spec = read_spec(run_dir)
        sup = Supervisor(run_dir, spec, dict(os.environ))
        sup.install_signal_handlers()
        return sup.resume() if "--resume" in args else sup.run()
    except OSError as e:
        sys.stderr.write(f"rlctl: {e}\n")
        return 127
    except RlctlError as e:
        sys.stderr.write(f"rlctl: {e}\n")
        _failed(run_dir, str(e))
        return 1
    except Exception as e:  # a defect of rlctl's: one line where the user reads, the traceback kept for a report
        import traceback

        where = run_dir / "supervisor-error.txt"
        with contextlib.suppress(OSError):
            where.write_text(traceback.format_exc())
        msg = f"rlctl's supervisor failed: {type(e).__name__}: {e} (traceback in {where}; please report it)"
        sys.stderr.write(f"rlctl: {msg}\n")
        _failed(run_dir, msg)
        return 1


def _failed(run_dir: Path, error: str) -> None:
    """A run whose supervisor could not go on is failed, with why, unless it had already ended."""
    with contextlib.suppress(Exception):
        if read_state(run_dir).get("status") in ACTIVE:
            write_state(run_dir, status="failed", ended_at=time.time(), error=error)


if __name__ == "__main__":
    sys.exit(main())
