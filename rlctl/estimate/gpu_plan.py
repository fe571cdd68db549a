"""What each GPU of a run holds, planned: the trainer, the rollout vLLM engine and rlctl's checkpoint evaluator.

The one place where they are added up per GPU: preflight's `memory.gpus` prints the split, the run directory keeps
it (gpu_memory.json, "plan") so that each GPU's measured peak is compared with what that GPU was planned to hold, and
the checkpoint evaluator takes its vLLM `gpu_memory_utilization` from it (rlctl.evals.loop).

The evaluator is a vLLM engine of its own, in its own process (rlctl.evals.generate). vLLM's rule, the same in the
releases rlctl targets (0.22-0.26, vllm/v1/worker/utils.py `request_memory`): an instance may use
`gpu_memory_utilization x total` bytes and refuses to start when less than that is free ("Free memory on device ...
is less than desired GPU memory utilization"). So two engines on one GPU each need their own fraction, and the
second's start check sees the first's memory (and the trainer's) as used: beside a training run the evaluator asks
for no more than the plan leaves, with a margin for the trainer's own error. Since vLLM 0.21 the CUDA graphs are
profiled inside that budget; the process's CUDA context is outside it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlctl.estimate.memory import (
    CUDA_CONTEXT,
    DTYPE_BYTES,
    VLLM_CUDA_GRAPHS,
    GiB,
    _adapter,
    _version,
    colocated_parts,
    colocation_mode,
    gpu_memory_gib,
    trainer_memory,
    vllm_activations,
    vllm_kv_per_token,
    vllm_max_num_seqs,
    vllm_memory,
)

if TYPE_CHECKING:
    from rlctl.recipe.models import Arch
    from rlctl.recipe.schema import Recipe

# the evaluator's engine arguments that the plan fixes (rlctl.evals.generate passes them to vllm.LLM)
EVAL_BATCHED_TOKENS = 8192
EVAL_VLLM_VERSION = "0.26.0"  # the sampler's bytes and max_num_seqs as in the releases rlctl targets (0.22-0.26)
VLLM_UTILIZATION = 0.9  # vLLM's own default: the most the evaluator asks for on a GPU of its own
# kept free beside a training run: the trainer plan is within +-15% of every measured point (docs/memory.md);
# the engines' budgets are exact (vLLM holds what it is given)
EVAL_MARGIN = 0.15
EVAL_MARGIN_MIN = 1.0 * GiB


@dataclass
class GpuShare:
    """One GPU of the run: what it holds at its peak, by part (bytes). `index`: the run's local GPU index
    (position in its CUDA_VISIBLE_DEVICES); None where the backend's scheduler places the roles (Ray)."""

    index: int | None
    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def trainer(self) -> float:
        return sum(v for k, v in self.parts.items() if k.startswith("trainer"))

    @property
    def role(self) -> str:
        names = [k for k in ("trainer", "rollout vLLM") if any(p.startswith(k) for p in self.parts)]
        return " + ".join(names) or "nothing"


@dataclass
class EvalEngine:
    """rlctl's checkpoint evaluator on vLLM, as planned."""

    device: str | None  # eval.gpu (the job's CUDA_VISIBLE_DEVICES); None: the run's first GPU, inherited
    shares: int | None  # the run's local GPU index it shares; None: a GPU of its own
    need: float  # the least budget vLLM starts with: weights, profiled activations, graphs, one max_model_len sequence
    want: float  # what it can use: every sequence of the largest set at once (max_num_seqs at most)
    room: float | None  # what the run leaves on the shared GPU, the margin and the job's CUDA context taken
    total: float
    max_model_len: int
    max_num_batched_tokens: int
    weights: float
    activations: float

    def _utilization(self, budget: float) -> float:
        return math.floor(budget / self.total * 1000) / 1000  # vLLM requests ceil(total x utilization)

    @property
    def alone(self) -> float | None:
        """gpu_memory_utilization on a GPU of its own (the baseline before training, the checkpoints left at the end,
        a free GPU); None: not even one sequence fits a whole GPU."""
        u = self._utilization(min(self.want, VLLM_UTILIZATION * self.total))
        return u if u * self.total >= self.need else None

    @property
    def beside(self) -> float | None:
        """gpu_memory_utilization beside the training run on the GPU it shares; None: it does not fit there (the
        evaluator waits for a free GPU)."""
        if self.room is None:
            return None
        u = self._utilization(min(self.want, self.room))
        return u if u * self.total >= self.need else None

    def footprint(self, utilization: float) -> float:
        """What NVML sees of the evaluator: its budget and its process's CUDA context."""
        return utilization * self.total + CUDA_CONTEXT

    def engine_args(self, utilization: float) -> dict[str, Any]:
        return {"gpu_memory_utilization": utilization, "max_model_len": self.max_model_len,
                "max_num_batched_tokens": self.max_num_batched_tokens}


@dataclass
class GpuPlan:
    total: float  # bytes per GPU, as torch and vLLM see them
    gpus: list[GpuShare]
    placed: bool  # whether GpuShare.index says which GPU (else only how many hold what)
    eval: EvalEngine | None
    run_devices: list[str]  # the run's GPUs (CUDA_VISIBLE_DEVICES ids), in local index order

    def shared(self) -> GpuShare | None:
        """The share the evaluator is planned beside (placed by Ray: the fullest, where it may land)."""
        if self.eval is None or self.eval.shares is None or not self.gpus:
            return None
        if not self.placed:
            return max(self.gpus, key=lambda g: g.total)
        return next((g for g in self.gpus if g.index == self.eval.shares), None)

    def lines(self, with_eval: bool = True) -> list[str]:
        """`GPU 0: trainer 11.4 + rollout vLLM 23.8 + eval vLLM 9.0 = 44.2 of 79.2 GiB`, GPUs holding the same
        grouped; the evaluator beside the GPU it shares (or on its own GPU)."""
        ev = self.eval if with_eval else None
        beside = ev.beside if ev is not None else None
        shared = self.shared() if ev is not None else None
        groups: dict[tuple, list[str]] = {}
        for g in self.gpus:
            parts = dict(g.parts)
            if g is shared and beside is not None:
                parts["eval vLLM"] = ev.footprint(beside)
            key = tuple((k, round(v / GiB, 1)) for k, v in parts.items())
            name = str(g.index) if g.index is not None else None
            groups.setdefault(key, []).append(name or "")
        out = []
        for key, names in groups.items():
            if self.placed:
                who = f"GPU {names[0]}" if len(names) == 1 else f"GPUs {','.join(names)} (each)"
            else:
                who = f"{len(names)} GPU(s) placed by the backend's scheduler (each)"
            total = sum(v for _, v in key)
            out.append(f"{who}: " + " + ".join(f"{k} {v:.1f}" for k, v in key)
                       + f" = {total:.1f} of {self.total / GiB:.1f} GiB")
        if ev is not None and ev.shares is None and ev.alone is not None:
            out.append(f"GPU {ev.device} (eval.gpu, not the run's): eval vLLM {ev.footprint(ev.alone) / GiB:.1f} of "
                       f"{self.total / GiB:.1f} GiB")
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON in GiB (gpu_memory.json's plan, the eval spec)."""
        g = GiB
        out: dict[str, Any] = {
            "gpus": [{"index": s.index, "parts_gib": {k: round(v / g, 3) for k, v in s.parts.items()},
                      "total_gib": round(s.total / g, 3)} for s in self.gpus],
            "placed": self.placed, "run_devices": self.run_devices, "split": self.lines()}
        if self.eval is not None:
            ev = self.eval
            shared = self.shared()
            out["eval"] = {"device": ev.device, "shares": ev.shares, "utilization_beside": ev.beside,
                           "utilization_alone": ev.alone, "max_model_len": ev.max_model_len,
                           "max_num_batched_tokens": ev.max_num_batched_tokens,
                           "footprint_beside_gib": round(ev.footprint(ev.beside) / g, 3) if ev.beside else None,
                           "footprint_alone_gib": round(ev.footprint(ev.alone) / g, 3) if ev.alone else None,
                           "need_gib": round(ev.need / g, 3), "room_gib": round(ev.room / g, 3)
                           if ev.room is not None else None,
                           "shared_total_gib": round(shared.total / g, 3) if shared else None}
        return out


def run_devices(recipe: Recipe, environ: dict[str, str] | None = None) -> list[str]:
    """The run's GPUs as CUDA_VISIBLE_DEVICES ids: the first gpus_per_node of the recipe's env's, else of the
    launching environment's, else of the machine's (what the run takes when nothing restricts it)."""
    env = os.environ if environ is None else environ
    spec = recipe.env.get("CUDA_VISIBLE_DEVICES") or env.get("CUDA_VISIBLE_DEVICES") or ""
    ids = [x.strip() for x in spec.split(",") if x.strip()] or [str(i) for i in range(recipe.resources.gpus_per_node)]
    return ids[:recipe.resources.gpus_per_node]


def _eval_sets(recipe: Recipe) -> list[Any]:
    """The sets rlctl's own evaluator runs on checkpoints (none with a command evaluator: its memory is its own)."""
    from rlctl.evals.sets import checkpoint_sets

    if recipe.eval.evaluator != "rlctl":
        return []
    return checkpoint_sets(recipe, _adapter(recipe))


def _eval_engine(recipe: Recipe, arch: Arch, total: float, sets: list[Any], devices: list[str],
                 gpus: list[GpuShare], placed: bool) -> EvalEngine:
    r = recipe
    if r.model.dtype == "float32":  # the evaluator serves a float32 model in bfloat16 (rlctl.evals.generate)
        r = r.model_copy(deep=True)
        r.model.dtype = "bfloat16"
    version = _version(EVAL_VLLM_VERSION)
    weights = arch.weight_bytes_on_disk or arch.params * DTYPE_BYTES[r.model.dtype]
    acts = vllm_activations(r, arch, total, EVAL_BATCHED_TOKENS, 1, version)
    per_token = vllm_kv_per_token(r, arch, 1)
    fixed = weights + acts + VLLM_CUDA_GRAPHS
    most = vllm_max_num_seqs(r.resources.gpu, total, version)
    kv_want = max(min(most, (s.limit or most) * s.n) * min(r.data.max_prompt_tokens + s.max_tokens,
                                                           r.model.max_model_len) for s in sets)
    device = r.eval.gpu
    first = device.split(",")[0].strip() if device else None
    shares = 0 if first is None else devices.index(first) if first in devices else None
    room = None
    if shares is not None and gpus:
        g = max(gpus, key=lambda x: x.total) if not placed else next((x for x in gpus if x.index == shares), None)
        if g is not None:
            margin = max(EVAL_MARGIN * g.trainer, EVAL_MARGIN_MIN)
            room = total - g.total - margin - CUDA_CONTEXT
    return EvalEngine(device=device, shares=shares, need=fixed + per_token * r.model.max_model_len,
                      want=fixed + per_token * kv_want, room=room, total=total, max_model_len=r.model.max_model_len,
                      max_num_batched_tokens=EVAL_BATCHED_TOKENS, weights=weights, activations=acts)


def gpu_plan(recipe: Recipe, arch: Arch, environ: dict[str, str] | None = None,
             card_gib: float | None = None) -> GpuPlan | None:
    """The run's GPUs and what each holds at its peak, with rlctl's checkpoint evaluator where the recipe has eval
    sets it runs; None for a CPU recipe or a GPU rlctl does not know. `card_gib`: the memory of the card the run
    has (NVML), where it is not the one `resources.gpu` names: vLLM takes its utilization of that card."""
    r = recipe
    gib = card_gib or gpu_memory_gib(r.resources.gpu)
    if r.resources.gpus_per_node == 0 or gib is None:
        return None
    total = gib * GiB
    a = _adapter(r)
    b = trainer_memory(r, arch)
    e = vllm_memory(r, arch, total) if r.uses_vllm else None
    roles = a.gpu_roles(r)

    def parts(held: set[str]) -> dict[str, float]:
        if e is not None and held >= {"trainer", "vllm"}:
            return colocated_parts(b, e, colocation_mode(r))
        out = {"trainer": b.total} if "trainer" in held else {}
        if e is not None and "vllm" in held:
            out["rollout vLLM"] = e.budget
        return out

    if roles is not None:
        gpus = [GpuShare(i, parts(held)) for i, held in enumerate(roles)]
    else:
        nodes = max(r.resources.nodes, 1)
        gpus = [GpuShare(None, parts({"trainer"})) for _ in range(max(a.trainer_gpus(r) // nodes, 1))]
        gpus += [GpuShare(None, parts({"vllm"})) for _ in range(r.inference_gpu_count // nodes)]
    devices = run_devices(r, environ)
    sets = _eval_sets(r)
    ev = _eval_engine(r, arch, total, sets, devices, gpus, roles is not None) if sets else None
    return GpuPlan(total, gpus, roles is not None, ev, devices)
