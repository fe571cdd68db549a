"""Placement and batch arithmetic: GPUs fit the nodes, TP divides the heads, batches divide evenly, groups >= 2."""

from __future__ import annotations

from rlctl.backends import cpu_backends
from rlctl.preflight import FAIL, OK, WARN, Context, Result, check


@check("placement.gpus")
def gpus(ctx: Context) -> Result:
    r = ctx.recipe
    res = r.resources
    if res.gpus_per_node == 0:
        if not ctx.backend.runs_on_cpu:
            return Result("placement.gpus", FAIL, f"{r.backend.name} needs GPUs (resources.gpus_per_node = 0)",
                          "set resources.gpus_per_node, or use a backend that runs on the CPU: "
                          + ", ".join(cpu_backends()))
        return Result("placement.gpus", OK, "CPU run")
    have = r.total_gpus
    per_node = res.gpus_per_node
    for name, ids in (("trainer_gpus", res.trainer_gpus), ("inference_gpus", res.inference_gpus)):
        if ids is not None and any(i >= per_node for i in ids):
            return Result("placement.gpus", FAIL, f"resources.{name} = {ids} names a GPU >= gpus_per_node {per_node}",
                          f"GPU ids run from 0 to {per_node - 1}")
    if not r.uses_vllm:  # the backend starts no inference engine: only its own processes take GPUs
        ids = res.trainer_gpus
        trainer = r.trainer_gpu_count
        how = f"{r.backend.name} starts no inference engine: its processes on {trainer} GPU(s)"
        if ids is None and res.inference_gpus is not None:
            how += " (resources.inference_gpus is ignored)"
        return Result("placement.gpus", OK, f"{how}, {res.nodes} x {per_node} GPUs")
    inference = r.inference_gpu_count
    if res.colocate:
        need = max(r.trainer_gpu_count, inference)
        how = f"trainer and {r.rollout.engines} engine(s) x TP {r.rollout.tensor_parallel} share GPUs"
    else:
        trainer = r.trainer_gpu_count
        need = trainer + inference
        how = f"trainer {trainer} + {r.rollout.engines} engine(s) x TP {r.rollout.tensor_parallel} = {need}"
        if res.trainer_gpus is not None and res.inference_gpus is not None:
            overlap = set(res.trainer_gpus) & set(res.inference_gpus)
            if overlap:
                need = len(set(res.trainer_gpus) | set(res.inference_gpus)) * res.nodes
                how = f"trainer and inference share GPU(s) {sorted(overlap)}"
        if trainer == 0:
            return Result("placement.gpus", FAIL, f"no GPU left for the trainer ({how} of {have})",
                          "fewer engines / smaller TP, more GPUs, or resources.colocate = true")
    if r.rollout.tensor_parallel > per_node:
        return Result("placement.gpus", FAIL, f"TP {r.rollout.tensor_parallel} > {per_node} GPUs per node",
                      "a vLLM engine's tensor parallel group must fit in one node")
    if need > have:
        return Result("placement.gpus", FAIL, f"needs {need} GPUs ({how}) but the recipe has {res.nodes} x {per_node}",
                      "add GPUs (resources.nodes / gpus_per_node), fewer engines, or colocate")
    return Result("placement.gpus", OK, f"{how} on {res.nodes} x {per_node} GPUs")


@check("placement.tensor_parallel")
def tp_heads(ctx: Context) -> Result | None:
    arch = ctx.arch
    r = ctx.recipe
    if isinstance(arch, Exception) or not r.uses_vllm:
        return None
    tp = r.rollout.tensor_parallel
    if arch.heads % tp:
        return Result("placement.tensor_parallel", FAIL, f"TP {tp} does not divide {arch.heads} attention heads",
                      f"use a rollout.tensor_parallel that divides {arch.heads}")
    if arch.kv_heads % tp and tp % arch.kv_heads:
        return Result("placement.tensor_parallel", FAIL,
                      f"TP {tp} and {arch.kv_heads} KV heads: neither divides the other",
                      f"use a rollout.tensor_parallel that divides {arch.kv_heads}")
    return Result("placement.tensor_parallel", OK,
                  f"TP {tp} divides {arch.heads} attention heads and fits {arch.kv_heads} KV heads")


@check("placement.batch")
def batch(ctx: Context) -> list[Result]:
    r = ctx.recipe
    out = []
    samples = r.samples_per_rollout
    tbs = r.train.train_batch_size
    dp = max(r.trainer_gpu_count, 1)
    mb = r.train.micro_batch_size
    if samples % tbs:
        out.append(Result("placement.batch", FAIL,
                          f"a rollout of {r.rollout.prompts_per_step} prompts x {r.rollout.group_size} = {samples} "
                          f"samples does not divide into train batches of {tbs}",
                          f"make train.train_batch_size a divisor of {samples}"))
    if tbs % (mb * dp):
        out.append(Result("placement.batch", FAIL,
                          f"train batch {tbs} is not a multiple of micro batch {mb} x {dp} data-parallel GPUs",
                          f"make train.train_batch_size a multiple of {mb * dp}"))
    out += ctx.backend.preflight(ctx, "placement")
    if not out:
        steps = samples // tbs
        out.append(Result("placement.batch", OK,
                          f"{samples} samples per rollout = {steps} optimizer step(s) of {tbs}; "
                          f"{tbs // (mb * dp)} accumulation step(s) of {mb} x {dp} GPU(s)"))
    return out


@check("placement.group_size")
def group_size(ctx: Context) -> Result:
    r = ctx.recipe
    g = r.rollout.group_size
    if r.algorithm.name != "ppo" and g < 2:
        return Result("placement.group_size", FAIL,
                      f"group_size {g}: {r.algorithm.name} normalises rewards within a group, one sample has no "
                      "baseline", "set rollout.group_size >= 2 (4-16 is typical)")
    if r.algorithm.name != "ppo" and g < 4:
        return Result("placement.group_size", WARN, f"group_size {g}: advantage estimates are noisy",
                      "4-16 samples per prompt is typical")
    return Result("placement.group_size", OK, f"{g} samples per prompt")
