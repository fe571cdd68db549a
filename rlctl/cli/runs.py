"""Runs: launch, resume, supervise, stop, logs, attach, status, metrics, doctor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from rlctl.cli._app import (
    AccountOpt,
    JsonOpt,
    PartitionOpt,
    RecipeArg,
    RunArg,
    SetOpt,
    TimeOpt,
    _echo,
    _seconds,
    app,
    on_option,
)
from rlctl.errors import EXIT_CHECK_FAILED, RlctlError


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
    executor: Annotated[str | None, typer.Option(
        "--executor", help="local (default), ray, slurm, or a plugin's.")] = None,
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (with --executor ray).")] = None,
    grace: Annotated[float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL on stop.")] = 30.0,
    restart: Annotated[str | None, typer.Option(
        "--restart", help="never | on-failure | on-stall | always: restart from the latest complete checkpoint "
        "(default: the recipe's [run] restart).")] = None,
    max_restarts: Annotated[int | None, typer.Option(
        "--max-restarts", min=0, help="Give up after this many restarts (default: [run] max_restarts).")] = None,
    on: Annotated[str | None, typer.Option("--on", callback=on_option,
                                           help="Run on this SSH host (rlctl hosts list), or the first of a "
                                           "pool that fits (--on box1,box2: rlctl watch moves the run when its host "
                                           "is gone); --resume then takes RUN or HOST:RUN.")] = None,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    time_limit: TimeOpt = None,
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
                         restart, max_restarts, on,
                         placement={"partition": partition, "account": account, "time": time_limit})
    run_dir, code = do_launch(opts)
    if detach:
        _echo(run_dir.name)
    raise typer.Exit(0 if code == 0 else (130 if code in (-2, -15, 130, 143) else 1))


@app.command(epilog="Unattended: a systemd unit with WorkingDirectory=<where you launch> and ExecStart=rlctl watch "
                   "(Restart=always), or cron: */5 * * * * cd ~/exp && rlctl watch --once (docs/resilience.md)")
def watch(
    runs: Annotated[list[str] | None, typer.Argument(help="Runs (name, unique prefix or directory); default: every "
                                                     "pool run here that has not ended.")] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between looks at each run.")] = 30.0,
    once: Annotated[bool, typer.Option("--once", help="One look at each run, then exit 0 (for cron).")] = False,
) -> None:
    """Keep pool runs alive unattended: a run whose host is gone (unreachable longer than [run] failover_after_s, or
    answering without the run's processes) moves to another host of its pool from its newest complete checkpoint;
    an old host that comes back has its attempt stopped; [run] on_event runs on failover, death and finish. Returns
    when the runs have ended (exit 0 when all finished)."""
    from rlctl.runs.state import find_run, read_state
    from rlctl.runs.watch import pool_runs
    from rlctl.runs.watch import watch as do_watch

    _seconds("--interval", interval, positive=True)
    dirs = [find_run(r) for r in runs] if runs else pool_runs()
    for d in dirs:
        if not isinstance(read_state(d).get("pool"), dict):
            raise RlctlError(f"{d.name} is not a pool run: there is no other host to move it to.",
                             hint=f"launch with --on HOST1,HOST2 (or [run] on = [...]) for that; rlctl logs -f "
                                  f"{d.name} follows this one")
    raise typer.Exit(do_watch(dirs, interval, once))


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
    from rlctl.runs.stopping import stop_plan, stop_run

    _seconds("--grace", grace)
    run_dir = find_run(run)
    if dry_run:
        _echo(stop_plan(run_dir, grace))
        return
    _echo(stop_run(run_dir, grace))




@app.command()
def logs(
    run: Annotated[str, typer.Argument(help="Run name (or unique prefix, or its directory).")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing as the run writes.")] = False,
    metrics: Annotated[bool, typer.Option("--metrics", help="The unified metrics stream, not the raw log.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Start this many lines from the end (0 = all).")] = 0,
    component: Annotated[str | None, typer.Option(
        "--component", "-c", help="One component's own log: inference, trainer, orchestrator, ray, supervisor (what "
        "the run has; an unknown one lists them).")] = None,
) -> None:
    """Print a run's raw log, one component's own log, or its unified metrics stream (JSON lines)."""
    from rlctl.runs.logs import show_logs
    from rlctl.runs.state import find_run

    if lines < 0:
        raise RlctlError(f"--lines {lines}: a count of lines, 0 (all) or more.", hint="rlctl logs RUN -n 100")
    if component is not None:
        if metrics:
            raise RlctlError("--metrics and --component: the metrics stream is the run's, not a component's.",
                             hint="drop one of them")
        from rlctl.runs.logs import show_component

        show_component(find_run(run), component, lines=lines, follow=follow)
        return
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
    recipe: Annotated[str | None, typer.Option(
        "--recipe", help="A recipe whose backend and metrics map (command: metrics_map) read the logs.")] = None,
    metrics_map: Annotated[str | None, typer.Option("--metrics-map", help="Trainer key -> rlctl name for a custom "
                                                    "trainer's logs: loss=policy_loss,avg_reward=reward/mean.")] = None,
) -> None:
    """Make a run directory for a run rlctl did not start: status, logs, doctor, metrics and ckpt then work on it.
    Exit 1 when a non-empty log yields no metrics record."""
    from rlctl.runs.attach import attach as do_attach
    from rlctl.runs.attach import follow as do_follow
    from rlctl.runs.attach import parse_metrics_map, report

    _seconds("--idle-exit", idle_exit)
    if _on_host(path):  # HOST:PATH, a log on an SSH host (rlctl hosts list)
        from rlctl import executors

        if follow:
            raise RlctlError("--follow with HOST:PATH: follow it with `rlctl logs RUN -f` (or status) instead.")
        text, code, _ = executors.get("ssh").attach_remote(*path.split(":", 1), backend, name, recipe=recipe,
                                                           metrics_map=metrics_map)
        _echo(text)
        raise typer.Exit(code)
    attached = do_attach(path, backend=backend, name=name, address=address, recipe=recipe,
                         metrics_map=parse_metrics_map(metrics_map))
    text, code = report(attached)
    _echo(text)
    if follow:  # a log that has no record yet may still get some
        attached.state = do_follow(attached.run_dir, attached.backend, idle_exit=idle_exit, echo=_echo)
        text, code = report(attached)
        _echo(text)
    raise typer.Exit(code)


def _on_host(path: str) -> bool:
    """HOST:PATH where HOST is a configured SSH host (and PATH is not a local file)."""
    host, sep, rest = path.partition(":")
    if not sep or not host or "/" in host or Path(path).exists():
        return False
    from rlctl.core.host import load_hosts

    try:
        return host in load_hosts()
    except RlctlError:
        return False


@app.command()
def status(
    run: Annotated[str | None, typer.Argument(help="A run for details; none for the table of runs.")] = None,
    as_json: JsonOpt = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh until interrupted.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes with --watch.")] = 2.0,
    stall_after: Annotated[float, typer.Option("--stall-after", help="Seconds without a new step = stalled.")] = 1800,
    experiment: Annotated[str | None, typer.Option("--experiment", "-e", help="Only this experiment's runs.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for each SSH host of remote runs.")]
    = 5.0,
    all_dirs: Annotated[bool, typer.Option("--all", help="The runs of every directory you launched from, not only "
                                           "./runs.")] = False,
) -> None:
    """Runs at a glance (grouped by experiment), or one run's progress, metrics, health and disk."""
    from rlctl.runs.status import show_status

    _seconds("--interval", interval, positive=True)
    _seconds("--stall-after", stall_after, positive=True)
    _seconds("--timeout", timeout, positive=True)
    import os

    os.environ["RLCTL_SSH_TIMEOUT"] = str(timeout)  # the SSH executor's wait for `status RUN`
    if all_dirs and run is not None:
        raise RlctlError("--all lists runs; with a RUN it has nothing to add.", hint=f"rlctl status {run}")
    show_status(run, as_json=as_json, watch=watch, interval=interval, stall_after=stall_after, experiment=experiment,
                timeout=timeout, all_dirs=all_dirs)




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


def _sync_finding(run_dir: Path) -> list:
    """A checkpoint sync that failed or is behind: the run's work is not where a failover or resume would look."""
    from rlctl.runs.checkpoints import find_checkpoints
    from rlctl.runs.doctor import Finding
    from rlctl.runs.state import read_state
    from rlctl.runs.sync import sync_health, sync_warning

    ckpts = find_checkpoints(str(read_state(run_dir).get("backend") or ""), run_dir)
    h = sync_health(run_dir, max((c.step for c in ckpts if c.complete), default=None))
    line = sync_warning(h)
    if not line:
        return []
    return [Finding("checkpoint.sync", "warn", line, "fix checkpoint.sync (or the store's credentials), then rlctl "
                    f"resume {run_dir.name} syncs what is missing; rlctl-events.jsonl has every sync_error",
                    {"sync": h})]


@app.command()
def doctor(
    run: RunArg, as_json: JsonOpt = False,
    weights: Annotated[bool, typer.Option("--weights", help="Compare the run's oldest and newest checkpoints: the "
                                          "fraction of tensors/values that changed (frozen-weights check).")] = False,
    between: Annotated[list[str] | None, typer.Option("--between", metavar="PATH|STEP",
                                                      help="Given twice: two checkpoint directories, .safetensors "
                                                      "files or the run's steps to compare instead; implies "
                                                      "--weights.")]
    = None,
) -> None:
    """Diagnose a run with the tuning playbook: flat learning, instability, spikes, collapse, truncation,
    zero-variance groups, train/eval divergence; with --weights, whether its checkpoints change at all.
    Exit 1 when a critical finding is made."""
    from rlctl.runs.doctor import cause_finding, diagnose, repeated_failure_finding, to_json
    from rlctl.runs.state import find_run, settled_status

    run_dir = find_run(run)
    settled_status(run_dir)  # a live run's executor brings its newest log here first (a remote run's mirror)
    # a run that died or hangs: why, first; then a failure that repeated and was not restarted
    findings = [f for f in (cause_finding(run_dir), repeated_failure_finding(run_dir)) if f is not None]
    findings += diagnose(run_dir) + _sync_finding(run_dir)
    unweighed = None
    if weights or between:
        from rlctl.runs.weights import between_paths, settle, weights_finding

        pair = between_paths(run_dir, between) if between else None
        import struct

        try:
            found = weights_finding(run_dir, pair=pair)
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:  # damaged or not safetensors
            where = f"--between {pair[0]} --between {pair[1]}" if pair else f"{run_dir.name}'s checkpoints"
            raise RlctlError(f"{where}: cannot read the weights ({e}).",
                             hint="give two checkpoint directories or .safetensors files") from None
        if found is None:  # nothing to compare: said, not reported as a frozen-weights finding
            from rlctl.runs.weights import nothing_to_compare

            unweighed = nothing_to_compare(run_dir)
        else:
            findings = settle(findings, found)
    if as_json:
        _echo(json.dumps({"run": run_dir.name, "findings": to_json(findings),
                          **({"weights": {"compared": False, "why": unweighed}} if unweighed else {})}, indent=2))
    else:
        if unweighed:
            _echo(f"weights: {unweighed}")
        if not findings:
            _echo(f"{run_dir.name}: no findings")
        for f in findings:
            _echo(f"[{f.severity}] {f.rule}: {f.message}\n    -> {f.action}"
                  + "".join(f"\n    evidence: {e}" for e in f.evidence.get("lines") or []))
    if any(f.severity == "critical" for f in findings):
        raise typer.Exit(EXIT_CHECK_FAILED)
