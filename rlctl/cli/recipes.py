"""Recipes: backends, recipe show, render, preflight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from rlctl.cli._app import AccountOpt, JsonOpt, PartitionOpt, RecipeArg, SetOpt, TimeOpt, _echo, app, recipe_app
from rlctl.errors import EXIT_CHECK_FAILED, RlctlError


@app.command()
def backends(as_json: JsonOpt = False) -> None:
    """List the registered backends, bundled and plugins: name, source distribution, known versions, runtime."""
    from rlctl.backends import listing, listing_text

    rows = listing()
    _echo(json.dumps(rows, indent=2) if as_json else listing_text(rows))


@recipe_app.command("show")
def recipe_show(recipe: RecipeArg, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Print the resolved recipe (extends and --set applied, defaults filled in)."""
    from rlctl.recipe.loader import load

    resolved = load(recipe, set_)
    _echo(resolved.to_json() if as_json else resolved.to_toml())


@app.command()
def render(
    recipe: RecipeArg,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write launch.sh and config files here.")] = None,
    as_json: JsonOpt = False,
    no_validate: Annotated[bool, typer.Option("--no-validate", help="Don't check flags against the backend.")] = False,
    executor: Annotated[str | None, typer.Option("--executor", help="Also what this executor submits (slurm: the "
                                                 "sbatch script).")] = None,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    time_limit: TimeOpt = None,
) -> None:
    """Print exactly what would be launched: command, environment, and files. Exit 1 if a flag/key is unknown."""
    from rlctl import executors
    from rlctl.recipe.planning import prepare
    from rlctl.runs.launch import place

    prep = prepare(recipe, set_)
    if executor is not None:
        executors.executor_class(executor)  # an unknown name is an error listing the known ones
        prep.recipe.resources.executor = executor
    place(prep.recipe, executor, {"partition": partition, "account": account, "time": time_limit})
    render_files = getattr(executors.get(prep.recipe.resources.executor), "render_files", None)
    for name, content in (render_files(prep.recipe, prep.backend) if render_files else {}).items():
        prep.plan.files[name] = content  # shown, and written with --out, like the backend's own files
    findings = [] if no_validate else prep.render_findings()
    if out is not None:
        if out.exists() and not out.is_dir():
            raise RlctlError(f"--out {out}: exists and is not a directory.")
        for p in prep.plan.write(out):
            typer.echo(f"wrote {p}", err=True)
    if as_json:
        plan = prep.plan
        _echo(json.dumps({
            "backend": plan.backend, "version": plan.version, "argv": plan.argv, "env": plan.masked_env(),
            "files": plan.files, "total_steps": plan.total_steps, "notes": plan.notes,
            "findings": [f.__dict__ for f in findings],
        }, indent=2))
    elif out is None:
        _echo(prep.plan.render_text())
    for f in findings:
        typer.echo(f"{f.level}: {f.message}" + (f" — {f.fix}" if f.fix else ""), err=True)
    if any(f.level == "error" for f in findings):
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command()
def preflight(
    recipe: RecipeArg,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
    only: Annotated[list[str] | None, typer.Option("--only", metavar="CHECK",
                                                   help="Run only these checks or families (repeat the option, "
                                                        "or separate them with commas).")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the LR curve to this PNG.")] = None,
) -> None:
    """Run every check that needs no GPU. Exit 0 if nothing fails, 1 if a check fails, 2 for unusable input."""
    from rlctl import preflight as pf
    from rlctl.recipe.planning import prepare

    only = [o.strip() for v in only or [] for o in v.split(",") if o.strip()] or None
    pf.check_only(only)
    if plot is not None:
        from rlctl.ui.plots import check_out

        check_out(plot)
    prep = prepare(recipe, set_)
    results = pf.run(prep, only)
    if plot is not None:
        from rlctl.ui.plots import plot_lr

        plot_lr(pf.Context(prep).lrs, prep.recipe, plot)  # bounded like the checks' curve (schedule.steps)
        typer.echo(f"wrote {plot}", err=True)
    none = pf.none_ran(only) if only and not results else None  # silence would read as a pass
    if as_json:
        _echo(json.dumps({"recipe": str(prep.resolved.path), "backend": prep.plan.backend,
                          "ok": not pf.failed(results), "results": [r.to_dict() for r in results],
                          **({"none_ran": none} if none else {})}, indent=2, default=str))
    elif none:
        _echo(f"preflight: {prep.resolved.path.name} ({prep.plan.label})\n{none}")
    else:
        from rlctl.ui.tables import preflight_table

        preflight_table(results, f"preflight: {prep.resolved.path.name} ({prep.plan.label})")
    if pf.failed(results):
        raise typer.Exit(EXIT_CHECK_FAILED)
