"""Checkpoint evals during a run: the step-0 baseline before training, one eval job per new complete checkpoint
(each in its own process, so a crashing evaluator never touches the run), results appended to metrics.jsonl at the
checkpoint's step, the best checkpoint by the primary eval marked in state.json, and `[run] stop_when`.

The supervisor calls four hooks (before_start, tick, housekeeping, drain); everything else is here. Job records live
in <run>/evals/: step-N.json (spec), step-N.out.json (results), step-N.log, and evals.json (what was done, failed).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlctl.core.state import process_alive, process_create_time
from rlctl.errors import RlctlError
from rlctl.evals.ledger import EVALS, read_ledger, write_ledger
from rlctl.evals.sets import EvalSet
from rlctl.metrics.stream import METRICS, ingest_lock, write_records

# ---- the eval part of a launch spec ------------------------------------------------------------------------------

def evals_spec(recipe: Any, backend: Any) -> dict[str, Any] | None:
    """What the supervisor needs to evaluate checkpoints (plain JSON), or None when nothing is evaluated by rlctl."""
    from rlctl.evals.sets import checkpoint_sets

    sets = checkpoint_sets(recipe, backend)
    if not sets and not recipe.run.stop_when:
        return None
    return {"sets": [s.to_dict() for s in sets], **job_fields(recipe, backend)}


def job_fields(recipe: Any, backend: Any) -> dict[str, Any]:
    """What every eval job of the recipe needs beside its sets (the supervisor's and `rlctl eval`'s alike, whether
    or not the backend evaluates the sets in its own loop)."""
    from rlctl.evals.sets import primary_key

    r = recipe
    return {
        "evaluator": r.eval.evaluator, "command": r.eval.command,
        "base_model": r.model.path, "dtype": r.model.dtype, "seed": r.train.seed,
        "input_key": r.data.input_key, "label_key": backend.eval_label_key(r),
        "reward_file": r.reward.function, "reward_name": r.reward.function_name,
        "baseline": r.eval.baseline, "gpu": r.eval.gpu, "timeout_s": r.eval.timeout_s,
        "primary": primary_key(r, backend), "stop_when": list(r.run.stop_when),
        "lora": r.lora is not None, "vllm_plan": vllm_plan(r),
    }


def vllm_plan(recipe: Any) -> dict[str, Any] | None:
    """The evaluator's vLLM as the run's memory plan sizes it (rlctl.estimate.gpu_plan): its gpu_memory_utilization
    beside the training run and on a GPU of its own, and the run's GPUs; None for a CPU recipe or an unknown model."""
    from rlctl.estimate.gpu_plan import gpu_plan
    from rlctl.recipe.models import resolve_arch

    if recipe.resources.gpus_per_node == 0:
        return None
    try:
        plan = gpu_plan(recipe, resolve_arch(recipe.model.path))
    except (RlctlError, ValueError):
        return None
    if plan is None or plan.eval is None:
        return None
    d = plan.to_dict()
    return {**d["eval"], "run_devices": d["run_devices"]}


def engine_args(plan: dict[str, Any] | None, utilization: float | None) -> dict[str, Any]:
    """vllm.LLM arguments of one eval job: the plan's utilization, context and batch (nothing without a plan)."""
    if not plan or not utilization:
        return {}
    return {"gpu_memory_utilization": utilization, "max_model_len": plan["max_model_len"],
            "max_num_batched_tokens": plan["max_num_batched_tokens"]}


def placement(plan: dict[str, Any] | None, gpu: str | None, training: bool | None,
              idle: Any = None) -> tuple[str | None, dict[str, Any]] | None:
    """Where the next eval job runs and with which vLLM arguments: (CUDA_VISIBLE_DEVICES or None to inherit the
    run's, engine_args), or None: wait — the plan leaves no room beside the training run and no GPU is free.
    `training`: the run's trainer holds its GPUs now (False: before it starts, after it ended; None: unknown, as for
    `rlctl eval` by hand: the smaller budget, which fits either way). `idle(exclude)` lists GPUs with nothing on
    them, asked only when the evaluator does not fit beside the run."""
    if not plan:
        return gpu, {}
    first = gpu.split(",")[0].strip() if gpu else None
    devices = [str(d) for d in plan.get("run_devices") or []]
    beside, alone = plan.get("utilization_beside"), plan.get("utilization_alone")
    if (first is not None and first not in devices) or training is False:  # a GPU of its own
        return gpu, engine_args(plan, alone)
    if beside:
        return gpu, engine_args(plan, beside)
    if training is None:
        return gpu, engine_args(plan, alone)
    free = idle(set(devices)) if idle is not None else []
    if free:
        return free[0], engine_args(plan, alone)
    return None


def has_weights(p: Path) -> bool:
    """An HF model or adapter directory with its weights (a config alone loads nothing: verl's huggingface/ holds
    config and tokenizer unless "hf_model" is saved)."""
    if not ((p / "config.json").is_file() or (p / "adapter_config.json").is_file()):
        return False
    return any(any(p.glob(g)) for g in ("*.safetensors", "*.bin", "*.pt"))


def model_dir(ckpt: Any) -> str:
    """What an evaluator loads for a checkpoint: of its paths (the layout the backend's adapter reports; its model
    paths first), the first that is an HF model or adapter directory with weights (e.g. OpenRLHF's global_stepN_hf
    next to the DeepSpeed state), else the first with a config."""
    paths = [*getattr(ckpt, "model_paths", []), *ckpt.paths()]
    for p in paths:
        if has_weights(p):
            return str(p)
    for p in paths:
        if (p / "config.json").is_file() or (p / "adapter_config.json").is_file():
            return str(p)
    return str(ckpt.path)


# ---- the job ----------------------------------------------------------------------------------------------------

def job_files(out_dir: Path, step: int) -> tuple[Path, Path, Path]:
    return out_dir / f"step-{step}.json", out_dir / f"step-{step}.out.json", out_dir / f"step-{step}.log"


def job_argv(spec_file: Path) -> list[str]:
    return [sys.executable, "-m", "rlctl.evals.job", str(spec_file)]


def job_env(gpu: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # the index as nvidia-smi and NVML number GPUs
    return env


IDLE_POLL_S = 30.0  # how often a waiting evaluator asks NVML for a free GPU

# vLLM's start-up refusals for memory (0.24: v1/worker/utils.py request_memory, v1/worker/gpu_worker.py
# determine_available_memory, v1/core/kv_cache_utils.py _check_enough_kv_cache_memory). Beside a training run they
# say nothing about the plan when the trainer's memory changed while the engine started: vLLM takes a snapshot of the
# device's free memory when its worker starts and counts every byte the device gains until its profile run ends as
# its own ("non-torch") use, and asserts the device did not lose any. A trainer starting beside it (its model, its
# own colocated vLLM's KV cache: tens of GiB) leaves no KV cache for the evaluator; a trainer killed beside it fails
# the assert. On an H100 the in-run evals of steps 2 and 4 failed that way, each started as a killed attempt was
# being restarted (docs/gpu/trl-vllm-3.json, tests/test_gpu_eval_start.py).
VLLM_START_REFUSAL = re.compile(
    r"(No available memory for the cache blocks|Error in memory profiling[^\n]*|[^\n]*on startup is less than "
    r"desired GPU memory utilization[^\n]*|[^\n]*larger than the available KV cache memory[^\n]*|"
    r"CUDA out of memory[^\n]*)")
START_RETRIES = 2  # an eval refused that way beside training is started again (once the training settled) this often


def start_refusal(log: Path) -> str | None:
    """vLLM's own line when an eval job's engine refused to start for memory (the job's traceback only says
    "Engine core initialization failed. See root cause above"), else None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = VLLM_START_REFUSAL.findall(text)
    return found[-1].strip()[:400] if found else None


def training_settled(attempts: list[dict[str, Any]], step: int | None) -> bool:
    """Whether the training's memory on its GPUs has stopped growing: its current attempt has logged a step since it
    started (the trainer loads its model, its colocated vLLM takes its KV cache, the optimizer its states, all before
    the first step ends). An attempt that has not (just started, restarted after a kill) grows by tens of GiB."""
    if not attempts:
        return False
    cur = attempts[-1]
    if cur.get("ended_at") is not None:
        return False  # between attempts: the next one starts any moment
    return step is not None and step > int(cur.get("from_step") or 0)


def job_limit(ev: dict[str, Any], timeout: float | None = None) -> float:
    """How long one eval job may run: `timeout` when given, else eval.timeout_s (default an hour)."""
    return timeout or float(ev.get("timeout_s") or 3600)


def job_spec(out_dir: Path, ev: dict[str, Any], step: int, model: str, sets: list[dict[str, Any]],
             run_dir: Path | None, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """One job's spec; `args`: its vLLM arguments (default: the plan's for an eval by hand, placement(..., None))."""
    if args is None:
        args = (placement(ev.get("vllm_plan"), ev.get("gpu"), None) or (None, {}))[1]
    # the job runs in its spec's folder: every path it gets is absolute (`rlctl eval` with the default ./runs hands
    # relative ones); a model that is no local path (a hub id, random:) stays as it is
    out_dir = out_dir.absolute()
    run_dir = run_dir.absolute() if run_dir else None
    model = str(Path(model).absolute()) if Path(model).exists() else model
    spec = {**{k: ev.get(k) for k in ("evaluator", "command", "base_model", "dtype", "seed", "input_key",
                                       "label_key", "reward_file", "reward_name", "timeout_s")},
            "sets": sets, "step": step, "model": model, "output": str(job_files(out_dir, step)[1]),
            "run_dir": str(run_dir) if run_dir else None, "engine_args": args}
    if step == 0:
        spec["base_model"] = None  # the base model itself
    return spec


def write_job(out_dir: Path, ev: dict[str, Any], step: int, model: str, sets: list[dict[str, Any]],
              run_dir: Path | None, args: dict[str, Any] | None = None) -> tuple[Path, Path, Path]:
    out_dir = out_dir.absolute()  # the job runs in its spec's folder (job_spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_file, out_file, log = job_files(out_dir, step)
    with contextlib.suppress(OSError):
        out_file.unlink()
    spec_file.write_text(json.dumps(job_spec(out_dir, ev, step, model, sets, run_dir, args), indent=2) + "\n")
    return spec_file, out_file, log


def start_job(spec_file: Path, log: Path, gpu: str | None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(job_argv(spec_file), env=job_env(gpu), stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=spec_file.parent)


def read_result(out_file: Path, log: Path, code: int | None) -> tuple[dict[str, float], str | None]:
    """(metrics, failure or None) of a finished job."""
    try:
        res = json.loads(out_file.read_text())
    except (OSError, ValueError):
        tail = ""
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace").strip().splitlines()[-1:][0] if log.stat().st_size else ""
        why = (f"killed by signal {-code}" if code is not None and code < 0 else
               f"exit code {code}" if code is not None else "it ended")
        return {}, f"evaluator crashed ({why}) before writing results" + (f": {tail[:300]}" if tail else "")
    metrics = {k: v for k, v in (res.get("metrics") or {}).items() if isinstance(v, (int, float)) and v == v}
    errors = res.get("errors") or {}
    failure = "; ".join(f"set {k}: {v}" for k, v in errors.items()) or None
    return metrics, failure


def append_metrics(run_dir: Path, step: int, metrics: dict[str, float]) -> None:
    """One record at the checkpoint's step, written under the ingest lock (one write: readers never see half)."""
    if not metrics:
        return
    with ingest_lock(run_dir, wait=30):  # a stuck ingester: append anyway (one write)
        write_records(run_dir / METRICS, [{"step": step, **metrics}])


# ---- best checkpoint and stop rules -------------------------------------------------------------------------------

def mark_best(run_dir: Path, backend: str, primary: str | None, write: Any) -> dict[str, Any] | None:
    """Mark the run's best checkpoint by `primary` in the stream (rlctl.runs.checkpoints.best_from_stream: the rule
    prune, rotation and resume read back through best_checkpoint) with `write(best_checkpoint=...)`."""
    from rlctl.runs.checkpoints import best_from_stream

    best = best_from_stream(run_dir, backend, primary) if primary else None
    if best is not None:
        write(best_checkpoint=best)
    return best


def stop_finding(run_dir: Path, stop_when: list[str], primary: str | None) -> Any:
    """The first doctor finding named in stop_when (`rule` or `rule:N`), or None."""
    from rlctl.metrics.stream import iter_metrics
    from rlctl.runs.doctor import COUNT_KEYS, diagnose_records, thresholds

    if not stop_when:
        return None
    t: dict[str, Any] = thresholds(run_dir)
    wanted = []
    for item in stop_when:
        name, _, n = item.partition(":")
        if n and name in COUNT_KEYS:
            t[COUNT_KEYS[name]] = float(n)
        wanted.append(name)
    if primary:
        t["primary"] = primary
    for f in diagnose_records(list(iter_metrics(run_dir / METRICS)), t):
        if f.rule in wanted:
            return f
    return None


# ---- the supervisor's side ---------------------------------------------------------------------------------------

class CheckpointEvals:
    """Owned by the supervisor of a run whose spec has "evals"; one eval job at a time."""

    def __init__(self, sup: Any):
        self.sup = sup
        self.run_dir: Path = sup.run_dir
        self.ev: dict[str, Any] = sup.spec.get("evals") or {}
        self.sets = [EvalSet(**d) for d in self.ev.get("sets") or []]
        self.ledger = read_ledger(self.run_dir)
        self.job: tuple[int, subprocess.Popen[bytes], Path, Path, float] | None = None
        self.stopped = False
        self.waiting: int | None = None  # the step waiting for room on a GPU (said once)
        self.settling: int | None = None  # the step waiting for the training's memory to settle (said once)
        self.beside = False  # the running job shares a GPU with the training
        self._idle_at = 0.0

    @property
    def out_dir(self) -> Path:
        return self.run_dir / EVALS

    def _done(self) -> dict[str, Any]:
        return self.ledger.setdefault("done", {})

    def _due(self, step: int) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.sets if s.due(step)]

    def _idle(self, exclude: set[str]) -> list[str]:
        """GPUs with nothing on them, asked at most every IDLE_POLL_S (NVML)."""
        from rlctl.core.gpus import idle_gpus

        if time.time() - self._idle_at < IDLE_POLL_S:
            return []
        self._idle_at = time.time()
        return idle_gpus(exclude)

    def _start(self, step: int, model: str, training: bool = False) -> None:
        sets = self._due(step)
        if not sets:
            self._done()[str(step)] = {"outcome": "skipped", "why": "no set due at this step"}
            return
        where = placement(self.ev.get("vllm_plan"), self.ev.get("gpu"), training, self._idle)
        if where is None:  # the plan leaves no room beside the training run and no GPU is free: wait
            if self.waiting != step:
                self.waiting = step
                plan = self.ev.get("vllm_plan") or {}
                self.sup.event(event="eval_waiting", step=step, why=(
                    f"no room for the evaluator's vLLM beside the training run ({plan.get('need_gib')} GiB needed, "
                    f"{plan.get('room_gib')} left by the plan): waiting for a free GPU or the end of training"))
            return
        self.waiting = None
        gpu, args = where
        beside = training and self._shares_training_gpu(gpu)
        if beside and not training_settled(getattr(self.sup, "attempts", []), self._step()):
            if self.settling != step:  # vLLM's start must not overlap the trainer's growth (VLLM_START_REFUSAL)
                self.settling = step
                self.sup.event(event="eval_waiting", step=step, why=(
                    "the training attempt beside it has not logged a step since it started: its GPU memory is still "
                    "growing, which vLLM's start-up profile would count as its own; starting after its first step"))
            return
        self.settling = None
        self.beside = beside
        spec_file, out_file, log = write_job(self.out_dir, self.ev, step, model, sets, self.run_dir, args)
        proc = start_job(spec_file, log, gpu)
        self.job = (step, proc, out_file, log, time.time())
        self.ledger["running"] = {"step": step, "pid": proc.pid, "model": model, "started_at": time.time(),
                                  "gpu": gpu, **({"gpu_memory_utilization": args["gpu_memory_utilization"]}
                                                 if args else {})}
        write_ledger(self.run_dir, self.ledger)
        self.sup.event(event="eval_started", step=step, model=model, pid=proc.pid, gpu=gpu,
                       gpu_memory_utilization=args.get("gpu_memory_utilization"))

    def _shares_training_gpu(self, gpu: str | None) -> bool:
        """The job's GPU is one of the run's (or it inherits the run's devices) and the run has a GPU plan."""
        plan = self.ev.get("vllm_plan")
        if not plan:
            return False
        return gpu is None or gpu.split(",")[0].strip() in {str(d) for d in plan.get("run_devices") or []}

    def _step(self) -> int | None:
        step = getattr(self.sup, "_ingested_step", None)
        return step() if callable(step) else None

    def _collect(self, code: int | None, timed_out: bool = False) -> None:
        assert self.job is not None
        step, _, out_file, log, started = self.job
        self.job = None
        metrics, failure = read_result(out_file, log, code)
        if timed_out:
            failure = f"timed out after {self.ev.get('timeout_s')} s (eval.timeout_s); killed"
        refusal = start_refusal(log) if failure and not metrics else None
        if refusal:
            failure = f"{failure} (vLLM: {refusal})"
        tries = self.ledger.setdefault("start_retries", {})
        if refusal and self.beside and tries.get(str(step), 0) < START_RETRIES:
            tries[str(step)] = tries.get(str(step), 0) + 1
            self.ledger.pop("running", None)
            write_ledger(self.run_dir, self.ledger)
            self.sup.event(event="eval_retry", step=step, attempt=tries[str(step)], error=failure, why=(
                "vLLM refused to start for memory while it shared the GPU with the training: again once the "
                "training's memory has settled"))
            return
        append_metrics(self.run_dir, step, metrics)
        entry = {"outcome": "failed" if failure else "ok", "seconds": round(time.time() - started, 1),
                 "metrics": sorted(metrics), "log": str(log)}
        if failure:
            entry["error"] = failure
            self.ledger.setdefault("failures", []).append({"step": step, "error": failure, "log": str(log),
                                                           "at": time.time()})
            self.sup.state(eval_failures=self.ledger["failures"][-5:])
        self._done()[str(step)] = entry
        self.ledger.get("stopped", {}).pop(str(step), None)
        self.ledger.pop("running", None)
        write_ledger(self.run_dir, self.ledger)
        self.sup.event(event="eval_done", step=step, outcome=entry["outcome"], error=failure)
        self.mark_best()
        if metrics and step > 0:
            self.check_stop()

    def _poll(self) -> bool:
        """True while a job runs."""
        if self.job is None:
            return False
        step, proc, *_ = self.job
        code = proc.poll()
        if code is None:
            if time.time() - self.job[4] > job_limit(self.ev):
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self._collect(proc.returncode, timed_out=True)
                return False
            return True
        self._collect(code)
        return False

    def before_start(self) -> None:
        """The step-0 baseline, before the first attempt (once per run; waits for it)."""
        if not self.sets or not self.ev.get("baseline", True) or "0" in self._done():
            return
        self.sup._mark_log("evaluating the base model (step-0 baseline) before training")
        self._start(0, self.ev["base_model"])
        while self._poll():
            if self.sup.stop_requested_at is not None:
                self.kill()
                return
            time.sleep(0.2)

    def _next_checkpoint(self) -> Any:
        from rlctl.runs.checkpoints import find_checkpoints

        done = self._done()
        for c in find_checkpoints(self.sup.spec["backend"], self.run_dir):
            if c.complete and str(c.step) not in done and c.step > 0:
                return c
        return None

    def tick(self) -> None:
        if not self.sets or self._poll():
            return
        c = self._next_checkpoint()
        if c is not None:
            self._start(c.step, model_dir(c), training=True)

    @property
    def running(self) -> bool:
        """An eval job runs now (the GPU sampler keeps its peak apart)."""
        return self.job is not None

    def drain(self, timeout: float) -> None:
        """At the end of a finished run: evaluate the checkpoints still waiting (bounded by `timeout`)."""
        deadline = time.time() + timeout
        while self.sets and time.time() < deadline:
            if self._poll():
                time.sleep(0.2)
                continue
            c = self._next_checkpoint()
            if c is None:
                return
            self._start(c.step, model_dir(c))
        self.kill()

    def kill(self) -> None:
        """The supervisor stops the job in flight (the attempt ended, or the drain ran out of time): not a failure of
        the evaluator. A job that wrote its results first is recorded; one that did not is left out of `done`, so the
        next supervisor of the run (`rlctl resume`) evaluates that step again, and said so."""
        if self.job is None:
            return
        step, proc, out_file, *_ = self.job
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if out_file.is_file():
            self._collect(proc.returncode)
            return
        self.job = None
        why = (f"stopped by rlctl when the run's attempt ended; evaluated again on resume, or now with "
               f"`rlctl eval {self.run_dir.name} --step {step}`")
        self.ledger.setdefault("stopped", {})[str(step)] = {"why": why, "at": time.time()}
        self.ledger.pop("running", None)
        write_ledger(self.run_dir, self.ledger)
        self.sup.event(event="eval_stopped", step=step, why=why)
        self.sup._mark_log(f"eval of step {step} {why}")

    def mark_best(self) -> None:
        with contextlib.suppress(Exception):
            mark_best(self.run_dir, self.sup.spec["backend"], self.ev.get("primary"), self.sup.state)

    def check_stop(self) -> None:
        """`[run] stop_when`: a named doctor finding stops the run cleanly (once), recorded in state.json."""
        if self.stopped or not self.ev.get("stop_when") or self.sup.stop_requested_at is not None:
            return
        try:
            f = stop_finding(self.run_dir, self.ev["stop_when"], self.ev.get("primary"))
        except Exception as e:  # a rule that breaks never stops a run; it is recorded
            self.sup.event(event="stop_when_error", error=str(e))
            return
        if f is None:
            return
        self.stopped = True
        self.mark_best()
        self.sup.state(stopped_by={"rule": f.rule, "message": f.message, "action": f.action,
                                   "evidence": f.evidence, "at": time.time()})
        self.sup.event(event="stop_when", rule=f.rule, message=f.message)
        self.sup._mark_log(f"stop_when {f.rule}: {f.message}; stopping the run")
        self.sup.request_stop()


def attach(sup: Any) -> CheckpointEvals | None:
    return CheckpointEvals(sup) if sup.spec.get("evals") else None


# ---- by hand: rlctl eval ----------------------------------------------------------------------------------------

def hand_spec(recipe_path: str | Path, set_names: list[str] | None, gpu: str | None) -> dict[str, Any]:
    """The eval spec of `rlctl eval` from a recipe: its sets (only `set_names` when given), evaluator and model.
    The same on this machine and on a host (which builds it from a run's own recipe.toml there)."""
    from rlctl.backends import get_backend
    from rlctl.evals.sets import eval_sets
    from rlctl.recipe.loader import load

    r = load(recipe_path).recipe
    sets = eval_sets(r)
    if set_names:
        unknown = [n for n in set_names if n not in {s.name for s in sets}]
        if unknown:
            import difflib

            meant = difflib.get_close_matches(unknown[0], [s.name for s in sets], n=1, cutoff=0.6)
            raise RlctlError(f"--set {unknown[0]}: no such eval set; the recipe has: "
                             f"{', '.join(s.name for s in sets) or 'none'}."
                             + (f" Did you mean `{meant[0]}`?" if meant else ""),
                             hint=f"--set {meant[0]}" if meant else
                             "--set one of those" if sets else "declare [eval.sets.<name>] in the recipe")
        sets = [s for s in sets if s.name in set_names]
    if not sets:
        raise RlctlError(f"{recipe_path}: no eval sets to evaluate.",
                         hint="declare [eval.sets.<name>] data = \"...\" (or data.eval) in the recipe")
    # not evals_spec: a run whose sets its backend evaluates in its own loop (verl) has no checkpoint sets there, and
    # the job still needs the recipe's keys, labels, dtype and reward
    ev = job_fields(r, get_backend(r.backend.name))
    ev.update(sets=[s.to_dict() for s in sets], evaluator=r.eval.evaluator, command=r.eval.command,
              base_model=r.model.path)
    if gpu is not None:
        ev["gpu"] = gpu
    return ev


def log_tail(log: Path, lines: int = 20, limit: int = 8000) -> str:
    """The end of an eval job's log (its stderr and stdout): what a failure is explained by."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])[-limit:]


def record_by_hand(run_dir: Path, step: int, metrics: dict[str, float], failure: str | None,
                   sets: list[str], host: str | None = None, job: str | None = None) -> None:
    """A by-hand eval's result in the run: its metrics at the checkpoint's step (one write), and a line in the
    ledger's `by_hand` list (apart from `done`, which the supervisor's own evals keep)."""
    append_metrics(run_dir, step, metrics)
    ledger = read_ledger(run_dir)
    entry: dict[str, Any] = {"step": step, "outcome": "failed" if failure else "ok", "sets": sets,
                             "metrics": sorted(metrics), "at": time.time()}
    if host:
        entry["host"] = host
    if job:
        entry["job"] = job
    if failure:
        entry["error"] = failure
    ledger.setdefault("by_hand", []).append(entry)
    write_ledger(run_dir, ledger)
    if metrics:  # the best checkpoint may have changed: marked as the supervisor's own evals mark it
        from rlctl.core.state import read_state, write_state
        from rlctl.evals.sets import primary_key_from_run

        with contextlib.suppress(Exception):
            mark_best(run_dir, str(read_state(run_dir).get("backend") or ""), primary_key_from_run(run_dir),
                      lambda **kw: write_state(run_dir, **kw))


def run_job_here(ev: dict[str, Any], step: int, model: str, sets: list[dict[str, Any]], out_dir: Path,
                 run_dir: Path | None, timeout: float | None = None) -> tuple[dict[str, float], str | None]:
    """Run one eval job in its own process on this machine and wait: (metrics, failure or None). The job's pid is
    kept beside its spec (step-N.pid) so that a caller cut off while it runs (`rlctl eval --on HOST` over a lost
    connection) can pick it up again: adopt_job."""
    spec_file, out_file, log = write_job(out_dir, ev, step, model, sets, run_dir)
    proc = start_job(spec_file, log, ev.get("gpu"))
    pid_file(out_dir, step).write_text(json.dumps({"pid": proc.pid, "create_time": process_create_time(proc.pid),
                                                   "job": f"{proc.pid}-{time.time():.6f}"}))
    limit = job_limit(ev, timeout)
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {}, f"timed out after {limit:g} s (eval.timeout_s)"
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return read_result(out_file, log, code)


def pid_file(out_dir: Path, step: int) -> Path:
    return out_dir / f"step-{step}.pid"


def job_id(out_dir: Path, step: int) -> str | None:
    """The id of the step's newest job here (its pid and start time), None when there is none."""
    if not pid_file(out_dir, step).is_file():
        return None
    try:
        return str(json.loads(pid_file(out_dir, step).read_text())["job"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def adopt_job(ev: dict[str, Any], step: int, model: str, sets: list[dict[str, Any]], out_dir: Path,
              run_dir: Path | None, timeout: float | None = None) -> tuple[dict[str, float], str | None] | None:
    """The result of this very job (same spec: model, sets, evaluator) started earlier by a caller that was cut
    off: waited for while it still runs, read when it finished unclaimed. None when there is no such job (it never
    started, its spec differs, or it died before writing results): the caller runs it again."""
    spec_file, out_file, log = job_files(out_dir, step)
    if not (spec_file.is_file() and pid_file(out_dir, step).is_file()):  # missing, or a FIFO that would block
        return None
    try:
        same = json.loads(spec_file.read_text()) == job_spec(out_dir, ev, step, model, sets, run_dir)
        rec = json.loads(pid_file(out_dir, step).read_text())
        pid, created = int(rec["pid"]), rec.get("create_time")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not same:
        return None
    limit = job_limit(ev, timeout)
    deadline = time.monotonic() + limit
    while process_alive(pid, created):  # that very process (a reused pid has another start time)
        if time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            return {}, f"timed out after {limit:g} s (eval.timeout_s)"
        time.sleep(0.5)
    if not out_file.is_file():
        return None
    return read_result(out_file, log, None)


def remote_executor(host: str) -> Any:
    """The executor that runs `rlctl eval --on HOST`: the `ssh` executor, when one is registered with eval_on."""
    from rlctl import executors

    if "ssh" not in executors.available():
        raise RlctlError(f"--on {host}: hosts not available (no `ssh` executor is registered in rlctl.executors).",
                         hint="run without --on to evaluate on this machine, or install an rlctl with SSH hosts")
    ex = executors.get("ssh")
    if not callable(getattr(ex, "eval_on", None)):
        raise RlctlError(f"--on {host}: the ssh executor cannot run eval jobs (it has no eval_on).",
                         hint="run without --on to evaluate on this machine")
    return ex
