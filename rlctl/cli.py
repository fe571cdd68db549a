"""The rlctl command line. One small function per command; the work is in the modules they call.

Heavy libraries (torch, ray, vllm, deepspeed, wandb) are never imported here: `rlctl --help`, render, preflight
and status stay fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from rlctl.errors import EXIT_CHECK_FAILED, EXIT_USAGE, RlctlError

app = typer.Typer(
    name="rlctl",
    help="A control plane for RL fine-tuning of LLMs (OpenRLHF, prime-rl, verl, TRL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
recipe_app = typer.Typer(help="Inspect recipes.", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")

RecipeArg = Annotated[str, typer.Argument(help="Recipe TOML file (or the name of a bundled recipe).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set rollout.group_size=16")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _echo(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@recipe_app.command("show")
def recipe_show(recipe: RecipeArg, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Print the resolved recipe (extends and --set applied, defaults filled in)."""
    from rlctl.recipe import load

    resolved = load(recipe, set_)
    _echo(resolved.to_json() if as_json else resolved.to_toml())


@app.command()
def render(
    recipe: RecipeArg,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write launch.sh and config files here.")] = None,
    as_json: JsonOpt = False,
    no_validate: Annotated[bool, typer.Option("--no-validate", help="Don't check flags against the backend.")] = False,
) -> None:
    """Print exactly what would be launched: command, environment, and files. Exit 1 if a flag/key is unknown."""
    from rlctl.planning import prepare

    prep = prepare(recipe, set_)
    findings = [] if no_validate else prep.validate()
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
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only these checks or families.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the LR curve to this PNG.")] = None,
) -> None:
    """Run every check that needs no GPU. Exit 0 if nothing fails, 1 if a check fails, 2 for unusable input."""
    from rlctl import preflight as pf
    from rlctl.planning import prepare

    prep = prepare(recipe, set_)
    results = pf.run(prep, only)
    if plot is not None:
        from rlctl.plots import plot_lr

        plot_lr(prep.backend.schedule(prep.recipe, prep.dataset_size), prep.recipe, plot)
        typer.echo(f"wrote {plot}", err=True)
    if as_json:
        _echo(json.dumps({"recipe": str(prep.resolved.path), "backend": prep.plan.backend,
                          "ok": not pf.failed(results), "results": [r.to_dict() for r in results]},
                         indent=2, default=str))
    else:
        from rlctl.tables import preflight_table

        preflight_table(results, f"preflight: {prep.resolved.path.name} ({prep.plan.backend} {prep.plan.version})")
    if pf.failed(results):
        raise typer.Exit(EXIT_CHECK_FAILED)


def main() -> None:
    """Entry point: user-facing errors become a message and an exit code, never a traceback."""
    try:
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except RlctlError as e:
        typer.echo(f"rlctl: {e}", err=True)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("rlctl: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # click usage errors and the like
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(EXIT_USAGE)
        raise


if __name__ == "__main__":
    main()
