"""Experiments: sweep, ab, compare, and `experiment list/show/resume/stop`. The work is in rlctl.experiments."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from rlctl.cli._app import JsonOpt, RecipeArg, SetOpt, Typer, _echo, _json, _seconds, app, on_option
from rlctl.errors import EXIT_CHECK_FAILED, CheckFailed, RlctlError

experiment_app = Typer(help="Experiments: many runs of one question (sweeps, A/B tests).",
                             no_args_is_help=True)
app.add_typer(experiment_app, name="experiment")

GridOpt = Annotated[list[str] | None, typer.Option(
    "--grid", metavar="KEY=V1,V2",
    help="A grid axis KEY=V1,V2,... (repeat for more axes; every combination is one arm).")]
SeedsOpt = Annotated[int | None, typer.Option("--seeds", min=1, metavar="N",
                                              help="Runs per arm (train.seed, +1, ...); more "
                                              "than before extends the experiment.")]
NameOpt = Annotated[str | None, typer.Option("--name", help="Experiment name; an existing one is resumed/extended.")]
ParallelOpt = Annotated[int | None, typer.Option("--parallel", min=1, help="Runs at once (per host with --on).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Launch even if some variants fail preflight, or the arms "
                                         "differ only in keys that cannot act (they would train identically).")]
OnOpt = Annotated[str | None, typer.Option("--on", callback=on_option,
                                           help="Spread runs over SSH hosts: HOST[,HOST...].")]
ExecOpt = Annotated[str | None, typer.Option("--executor", help="local (default), ray, or a plugin's.")]
AddrOpt = Annotated[str | None, typer.Option("--address", help="Ray cluster address (with --executor ray).")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Stay until every variant has ended, printing progress.")]
QuestionOpt = Annotated[str | None, typer.Option("--question", help="What the experiment asks (for the report).")]
ExpArg = Annotated[str, typer.Argument(help="Experiment name (or its directory).")]


def _placement(parallel: int | None, on: str | None, executor: str | None, address: str | None, force: bool,
               needs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Where the variants may go: hosts (SSH), a Ray cluster, or this machine's GPUs; `parallel` runs per place."""
    import dataclasses

    from rlctl import executors
    from rlctl.experiments.queue import local_gpu_ids
    from rlctl.runs.launch import LaunchOptions
    from rlctl.runs.state import runs_root

    hosts: list[str] | None = None
    if on:
        hosts = [h.strip() for h in on.split(",") if h.strip()]
        has_on = any(f.name == "on" for f in dataclasses.fields(LaunchOptions))
        if not hosts:
            raise RlctlError(f"--on {on!r}: expected HOST[,HOST...].")
        if "ssh" not in executors.available() or not has_on:
            raise RlctlError(f"--on {on}: no ssh executor is registered in this rlctl, so runs cannot go to SSH hosts.",
                             hint="install an rlctl with the SSH executor (rlctl launch --on HOST), or drop --on to "
                                  "run here / --executor ray for a Ray cluster")
        from rlctl.core.host import get_host

        for h in hosts:  # every host known (rlctl hosts add) before anything is queued
            get_host(h)
    if executor is not None and executor not in executors.available():
        raise RlctlError(f"--executor {executor!r}: expected one of {', '.join(executors.available())}.")
    max_gpus = max((n.get("gpus") or 0 for n in needs.values()), default=0)
    recipe_executor = {n.get("executor") for n in needs.values()} - {None}
    place = executor or (recipe_executor.pop() if len(recipe_executor) == 1 else "local")
    gpu_ids: list[int] = []
    if not hosts and place == "local" and max_gpus:
        gpu_ids = local_gpu_ids()
        if max_gpus > len(gpu_ids):
            raise RlctlError(f"a variant needs {max_gpus} GPUs and this machine offers {len(gpu_ids)} "
                             f"({gpu_ids or 'none'}).", hint="use --executor ray or --on HOST, or fewer GPUs")
        if parallel is None:  # as many runs as the smallest fit; the GPU count keeps any two off the same GPUs
            min_gpus = min((n.get("gpus") or 0 for n in needs.values() if n.get("gpus")), default=max_gpus)
            parallel = max(len(gpu_ids) // min_gpus, 1)
    all_at_once = parallel is None and not hosts and executors.executor_class(place).queues_jobs
    if all_at_once:
        parallel = len(needs)  # the place's own queue (SLURM's) decides what runs when
    if max_gpus and any((n.get("nodes") or 1) > 1 for n in needs.values()) and place == "local" and not hosts:
        raise RlctlError("a variant needs more than one node; this machine is one.", hint="--executor ray")
    return {"parallel": parallel or 1, "hosts": hosts, "executor": executor, "address": address, "force": force,
            "gpu_ids": gpu_ids, "needs": needs, "runs_root": str(runs_root().resolve()), "all_at_once": all_at_once}


def _problems_text(problems: list[Any]) -> str:
    lines = [f"{len(problems)} variant(s) fail preflight; nothing launched:"]
    for p in problems:
        lines.append(f"  {p.variant}  ({p.settings})")
        lines += [f"    - {f}" for f in p.failures]
    return "\n".join(lines)


def _start(name: str, kind: str, arms: list[Any], seeds: int, parallel: int | None, on: str | None,
           executor: str | None, address: str | None, force: bool, wait: bool, question: str | None,
           grid: list[tuple[str, list[str]]] | None = None) -> None:
    from rlctl.experiments import manifest as mf
    from rlctl.experiments import queue
    from rlctl.experiments.variants import inert_keys, inert_record, preflight_all, refuse_inert, variants

    d = mf.exp_dir(name)
    if (d / mf.MANIFEST).is_file():
        raise RlctlError(f"experiment {name} exists with other settings.",
                         hint=f"rlctl experiment resume {name}, or choose another --name")
    # arms that would train identically, or a grid axis that cannot act: refused before any preflight or run (exit
    # 2); keys of a diff that cannot act beside others that do: said, the result is the others'
    found = inert_keys(arms)
    for w in refuse_inert(arms, "A and B" if kind == "ab" else f"the {len(arms)} arms of the grid", grid, found,
                          force):
        sys_err(f"warning: {w}")
    vs = variants(name, arms, seeds)
    sys_err(f"preflight of {len(vs)} variants ({len(arms)} arms x {seeds} seeds) ...")
    problems, needs = preflight_all(arms, vs)
    if problems and not force:
        sys_err(_problems_text(problems))
        raise CheckFailed("fix the variants, or pass --force to launch anyway.")
    placement = _placement(parallel, on, executor, address, force, needs)
    m = mf.new_manifest(name, kind, arms, seeds, vs, placement, question, inert_record(arms, force, found))
    m["preflight"] = {p.variant: p.failures for p in problems}
    mf.write_manifest(d, m)
    pid = queue.start_detached(d)
    pace = ("all at once (the scheduler's queue decides what runs when)" if placement["all_at_once"] else
            f"{placement['parallel']} at a time")
    _echo(f"{name}: {len(vs)} runs queued, {pace} (queue pid {pid}); rlctl experiment show {name}")
    if wait:
        _wait(d)


def _extend_or_resume(d: Path, seeds: int | None, wait: bool, force: bool) -> None:
    """`--name EXP` again: more seeds become new variants (preflighted), then the queue (re)starts."""
    from rlctl.experiments import manifest as mf
    from rlctl.experiments import queue
    from rlctl.experiments.variants import Arm, preflight_all, variants

    m = mf.read_manifest(d)
    if seeds is not None and seeds > m["seeds"]:
        arms = [Arm.from_dict(a) for a in m["arms"]]
        vs = variants(m["name"], arms, seeds, first=m["seeds"])
        problems, needs = preflight_all(arms, vs)
        if problems and not (force or m["placement"].get("force")):
            sys_err(_problems_text(problems))
            raise CheckFailed("fix the variants, or pass --force to launch anyway.")
        m["seeds"] = seeds
        m["variants"] += [v.to_dict() for v in vs]
        m["placement"].setdefault("needs", {}).update(needs)
        if m["placement"].get("all_at_once"):  # more seeds go to the scheduler's queue at once too
            m["placement"]["parallel"] = len(m["variants"])
        mf.write_manifest(d, m)
        sys_err(f"{m['name']}: {len(vs)} runs added ({seeds} seeds per arm now)")
    elif seeds is not None and seeds < m["seeds"]:
        sys_err(f"{m['name']} has {m['seeds']} seeds per arm already; --seeds {seeds} removes none.")
    pid = queue.start_detached(d)
    _echo(f"{m['name']}: queue running (pid {pid}); rlctl experiment show {m['name']}")
    if wait:
        _wait(d)


def _wait(d: Path) -> None:
    from rlctl.experiments.manifest import read_json, variant_status
    from rlctl.experiments.queue import QUEUE, queue_alive

    last = ""
    while True:
        rows = variant_status(d)  # the queue's counts; each run's own status once the queue has ended
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["queue"]] = counts.get(r["queue"], 0) + 1
        line = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        if line != last:
            sys_err(f"{d.name}: {line}")
            last = line
        if not queue_alive(d):
            q = read_json(d / QUEUE)
            _echo(f"{d.name}: queue {q.get('state', 'gone')}")
            rows = settled_variants(d)
            bad = [r for r in rows if r["queue"] == "launch-failed" or r.get("status") not in ("finished", None)]
            if q.get("state") != "finished" or bad:
                raise typer.Exit(EXIT_CHECK_FAILED)
            return
        time.sleep(1.0)


def settled_variants(d: Path, manifest: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The variants with each run's status as `rlctl status` tells it (its rows: one mechanism), not as recorded."""
    from rlctl.experiments.manifest import read_queue, variant_status
    from rlctl.runs.status import table_rows

    told: dict[str, str] = {}
    if any(q.get("run_dir") for q in read_queue(d)["variants"].values()):
        with contextlib.suppress(RlctlError):  # an experiment whose record is gone: the recorded states
            told = {r["name"]: r["status"] for r in table_rows(root=d.parent.parent, experiment=d.name)}
    return variant_status(d, manifest, told=told)


def sys_err(text: str) -> None:
    typer.echo(text, err=True)


@app.command(epilog="Example: rlctl sweep r.toml --grid optim.lr=1e-6,2e-6 --grid algorithm.eps_clip=0.1,0.2 "
             "--set train.epochs_per_rollout=2 --seeds 3 --name lr-clip --parallel 2 (the clip acts only where a "
             "rollout is trained on after an optimizer step: rlctl preflight says where a key cannot act)")
def sweep(
    recipe: RecipeArg, grid: GridOpt = None, seeds: SeedsOpt = None, name: NameOpt = None, parallel: ParallelOpt = None,
    force: ForceOpt = False, on: OnOpt = None, executor: ExecOpt = None, address: AddrOpt = None, set_: SetOpt = None,
    wait: WaitOpt = False, question: QuestionOpt = None,
) -> None:
    """Run every combination of a grid (or the recipe's [sweep] table) over seeds, as capacity frees up. Every
    variant is preflighted first; the queue runs in the background (rlctl experiment show/stop/resume)."""
    from rlctl.experiments import manifest as mf
    from rlctl.experiments.variants import grid_arms, parse_grid
    from rlctl.recipe.loader import load

    if name is not None and (mf.exp_dir(name) / mf.MANIFEST).is_file():
        if grid:
            sys_err(f"{name} exists: its grid is the one it was made with; --grid is ignored.")
        _extend_or_resume(mf.exp_dir(name), seeds, wait, force)
        return
    r = load(recipe, set_ or []).recipe
    axes = parse_grid(grid or [])
    where = "--grid"
    if not axes and r.sweep is not None and r.sweep.grid:
        where = "[sweep] grid"
        axes = parse_grid([f"{k}={','.join(_toml_value(v) for v in vals)}" for k, vals in r.sweep.grid.items()],
                          where=where)
    if not axes:
        raise RlctlError("nothing to sweep: no --grid and no [sweep] grid in the recipe.",
                         hint="--grid optim.lr=1e-6,2e-6 (or rlctl ab A.toml B.toml for two recipes)")
    seeds = seeds or (r.sweep.seeds if r.sweep else 1)
    parallel = parallel or (r.sweep.parallel if r.sweep else None)
    name = name or f"{r.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    mf.check_name(name)
    arms = grid_arms(recipe, axes, set_ or [], where)
    _start(name, "sweep", arms, seeds, parallel, on, executor, address, force, wait, question, axes)


def _toml_value(v: Any) -> str:
    from rlctl.recipe.loader import dump_toml

    return dump_toml({"v": v}).split("=", 1)[1].strip()


@app.command(epilog="Example: rlctl ab a28a.toml a28b.toml --seeds 3 --name a28-eps-clip")
def ab(
    a: Annotated[str, typer.Argument(help="Recipe A (the baseline).")],
    b: Annotated[str, typer.Argument(help="Recipe B (the change).")],
    seeds: SeedsOpt = None, name: NameOpt = None, parallel: ParallelOpt = None, force: ForceOpt = False,
    on: OnOpt = None, executor: ExecOpt = None, address: AddrOpt = None, set_: SetOpt = None, wait: WaitOpt = False,
    question: QuestionOpt = None,
) -> None:
    """An A/B test of two recipes over the same seeds (paired by seed when they share data order)."""
    from rlctl.experiments import manifest as mf
    from rlctl.experiments.variants import ab_arms

    if name is not None and (mf.exp_dir(name) / mf.MANIFEST).is_file():
        _extend_or_resume(mf.exp_dir(name), seeds, wait, force)
        return
    arms = ab_arms(a, b, set_ or [])
    name = name or f"ab-{time.strftime('%Y%m%d-%H%M%S')}"
    mf.check_name(name)
    _start(name, "ab", arms, seeds or 1, parallel, on, executor, address, force, wait, question)


@app.command(epilog="Example: rlctl compare a28-eps-clip --metric eval/default/greedy_pass@1 --plot a28.png "
                     "--report a28.md")
def compare(
    refs: Annotated[list[str], typer.Argument(help="An experiment, or runs (runs whose recipes differ only in "
                                                   "train.seed form one arm).")],
    metric: Annotated[str | None, typer.Option("--metric", help="Metric to compare (default: the primary eval "
                                               "eval/<set>/<metric> if the runs have one, else reward/mean).")] = None,
    window: Annotated[int, typer.Option("--window", help="Mean of each run's last N logged values "
                                       "(never its step-0 baseline of the base model).")] = 5,
    plot: Annotated[Path | None, typer.Option("--plot", help="Each arm's mean curve with its 95% band (PNG).")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write the research-log entry (markdown).")] = None,
    question: QuestionOpt = None, as_json: JsonOpt = False,
    include_running: Annotated[bool, typer.Option(
        "--include-running", help="Also compare runs that have not finished (running, stopped by hand, failed) on "
        "their values so far; by default they are left out and named.")] = False,
) -> None:
    """Arms with statistics: mean and 95% CI across seeds, differences with a t-test (paired by seed where it
    applies), and the seeds an effect of the observed size would need. Unfinished runs are left out (and named)
    unless --include-running."""
    from rlctl.experiments import manifest as mf
    from rlctl.experiments import report as rp

    manifest = None
    queued: list[rp.Unfinished] = []
    if len(refs) == 1 and not _is_run(refs[0]):
        d = mf.find_experiment(refs[0])
        manifest = mf.read_manifest(d)
        arms, runs, queued = rp.arms_of_experiment(d)
    else:
        arms, runs = rp.arms_of_runs(refs)
    c = rp.compare(arms, runs, metric, window, include_running, queued)
    if manifest is not None:
        c.notes += rp.inert_notes(manifest)
    plot_path = rp.plot(c, plot) if plot else None
    if report:
        if plot_path is None:
            plot_path = rp.plot(c, report.with_suffix(".png"))
        rel = Path(plot_path.resolve().relative_to(report.resolve().parent)) if plot_path.resolve().is_relative_to(
            report.resolve().parent) else plot_path
        report.write_text(rp.markdown(c, manifest, rel, question))
    _echo(_json(rp.to_json(c)) if as_json else rp.text(c))
    for what, path in (("plot", plot_path), ("report", report)):  # where they went (stderr: --json stays JSON)
        if path is not None:
            typer.echo(f"wrote {what} {path}", err=True)


def _is_run(ref: str) -> bool:
    from rlctl.runs.state import STATE, runs_root

    p = Path(ref)
    return (p / STATE).is_file() or (runs_root() / ref / STATE).is_file() or (
        not (p / "manifest.json").is_file() and not _is_experiment(ref))


def _is_experiment(ref: str) -> bool:
    from rlctl.experiments.manifest import MANIFEST, experiments_root

    return (experiments_root() / ref / MANIFEST).is_file()


@experiment_app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """Experiments with how many of their runs are queued, running, done."""
    from rlctl.experiments import manifest as mf
    from rlctl.experiments.queue import queue_state

    out = []
    for d in mf.list_experiments():
        rows = mf.variant_status(d)  # the queue's counts only
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["queue"]] = counts.get(r["queue"], 0) + 1
        m = mf.read_manifest(d)
        out.append({"name": d.name, "kind": m.get("kind"), "arms": len(m.get("arms", [])), "seeds": m["seeds"],
                    "queue": queue_state(d), "variants": counts})
    if as_json:
        _echo(json.dumps(out, indent=2))
    elif not out:
        _echo("no experiments yet (rlctl sweep / rlctl ab)")
    else:
        for e in out:
            _echo(f"{e['name']}  {e['kind']}  {e['arms']} arms x {e['seeds']} seeds  queue {e['queue']}  "
                  + ", ".join(f"{k} {v}" for k, v in sorted(e["variants"].items())))


@experiment_app.command()
def show(exp: ExpArg, as_json: JsonOpt = False) -> None:
    """An experiment's arms (with their recipe diffs), variants, runs and where each is."""
    from rlctl.experiments import manifest as mf
    from rlctl.experiments.queue import queue_alive, queue_state

    d = mf.find_experiment(exp)
    m = mf.read_manifest(d)
    rows = settled_variants(d, m)
    if as_json:
        _echo(json.dumps({"manifest": m, "variants": rows, "queue_pid": queue_alive(d)}, indent=2, default=str))
        return
    git = m.get("git") or {}
    lines = [f"{m['name']}  ({m['kind']}, {len(m['arms'])} arms x {m['seeds']} seeds)  queue {queue_state(d)}",
             f"commit {git.get('commit', 'unknown')}" + (" (dirty)" if git.get("dirty") else "")
             + (f"  patches {', '.join(m['patches'])}" if m.get("patches") else "")]
    down = mf.read_queue(d).get("hosts_down") or {}
    if down:
        lines.append("hosts not answering: " + ", ".join(
            f"{h} (since {time.strftime('%H:%M:%S', time.localtime(t))})" for h, t in down.items()))
    for a in m["arms"]:
        diff = "; ".join(f"{k}: {v[0]} -> {v[1]}" for k, v in (a.get("diff") or {}).items()) or "(base)"
        lines.append(f"  {a['id']}: {a['label']}   diff: {diff}")
    for r in rows:
        run = Path(r["run_dir"]).name if r["run_dir"] else "-"
        where = (r.get("slot") or {}).get("name") if isinstance(r.get("slot"), dict) else None
        lines.append(f"    {r['id']:<16} {r['queue']:<13} {r.get('status') or '-':<10} {run}"
                     + (f"  on {where}" if where else "") + (f"  ! {r['error']}" if r.get("error") else "")
                     + (f"  ! host unreachable since {time.strftime('%H:%M:%S', time.localtime(since))}"
                        if (since := r.get("unreachable_since")) else "")
                     + (f"  ! waiting on a dead queue: {r['next']}" if r.get("next") else ""))
    _echo("\n".join(lines))


@experiment_app.command()
def resume(exp: ExpArg, seeds: SeedsOpt = None, wait: WaitOpt = False, force: ForceOpt = False) -> None:
    """Start the experiment's queue again (after a reboot, kill -9 or stop): live runs are adopted, interrupted ones
    resume from their checkpoints, only what never ran is launched; --seeds more extends."""
    from rlctl.experiments import manifest as mf

    _extend_or_resume(mf.find_experiment(exp), seeds, wait, force)


@experiment_app.command()
def stop(exp: ExpArg, grace: Annotated[float, typer.Option("--grace", help="Seconds to SIGKILL per run.")] = 30.0
         ) -> None:
    """Stop the queue and every running run of the experiment (rlctl experiment resume continues it)."""
    from rlctl.experiments import manifest as mf
    from rlctl.experiments import queue

    _seconds("--grace", grace)
    _echo(queue.stop(mf.find_experiment(exp), grace))
