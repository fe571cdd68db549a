"""Placement and batch arithmetic: GPUs fit the nodes, TP divides the heads, batches divide evenly, groups >= 2."""

from __future__ import annotations

from rlctl.backends import cpu_backends
from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check


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
    if res.trainer_gpus == []:  # a GPU recipe whose trainer has none contradicts itself, whichever backend
        return Result("placement.gpus", FAIL, "resources.trainer_gpus = []: the trainer gets no GPU",
                      "leave resources.trainer_gpus unset (the GPUs inference does not take) or list the trainer's "
                      "GPU ids")
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
    inference = r.inference_gpu_count if r.uses_vllm else 0
    if ctx.backend.colocated(r):
        need = max(ctx.backend.trainer_gpus(r), inference)
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
    spans = None
    if r.rollout.tensor_parallel > per_node:
        if not ctx.backend.tp_spans_nodes:
            return Result("placement.gpus", FAIL, f"TP {r.rollout.tensor_parallel} > {per_node} GPUs per node",
                          "a vLLM engine's tensor parallel group must fit in one node")
        # the backend places a TP group across nodes (Backend.tp_spans_nodes): it runs, its all-reduces cross nodes
        spans = Result("placement.gpus", WARN, f"TP {r.rollout.tensor_parallel} > {per_node} GPUs per node: each "
                       f"engine's tensor parallel group spans nodes, its all-reduces go over the network ({how})",
                       f"rollout.tensor_parallel <= {per_node} (more engines instead) keeps each engine on one node")
    if need > have:
        return Result("placement.gpus", FAIL, f"needs {need} GPUs ({how}) but the recipe has {res.nodes} x {per_node}",
                      "add GPUs (resources.nodes / gpus_per_node), fewer engines, or colocate")
    own = [f for f in ctx.backend.placement_errors(r) if f.level == "error"]
    if own:  # what the backend's own code refuses beyond the shared arithmetic (render refuses it too)
        return Result("placement.gpus", FAIL, f"{own[0].message}: {how}", own[0].fix)
    return spans or Result("placement.gpus", OK, f"{how} on {res.nodes} x {per_node} GPUs")


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


# what placement.batch says of a rollout smaller than one train batch (the agreement tests name it: a change of
# meaning rlctl refuses where the backend runs it)
LESS_THAN_A_BATCH = "is less than one train batch"


def _divisors_near(n: int, target: int, multiple_of: int) -> list[int]:
    """The divisors of n that are multiples of `multiple_of`, nearest to target first (the smaller on a tie)."""
    found = [d for d in range(multiple_of, n + 1, multiple_of) if n % d == 0]
    return sorted(found, key=lambda d: (abs(d - target), d))


def batch_fix(ctx: Context, samples: int, tbs: int, mb: int, dp: int) -> dict[str, int] | None:
    """The nearest batch arithmetic that works and that the backend honours: keep the train batch and lower the micro
    batch where that is enough, else the train batch that divides the rollout nearest to the recipe's (with the
    largest micro batch that fits). A rollout must make at least one optimizer step: a train batch larger than the
    rollout is never kept. Each candidate is put to the adapter (unhonoured()) with the batch keys it leaves as they
    are, so that a fix of one key is not proposed where the other still breaks the backend's own rule."""
    from rlctl.preflight._fixes import honoured

    b, r = ctx.backend, ctx.recipe
    straddle, rounds = b.updates_straddle_rollouts, b.train_batch_rounds or not b.honours_micro_batch
    candidates: list[dict[str, int]] = []
    if samples % tbs == 0 or (straddle and samples >= tbs):
        candidates += [{"train.micro_batch_size": m} for m in range(mb, 0, -1) if tbs % (m * dp) == 0]
    # a backend that rounds takes any micro batch: the recipe's first, then those that divide the rollout
    micros = [mb] + [m for m in range(mb - 1, 0, -1) if not rounds or samples % (m * dp) == 0]
    for m in micros:
        for d in _divisors_near(samples, tbs, 1 if rounds else m * dp):
            if b.honours_micro_batch and m * dp > d:  # one micro batch over the train batch: a step is not d
                continue
            candidates.append({"train.train_batch_size": d, **({"train.micro_batch_size": m} if m != mb else {})})
    now = {"train.train_batch_size": tbs, **({"train.micro_batch_size": mb} if b.honours_micro_batch else {})}
    for cand in candidates:
        if cand.get("train.train_batch_size", tbs) == tbs and cand.get("train.micro_batch_size", mb) == mb:
            continue
        if honoured(b, r, {**now, **cand}):
            return cand
    return None


def _rollout_fix(ctx: Context, tbs: int) -> tuple[str, dict[str, int]] | None:
    """More prompts per rollout, the fewest that make it whole train batches, where the backend reads
    rollout.prompts_per_step (the other way to make a rollout at least one optimizer step)."""
    from rlctl.preflight._fixes import honoured

    r = ctx.recipe
    g, pps = r.rollout.group_size, r.rollout.prompts_per_step
    more = next(p for p in range(pps + 1, pps + tbs + 1) if (p * g) % tbs == 0)
    sets = {"rollout.prompts_per_step": more}
    return (f"set rollout.prompts_per_step = {more}", sets) if honoured(ctx.backend, r, sets) else None


@check("placement.batch", hosts="placement")
def batch(ctx: Context) -> list[Result]:
    r = ctx.recipe
    out = []
    samples = ctx.backend.samples_per_step(r)
    tbs = r.train.train_batch_size
    dp = max(ctx.backend.trainer_gpus(r), 1)
    mb = r.train.micro_batch_size if ctx.backend.honours_micro_batch else 1
    problems = []
    rollout = f"a rollout of {r.rollout.prompts_per_step} prompts x {r.rollout.group_size} = {samples} samples"
    if samples < tbs:
        # no optimizer step per rollout: where updates straddle rollouts each step waits for several, so a step
        # learns from more prompts than rollout.prompts_per_step says, and the run's step counts are not the recipe's
        rounds = -(-tbs // samples)
        problems.append(f"{rollout} {LESS_THAN_A_BATCH} of {tbs}: 0 optimizer steps per rollout"
                        + (f" (each step waits for {rounds} rollouts, {rounds * r.rollout.prompts_per_step} prompts, "
                           f"not rollout.prompts_per_step {r.rollout.prompts_per_step})"
                           if ctx.backend.updates_straddle_rollouts else ""))
    elif samples % tbs and not ctx.backend.updates_straddle_rollouts:
        problems.append(f"{rollout} does not divide into train batches of {tbs}")
    # a backend that packs its own micro batches spreads samples over its ranks by tokens: no divisibility to meet
    if tbs % (mb * dp) and not ctx.backend.train_batch_rounds and ctx.backend.honours_micro_batch:
        problems.append(f"train batch {tbs} is not a multiple of micro batch {mb} x {dp} data-parallel GPUs")
    if problems:
        fix = batch_fix(ctx, samples, tbs, mb, dp)
        more = _rollout_fix(ctx, tbs) if samples < tbs else None
        text = (("set " + ", ".join(f"{k} = {v}" for k, v in fix.items())) if fix else
                f"make train.train_batch_size a divisor of {samples} and a multiple of {dp} GPUs")
        if fix is None and more is not None:
            text, fix, more = more[0], more[1], None
        out.append(Result("placement.batch", FAIL, "; ".join(problems), text, set=fix,
                          other_fixes=[more] if more else []))
    out += ctx.backend.preflight(ctx, "placement")
    if not out and mb * dp > tbs and ctx.backend.honours_micro_batch:  # a backend that rounds takes one micro batch
        out.append(Result("placement.batch", WARN,
                          f"micro batch {mb} x {dp} data-parallel GPU(s) = {mb * dp} samples > train batch {tbs}: "
                          f"each optimizer step takes {mb * dp} samples, not {tbs}",
                          f"set train.micro_batch_size <= {max(tbs // dp, 1)} or train.train_batch_size = {mb * dp}"))
    if not out:
        steps = samples // tbs
        full, rest = divmod(tbs, mb * dp)
        # a backend that rounds (train_batch_rounds) splits each GPU's share into micro batches, the last smaller
        micro = (f"{full} accumulation step(s) of {mb} x {dp} GPU(s)" if not rest else
                 f"{full + 1} accumulation step(s) per GPU: {full} of {mb} x {dp} GPU(s) and the last of "
                 f"{rest // dp if rest % dp == 0 else f'{rest} over {dp}'} x {dp}")
        epochs = r.train.epochs_per_rollout or 1
        # each epoch over the rollout steps the optimizer again (TRL num_iterations, OpenRLHF max_epochs, verl
        # ppo_epochs): a hostile trial read "1 optimizer step" where TRL made 2 per rollout
        per = (f"{steps} optimizer step(s) of {tbs}" if epochs == 1 else
               f"{steps} optimizer step(s) of {tbs} x {epochs} epochs = {steps * epochs} optimizer steps per rollout")
        out.append(Result("placement.batch", OK, f"{samples} samples per rollout = {per}; {micro}"))
    return out


@check("placement.group_size")
def group_size(ctx: Context) -> Result:
    r = ctx.recipe
    g = r.rollout.group_size
    if r.algorithm.name != "ppo" and g < 2:
        # FAIL where the backend refuses it; where it runs, without a group baseline: said loudly
        return Result("placement.group_size", FAIL if ctx.backend.refuses_single_sample(r) else WARN,
                      f"group_size {g}: {r.algorithm.name} normalises rewards within a group, one sample has no "
                      "baseline" + ("" if ctx.backend.refuses_single_sample(r) else
                                    f" ({r.backend.name} runs it: the advantages are not what "
                                    f"{r.algorithm.name} means)"),
                      "set rollout.group_size >= 2 (4-16 is typical)")
    if r.algorithm.name != "ppo" and g < 4:
        return Result("placement.group_size", WARN, f"group_size {g}: advantage estimates are noisy",
                      "4-16 samples per prompt is typical")
    return Result("placement.group_size", OK, f"{g} samples per prompt")


@check("placement.hosts")
def hosts(ctx: Context) -> Result | None:
    """Every host `[run] on` names is one rlctl knows (hosts.toml): launch would refuse it, after preflight passed.
    Not on the host a run was sent to: its recipe names the laptop's hosts."""
    import os

    from rlctl.core.host import hosts_file, unknown_hosts
    from rlctl.preflight.references import where

    on = ctx.recipe.run.on
    if on is None or os.environ.get("RLCTL_REMOTE_SIDE"):
        return None
    names = [on] if isinstance(on, str) else list(on)
    missing = unknown_hosts(names)
    if not missing:
        return Result("placement.hosts", OK, f"run.on: {', '.join(names)} in {hosts_file()}")
    return Result("placement.hosts", FAIL,
                  f"{where(ctx, 'run.on')}: run.on names {', '.join(repr(n) for n in missing)}, no host in "
                  f"{hosts_file()}",
                  " and ".join(f"rlctl hosts add {n} USER@HOST" for n in missing)
                  + " (--workdir DIR --python PATH as that host needs), or remove it from run.on")


@check("placement.pool")
def pool(ctx: Context) -> Result | None:
    """A pool (`[run] on = [...]`) moves a run whose host is gone to another host from its newest synced checkpoint;
    without `checkpoint.sync` there is none the other hosts can reach (docs/resilience.md)."""
    r = ctx.recipe
    if not isinstance(r.run.on, list):
        return None
    hosts = ", ".join(r.run.on)
    if r.checkpoint.sync:
        import os

        from rlctl.core.host import unknown_hosts

        if not os.environ.get("RLCTL_REMOTE_SIDE") and unknown_hosts(list(r.run.on)):  # no OK about a host unknown
            return Result("placement.pool", SKIP, f"pool of {len(r.run.on)} host(s) ({hosts}): not every one is a "
                          "host rlctl knows (placement.hosts says which)")
        return Result("placement.pool", OK, f"pool of {len(r.run.on)} host(s) ({hosts}); a failover resumes from the "
                      f"newest complete checkpoint in {r.checkpoint.sync}")
    return Result("placement.pool", WARN,
                  f"pool of {len(r.run.on)} host(s) ({hosts}) without checkpoint.sync: a run that loses its host fails "
                  "over from step 0 (or from a copy `rlctl ckpt pull` brought here), and its old attempt is stopped "
                  "only once that host answers again",
                  'set checkpoint.sync = "s3://bucket/prefix" (any fsspec URL; pip install "rlctl[sync]")')
