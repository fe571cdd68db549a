"""`rlctl launch`: preflight, patch, run directory, then `executors.get(name).submit(...)` (attached or detached);
`--resume PARENT` starts from a copy of the parent's newest complete checkpoint, never writing into the parent."""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.errors import CheckFailed, RlctlError
from rlctl.runs.rundir import SECRET_REF, child_environment  # noqa: F401 - re-exported for callers


@dataclass
class LaunchOptions:
    recipe: str
    sets: list[str]
    detach: bool = False
    smoke: bool = False
    name: str | None = None
    force: bool = False
    resume: str | None = None
    executor: str | None = None
    address: str | None = None
    grace_seconds: float = 30.0
    restart: str | None = None  # never | on-failure | on-stall | always (default: the recipe's [run] restart)
    max_restarts: int | None = None
    on: str | list[str] | None = None  # an SSH host (rlctl hosts), or a pool of them (a list, or "a,b")
    # a pool run's attempt (rlctl.runs.failover): its generation and fencing token, the W&B run id it continues, and
    # the stream of the attempts before it up to the step it resumes from (docs/resilience.md)
    lineage: dict[str, Any] | None = None
    exact_name: bool = False  # the run directory is named exactly `name` (an attempt of a pool run on a new host)
    resume_manifest: str | None = None  # with --resume URL: this synced checkpoint, not the newest
    placement: dict[str, str] | None = None  # --partition/--account/--time: keys of the executor's own table


def place(recipe: Any, executor: str | None, placement: dict[str, str] | None) -> None:
    """--partition P etc.: keys of `[executor.<name>]` for the executor that runs the recipe."""
    name = executor or recipe.resources.executor
    for key, value in (placement or {}).items():
        if value is not None:
            recipe.executor.place(name, key, value, f"--{key}")


def pool_hosts(on: str | list[str] | None) -> list[str] | None:
    """`--on box1,box2` or `[run] on = [...]` as a list of host names (a pool); a single name (str) is not a pool."""
    if isinstance(on, list):
        return list(on)
    if isinstance(on, str) and "," in on:
        return [h.strip() for h in on.split(",") if h.strip()]
    return None


def smoke(recipe: Any) -> None:
    """The seeds' quick mode: a few steps, short generations, small groups; nothing kept."""
    r = recipe
    r.train.steps = min(r.train.steps or 3, 3)
    r.train.episodes = None
    r.rollout.max_tokens = min(r.rollout.max_tokens, 64)
    r.rollout.group_size = max(2, min(r.rollout.group_size, 4))
    r.rollout.prompts_per_step = min(r.rollout.prompts_per_step, 2)
    r.train.train_batch_size = r.samples_per_rollout
    r.train.micro_batch_size = min(r.train.micro_batch_size, r.train.train_batch_size)
    r.checkpoint.every = None
    r.eval.every = None
    r.eval.baseline = False  # no step-0 eval either (docs/eval.md)
    if r.logging.wandb:
        r.logging.wandb.offline = True


def wandb_run_id(run_dir: Path, resumed_from: Path | None) -> str:
    """One W&B run per rlctl run, with a stable id: a resumed run continues its parent's W&B run."""
    from rlctl.runs.state import read_state

    if resumed_from is not None:
        parent = read_state(resumed_from).get("wandb_run_id")
        if parent:
            return str(parent)
    return re.sub(r"[^A-Za-z0-9_-]", "-", run_dir.name)[:64]


def sink_spec(recipe: Any, run_dir: Path, wandb_id: str | None) -> dict[str, Any]:
    names = list(recipe.logging.rlctl_sinks)
    spec: dict[str, Any] = {"names": names, "tensorboard": recipe.logging.tensorboard}
    if "wandb" in names:
        wb = recipe.logging.wandb
        if wb is None:
            raise RlctlError("logging.rlctl_sinks has wandb but there is no [logging.wandb] table.",
                             hint='add [logging.wandb] project = "..."')
        spec["wandb"] = {"project": wb.project, "entity": wb.entity, "name": wb.name or run_dir.name,
                         "offline": wb.offline, "id": wandb_id or wandb_run_id(run_dir, None),
                         "config": masked_config(recipe)}
    return spec


def masked_config(recipe: Any) -> dict[str, Any]:
    from rlctl.runs.rundir import masked_recipe_data

    return masked_recipe_data(recipe.model_dump(mode="json", exclude_none=True))


def _model_cache() -> str:
    from rlctl.recipe.tiny_model import model_cache

    return str(model_cache().absolute())


def launch(opts: LaunchOptions, out: Any = None) -> tuple[Path, int]:
    """Start a run. Returns (run directory, exit code); detached runs return at once with code 0."""
    import json

    from rlctl import executors
    from rlctl import preflight as pf
    from rlctl.recipe.loader import dump_toml
    from rlctl.recipe.planning import prepare
    from rlctl.runs.rundir import check_run_name, create_run_dir, environment_record, masked_recipe_data
    from rlctl.runs.state import check_run_ref, find_run, read_state, runs_root, write_state
    from rlctl.runs.supervisor import RestartPolicy, write_spec

    out = out or sys.stderr
    if opts.name is not None:
        check_run_name(opts.name)
    if opts.resume is not None:  # `--resume ""` is no parent: an error, not a fresh start
        check_run_ref(opts.resume)
    prep = prepare(opts.recipe, opts.sets)
    recipe = prep.recipe
    name = check_run_name(opts.name if opts.name is not None else recipe.name,
                          "--name" if opts.name is not None else "the recipe's name")
    if isinstance(opts.on, str):  # an empty --on is no host, never "here" (the CLI says so first)
        from rlctl.core.host import check_on

        check_on(opts.on)
    on = opts.on or (None if os.environ.get("RLCTL_REMOTE_SIDE") else recipe.run.on)
    if on:
        from rlctl.core.host import check_hosts_known
        from rlctl.preflight.references import key_where

        named = "--on" if opts.on else f"{key_where(prep.resolved, 'run.on')}: run.on"
        check_hosts_known(pool_hosts(on) or [str(on)], named)
        # the run goes to an SSH host (or a pool of them): preflight and supervision happen there
        return executors.get("ssh").launch(opts, pool_hosts(on) or on, out)  # type: ignore[attr-defined]
    resumed_from = parent_ckpt = None
    if opts.smoke:
        smoke(recipe)
    if opts.executor:
        recipe.resources.executor = opts.executor
    place(recipe, opts.executor, opts.placement)
    if opts.address:
        recipe.resources.ray_address = opts.address
    if opts.restart is not None:
        recipe.run.restart = opts.restart
    if opts.max_restarts is not None:
        recipe.run.max_restarts = opts.max_restarts
    policy = RestartPolicy.from_dict({"mode": recipe.run.restart, "max_restarts": recipe.run.max_restarts})
    executor = executors.get(recipe.resources.executor)
    remote = None  # --resume s3://...: a checkpoint synced by another run (checkpoint.sync), maybe elsewhere
    if opts.resume and "://" in opts.resume:
        from rlctl.runs.sync import read_latest

        if opts.resume_manifest:
            from rlctl.runs.sync import manifest_at, store

            fs, root = store(opts.resume)
            remote = manifest_at(fs, root, opts.resume_manifest)
        else:
            remote = read_latest(opts.resume)
        if remote is None:
            raise RlctlError(f"--resume {opts.resume}: no complete synced checkpoint there (no `latest`, or its "
                             "files are missing).")
        recipe.checkpoint.resume = remote["step"]
        prep.resume_source = f"the synced checkpoint of {opts.resume}, fetched into the new run (--resume)"
    elif opts.resume:
        resumed_from = find_run(opts.resume)
        _not_running(resumed_from, opts.force, out)
        parent_ckpt = _parent_checkpoint(prep.backend, resumed_from)
        recipe.checkpoint.resume = parent_ckpt.step
        prep.resume_source = f"{resumed_from.name}'s checkpoint, copied into the new run (--resume)"
    prep.plan = prep.backend.render(recipe, prep.dataset_size)

    results = pf.run(prep)
    if pf.failed(results) and not opts.force:
        from rlctl.ui.tables import preflight_table

        preflight_table([r for r in results if r.verdict in ("fail", "warn")], "preflight failed")
        raise CheckFailed("preflight failed; fix the recipe, or launch with --force to start anyway.")

    if recipe.patches.set:
        from rlctl.patching import apply_for_launch

        apply_for_launch(recipe, out)

    if "wandb" in recipe.logging.rlctl_sinks and recipe.logging.wandb is None:
        raise RlctlError("logging.rlctl_sinks has wandb but there is no [logging.wandb] table.",
                         hint='add [logging.wandb] project = "..."')
    extra = {"RLCTL_RUN_DIR": "", "RLCTL_MODEL_CACHE": _model_cache(),
             "PYTHONUNBUFFERED": "1"}
    child_env = child_environment(prep.plan.env, extra)  # fails before anything is written if a secret is missing

    if opts.exact_name:
        from rlctl.runs.rundir import create_named_run_dir

        run_dir = create_named_run_dir(runs_root(), name).resolve()
    else:
        run_dir = create_run_dir(runs_root(), name).resolve()
    rerender = False
    resume_changes: list[str] = []
    if resumed_from is not None:
        # the new run resumes from its own copy: nothing is ever written into the parent's directory
        own = _own_checkpoint_dir(recipe, run_dir, resumed_from)
        if own != recipe.checkpoint.dir:
            recipe.checkpoint.dir, rerender = own, True
        stage_checkpoint(parent_ckpt, _ckpt_root(resumed_from), _abs(run_dir, recipe.checkpoint.dir))
        resume_changes = point_staged(prep.backend, _abs(run_dir, recipe.checkpoint.dir), parent_ckpt.step)
    if remote is not None:
        from rlctl.runs.sync import fetch_manifest, mark_synced

        fetch_manifest(opts.resume, remote, _abs(run_dir, recipe.checkpoint.dir))
        resume_changes = point_staged(prep.backend, _abs(run_dir, recipe.checkpoint.dir), remote["step"])
        if recipe.checkpoint.sync == opts.resume:  # the run's own store: the checkpoint is synced already
            mark_synced(run_dir, opts.resume, remote)
    if executor.copies_working_dir and not Path(recipe.checkpoint.dir).is_absolute():
        # the job runs in a copy of the run directory: checkpoints must name the real one
        recipe.checkpoint.dir, rerender = str(run_dir / recipe.checkpoint.dir), True
    if rerender:
        prep.plan = prep.backend.render(recipe, prep.dataset_size)
    child_env["RLCTL_RUN_DIR"] = str(run_dir)
    child_env["RLCTL_METRICS_FILE"] = str(run_dir / "backend_metrics.jsonl")  # read by rlctl's OpenRLHF patch
    lineage = opts.lineage or {}
    if lineage:
        continue_stream(run_dir, lineage)
    wandb_id = None
    if recipe.logging.wandb:
        wandb_id = (lineage.get("wandb_run_id") or (remote or {}).get("wandb_run_id")  # --resume URL: its run's
                    or wandb_run_id(run_dir, resumed_from))
        child_env["WANDB_RUN_ID"] = wandb_id  # honoured by wandb.init in every backend
        child_env["WANDB_RESUME"] = "allow"
    data = masked_recipe_data(recipe.model_dump(mode="json", exclude_none=True))
    (run_dir / "recipe.toml").write_text(dump_toml(data))
    from rlctl.runs.components import write_components

    write_components(run_dir, prep.backend, recipe)  # where each component logs: status reads it, no recipe parse
    plan = prep.backend.prepare_launch(prep.plan, run_dir)
    plan.write(run_dir)
    from rlctl.evals.in_loop import write_context

    # what the backend's own eval runs, as rendered: its metrics are named eval/<set>/<mode> (docs/eval.md)
    in_loop = getattr(prep.backend, "in_loop_eval_run", None)  # a plugin adapter may not define it
    write_context(run_dir, in_loop(recipe) if in_loop else None)

    packages = (*prep.backend.packages, *prep.backend.recorded_packages)
    (run_dir / "env.json").write_text(json.dumps(environment_record(Path.cwd(), packages), indent=2))
    # progress, ETA and stall rules count the step the backend logs, which may stand for several optimizer steps
    per_logged = max(int(prep.backend.optimizer_steps_per_logged_step(recipe)), 1)
    logged_total = -(-plan.total_steps // per_logged) if plan.total_steps else plan.total_steps
    spec = {
        "argv": executor.command(plan, prep.backend, {}), "backend": plan.backend, "executor": executor.name,
        "grace_seconds": opts.grace_seconds,
        "keep_last": recipe.checkpoint.keep_last, "checkpoint_dir": recipe.checkpoint.dir,
        "min_free_gb": recipe.checkpoint.min_free_gb,
        "disk_headroom": recipe.preflight.disk_headroom,
        "prune_during_run": bool(recipe.checkpoint.keep_last) and prep.backend.prune_during_run(recipe),
        "sinks": sink_spec(recipe, run_dir, wandb_id),
        "total_steps": logged_total, "optimizer_steps": plan.total_steps,
        # the step the first attempt resumes from (--resume, a failover, the recipe's own step): at total_steps
        # the supervisor starts nothing (Supervisor._nothing_left)
        "resume_step": recipe.checkpoint.resume if type(recipe.checkpoint.resume) is int else None,
        "checkpoint_every": recipe.checkpoint.every, "eval_every": recipe.eval.every,
        "restart": {"mode": policy.mode, "max_restarts": policy.max_restarts},
        "stall": recipe.run.stall.model_dump(), "sync": recipe.checkpoint.sync,
        # what a supervisor started later (`rlctl resume`) adds to its own environment for the backend
        "env_extra": {k: child_env[k] for k in ("RLCTL_RUN_DIR", "RLCTL_METRICS_FILE", "RLCTL_MODEL_CACHE",
                                                "PYTHONUNBUFFERED", "WANDB_RUN_ID", "WANDB_RESUME") if k in child_env},
    }
    from rlctl.evals.loop import evals_spec

    spec["evals"] = evals_spec(recipe, prep.backend)  # baseline, checkpoint evals, stop_when (docs/eval.md)
    if lineage.get("fence"):
        spec["fence"] = lineage["fence"]  # its generation in the sync store (rlctl.runs.fencing)
        # checkpoints reach the store as often as the generation is checked: a failover resumes from a recent one
        spec["housekeeping_seconds"] = min(10.0, float(lineage["fence"].get("every_s") or 10.0))
    spec = executor.prepare(run_dir, spec, child_env, plan, recipe, opts)
    write_spec(run_dir, spec)
    write_state(run_dir, name=run_dir.name, status="starting", backend=plan.backend,
                version=plan.version, total_steps=logged_total, optimizer_steps=plan.total_steps,
                recipe=str(prep.resolved.path),
                executor=executor.name, started_at=time.time(),
                resumed_from=str(resumed_from) if resumed_from else (opts.resume if remote else None),
                resumed_from_checkpoint=str(parent_ckpt.path) if parent_ckpt else None, wandb_run_id=wandb_id,
                restart=spec["restart"],
                preflight={r.verdict: sum(1 for x in results if x.verdict == r.verdict) for r in results},
                **({"resume_changes": resume_changes} if resume_changes else {}))  # made the copy the one loaded
    if resumed_from:
        (run_dir / "parent").symlink_to(resumed_from.resolve())

    if opts.detach:
        executor.submit(run_dir, spec, child_env, detach=True)
        return run_dir, 0

    from rlctl.ui.progress import Progress

    progress = Progress(out, logged_total)
    try:
        code = executor.submit(run_dir, spec, child_env, detach=False, on_tick=progress.tick)
    except OSError:
        raise RlctlError(f"could not start {spec['argv'][0]!r}; see {run_dir / 'stdout.log'}.") from None
    if note := read_state(run_dir).get("nothing_left"):
        print(f"rlctl: {note}", file=out)
    progress.done(run_dir)
    from rlctl.metrics.gpu import verdict_line  # measured peak (NVML) vs the plan; says so when not measured

    if gpu_line := verdict_line(run_dir):  # none for a CPU recipe (gpus_per_node = 0)
        print(gpu_line, file=out)
    if read_state(run_dir).get("stopped_by"):
        return run_dir, 0  # stopped by the recipe's own stop_when: it ended as asked, not interrupted
    return run_dir, code


def continue_stream(run_dir: Path, lineage: dict[str, Any]) -> None:
    """An attempt that continues a pool run elsewhere starts with the run's stream up to the step it resumes from
    (every step once: the steps it repeats are dropped, and the records already sent to W&B are not sent again)."""
    from rlctl.metrics.sinks import skip_to_end
    from rlctl.metrics.stream import METRICS, STEP_FLOOR

    stream = lineage.get("stream")
    if not stream:
        return
    (run_dir / METRICS).write_text(stream if stream.endswith("\n") else stream + "\n")
    if lineage.get("from_step") is not None:
        (run_dir / STEP_FLOOR).write_text(str(int(lineage["from_step"])))
    skip_to_end(run_dir)


def _abs(run_dir: Path, d: str) -> Path:
    return Path(d) if Path(d).is_absolute() else run_dir / d


def _ckpt_root(run: Path) -> Path:
    from rlctl.runs.checkpoints import checkpoint_dir

    return checkpoint_dir(run)


def _not_running(parent: Path, force: bool, out: Any) -> None:
    """--resume of a run that still trains would start a second run from its checkpoint beside it (a fork, both
    writing their own checkpoints): refused unless --force, and said either way."""
    from rlctl.runs.state import ACTIVE, settled_status

    status = settled_status(parent)
    if status not in ACTIVE:
        return
    if not force:
        raise RlctlError(f"--resume {parent.name}: that run is still {status}; a new run from its checkpoint would "
                         "train beside it (a fork), not take over.",
                         hint=f"it goes on by itself (after a crash, `rlctl resume {parent.name}` continues it); to "
                              f"start a new run from its checkpoint, stop it first (rlctl stop {parent.name}) and "
                              "launch again, or add --force to fork it on purpose")
    print(f"rlctl: {parent.name} is still {status}: forking it (--force); it goes on, the new run starts from its "
          "checkpoint", file=out)


def point_staged(backend: Any, root: Path, step: int) -> list[str]:
    """The copy resumed from is what the backend's own resume loads in the new run's root (Backend.point_resume: a
    best-marked checkpoint older than the parent's newest is staged without OpenRLHF's `latest`, which names the
    newest). Returns what was changed there, in words."""
    staged = next((c for c in backend.checkpoints(root) if c.step == step), None) if root.is_dir() else None
    return backend.point_resume(root, staged) if staged is not None else []


def _parent_checkpoint(backend: Any, old_run: Path) -> Any:
    """The parent run's newest complete checkpoint — or, when a stop_when rule stopped it, the checkpoint marked
    best by its primary eval (docs/eval.md) — or a clear error."""
    from rlctl.runs.checkpoints import best_checkpoint, find_checkpoints, latest_complete
    from rlctl.runs.state import read_state

    mark = best_checkpoint(old_run, backend.name) if read_state(old_run).get("stopped_by") else None
    best = mark["step"] if mark else None
    ckpt = next((c for c in find_checkpoints(backend.name, old_run) if c.complete and c.step == best), None)
    if ckpt is not None:
        print(f"rlctl: resuming from step {best}, the checkpoint {old_run.name} marked best "
              f"({read_state(old_run)['stopped_by'].get('rule')} stopped it)", file=sys.stderr)
        return ckpt
    ckpt = latest_complete(backend.name, old_run)
    if ckpt is None:
        host = read_state(old_run).get("host")
        if host:  # a run on an SSH host: its checkpoints are there, not in this record of it
            raise RlctlError(f"{old_run.name} ran on {host}: no complete checkpoint of it is on this machine.",
                             hint=f"resume it on {host} (rlctl launch RECIPE --on {host} --resume {old_run.name}), "
                                  f"or bring its newest checkpoint here first (rlctl ckpt pull {old_run.name})")
        raise RlctlError(f"{old_run.name} has no complete checkpoint to resume from.",
                         hint="rlctl ckpt list " + old_run.name)
    return ckpt


def _own_checkpoint_dir(recipe: Any, run_dir: Path, parent: Path) -> str:
    """The new run's checkpoint directory: as the recipe says, unless that is the parent's (a shared absolute
    path) — then the new run's own `checkpoints/`."""
    mine = _abs(run_dir, recipe.checkpoint.dir).resolve()
    theirs = _ckpt_root(parent).resolve()
    if mine == theirs or theirs in mine.parents or mine in theirs.parents:
        return "checkpoints"
    return recipe.checkpoint.dir


def stage_checkpoint(ckpt: Any, parent_root: Path, dest_root: Path) -> list[Path]:
    """Copy what resuming needs from the parent — the checkpoint, the paths that belong to it, and the small
    marker files at the top of its checkpoint root (e.g. a `latest` pointer) — into the new run's checkpoint root,
    at the same relative places. Copies, never links: the new run may write and prune freely; the parent is only
    read."""
    import shutil

    dest_root.mkdir(parents=True, exist_ok=True)
    copied = []
    for src in [ckpt.path, *getattr(ckpt, "extra_paths", [])]:
        try:
            rel = src.resolve().relative_to(parent_root.resolve())
        except ValueError:
            rel = Path(src.name)
        dst = dest_root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=False)
        else:
            shutil.copy2(src, dst)
        copied.append(dst)
    from rlctl.runs.checkpoints import root_markers

    for p in root_markers(parent_root):
        if not (dest_root / p.name).exists():
            shutil.copy2(p, dest_root / p.name)
            copied.append(dest_root / p.name)
    return copied
