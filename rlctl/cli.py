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
    context_settings={"help_option_names": ["-h", "--help"]},
)
recipe_app = typer.Typer(help="Inspect recipes.", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")
patch_app = typer.Typer(help="Versioned patch sets for installed backends.", no_args_is_help=True)
app.add_typer(patch_app, name="patch")
ckpt_app = typer.Typer(help="A run's checkpoints.", no_args_is_help=True)
app.add_typer(ckpt_app, name="ckpt")
model_app = typer.Typer(help="Models for smoke tests.", no_args_is_help=True)
app.add_typer(model_app, name="model")

RecipeArg = Annotated[str, typer.Argument(help="Recipe TOML file (or the name of a bundled recipe).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set rollout.group_size=16")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _echo(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _seconds(option: str, value: float, *, positive: bool = False) -> float:
    """A duration option: a finite number, >= 0 (or > 0); nan and inf are usage errors, not hangs."""
    import math

    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise RlctlError(f"{option} {value}: expected a finite number of seconds {'> 0' if positive else '>= 0'}.",
                         hint=f"e.g. {option} 30")
    return value


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
) -> None:
    """Print exactly what would be launched: command, environment, and files. Exit 1 if a flag/key is unknown."""
    from rlctl.recipe.planning import prepare

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
    from rlctl.recipe.planning import prepare

    pf.check_only(only)
    if plot is not None:
        from rlctl.ui.plots import check_out

        check_out(plot)
    prep = prepare(recipe, set_)
    results = pf.run(prep, only)
    if plot is not None:
        from rlctl.ui.plots import plot_lr

        plot_lr(prep.backend.schedule(prep.recipe, prep.dataset_size), prep.recipe, plot)
        typer.echo(f"wrote {plot}", err=True)
    if as_json:
        _echo(json.dumps({"recipe": str(prep.resolved.path), "backend": prep.plan.backend,
                          "ok": not pf.failed(results), "results": [r.to_dict() for r in results]},
                         indent=2, default=str))
    else:
        from rlctl.ui.tables import preflight_table

        preflight_table(results, f"preflight: {prep.resolved.path.name} ({prep.plan.backend} {prep.plan.version})")
    if pf.failed(results):
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command()
def launch(
    recipe: RecipeArg,
    set_: SetOpt = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return at once; follow with status/logs.")] = False,
    smoke: Annotated[bool, typer.Option("--smoke", help="A few steps, short lengths, small groups.")] = False,
    name: Annotated[str | None, typer.Option("--name", help="Run name (default: the recipe's name).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Start even if preflight fails.")] = False,
    resume: Annotated[str | None, typer.Option(
        "--resume", help="Resume from a run's newest complete checkpoint (copied), or a synced one (s3://...).",
    )] = None,
    executor: Annotated[str | None, typer.Option("--executor", help="local (default), ray, or a plugin's.")] = None,
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (with --executor ray).")] = None,
    grace: Annotated[float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL on stop.")] = 30.0,
    restart: Annotated[str | None, typer.Option(
        "--restart", help="never | on-failure | on-stall | always: restart from the latest complete checkpoint "
        "(default: the recipe's [run] restart).")] = None,
    max_restarts: Annotated[int | None, typer.Option(
        "--max-restarts", min=0, help="Give up after this many restarts (default: [run] max_restarts).")] = None,
) -> None:
    """Preflight, patch, create the run directory and start training; stream progress unless --detach."""
    from rlctl.executors import available
    from rlctl.runs.launch import LaunchOptions
    from rlctl.runs.launch import launch as do_launch
    from rlctl.runs.supervisor import POLICIES

    _seconds("--grace", grace)
    if executor is not None and executor not in available():
        raise RlctlError(f"--executor {executor!r}: expected one of {', '.join(available())}.")
    if restart is not None and restart not in POLICIES:
        raise RlctlError(f"--restart {restart!r}: expected one of {', '.join(POLICIES)}.")
    opts = LaunchOptions(recipe, set_ or [], detach, smoke, name, force, resume, executor, address, grace,
                         restart, max_restarts)
    run_dir, code = do_launch(opts)
    if detach:
        _echo(run_dir.name)
    raise typer.Exit(0 if code == 0 else (130 if code in (-2, -15, 130, 143) else 1))


@app.command()
def resume(run: Annotated[str, typer.Argument(help="Run name (or unique prefix, or its directory).")]) -> None:
    """Pick a run up after a reboot or a killed rlctl, in the background: adopt its live processes, or start the next
    attempt from the latest complete checkpoint. A finished run is left as it is."""
    from rlctl.runs.state import find_run
    from rlctl.runs.supervisor import resume_detached

    _echo(resume_detached(find_run(run)))


@app.command()
def supervise(run: Annotated[str, typer.Argument(help="Run name (or unique prefix, or its directory).")]) -> None:
    """Like resume, but in the foreground until the run ends (for systemd: ExecStart=rlctl supervise RUN)."""
    from rlctl.runs.state import find_run, read_state
    from rlctl.runs.supervisor import supervise_foreground

    run_dir = find_run(run)
    code = supervise_foreground(run_dir)
    _echo(f"{run_dir.name}: {read_state(run_dir).get('status')}")
    raise typer.Exit(0 if code == 0 else 1)


@app.command()
def stop(
    run: Annotated[str, typer.Argument(help="Run name (or unique prefix, or its directory).")],
    grace: Annotated[float, typer.Option("--grace", help="Seconds to wait before SIGKILL.")] = 30.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be signalled; signal nothing.")] = False,
) -> None:
    """Stop a run cleanly: SIGTERM to its process group (or the Ray job), SIGKILL after the grace period."""
    from rlctl.runs.state import find_run
    from rlctl.runs.stopping import stop_run

    _seconds("--grace", grace)
    run_dir = find_run(run)
    if dry_run:
        _echo(_stop_plan(run_dir, grace))
        return
    _echo(stop_run(run_dir, grace))


def _stop_plan(run_dir: Path, grace: float) -> str:
    """What `rlctl stop` would do to a run, from its recorded state; nothing is signalled."""
    from rlctl.runs.state import ACTIVE, read_state

    st = read_state(run_dir)
    status = st.get("status", "unknown")
    if status not in ACTIVE:
        return f"{run_dir.name} is {status}: stop would do nothing."
    from rlctl import executors

    return executors.get(st.get("executor")).stop_plan(run_dir, st, grace)


@app.command()
def logs(
    run: Annotated[str, typer.Argument(help="Run name (or unique prefix, or its directory).")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing as the run writes.")] = False,
    metrics: Annotated[bool, typer.Option("--metrics", help="The unified metrics stream, not the raw log.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Start this many lines from the end (0 = all).")] = 0,
) -> None:
    """Print a run's raw log or its unified metrics stream (JSON lines)."""
    from rlctl.runs.logs import show_logs
    from rlctl.runs.state import find_run

    show_logs(find_run(run), follow=follow, metrics=metrics, lines=lines)


@app.command(epilog="Example: rlctl attach ~/openrlhf/train.log --backend auto --name gptoss-a --follow")
def attach(
    path: Annotated[str, typer.Argument(help="A log file, a directory (logs, checkpoints, TensorBoard, W&B offline "
                                             "runs, trainer_state.json) or a Ray job id.")],
    backend: Annotated[str, typer.Option("--backend", help="Which backend wrote it, or auto.")] = "auto",
    name: Annotated[str | None, typer.Option("--name", help="Run name (default: from PATH).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep reading the log while it grows.")] = False,
    address: Annotated[str | None, typer.Option("--address", help="Ray dashboard, for a Ray job id.")] = None,
    idle_exit: Annotated[float, typer.Option("--idle-exit", help="With --follow: stop after this many seconds "
                                                                 "without growth (0 = never).")] = 0.0,
) -> None:
    """Make a run directory for a run rlctl did not start: status, logs, doctor, metrics and ckpt then work on it.
    Exit 1 when a non-empty log yields no metrics record."""
    from rlctl.runs.attach import attach as do_attach
    from rlctl.runs.attach import follow as do_follow
    from rlctl.runs.attach import report

    _seconds("--idle-exit", idle_exit)
    attached = do_attach(path, backend=backend, name=name, address=address)
    text, code = report(attached)
    _echo(text)
    if follow:  # a log that has no record yet may still get some
        attached.state = do_follow(attached.run_dir, attached.backend, idle_exit=idle_exit, echo=_echo)
        text, code = report(attached)
        _echo(text)
    raise typer.Exit(code)


@app.command()
def status(
    run: Annotated[str | None, typer.Argument(help="A run for details; none for the table of runs.")] = None,
    as_json: JsonOpt = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh until interrupted.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes with --watch.")] = 2.0,
    stall_after: Annotated[float, typer.Option("--stall-after", help="Seconds without a new step = stalled.")] = 1800,
) -> None:
    """Runs at a glance, or one run's progress, metrics, health and disk."""
    from rlctl.runs.status import show_status

    _seconds("--interval", interval, positive=True)
    _seconds("--stall-after", stall_after, positive=True)

    show_status(run, as_json=as_json, watch=watch, interval=interval, stall_after=stall_after)


DirOpt = Annotated[Path | None, typer.Option("--dir", help="Your own patch sets (<backend>/<version>/).")]
PythonOpt = Annotated[str | None, typer.Option("--python", help="Interpreter whose site-packages to patch.")]
SetArg = Annotated[str | None, typer.Argument(help="Patch set, e.g. openrlhf/0.9.3 (default: --backend's set).")]
BackendOpt = Annotated[str | None, typer.Option("--backend", help="Pick the set for this backend's installed version.")]


def _pick_set(name: str | None, backend: str | None, user_dir: Path | None, python: str | None):
    from rlctl import patching

    if name:
        return patching.find_set(name, user_dir)
    if not backend:
        raise RlctlError("name a patch set (rlctl patch list) or give --backend.")
    sets = [s for s in patching.discover(user_dir) if s.backend == backend]
    if not sets:
        raise RlctlError(f"no patch set for backend {backend!r}.")
    inst = patching.locate(sets[0].package, python)
    exact = [s for s in sets if s.version == inst.version]
    return exact[0] if exact else sets[-1]


@patch_app.command("list")
def patch_list(user_dir: DirOpt = None) -> None:
    """The patch sets shipped with rlctl and those in --dir."""
    from rlctl import patching

    for ps in patching.discover(user_dir):
        _echo(f"{ps.name}  ({ps.source}: {ps.root})  {ps.description}")
        for i, e in enumerate(ps.patches, 1):
            _echo(f"  {i}. {e.file.name}: {e.purpose}")
            _echo(f"     targets: {', '.join(e.targets)}")


@patch_app.command("status")
def patch_status(name: SetArg = None, backend: BackendOpt = None, python: PythonOpt = None,
                 user_dir: DirOpt = None, as_json: JsonOpt = False) -> None:
    """Each patch of a set against the installed package: applied, not applied, partly applied, conflicting."""
    from rlctl import patching

    ps = _pick_set(name, backend, user_dir, python)
    inst = patching.locate(ps.package, python)
    states, note = patching.status(ps, inst)
    if as_json:
        _echo(json.dumps({"set": ps.name, "installed": inst.version, "site": str(inst.site), "note": note,
                          "patches": [s.__dict__ for s in states]}, indent=2))
        return
    _echo(f"{ps.name} against {ps.package} {inst.version} in {inst.site}")
    if note:
        _echo(f"  ! {note}")
    for s in states:
        _echo(f"  {s.state:<15} {s.patch}" + (f"  ({s.note})" if s.note else ""))


@patch_app.command("apply")
def patch_apply(name: SetArg = None, backend: BackendOpt = None, python: PythonOpt = None, user_dir: DirOpt = None,
                dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change.")] = False,
                allow_version_mismatch: Annotated[bool, typer.Option("--allow-version-mismatch")] = False) -> None:
    """Apply a set in order, skipping what is applied; all or nothing."""
    from rlctl import patching

    ps = _pick_set(name, backend, user_dir, python)
    inst = patching.locate(ps.package, python)
    out = patching.apply(ps, inst, dry_run=dry_run, allow_version_mismatch=allow_version_mismatch)
    verb = "would apply" if dry_run else "applied"
    _echo(f"{ps.name}: {verb} {len(out.changed)} ({', '.join(out.changed) or '-'}); already applied "
          f"{len(out.skipped)}")
    if out.dry_run_output:
        _echo(out.dry_run_output)


@patch_app.command("revert")
def patch_revert(name: SetArg = None, backend: BackendOpt = None, python: PythonOpt = None, user_dir: DirOpt = None,
                 dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change.")] = False) -> None:
    """Undo a set (reverse order); all or nothing."""
    from rlctl import patching

    ps = _pick_set(name, backend, user_dir, python)
    inst = patching.locate(ps.package, python)
    out = patching.revert(ps, inst, dry_run=dry_run)
    _echo(f"{ps.name}: {'would revert' if dry_run else 'reverted'} {len(out.changed)} "
          f"({', '.join(out.changed) or '-'})")


RunArg = Annotated[str, typer.Argument(help="Run name (or unique prefix, or its directory).")]


@app.command()
def metrics(
    runs: Annotated[list[str], typer.Argument(help="One or more runs to compare.")],
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the curves (runs overlaid) to this PNG.")] = None,
    keys: Annotated[str, typer.Option("--keys", help="Comma-separated metric names.")] = "reward/mean",
    csv: Annotated[bool, typer.Option("--csv", help="Print step,run,key,value rows.")] = False,
) -> None:
    """Compare runs: overlaid curves (--plot), CSV, or the latest value of each key."""
    from rlctl.metrics.compare import compare

    _echo(compare(runs, [k.strip() for k in keys.split(",") if k.strip()], plot, csv))


@app.command()
def doctor(
    run: RunArg, as_json: JsonOpt = False,
    weights: Annotated[bool, typer.Option("--weights", help="Compare the run's oldest and newest checkpoints: the "
                                          "fraction of tensors/values that changed (frozen-weights check).")] = False,
    between: Annotated[list[Path] | None, typer.Option("--between", help="Two checkpoint directories (or "
                                                       ".safetensors files) to compare instead; implies --weights.")]
    = None,
) -> None:
    """Diagnose a run with the tuning playbook: flat learning, instability, spikes, collapse, truncation,
    zero-variance groups, train/eval divergence; with --weights, whether its checkpoints change at all.
    Exit 1 when a critical finding is made."""
    from rlctl.runs.doctor import diagnose, to_json
    from rlctl.runs.state import find_run

    run_dir = find_run(run)
    findings = diagnose(run_dir)
    if weights or between:
        from rlctl.runs.weights import weights_finding

        if between and len(between) != 2:
            raise typer.BadParameter("--between takes two checkpoints: --between A --between B")
        import struct

        try:
            findings.append(weights_finding(run_dir, pair=(between[0], between[1]) if between else None))
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:  # damaged or not safetensors
            where = f"--between {between[0]} {between[1]}" if between else f"{run_dir.name}'s checkpoints"
            raise RlctlError(f"{where}: cannot read the weights ({e}).",
                             hint="give two checkpoint directories or .safetensors files") from None
    if as_json:
        _echo(json.dumps({"run": run_dir.name, "findings": to_json(findings)}, indent=2))
    elif not findings:
        _echo(f"{run_dir.name}: no findings")
    else:
        for f in findings:
            _echo(f"[{f.severity}] {f.rule}: {f.message}\n    -> {f.action}")
    if any(f.severity == "critical" for f in findings):
        raise typer.Exit(EXIT_CHECK_FAILED)


@ckpt_app.command("list")
def ckpt_list(run: RunArg, as_json: JsonOpt = False) -> None:
    """Each checkpoint: step, size, complete or not, and which eval scored best."""
    from rlctl.runs.checkpoints import best_checkpoint, find_checkpoints
    from rlctl.runs.state import find_run, read_state

    run_dir = find_run(run)
    ckpts = find_checkpoints(read_state(run_dir).get("backend", ""), run_dir)
    best = best_checkpoint(run_dir)
    rows = [{"step": c.step, "complete": c.complete, "bytes": c.size(), "path": str(c.path)} for c in ckpts]
    if as_json:
        _echo(json.dumps({"checkpoints": rows, "best_eval": best}, indent=2))
        return
    if not rows:
        _echo(f"{run_dir.name}: no checkpoints")
    for r in rows:
        _echo(f"step {r['step']:>7}  {'complete' if r['complete'] else 'INCOMPLETE':<10}  {r['bytes'] / 1e9:8.2f} GB  "
              f"{r['path']}")
    if best:
        _echo(f"best eval: {best[1]} = {best[2]:.4g} at step {best[0]}")


@ckpt_app.command("prune")
def ckpt_prune(
    run: RunArg,
    keep_last: Annotated[int, typer.Option("--keep-last", help="Complete checkpoints to keep (>= 1).")],
    keep_best: Annotated[bool, typer.Option("--keep-best", help="Also keep the one at the best eval.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be deleted.")] = False,
) -> None:
    """Delete old checkpoints; never the newest complete one, one being written, or anything outside the run."""
    from rlctl.runs.checkpoints import prune
    from rlctl.runs.state import find_run, read_state

    run_dir = find_run(run)
    backend = read_state(run_dir).get("backend", "")
    doomed = prune(backend, run_dir, keep_last, keep_best, dry_run=True)
    sizes = {c.step: c.size() for c in doomed}
    for c in doomed:
        _echo(f"{'would delete' if dry_run else 'deleting'} step {c.step:>7}  {sizes[c.step] / 1e9:8.2f} GB  "
              + "  ".join(str(p) for p in c.paths()))
    if not dry_run and doomed:
        doomed = prune(backend, run_dir, keep_last, keep_best, dry_run=False)
    verb = "would delete" if dry_run else "deleted"
    _echo(f"{verb} {len(doomed)} checkpoint(s), {sum(sizes.values()) / 1e9:.2f} GB: "
          + (", ".join(f"step {c.step}" for c in doomed) or "nothing"))


@model_app.command("tiny")
def model_tiny(
    path: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    source: Annotated[str, typer.Option("--source", help="random:qwen2?hidden=64&layers=2")] = "random:qwen2",
) -> None:
    """A tiny randomly initialised model with a byte-level tokenizer (needs the [trl] extra)."""
    from rlctl.recipe.tiny_model import make_tiny, parse_random_source

    parse_random_source(source)
    if path.exists() and not path.is_dir():
        raise RlctlError(f"{path}: exists and is not a directory.", hint="name a new directory for the model.")
    if path.is_dir() and any(path.iterdir()) and not (path / "rlctl_tiny.json").is_file():
        raise RlctlError(f"{path}: a non-empty directory that is not an rlctl tiny model; writing there would "
                         "overwrite its config.json, weights and tokenizer. Nothing was written.",
                         hint="name a new or empty directory.")
    try:
        out = make_tiny(path, source)
    except ImportError as e:
        raise RlctlError(f"making a model needs torch and transformers ({e.name} is missing).",
                         hint="pip install torch transformers") from None
    _echo(str(out))


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """Click's exception classes, wherever this typer keeps them: typer >= 0.29 vendors click as `typer._click`
    (its exceptions derive from `typer.exceptions.TyperException`); older typer uses the `click` package."""
    types: list[type[BaseException]] = []
    for mod, attr in (("typer.exceptions", "TyperException"), ("typer._click.exceptions", "ClickException"),
                      ("click.exceptions", "ClickException")):
        try:
            types.append(getattr(__import__(mod, fromlist=[attr]), attr))
        except (ImportError, AttributeError):
            continue
    return tuple(types)


def _exit_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(Exit classes, Abort classes) of typer and of whichever click it uses."""
    exits: list[type[BaseException]] = [typer.Exit]
    aborts: list[type[BaseException]] = [typer.Abort]
    for mod in ("typer._click.exceptions", "click.exceptions"):
        try:
            m = __import__(mod, fromlist=["Exit", "Abort"])
        except ImportError:
            continue
        exits += [c for c in (getattr(m, "Exit", None),) if c]
        aborts += [c for c in (getattr(m, "Abort", None),) if c]
    return tuple(exits), tuple(aborts)


def os_error_message(e: OSError) -> str:
    """An OSError as a person reads it: the path, what went wrong, what to do."""
    import errno as _errno

    where = e.filename if e.filename is not None else ""
    if e.filename2 is not None:
        where = f"{where} -> {e.filename2}"
    what = e.strerror or str(e) or type(e).__name__
    hints = {
        _errno.ENAMETOOLONG: "use a shorter file name (most file systems allow 255 bytes per name).",
        _errno.EACCES: "check the permissions of the file and its directory.",
        _errno.EPERM: "check the permissions of the file and its directory.",
        _errno.ELOOP: "a symlink points (indirectly) at itself; fix or remove it.",
        _errno.ENOTDIR: "a part of the path is a file, not a directory.",
        _errno.ENOENT: "check the path; create the missing directory first.",
        _errno.EISDIR: "name a file, not a directory.",
        _errno.ENOSPC: "free disk space (rlctl ckpt prune RUN --keep-last N --dry-run shows what can go).",
        _errno.EROFS: "the file system is read-only; choose another location.",
        _errno.EEXIST: "choose another name, or remove the existing file.",
    }
    hint = hints.get(e.errno or -1)
    msg = f"{where}: {what}." if where else f"{what}."
    return msg + (f"\n  fix: {hint}" if hint else "")


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error becomes a message and an exit code (0 ok, 1 a check failed, 2 usage or input
    error), never a traceback. Set RLCTL_DEBUG=1 to see the traceback of an internal error."""
    import contextlib
    import os

    usage_types = _usage_error_types()
    exit_types, abort_types = _exit_types()
    for stream in (sys.stdout, sys.stderr):  # an ASCII-only terminal (LANG=C) gets '?' for a sparkline, not a crash
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure):
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="replace")
    try:
        rc = app(args=argv, prog_name="rlctl", standalone_mode=False)
        code = rc if isinstance(rc, int) else 0
    except RlctlError as e:
        typer.echo(f"rlctl: {e}", err=True)
        code = e.exit_code
    except exit_types as e:
        code = int(getattr(e, "exit_code", 1) or 0)
    except abort_types:
        typer.echo("rlctl: aborted", err=True)
        code = 130
    except KeyboardInterrupt:
        code = 130
    except usage_types as e:  # usage errors: unknown command/option, missing argument, bad value
        try:
            e.show()  # type: ignore[attr-defined]
        except Exception:  # a typer/click pair that cannot format its own usage line: the message alone
            fmt = getattr(e, "format_message", None)
            typer.echo(f"rlctl: {fmt() if callable(fmt) else e}\n  fix: rlctl --help lists the commands and "
                       "options.", err=True)
        code = EXIT_USAGE
    except BrokenPipeError:  # `rlctl ... | head`
        code = 0
    except OSError as e:
        typer.echo(f"rlctl: {os_error_message(e)}", err=True)
        code = EXIT_USAGE
    except RecursionError:
        typer.echo("rlctl: input nested too deeply to read.", err=True)
        code = EXIT_USAGE
    except Exception as e:
        if isinstance(e, ValueError) and ("null byte" in str(e) or "null character" in str(e)):
            typer.echo("rlctl: a path or name contains a NUL character (\\0), which no file name can hold.\n"
                       "  fix: check the value for stray escape sequences such as \\u0000.", err=True)
            code = EXIT_USAGE
        else:  # a bug in rlctl: still no traceback, but say so plainly
            if os.environ.get("RLCTL_DEBUG"):
                raise
            typer.echo(f"rlctl: internal error: {type(e).__name__}: {e}\n  fix: this is a bug in rlctl; rerun "
                       "with RLCTL_DEBUG=1 for the traceback and report it.", err=True)
            code = EXIT_CHECK_FAILED
    sys.exit(code)


if __name__ == "__main__":
    main()
