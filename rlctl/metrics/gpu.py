"""Per-GPU memory of a run, sampled through NVML (nvidia-ml-py) by the supervisor: what an OOM sees.

The supervisor calls `GpuSampler.tick()` on every poll (every 0.5 s); the sampler reads NVML's `used` per GPU,
keeps the peak, and every `every_s` seconds (and at the end) appends one record to the metrics stream:
`gpu/<i>/memory_used_gib` (now) and `gpu/<i>/memory_peak_gib` (peak so far), at the run's latest step. The summary
`gpu_memory.json` in the run directory holds the peaks (apart: while rlctl's checkpoint evaluator ran beside the
training and while it did not), the GPU size, what was in use before the run started and the memory plan rlctl made
for the recipe, per GPU (rlctl.estimate.gpu_plan: trainer, rollout vLLM, eval vLLM), so that `rlctl status` puts
each GPU's measured peak next to what that GPU was planned to hold. No NVML (a CPU machine, CI, no driver): the
summary says so and nothing else happens. pynvml is imported lazily, here only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from rlctl.metrics.stream import METRICS, write_records

SUMMARY = "gpu_memory.json"
GiB = 1024**3


def _visible(env: dict[str, str] | None) -> list[int] | None:
    """NVML indices of the GPUs the run sees (CUDA_VISIBLE_DEVICES as integers), None = all."""
    spec = (env or os.environ).get("CUDA_VISIBLE_DEVICES")
    if spec is None or not spec.strip():
        return None
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:  # GPU UUIDs: sample all
        return None


def _last_step(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - 8192, 0))
            lines = fh.read().splitlines()
        for line in reversed(lines):
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                return int(json.loads(line)["step"])
    except (OSError, KeyError):
        pass
    return 0


class GpuSampler:
    def __init__(self, run_dir: Path, env: dict[str, str] | None = None, every_s: float = 10.0):
        self.run_dir = run_dir
        self.every_s = float((env or os.environ).get("RLCTL_GPU_RECORD_S", every_s))
        self.env = env
        self.handles: list[tuple[int, Any]] = []
        self.peak: dict[int, float] = {}
        self.peak_eval: dict[int, float] = {}  # while a checkpoint eval job ran beside the training
        self.peak_train: dict[int, float] = {}  # while none did
        self.now: dict[int, float] = {}
        self.util: dict[int, float | None] = {}  # % busy at the last sample (None: NVML would not say)
        self.total: dict[int, float] = {}
        self.before: dict[int, float] = {}
        self.samples = 0
        self.last_record = 0.0
        self.nvml = None
        self.reason = ""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            wanted = _visible(env)
            count = pynvml.nvmlDeviceGetCount()
            for i in (wanted if wanted is not None else range(count)):
                if 0 <= i < count:
                    self.handles.append((i, pynvml.nvmlDeviceGetHandleByIndex(i)))
            self.nvml = pynvml
            if not self.handles:
                self.reason = "NVML sees no GPU for this run"
        except ImportError:
            self.reason = "nvidia-ml-py is not installed: GPU memory not sampled"
        except Exception as e:  # no driver, no GPU
            self.reason = f"NVML unavailable ({type(e).__name__}): GPU memory not sampled"
        self.names: dict[int, str] = {}
        for i, h in self.handles:
            with contextlib.suppress(Exception):
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                self.total[i] = mem.total / GiB
                self.before[i] = mem.used / GiB
            with contextlib.suppress(Exception):
                name = self.nvml.nvmlDeviceGetName(h)
                self.names[i] = name.decode() if isinstance(name, bytes) else str(name)
        self._carry_on(read_summary(run_dir))
        self.plan = self._plan()
        self._write_summary()

    def _carry_on(self, old: dict[str, Any] | None) -> None:
        """A supervisor that picks a run up (`rlctl resume` after every process was killed) continues the run's
        record: the peaks its predecessor saw and the memory in use before the run began, not a fresh start."""
        gpus = old.get("gpus") if isinstance(old, dict) and isinstance(old.get("gpus"), dict) else {}
        for key, g in gpus.items():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                i = int(key)
                if i not in self.total:
                    continue
                for mine, name in ((self.peak, "peak_gib"), (self.peak_eval, "peak_with_eval_gib"),
                                   (self.peak_train, "peak_without_eval_gib")):
                    if _num(g.get(name)):
                        mine[i] = max(mine.get(i, 0.0), float(g[name]))
                if _num(g.get("used_before_gib")):
                    self.before[i] = float(g["used_before_gib"])

    @property
    def active(self) -> bool:
        return bool(self.handles)

    def _plan(self) -> dict[str, Any] | None:
        """rlctl's memory plan for the run's recipe: the trainer's terms and what each GPU holds (trainer, rollout
        vLLM, checkpoint evaluator), to put the measurement next to it."""
        try:
            from rlctl.estimate.gpu_plan import gpu_plan
            from rlctl.estimate.memory import GiB as G
            from rlctl.estimate.memory import card_like, gpu_memory_gib, trainer_memory
            from rlctl.recipe.loader import load
            from rlctl.recipe.models import resolve_arch

            recipe = load(self.run_dir / "recipe.toml").recipe
            if recipe.resources.gpus_per_node == 0:
                return None
            arch = resolve_arch(recipe.model.path)
            b = trainer_memory(recipe, arch)
            named = gpu_memory_gib(recipe.resources.gpu)
            out = {"trainer_gib": round(b.total / G, 2), "terms_gib": {k: round(v / G, 3) for k, v in b.terms.items()},
                   "gpu": recipe.resources.gpu, "gpu_gib": named}
            # vLLM takes its gpu_memory_utilization of the card it is on: a plan for the card `resources.gpu` names
            # judged against another card's peak says nothing (an H100 recipe on an H200: "UNDERestimated by 42%")
            card = min(self.total.values(), default=None)
            if card and (named is None or not card_like(card, named)):
                out.update(gpu_gib=round(card, 2), card=self.names.get(min(self.total, key=self.total.get), "GPU"),
                           recipe_gpu_gib=named)
            with contextlib.suppress(Exception):
                plan = gpu_plan(recipe, arch, self.env, card_gib=out["gpu_gib"] if "card" in out else None)
                if plan is not None:
                    out.update(plan.to_dict())
            return out
        except Exception:
            return None

    def tick(self, final: bool = False, eval_running: bool = False) -> None:
        """One sample per GPU; `eval_running`: a checkpoint eval job runs beside the training now (its peak is kept
        apart, to be compared with the plan that counts the evaluator)."""
        if not self.handles:
            return
        apart = self.peak_eval if eval_running else self.peak_train
        for i, h in self.handles:
            try:
                used = self.nvml.nvmlDeviceGetMemoryInfo(h).used / GiB
            except Exception:
                continue
            self.now[i] = used
            try:
                self.util[i] = float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                self.util[i] = None
            self.peak[i] = max(self.peak.get(i, 0.0), used)
            apart[i] = max(apart.get(i, 0.0), used)
        self.samples += 1
        t = time.time()
        if final or t - self.last_record >= self.every_s:
            self.last_record = t
            rec: dict[str, Any] = {"step": _last_step(self.run_dir / METRICS)}
            for i in self.now:
                rec[f"gpu/{i}/memory_used_gib"] = round(self.now[i], 3)
                rec[f"gpu/{i}/memory_peak_gib"] = round(self.peak[i], 3)
            with contextlib.suppress(OSError):
                write_records(self.run_dir / METRICS, [rec], now=t)
            self._write_summary()

    def close(self) -> None:
        self.tick(final=True)
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def summary(self) -> dict[str, Any]:
        gpus: dict[str, Any] = {}
        for i in self.total:
            g = gpus[str(i)] = {"peak_gib": round(self.peak.get(i, 0.0), 3), "total_gib": round(self.total[i], 3),
                                "used_before_gib": round(self.before.get(i, 0.0), 3)}
            if i in self.peak_eval:
                g["peak_with_eval_gib"] = round(self.peak_eval[i], 3)
            if i in self.peak_eval or i in self.peak_train:  # kept apart from the start: a resumed run carries it on
                g["peak_without_eval_gib"] = round(self.peak_train.get(i, 0.0), 3)
        return {"nvml": self.active, "reason": self.reason or None, "samples": self.samples, "gpus": gpus,
                "plan": self.plan}

    def _write_summary(self) -> None:
        with contextlib.suppress(OSError):
            tmp = self.run_dir / (SUMMARY + ".tmp")
            tmp.write_text(json.dumps(self.summary(), indent=2) + "\n")
            os.replace(tmp, self.run_dir / SUMMARY)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None


def _num(v: Any) -> float | None:
    """A positive finite number from a summary, or None (a damaged file says nothing)."""
    import math

    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 \
        else None


def _preflight_word(plan: float, gpu: float) -> str:
    """What preflight's memory checks said for this plan on this GPU (FAIL above it, WARN within 10%)."""
    return "FAIL" if plan > gpu else "WARN" if plan > 0.9 * gpu else "OK"


def oom_line(run_dir: Path, summary: dict[str, Any] | None) -> str | None:
    """`GPU memory: ran out of memory at step 12 (torch OutOfMemoryError: ...) (plan: 118.8 GiB needed of 79.6 —
    preflight said FAIL)`, when the run's log holds an out-of-memory message; None otherwise."""
    from rlctl.metrics.oom import find_oom

    oom = find_oom(run_dir / "stdout.log")
    if oom is None:
        return None
    step = _last_step(run_dir / METRICS)
    where = f"at step {step}" if step else "before the first logged step"
    line = f"GPU memory: ran out of memory {where} ({oom.what}" + (f": {oom.detail})" if oom.detail else ")")
    s = summary if isinstance(summary, dict) else {}
    plan_d = s.get("plan") if isinstance(s.get("plan"), dict) else {}
    gpus = {k: g for k, g in (s.get("gpus") or {}).items() if isinstance(g, dict)} \
        if isinstance(s.get("gpus"), dict) else {}
    plan = _num(plan_d.get("trainer_gib"))
    what = "per trainer GPU"
    # a GPU that holds more than the trainer (colocated vLLM): its whole plan is what an OOM there is judged by
    fullest = max((g for g in plan_d.get("gpus") or [] if isinstance(g, dict) and _num(g.get("total_gib"))),
                  key=lambda g: g["total_gib"], default=None)
    if fullest is not None and set(fullest.get("parts_gib") or {}) != {"trainer"}:
        plan, what = _num(fullest["total_gib"]), f"on one GPU ({' + '.join(fullest.get('parts_gib') or {})})"
    gpu = _num(plan_d.get("gpu_gib")) or max((_num(g.get("total_gib")) or 0.0 for g in gpus.values()), default=0.0)
    if plan and gpu:
        word = _preflight_word(plan, gpu)
        line += (f" (plan: {plan:.1f} GiB {what} needed of {gpu:.1f} — preflight said {word}"
                 + (")" if word == "FAIL" else "; the plan did not foresee this OOM, see docs/memory.md)"))
    elif plan:
        line += f" (plan: {plan:.1f} GiB {what})"
    peaks = [(k, _num(g.get("peak_gib")), _num(g.get("total_gib"))) for k, g in gpus.items()]
    peaks = [p for p in peaks if p[1] and p[2]]
    if s.get("nvml") and peaks:
        i, peak, total = max(peaks, key=lambda p: p[1])
        line += f"; measured peak {peak:.1f} GiB of {total:.1f} (GPU {i}), capped by the GPU: not a test of the plan"
    return line


def _card_clause(plan: dict[str, Any]) -> str:
    """Where the plan is for the card the run had, not the recipe's: which, and what the recipe said."""
    if not plan.get("card"):
        return ""
    named = _num(plan.get("recipe_gpu_gib"))
    return (f" (planned for the card the run had, {plan['card']} with {_num(plan.get('gpu_gib')) or 0.0:.1f} GiB; "
            f"the recipe's resources.gpu = {plan.get('gpu')!r}"
            + (f" is {named:.1f} GiB" if named else " is not a card rlctl knows") + ")")


# less than one CUDA context (~0.5-0.8 GiB): nothing of the run was ever on the GPU
NOT_LOADED_GIB = 0.3


def _verdict(plan: float, own: float) -> str:
    ratio = plan / own
    return "within 15%" if abs(ratio - 1) <= 0.15 else \
        f"plan {'over' if ratio > 1 else 'UNDER'}estimated by {abs(ratio - 1) * 100:.0f}%"


def _planned(plan: dict[str, Any], gpus: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], bool]:
    """({measured GPU key: its planned share {"parts_gib", "total_gib", "index"}}, matched by size). Placed plans
    map the run's local index to its CUDA_VISIBLE_DEVICES id; where the backend's scheduler placed the roles (Ray)
    the measured GPUs and the planned shares are paired by size, largest first."""
    shares = [g for g in plan.get("gpus") or [] if isinstance(g, dict) and _num(g.get("total_gib"))]
    devices = [str(d) for d in plan.get("run_devices") or []]
    if plan.get("placed"):
        out = {}
        for g in shares:
            i = g.get("index")
            key = devices[i] if isinstance(i, int) and 0 <= i < len(devices) else str(i)
            if key in gpus:
                out[key] = g
        return out, False
    mine = [k for k in gpus if k in devices] or list(gpus)
    by_peak = sorted(mine, key=lambda k: -(_num(gpus[k].get("peak_gib")) or 0.0))
    by_plan = sorted(shares, key=lambda g: -g["total_gib"])
    return dict(zip(by_peak, by_plan, strict=False)), True


def _parts(share: dict[str, Any], extra: dict[str, float] | None = None) -> tuple[str, float]:
    parts = {**{k: v for k, v in (share.get("parts_gib") or {}).items() if _num(v)}, **(extra or {})}
    total = sum(parts.values())
    text = " + ".join(f"{k} {v:.1f}" for k, v in parts.items())
    return (f"{text} = {total:.1f}" if len(parts) > 1 else text), total


def asks_for_gpus(run_dir: Path) -> bool:
    """False for a run whose recipe asks for no GPU (`resources.gpus_per_node = 0`: the CPU quickstart): its GPU
    memory is no question, so no line says it was "not measured". A run without its recipe (attached) may have
    used one."""
    import tomllib

    try:
        resources = tomllib.loads((run_dir / "recipe.toml").read_text()).get("resources")
    except (OSError, ValueError):
        return True
    return not (isinstance(resources, dict) and resources.get("gpus_per_node") == 0)


def verdict_line(run_dir: Path) -> str | None:
    """`GPU memory: peak 34.5 GiB of 79.6 (GPU 0), plan said trainer 11.4 + rollout vLLM 23.8 = 35.2 GiB on that
    GPU: within 15%` — each GPU's peak against what that GPU was planned to hold (colocated: trainer + vLLM; the
    engines' own GPUs: their budget; with the checkpoint evaluator beside the training: that too, for the samples
    taken while it ran); or why not; a run whose log says it ran out of memory gets that instead (oom_line)."""
    s = read_summary(run_dir)
    oom = oom_line(run_dir, s)
    if oom is not None:
        return oom
    if s is None or not asks_for_gpus(run_dir):
        return None
    if not s.get("nvml"):
        return f"GPU memory: not measured ({s.get('reason') or 'no NVML'}); check skipped"
    gpus = {k: g for k, g in (s.get("gpus") or {}).items() if isinstance(g, dict) and _num(g.get("total_gib"))}
    plan = s.get("plan") if isinstance(s.get("plan"), dict) else {}
    # NVML sampled every GPU the run could see: judge only those it uses, where the plan says which
    mine = {k: g for k, g in gpus.items() if k in {str(d) for d in plan.get("run_devices") or []}}
    gpus = mine or gpus
    if not gpus:
        return None

    def own(g: dict[str, Any], key: str = "peak_gib") -> float:
        return (_num(g.get(key)) or 0.0) - (_num(g.get("used_before_gib")) or 0.0)

    i, g = max(gpus.items(), key=lambda kv: _num(kv[1].get("peak_gib")) or 0.0)
    if not s.get("samples") or own(g) < NOT_LOADED_GIB:
        return (f"GPU memory: not measured: the run ended before loading anything on the GPU (peak "
                f"{_num(g.get('peak_gib')) or 0.0:.1f} GiB of {g['total_gib']:.1f} on GPU {i}, "
                f"{_num(g.get('used_before_gib')) or 0.0:.1f} in use before the run); nothing to compare with the plan")

    def head(k: str, g: dict[str, Any], key: str = "peak_gib") -> str:
        before = _num(g.get("used_before_gib")) or 0.0
        return (f"peak {_num(g.get(key)) or 0.0:.1f} GiB of {g['total_gib']:.1f} (GPU {k}"
                + (f", {before:.1f} in use before the run" if before > 0.6 else "")
                + (", while no checkpoint eval ran)" if key == "peak_without_eval_gib" else ")"))

    planned, by_size = _planned(plan, gpus) if plan.get("gpus") else ({}, False)
    if not planned:  # a summary from before per-GPU plans: the trainer's plan against the fullest GPU
        line = f"GPU memory: {head(i, g)}"
        trainer = _num(plan.get("trainer_gib"))
        if trainer:
            line += f", plan said {trainer:.1f} GiB per trainer GPU: {_verdict(trainer, own(g))}"
        return line
    ev = plan.get("eval") if isinstance(plan.get("eval"), dict) else {}
    beside = _num(ev.get("footprint_beside_gib"))
    # per kind of GPU (what it was planned to hold), the fullest one
    groups: dict[str, tuple[str, dict[str, Any]]] = {}
    for k, share in planned.items():
        key = json.dumps(share.get("parts_gib"), sort_keys=True)
        if key not in groups or (_num(gpus[k].get("peak_gib")) or 0) > (_num(gpus[groups[key][0]].get("peak_gib"))
                                                                         or 0):
            groups[key] = (k, share)
    clauses = []
    for k, share in groups.values():
        g = gpus[k]
        text, total = _parts(share)
        with_eval = beside and "peak_with_eval_gib" in g and share.get("index") == ev.get("shares") \
            and not by_size
        train_key = "peak_without_eval_gib" if with_eval else "peak_gib"
        clause = (f"{head(k, g, train_key)}, plan said {text} GiB on that GPU: "
                  + (_verdict(total, own(g, train_key)) if own(g, train_key) > 0 else "not loaded"))
        if with_eval:
            etext, etotal = _parts(share, {"eval vLLM": beside})
            clause += (f"; with the checkpoint evaluator beside it: peak {g['peak_with_eval_gib']:.1f} GiB, plan "
                       f"said {etext} GiB: {_verdict(etotal, own(g, 'peak_with_eval_gib'))}")
        clauses.append(clause)
    line = "GPU memory: " + "; ".join(clauses)
    if by_size and len(groups) > 1:
        line += " (roles paired with GPUs by size: the backend's scheduler placed them)"
    return line + _card_clause(plan)
