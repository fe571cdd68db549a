"""`rlctl eval`: held-out evals by hand, on a run's checkpoints or on a base model (docs/eval.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rlctl.cli._app import JsonOpt, _echo, app
from rlctl.errors import RlctlError

EPILOG = """\b
Examples:
  rlctl eval my-run                     the newest complete checkpoint, every eval set of its recipe
  rlctl eval my-run --all --set ood     every checkpoint (and the step-0 baseline) on the set `ood`
  rlctl eval my-run --step 30 --gpu 7   one checkpoint, on GPU 7, beside the training
  rlctl eval Qwen/Qwen2.5-7B --recipe r.toml   the baseline of a base model on the recipe's sets
"""


def _parse_target(target: str, recipe: str | None) -> tuple[Path | None, str]:
    """(run directory or None, the recipe to read the sets from)."""
    from rlctl.runs.state import find_run

    try:
        run_dir = find_run(target)
    except RlctlError as e:
        if recipe is None:
            raise RlctlError(f"{target!r} is not a run ({e}); to evaluate a model give the recipe with its eval sets.",
                             hint=f"rlctl eval {target} --recipe RECIPE.toml") from None
        return None, recipe
    return run_dir, recipe or str(run_dir / "recipe.toml")


@app.command("eval", epilog=EPILOG)
def eval_cmd(
    target: Annotated[str, typer.Argument(help="A run (name, prefix or directory), or a model path/id with --recipe.")],
    step: Annotated[int | None, typer.Option("--step", help="Evaluate the checkpoint of this step (0 = base).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every complete checkpoint, and the baseline.")] = False,
    set_name: Annotated[list[str] | None, typer.Option("--set", help="Only this eval set (repeatable).")] = None,
    on: Annotated[str | None, typer.Option("--on", help="Evaluate on this host (an SSH host).")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="CUDA_VISIBLE_DEVICES for the eval job.")] = None,
    recipe: Annotated[str | None, typer.Option("--recipe", help="Recipe with the eval sets (default: the run's).")]
    = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate checkpoints (or a base model) on the recipe's eval sets, each job in its own process; a run's
    results go into its metrics stream at the checkpoint's step."""
    from rlctl.evals.loop import EVALS, append_metrics, evals_spec, remote_executor, run_job_here
    from rlctl.evals.sets import eval_sets
    from rlctl.recipe.loader import load

    if step is not None and all_:
        raise RlctlError("--step and --all: choose one.", hint="--step N for one checkpoint, --all for every one")
    if on is not None:
        remote_executor(on)  # errors clearly while hosts are not available
    run_dir, recipe_path = _parse_target(target, recipe)
    resolved = load(recipe_path)
    r = resolved.recipe
    sets = eval_sets(r)
    if set_name:
        unknown = [n for n in set_name if n not in {s.name for s in sets}]
        if unknown:
            raise RlctlError(f"--set {unknown[0]}: no such eval set; the recipe has: "
                             f"{', '.join(s.name for s in sets) or 'none'}.")
        sets = [s for s in sets if s.name in set_name]
    if not sets:
        raise RlctlError(f"{recipe_path}: no eval sets to evaluate.",
                         hint="declare [eval.sets.<name>] data = \"...\" (or data.eval) in the recipe")
    from rlctl.backends import get_backend

    ev = evals_spec(r, get_backend(r.backend.name)) or {}
    ev.update(sets=[s.to_dict() for s in sets], evaluator=r.eval.evaluator, command=r.eval.command,
              base_model=r.model.path)
    if gpu is not None:
        ev["gpu"] = gpu
    jobs: list[tuple[int, str]] = []
    if run_dir is None:
        jobs = [(0, target)]
        out_dir = Path.cwd() / "rlctl-evals" / Path(target).name
    else:
        jobs = _run_jobs(run_dir, r.backend.name, step, all_)
        out_dir = run_dir / EVALS
    rows: list[dict[str, Any]] = []
    failed = False
    for s_step, model in jobs:
        base = ev["base_model"] if s_step > 0 else None
        metrics, failure = run_job_here({**ev, "base_model": base or ev["base_model"]}, s_step, model,
                                        ev["sets"], out_dir, run_dir)
        if run_dir is not None:
            append_metrics(run_dir, s_step, metrics)
        rows.append({"step": s_step, "model": model, "metrics": metrics, "error": failure})
        failed |= failure is not None
        if not as_json:
            _echo(f"step {s_step:>6}  {model}")
            for k, v in sorted(metrics.items()):
                _echo(f"    {k:<48} {v:.4g}")
            if failure:
                _echo(f"    failed: {failure}")
    if as_json:
        _echo(json.dumps({"target": target, "results": rows}, indent=2))
    if failed:
        raise typer.Exit(1)


def _run_jobs(run_dir: Path, backend: str, step: int | None, all_: bool) -> list[tuple[int, str]]:
    from rlctl.evals.loop import model_dir
    from rlctl.runs.checkpoints import find_checkpoints
    from rlctl.runs.state import read_state

    ckpts = [c for c in find_checkpoints(read_state(run_dir).get("backend") or backend, run_dir) if c.complete]
    base = _base_model(run_dir)
    if step == 0:
        return [(0, base)]
    if step is not None:
        found = [c for c in ckpts if c.step == step]
        if not found:
            raise RlctlError(f"{run_dir.name} has no complete checkpoint at step {step}; complete: "
                             f"{', '.join(str(c.step) for c in ckpts) or 'none'}.",
                             hint=f"rlctl ckpt list {run_dir.name}")
        return [(step, model_dir(found[0]))]
    if all_:
        return [(0, base)] + [(c.step, model_dir(c)) for c in ckpts]
    if not ckpts:
        raise RlctlError(f"{run_dir.name} has no complete checkpoint.", hint=f"rlctl eval {run_dir.name} --step 0 "
                         "evaluates its base model")
    return [(ckpts[-1].step, model_dir(ckpts[-1]))]


def _base_model(run_dir: Path) -> str:
    import tomllib

    try:
        return str(tomllib.loads((run_dir / "recipe.toml").read_text())["model"]["path"])
    except (OSError, ValueError, KeyError, TypeError):
        raise RlctlError(f"{run_dir}/recipe.toml: no model.path.") from None
