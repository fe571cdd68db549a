"""GPU memory plan: trainer per GPU, vLLM engine per GPU, colocation caught the way vLLM itself fails, and what each
GPU holds with rlctl's checkpoint evaluator beside the run (rlctl.estimate.gpu_plan)."""

from __future__ import annotations

from rlctl.estimate.memory import (
    GiB,
    colocation_mode,
    fitting_fix,
    fix_text,
    gpu_memory_gib,
    no_accumulation_micro_batch,
    trainer_memory,
    trainer_resident,
    vllm_memory,
)
from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check, gib


def _setup(ctx: Context, name: str):
    r = ctx.recipe
    if r.resources.gpus_per_node == 0:
        return None, None, Result(name, SKIP, "recipe runs on CPU (resources.gpus_per_node = 0)")
    total = gpu_memory_gib(r.resources.gpu)
    if total is None:
        return None, None, Result(name, SKIP, f"unknown GPU {r.resources.gpu!r}",
                                  'write it as e.g. "H100-80GB" or "A6000-48GB"')
    if isinstance(ctx.arch, Exception):
        return None, None, Result(name, SKIP, ctx.arch.message, ctx.arch.hint)
    return ctx.arch, total * GiB, None


def _fit_sets(fit: dict, recipe) -> dict | None:
    """fitting_fix as recipe keys (a token budget is a backend extra: no machine-readable form)."""
    if not fit or "token_budget" in fit:
        return None
    sets: dict = {}
    if fit["gradient_checkpointing"] and not recipe.train.gradient_checkpointing:
        sets["train.gradient_checkpointing"] = True
    if fit["micro_batch_size"] != recipe.train.micro_batch_size:
        sets["train.micro_batch_size"] = fit["micro_batch_size"]
    return sets or None


@check("memory.trainer")
def trainer(ctx: Context) -> Result:
    arch, total, skip = _setup(ctx, "memory.trainer")
    if skip:
        return skip
    b = trainer_memory(ctx.recipe, arch)
    # the backend's own caveats (what it counts as an upper bound, what it leaves out) print under the figure
    data = {"per_gpu_bytes": b.total, "terms": b.terms, "gpu_bytes": total, "params": arch.params,
            "notes": list(b.facts.get("backend_notes", []))}
    figure = f"{gib(b.total)} per trainer GPU of {gib(total)} ({b.table()} GiB; {arch.params / 1e9:.2f}B params)"
    if b.total > total:
        fix = fix_text(fitting_fix(ctx.recipe, arch, total), ctx.recipe)
        sets = None
        if not fix:
            # the least any micro batch needs: a smaller micro batch is not always less, since accumulating over
            # several keeps the whole (fp32 under mixed precision) gradients; every figure cited is a plan computed here
            r = ctx.recipe
            mine, gc = r.train.micro_batch_size, r.train.gradient_checkpointing
            whole = no_accumulation_micro_batch(r)
            plans = {(m, g): trainer_memory(r, arch, micro_batch=m, checkpointing=g).total
                     for m in {1, mine, *([whole] if whole else [])} for g in {gc, True}}
            # the least; among equals the recipe's own checkpointing, then the smaller micro batch
            (mb, use_gc), least = min(plans.items(), key=lambda kv: (round(kv[1] / GiB, 1), kv[0][1] != gc,
                                                                       kv[0][0]))
            gc_note = " with train.gradient_checkpointing = true" if use_gc and not gc else ""
            how = (f"the recipe's own train.micro_batch_size = {mb}" if mb == mine
                   else f"train.micro_batch_size = {mb}") + f"{gc_note}, {gib(least)}"
            if mb > 1 and gib(plans[(1, use_gc)]) != gib(least):
                how += (f" (micro batch 1 needs more, {gib(plans[(1, use_gc)])}: gradient accumulation keeps the "
                        "whole gradients between micro batches)")
            from rlctl.backends import get_backend

            key = get_backend(r.backend.name).seq_len_key
            shorten = f"shorten {key}" if key else "shorten data.max_prompt_tokens or rollout.max_tokens"
            options = [shorten, *([] if r.lora else ["use LoRA"]),
                       "raise train.zero_stage / more trainer GPUs" if (r.train.zero_stage or 0) < 3
                       else "more trainer GPUs", *([] if r.train.offload else ["train.offload"])]
            fix = (f"no micro batch fits: the least is {how}: "
                   + ", ".join(options[:-1]) + ", or " + options[-1])
        else:
            sets = _fit_sets(fitting_fix(ctx.recipe, arch, total), ctx.recipe)
            fix = f"set {fix}"
        return Result("memory.trainer", FAIL, figure, fix, data, set=sets)
    if b.total > 0.9 * total:
        return Result("memory.trainer", WARN, figure, "less than 10% headroom: fragmentation can still OOM", data)
    return Result("memory.trainer", OK, figure, None, data)


@check("memory.vllm")
def engine(ctx: Context) -> Result:
    if not ctx.recipe.uses_vllm:
        return Result("memory.vllm", SKIP, "no vLLM engine (the trainer's own model generates)")
    arch, total, skip = _setup(ctx, "memory.vllm")
    if skip:
        return skip
    r = ctx.recipe
    e = vllm_memory(r, arch, total)
    data = {k: getattr(e, k) for k in ("budget", "weights", "activations", "kv_cache", "kv_per_token",
                                        "seqs_at_max_len", "seqs_at_rollout_len", "concurrent_needed")}
    rollout_len = min(r.data.max_prompt_tokens + r.rollout.max_tokens, r.model.max_model_len)
    # a checkpoint vLLM holds as stored (gpt-oss: MXFP4 experts) is sized from its bytes on disk, not params x dtype
    stored = (f"; from the checkpoint's quantized size on disk, {gib(arch.weight_bytes_on_disk)}, not params x "
              f"{r.model.dtype}" if arch.weight_bytes_on_disk else "")
    figure = (f"{r.rollout.gpu_memory_utilization:.2f} x {gib(total)} = {gib(e.budget)} per GPU: weights "
              f"{gib(e.weights)} (TP {r.rollout.tensor_parallel}{stored}), activations {gib(e.activations)}, KV cache "
              f"{gib(max(e.kv_cache, 0))} = {e.seqs_at_rollout_len} sequences of {rollout_len} tokens at once "
              f"(a rollout has {e.concurrent_needed} per engine)")
    if e.kv_cache <= 0:
        return Result("memory.vllm", FAIL, figure,
                      "no memory left for the KV cache: raise rollout.gpu_memory_utilization or "
                      "rollout.tensor_parallel", data)
    if e.seqs_at_max_len < 1:
        return Result("memory.vllm", FAIL, figure,
                      "not even one sequence of max_model_len fits the KV cache (vLLM refuses to start): lower "
                      "model.max_model_len or raise gpu_memory_utilization / tensor_parallel", data)
    if not e.fits_needed:
        return Result("memory.vllm", WARN, figure,
                      "vLLM will queue and preempt sequences: rollouts slow down; more engines, more memory or "
                      "shorter max_tokens", data)
    return Result("memory.vllm", OK, figure, None, data)


@check("memory.colocation")
def colocation(ctx: Context) -> Result | None:
    r = ctx.recipe
    shared = ctx.backend.colocated(r) or (
        r.resources.trainer_gpus is not None and r.resources.inference_gpus is not None
        and set(r.resources.trainer_gpus) & set(r.resources.inference_gpus))
    if not shared or not ctx.recipe.uses_vllm:
        return None
    arch, total, skip = _setup(ctx, "memory.colocation")
    if skip:
        return skip
    b = trainer_memory(r, arch)
    e = vllm_memory(r, arch, total)
    mode = colocation_mode(r)
    # at vLLM's start the trainer holds its weights; a sleeping engine wakes later next to optimizer states too
    resident = trainer_resident(b, with_optimizer=(mode == "sleep"))
    util = r.rollout.gpu_memory_utilization
    free = total - resident
    # the highest utilization that passes vLLM's start check and, when both stay resident, the training peak
    limit = free / total if mode == "sleep" else min(free, total - b.total) / total
    max_util = max(round(limit - 0.02, 2), 0.0)
    data = {"mode": mode, "trainer_resident": resident, "trainer_peak": b.total, "vllm_budget": e.budget,
            "gpu_bytes": total, "max_utilization": max_util}
    if e.budget > free:
        return Result(
            "memory.colocation", FAIL,
            f"Free memory on device ({free / GiB:.2f}/{total / GiB:.2f} GiB) on startup is less than desired GPU "
            f"memory utilization ({util}, {e.budget / GiB:.2f} GiB): the trainer already holds {gib(resident)}",
            f"set rollout.gpu_memory_utilization <= {max_util:.2f}", data,
            set={"rollout.gpu_memory_utilization": max_util} if max_util > 0 else None)
    if mode == "resident":
        peak = b.total + e.budget
        if peak > total:
            fixes = []
            # the lowest utilization that still leaves vLLM one max_model_len sequence of KV cache
            need = (e.weights + e.activations + e.kv_per_token * r.model.max_model_len) / total
            if max_util >= need:
                fixes.append(f"rollout.gpu_memory_utilization = {max_util:.2f}")
            trainer_fix = fix_text(fitting_fix(r, arch, total - e.budget), r)
            if trainer_fix:
                fixes.append(f"keep utilization {util} and set {trainer_fix}")
            data["fixes"] = fixes
            return Result(
                "memory.colocation", FAIL,
                f"trainer step peak {gib(b.total)} + vLLM {gib(e.budget)} = {gib(peak)} > {gib(total)} "
                "(both stay resident): CUDA OOM at the first training step",
                ("set " + ", or ".join(fixes)) if fixes else
                "nothing within this GPU fits both: a second GPU for the trainer, LoRA, or a smaller model", data)
        return Result("memory.colocation", OK,
                      f"trainer peak {gib(b.total)} + vLLM {gib(e.budget)} = {gib(peak)} of {gib(total)}", None, data)
    peak = b.total + e.weights
    verdict = FAIL if peak > total else OK
    return Result("memory.colocation", verdict,
                  f"rollout: trainer {gib(resident)} + vLLM {gib(e.budget)}; training (engine asleep): "
                  f"{gib(b.total)} + engine weights {gib(e.weights)} = {gib(peak)} of {gib(total)}",
                  None if verdict == OK else "lower train.micro_batch_size or enable offload", data)


def _idle_gpus(ctx: Context, devices: list[str]) -> list[str]:
    """GPUs of this machine the run does not use with nothing on them (none asked of a remote executor's)."""
    from rlctl.core.gpus import idle_gpus
    from rlctl.executors import get

    if get(ctx.recipe.resources.executor).remote:
        return []
    return idle_gpus(set(devices), ctx.gpus()[0])


def _rollout_fix(ctx: Context, arch, plan) -> float | None:
    """The highest rollout.gpu_memory_utilization that leaves the evaluator its least beside the run while the
    rollout engine still holds one max_model_len sequence; None where lowering it does not help."""
    from rlctl.estimate.gpu_plan import gpu_plan

    r = ctx.recipe
    shared = plan.shared()
    if shared is None or not any(k.startswith("rollout vLLM") for k in shared.parts):
        return None
    u = round(r.rollout.gpu_memory_utilization - 0.01, 2)
    while u > 0.01:
        trial = r.model_copy(deep=True)
        trial.rollout.gpu_memory_utilization = u
        e = vllm_memory(trial, arch, plan.total)
        if e.kv_cache <= 0 or e.seqs_at_max_len < 1:
            return None
        p = gpu_plan(trial, arch)
        if p is not None and p.eval is not None and p.eval.beside is not None:
            return u
        u = round(u - 0.01, 2)
    return None


@check("memory.gpus")
def gpus(ctx: Context) -> Result | None:
    """Each GPU's whole plan: trainer + rollout vLLM + rlctl's checkpoint evaluator (eval sets it runs during
    training); its vLLM gpu_memory_utilization comes from here."""
    from rlctl.estimate.gpu_plan import VLLM_UTILIZATION, gpu_plan

    arch, total, skip = _setup(ctx, "memory.gpus")
    if skip:
        return skip
    plan = gpu_plan(ctx.recipe, arch)
    if plan is None:
        return None
    data = plan.to_dict()
    split = "; ".join(plan.lines())
    ev = plan.eval
    # the fullest GPU, the evaluator beside the run included: what a sweep's placement asks of each GPU
    shared = plan.shared()
    data["peak"] = max([g.total for g in plan.gpus]
                       + ([shared.total + ev.footprint(ev.beside)] if shared and ev and ev.beside else []), default=0.0)
    over = [g for g in plan.gpus if g.total > plan.total]
    if over:  # memory.trainer / memory.colocation say why and compute the fix: never OK beside them
        return Result("memory.gpus", FAIL, split,
                      "a GPU holds more than it has: memory.trainer / memory.colocation give the fix", data)
    if ev is None:
        return Result("memory.gpus", OK, split, None, data)
    if ev.alone is None:
        return Result("memory.gpus", FAIL,
                      f"{split}; the checkpoint evaluator's vLLM needs {gib(ev.need)} (weights {gib(ev.weights)}, "
                      f"activations {gib(ev.activations)}, one sequence of model.max_model_len) — more than "
                      f"{VLLM_UTILIZATION} of a GPU", "lower model.max_model_len, or use eval.evaluator = \"command\" "
                      "with an evaluator that shards the model", data)
    if ev.shares is None:
        return Result("memory.gpus", OK, f"{split}; checkpoint evals: gpu_memory_utilization {ev.alone}", None, data)
    if ev.beside is not None:
        return Result("memory.gpus", OK, f"{split}; checkpoint evals beside the training run: gpu_memory_utilization "
                      f"{ev.beside}", None, data)
    # no room beside the run: the evaluator waits for a GPU with nothing on it (the run's, once training ends)
    bare = "; ".join(plan.lines(with_eval=False))
    short = (f"{bare}: no room for the checkpoint evaluator's vLLM beside the training run ({gib(ev.need)} needed, "
             f"{gib(max(ev.room or 0.0, 0.0))} left after a margin for the plan's error)")
    idle = _idle_gpus(ctx, plan.run_devices)
    if idle:
        return Result("memory.gpus", WARN, f"{short}; checkpoint evals wait for a free GPU (GPU {idle[0]} is free "
                      "now: env.gpus)", f'set eval.gpu = "{idle[0]}" to plan them there', data)
    fixes = []
    u = _rollout_fix(ctx, arch, plan)
    if u is not None:
        fixes.append(f"set rollout.gpu_memory_utilization = {u:.2f}")
    fixes.append('give the evaluator a GPU the run does not use (eval.gpu = "<index>")')
    fixes.append("evaluate after training (`rlctl eval RUN --all`) instead of eval sets in the recipe")
    return Result("memory.gpus", FAIL, f"{short}, and no other GPU is free: evals during training would never run "
                  "(run.stop_when needs them)" if ctx.recipe.run.stop_when else
                  f"{short}, and no other GPU is free: evals would wait for the end of training",
                  ", or ".join(fixes), data, set={"rollout.gpu_memory_utilization": u} if u is not None else None)
