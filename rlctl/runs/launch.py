"""`rlctl launch`: preflight, patch, run directory, start the backend (attached or detached), resume."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.errors import CheckFailed, RlctlError

SECRET_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


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
    if r.logging.wandb:
        r.logging.wandb.offline = True


def child_environment(plan_env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The backend's environment: ours, the recipe's, rlctl's; `${NAME}` references resolved from ours."""
    env = dict(os.environ)
    missing = []
    for k, v in plan_env.items():
        m = SECRET_REF.match(v)
        if m:
            if m.group(1) not in os.environ:
                missing.append(m.group(1))
                continue
            env[k] = os.environ[m.group(1)]
        else:
            env[k] = v
    if missing:
        raise RlctlError(f"the run needs {', '.join(missing)} in the environment and it is not set.",
                         hint=f"export {missing[0]}=... (rlctl never writes it to disk)")
    env.update(extra)
    return env


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
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "rlctl" / "models")


def _argv(plan: Any) -> list[str]:
    argv = list(plan.argv)
    if plan.backend == "trl" and argv and argv[0] == "python3":
        argv[0] = sys.executable  # the TRL runner lives in rlctl's own environment
    return argv


def launch(opts: LaunchOptions, out: Any = None) -> tuple[Path, int]:
    """Start a run. Returns (run directory, exit code); detached runs return at once with code 0."""
    from rlctl import preflight as pf
    from rlctl.runs.rundir import create_run_dir, environment_record, masked_recipe_data
    from rlctl.executors.local import Supervisor, write_spec
    from rlctl.recipe.planning import prepare
    from rlctl.recipe.loader import dump_toml
    from rlctl.runs.state import find_run, runs_root, write_state

    out = out or sys.stderr
    prep = prepare(opts.recipe, opts.sets)
    recipe = prep.recipe
    resumed_from = None
    if opts.smoke:
        smoke(recipe)
    if opts.executor:
        recipe.resources.executor = opts.executor
    if opts.address:
        recipe.resources.ray_address = opts.address
    if opts.resume:
        resumed_from = find_run(opts.resume)
        _resume_from(recipe, prep.backend, resumed_from)
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
    name = opts.name or recipe.name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise RlctlError(f"--name {name!r}: use letters, digits, '.', '_' and '-'.")
    extra = {"RLCTL_RUN_DIR": "", "RLCTL_MODEL_CACHE": os.environ.get("RLCTL_MODEL_CACHE", _model_cache()),
             "PYTHONUNBUFFERED": "1"}
    child_env = child_environment(prep.plan.env, extra)  # fails before anything is written if a secret is missing

    run_dir = create_run_dir(runs_root(), name).resolve()
    if recipe.resources.executor == "ray" and not Path(recipe.checkpoint.dir).is_absolute():
        # a Ray job runs in a copy of the run directory: checkpoints must name the real one
        recipe.checkpoint.dir = str(run_dir / recipe.checkpoint.dir)
        prep.plan = prep.backend.render(recipe, prep.dataset_size)
    child_env["RLCTL_RUN_DIR"] = str(run_dir)
    child_env["RLCTL_METRICS_FILE"] = str(run_dir / "backend_metrics.jsonl")  # read by rlctl's OpenRLHF patch
    wandb_id = None
    if recipe.logging.wandb:
        wandb_id = wandb_run_id(run_dir, resumed_from)
        child_env["WANDB_RUN_ID"] = wandb_id  # honoured by wandb.init in every backend
        child_env["WANDB_RESUME"] = "allow"
    data = masked_recipe_data(recipe.model_dump(mode="json", exclude_none=True))
    (run_dir / "recipe.toml").write_text(dump_toml(data))
    prep.plan.write(run_dir)
    import json

    (run_dir / "env.json").write_text(json.dumps(environment_record(Path.cwd(), prep.backend.packages), indent=2))
    spec = {
        "argv": _argv(prep.plan), "backend": prep.plan.backend, "grace_seconds": opts.grace_seconds,
        "keep_last": recipe.checkpoint.keep_last, "checkpoint_dir": recipe.checkpoint.dir,
        "disk_headroom": recipe.preflight.disk_headroom,
        "prune_during_run": bool(recipe.checkpoint.keep_last) and prep.backend.prune_during_run(recipe),
        "sinks": sink_spec(recipe, run_dir, wandb_id),
    }
    write_spec(run_dir, spec)
    write_state(run_dir, name=run_dir.name, status="starting", backend=prep.plan.backend,
                version=prep.plan.version, total_steps=prep.plan.total_steps, recipe=str(prep.resolved.path),
                executor=recipe.resources.executor, started_at=time.time(),
                resumed_from=str(resumed_from) if resumed_from else None, wandb_run_id=wandb_id,
                preflight={r.verdict: sum(1 for x in results if x.verdict == r.verdict) for r in results})
    if resumed_from:
        (run_dir / "parent").symlink_to(resumed_from.resolve())

    if recipe.resources.executor == "ray":
        from rlctl.executors.ray import launch_ray

        return run_dir, launch_ray(run_dir, prep, child_env, opts, out)

    if opts.detach:
        with open(run_dir / "supervisor.log", "ab") as log:
            subprocess.Popen([sys.executable, "-m", "rlctl.executors.local", str(run_dir)], env=child_env,
                             cwd=run_dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        _wait_started(run_dir)
        return run_dir, 0

    from rlctl.ui.progress import Progress

    progress = Progress(out, prep.plan.total_steps)
    sup = Supervisor(run_dir, spec, child_env, on_tick=progress.tick)
    sup.install_signal_handlers()
    try:
        sup.start()
    except OSError:
        raise RlctlError(f"could not start {spec['argv'][0]!r}; see {run_dir / 'stdout.log'}.") from None
    code = sup.loop()
    progress.done(run_dir)
    return run_dir, code


def _wait_started(run_dir: Path, timeout: float = 20.0) -> None:
    from rlctl.runs.state import read_state

    deadline = time.time() + timeout
    while time.time() < deadline:
        if read_state(run_dir).get("status") != "starting":
            return
        time.sleep(0.05)


def _resume_from(recipe: Any, backend: Any, old_run: Path) -> None:
    """Point the recipe at the old run's newest complete checkpoint, with the backend's own resume flags."""
    from rlctl.runs.checkpoints import latest_complete

    ckpt = latest_complete(backend.name, old_run)
    if ckpt is None:
        raise RlctlError(f"{old_run.name} has no complete checkpoint to resume from.",
                         hint="rlctl ckpt list " + old_run.name)
    recipe.checkpoint.dir = str(ckpt.path.parent.resolve())
    recipe.checkpoint.resume = ckpt.step
    if backend.name == "trl":
        recipe.backend.trl.extra["resume_from_checkpoint"] = str(ckpt.path.resolve())
