"""The Typer app, its command groups and the options several command modules share.

Heavy libraries (torch, ray, vllm, deepspeed, wandb) are never imported here: `rlctl --help`, render, preflight
and status stay fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from rlctl.errors import RlctlError


def _usage_name(p: Any) -> str:
    """An argument as the usage line and the missing-argument error write it: `RUN`, `RUNS...`."""
    return (p.metavar or p.name or "").upper() + ("..." if p.nargs != 1 else "")


def _missing_parameter() -> tuple[type[BaseException], ...]:
    """Click's MissingParameter, wherever this typer keeps it (typer >= 0.29 vendors click as `typer._click`)."""
    found: list[type[BaseException]] = []
    for mod in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(__import__(mod, fromlist=["MissingParameter"]).MissingParameter)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


class _Command(typer.core.TyperCommand):
    """A command whose usage line writes its arguments as click does (`RUN`, `[RUN]`, `RUNS...`): typer from 0.2x
    writes a required one as `{run}`, which a user reads as a placeholder left unformatted; and whose missing-argument
    error names it the same way (typer says `Missing argument 'run'.`)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name != "argument":
                pieces.extend(p.get_usage_pieces(ctx))
                continue
            name = _usage_name(p)
            pieces.append(name if p.required else f"[{name}]")
        return pieces

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _missing_parameter() as e:
            param = getattr(e, "param", None)
            if param is not None and param.param_type_name == "argument" and getattr(e, "param_hint", 1) is None:
                e.param_hint = f"'{_usage_name(param)}'"  # type: ignore[attr-defined]
            raise


class Typer(typer.Typer):
    """rlctl's Typer apps: every command built as _Command unless it names its own class."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or _Command, **kwargs)


app = Typer(
    name="rlctl",
    help="A control plane for RL fine-tuning of LLMs (OpenRLHF, prime-rl, verl, TRL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
recipe_app = Typer(help="Inspect recipes.", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")
patch_app = Typer(help="Versioned patch sets for installed backends.", no_args_is_help=True)
app.add_typer(patch_app, name="patch")
ckpt_app = Typer(help="A run's checkpoints.", no_args_is_help=True)
app.add_typer(ckpt_app, name="ckpt")
model_app = Typer(help="Models for smoke tests.", no_args_is_help=True)
app.add_typer(model_app, name="model")

def _print_version(value: bool) -> None:
    if value:
        from rlctl import __version__

        _echo(f"rlctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print rlctl's version and exit.")] = False) -> None:
    del version  # Unused: the callback answers


RecipeArg = Annotated[str, typer.Argument(help="Recipe TOML file (or the name of a bundled recipe).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE",
                                                  help="Override a key: --set rollout.group_size=16; "
                                                       "KEY=null unsets an optional key")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
# placement on a batch cluster: keys of the executor's own table ([executor.slurm] partition, account, time)
PartitionOpt = Annotated[str | None, typer.Option("--partition", help="With --executor slurm: the partition.")]
AccountOpt = Annotated[str | None, typer.Option("--account", help="With --executor slurm: the account to charge.")]
TimeOpt = Annotated[str | None, typer.Option("--time", help="With --executor slurm: the job's time limit "
                                             "(e.g. 4:00:00); it checkpoints and requeues itself before it.")]


def on_option(value: str | None) -> str | None:
    """The callback of the --on of a command that takes a pool (HOST[,HOST...]): one check that an empty host, an
    empty element or a host named twice is an error, not this machine (or a pool of one host twice)."""
    from rlctl.core.host import check_on

    return check_on(value)


def on_host_option(ctx: typer.Context, value: str | None) -> str | None:
    """The callback of the --on of a command that runs on one host (eval, patch): a list is an error saying so."""
    from rlctl.core.host import check_on

    return check_on(value, pool=False, command=" ".join(["rlctl", *ctx.command_path.split()[1:]]))


def _echo(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _json(obj: object) -> str:
    """--json output that every JSON parser reads: a non-finite number (a degenerate t, an unbounded interval) is
    null, never Python's bare Infinity/NaN; what JSON cannot hold (a path) is its text."""
    import json
    import math

    def clean(x: object) -> object:
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(obj), indent=2, default=str, allow_nan=False)


def _seconds(option: str, value: float, *, positive: bool = False) -> float:
    """A duration option: a finite number, >= 0 (or > 0); nan and inf are usage errors, not hangs."""
    import math

    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise RlctlError(f"{option} {value}: expected a finite number of seconds {'> 0' if positive else '>= 0'}.",
                         hint=f"e.g. {option} 30")
    return value

DirOpt = Annotated[Path | None, typer.Option("--dir", help="Your own patch sets (<backend>/<version>/).")]
PythonOpt = Annotated[str | None, typer.Option("--python", help="Interpreter whose site-packages to patch.")]
SetArg = Annotated[str | None, typer.Argument(help="Patch set, e.g. openrlhf/0.9.3 (default: --backend's set).")]
BackendOpt = Annotated[str | None, typer.Option("--backend", help="Pick the set for this backend's installed version.")]
RunArg = Annotated[str, typer.Argument(help="Run name (or unique prefix, or its directory).")]
