"""`rlctl eval`: held-out evals by hand, on a run's checkpoints or on a base model (docs/eval.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from rlctl.cli._app import AccountOpt, JsonOpt, PartitionOpt, _echo, app, on_host_option
from rlctl.errors import RlctlError

EPILOG = """\b
Examples:
  rlctl eval my-run                     the newest complete checkpoint, every eval set of its recipe
  rlctl eval my-run --all --set ood     every checkpoint (and the step-0 baseline) on the set `ood`
  rlctl eval my-run --step 30 --gpu 7   one checkpoint, on GPU 7, beside the training
  rlctl eval my-run --force             again, though the run's own evals did it (else their result is shown)
  rlctl eval Qwen/Qwen2.5-7B --recipe r.toml   the baseline of a base model on the recipe's sets
  rlctl eval my-run --all --on spare    on an SSH host: checkpoints pushed (verified), results back here
  rlctl eval my-run --all --executor slurm --partition gpu   each job a SLURM job (the default for a run on SLURM)
"""


PRUNED: Any = None  # the model of a job whose checkpoint is gone but whose result is recorded (_run_jobs)


def _gpu_option(value: str | None) -> str | None:
    """An empty --gpu (`--gpu "$GPU"` with GPU unset), or an empty element of it (`--gpu 0,,1`), is an error, not
    "no GPU named" (which lets the run's place decide, and skips checkpoints already evaluated)."""
    if value is not None:
        from rlctl.core.gpus import check_gpu_list

        try:
            check_gpu_list(value, "--gpu")
        except RlctlError as e:
            raise RlctlError(e.message,
                             hint=f"{e.hint} (drop --gpu to evaluate where the run's place decides)") from None
    return value


def _parse_target(target: str, recipe: str | None) -> tuple[Path | None, str]:
    """(run directory or None, the recipe to read the sets from)."""
    from rlctl.runs.state import check_run_ref, find_run

    check_run_ref(target)  # an empty target is no run, nor a model to evaluate
    try:
        run_dir = find_run(target)
    except RlctlError as e:
        if recipe is None:  # one error: the run's lookup says what it found; evaluating a model is the other fix
            meant = getattr(e, "meant", None)
            model = f"rlctl eval {target} --recipe RECIPE.toml to evaluate a model"
            raise RlctlError(e.message,
                             hint=f"rlctl eval {meant}, or {model}" if meant else f"{model}; {e.hint}"
                             if e.hint else model) from None
        _check_model(target)
        return None, recipe
    if recipe is None:
        from rlctl.runs.state import read_state

        st = read_state(run_dir)
        if st.get("executor") == "attached" or st.get("status") == "attached":
            raise RlctlError(f"{run_dir.name} is attached: rlctl did not launch it, so it has no recipe with a model "
                             "and eval sets to evaluate with.",
                             hint=f"give one: rlctl eval {target} --recipe RECIPE.toml (or evaluate a checkpoint "
                                  "directory: rlctl eval CHECKPOINT_DIR --recipe RECIPE.toml)")
    return run_dir, recipe or str(run_dir / "recipe.toml")


def _check_model(target: str) -> None:
    """A model given to evaluate is read as model.path is (rlctl.recipe.paths, MODEL): written as a path (./ ../ / ~)
    or there, it is a local directory, and one that is not there is said here, not found by transformers as a
    malformed Hub id in an eval job; anything else is a Hub id."""
    from rlctl.recipe.loader import file_problem
    from rlctl.recipe.paths import MODEL, resolve_value

    local = Path(resolve_value(target, MODEL, Path.cwd()))
    if not local.is_absolute() or local.is_dir():
        return
    problem = file_problem(local) or "is a file, not a model directory"
    raise RlctlError(f"{target} {problem}: no run of that name, and no model directory there ({local}).",
                     hint="give a model directory (config.json and the weights), a Hub id (e.g. Qwen/Qwen2.5-0.5B) or "
                          "a run (rlctl status lists them)")


@app.command("eval", epilog=EPILOG)
def eval_cmd(
    target: Annotated[str, typer.Argument(help="A run (name, prefix or directory), or a model path/id with --recipe.")],
    step: Annotated[str | None, typer.Option("--step", metavar="N", help="Evaluate the checkpoint of this step "
                                             "(0 = base).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every complete checkpoint, and the baseline.")] = False,
    set_name: Annotated[list[str] | None, typer.Option("--set", metavar="SET",
                                                       help="Only this eval set (repeatable).")] = None,
    on: Annotated[str | None, typer.Option("--on", callback=on_host_option,
                                           help="Evaluate on this SSH host (rlctl hosts list).")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", callback=_gpu_option, help="CUDA_VISIBLE_DEVICES for the eval job "
                                            "(on the host with --on).")] = None,
    recipe: Annotated[str | None, typer.Option("--recipe", help="Recipe with the eval sets (default: the run's).")]
    = None,
    executor: Annotated[str | None, typer.Option("--executor", help="Where each job runs: local (this machine) or "
                                                 "slurm (a batch job each; the default for a run on SLURM).")] = None,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="With --executor slurm: each eval job's time "
                                                   "limit (default: eval.timeout_s and 10 minutes).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Evaluate again a checkpoint already evaluated on these "
                                        "sets (by default its recorded result is shown and nothing runs, "
                                        "unless --on, --executor or --gpu names where).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate checkpoints (or a base model) on the recipe's eval sets, each job in its own process; a run's
    results go into its metrics stream at the checkpoint's step."""
    from rlctl.evals.loop import EVALS, hand_spec, job_files, record_by_hand, remote_executor, run_job_here

    if step is not None and all_:
        raise RlctlError("--step and --all: choose one.", hint="--step N for one checkpoint, --all for every one")
    if on is not None and executor is not None:
        raise RlctlError("--on and --executor: choose one.", hint="--on HOST for an SSH host, --executor slurm for "
                         "SLURM jobs submitted from here")
    placement = {"partition": partition, "account": account, "time": time_limit}
    ex = None
    if on is not None:
        ex = remote_executor(on)
        from rlctl.core.host import get_host

        get_host(on)  # an unknown host is said before anything is read or sent
    run_dir, recipe_path = _parse_target(target, recipe)
    step_n = _step_number(run_dir, step) if run_dir is not None else None  # a word: said before any recipe is read
    placed = None if on is not None else _placed(executor, run_dir, placement)
    if ex is not None and run_dir is not None and recipe is None and not (run_dir / "recipe.toml").is_file():
        from rlctl.runs.state import read_state

        ex.catch_up_logs(run_dir, read_state(run_dir))  # a run on a host: its recipe.toml mirrored here first
    ev = hand_spec(recipe_path, set_name, gpu)
    set_names = [s["name"] for s in ev["sets"]]
    if run_dir is None:
        jobs = [(0, target)]
        out_dir = Path.cwd() / "rlctl-evals" / Path(target).name
    else:
        jobs = _run_jobs(run_dir, ev, step_n, all_, ex)
        out_dir = run_dir / EVALS
    rows: list[dict[str, Any]] = []
    failed = False
    if run_dir is not None and jobs and jobs[0][1] is PRUNED:  # recorded, its checkpoint gone: nothing can run
        from rlctl.evals.ledger import evaluated

        s_step = jobs.pop()[0]
        had = evaluated(run_dir, s_step, set_names) or {}
        rows.append({"step": s_step, "model": None, "metrics": had, "error": None, "evaluated_already": True,
                     "checkpoint_pruned": True})
        if not as_json:
            _echo(f"step {s_step:>6}  (recorded; its checkpoint was pruned, so it cannot be evaluated again"
                  + (": --force has nothing to run" if force else "") + f"; in {run_dir / EVALS})")
            for k, v in sorted(had.items()):
                _echo(f"    {k:<48} {v:.4g}")
    # a plain repeat of what was evaluated already shows it, not run again (and recorded twice); a place named
    # (--on, --executor, --gpu) or --force is a request to evaluate there, so it runs
    if run_dir is not None and not (force or on or executor or gpu):
        from rlctl.evals.ledger import evaluated

        for s_step, model in list(jobs):
            had = evaluated(run_dir, s_step, set_names)
            if had is None:
                continue
            jobs.remove((s_step, model))
            rows.append({"step": s_step, "model": model, "metrics": had, "error": None, "evaluated_already": True})
            if not as_json:
                _echo(f"step {s_step:>6}  {model}  (evaluated already: not run again; --force evaluates it again)")
                for k, v in sorted(had.items()):
                    _echo(f"    {k:<48} {v:.4g}")

    def show(s_step: int, model: str, metrics: dict[str, float], failure: str | None, tail: str = "") -> None:
        nonlocal failed
        rows.append({"step": s_step, "model": model, "metrics": metrics, "error": failure,
                     **({"host": on} if on else {}), **({"log_tail": tail} if failure and tail else {})})
        failed |= failure is not None
        if as_json:
            return
        _echo(f"step {s_step:>6}  {model}" + (f"  (on {on})" if on else ""))
        for k, v in sorted(metrics.items()):
            _echo(f"    {k:<48} {v:.4g}")
        if failure:
            _echo(f"    failed: {failure}")
            for line in tail.splitlines()[-12:]:
                _echo(f"    | {line}")

    if ex is not None and jobs:  # (none left: every one was evaluated already)
        assert on is not None
        done: list[int] = []
        try:
            for a in ex.eval_on(on, ev, [s for s, _ in jobs], run_dir=run_dir,
                                model=target if run_dir is None else None, recipe=recipe_path,
                                set_names=set_name, gpu=gpu, recipe_given=recipe is not None, pending_dir=out_dir):
                metrics = {k: float(v) for k, v in (a.get("metrics") or {}).items()}
                if not a.get("in_place"):  # bring the results home: the job's JSON, then the stream (one write)
                    _save_result(out_dir, a)
                    if run_dir is not None and not a.get("recorded"):  # a run on a host: recorded in its stream there
                        record_by_hand(run_dir, a["step"], metrics, a.get("error"), set_names, host=on)
                done.append(a["step"])
                show(a["step"], a.get("model", ""), metrics, a.get("error"), a.get("log_tail") or "")
        except RlctlError as e:
            left = [s for s, _ in jobs if s not in done]
            if done:  # what came back before the failure is recorded; say which steps are still to do
                e.message += (f"\n  recorded: {', '.join(f'step {s}' for s in done) or 'nothing'}; not recorded: "
                              f"{', '.join(f'step {s}' for s in left)} (run the command again for them: a job "
                              "still running there is picked up, not started twice)")
            raise
    elif placed is not None and jobs:  # an executor that places each job (SLURM: a batch job each)
        from rlctl.recipe.loader import load

        for a in placed.eval_jobs(ev, jobs, out_dir, run_dir, load(recipe_path).recipe, placement):
            if run_dir is not None:
                record_by_hand(run_dir, a["step"], a["metrics"], a["error"], set_names, job=a.get("job"))
            show(a["step"], a["model"], a["metrics"], a["error"], a.get("log_tail") or "")
    else:
        for s_step, model in jobs:
            metrics, failure = run_job_here(ev, s_step, model, ev["sets"], out_dir, run_dir)
            if run_dir is not None:
                record_by_hand(run_dir, s_step, metrics, failure, set_names)
            from rlctl.evals.loop import log_tail

            show(s_step, model, metrics, failure, log_tail(job_files(out_dir, s_step)[2]) if failure else "")
    if as_json:
        _echo(json.dumps({"target": target, "results": rows}, indent=2))
    if failed:
        raise typer.Exit(1)


def _placed(executor: str | None, run_dir: Path | None, placement: dict[str, str | None]) -> Any:
    """The executor that places each eval job (one with `eval_jobs`), or None to run them on this machine. Default:
    the run's own executor when it places eval jobs (a run on SLURM is evaluated by SLURM jobs, not on the login
    node); --executor local runs them here."""
    from rlctl import executors

    name = executor
    if name is None and run_dir is not None:
        from rlctl.runs.state import read_state

        ran = str(read_state(run_dir).get("executor") or "local")
        with_jobs = ran in executors.available() and callable(getattr(executors.executor_class(ran), "eval_jobs", None))
        if with_jobs:
            name = ran
            print(f"rlctl: {run_dir.name} ran on {ran}: each eval job goes there too (--executor local evaluates on "
                  "this machine)", file=sys.stderr)
    if name is None or name == "local":
        given = [f"--{k}" for k, v in placement.items() if v is not None]
        if given:
            raise RlctlError(f"{', '.join(given)}: these place eval jobs on a cluster; here they run on this machine.",
                             hint="add --executor slurm")
        return None
    ex = executors.get(name)
    if not callable(getattr(ex, "eval_jobs", None)):
        raise RlctlError(f"--executor {name}: it cannot run eval jobs.",
                         hint="--executor local (this machine), --executor slurm, or --on HOST for an SSH host")
    return ex


def _save_result(out_dir: Path, answer: dict[str, Any]) -> None:
    """A host's eval results and log tail where a local eval keeps its own (<run>/evals/step-N.out.json, .log)."""
    import os

    from rlctl.evals.loop import job_files

    out_dir.mkdir(parents=True, exist_ok=True)
    _, out_file, log = job_files(out_dir, int(answer["step"]))
    result = answer.get("result") or {"step": answer["step"], "metrics": {}, "errors": {"job": answer.get("error")}}
    tmp = out_file.with_name(out_file.name + ".tmp")
    tmp.write_text(json.dumps({**result, "host": answer.get("host"), "remote_log": answer.get("log")}) + "\n")
    os.replace(tmp, out_file)
    log.write_text(f"# the tail of {answer.get('host')}:{answer.get('log')}\n{answer.get('log_tail') or ''}\n")


def _step_number(run_dir: Path, step: str | None) -> int | None:
    """--step as a checkpoint's step; a word (`final`, `latest`) is exit 2 naming the steps there are: a final save
    without a step (TRL's `final/`) is no checkpoint of the run's stream, but it can be evaluated as a model."""
    if step is None or step.strip().isdigit():
        return None if step is None else int(step)
    from rlctl.runs.checkpoints import final_saves, find_checkpoints
    from rlctl.runs.state import read_state

    backend = str(read_state(run_dir).get("backend") or "")
    steps = [c.step for c in find_checkpoints(backend, run_dir) if c.complete]
    finals = final_saves(backend, run_dir)
    said = (f"; its final save {finals[-1]} has no step: evaluate it as a model, rlctl eval {finals[-1]} --recipe "
            f"{run_dir / 'recipe.toml'}") if finals else ""
    raise RlctlError(f"--step {step!r}: --step takes a checkpoint's step number (0 = the base model). "
                     f"{run_dir.name}'s complete checkpoints: {', '.join(map(str, steps)) or 'none'}{said}.",
                     hint=f"rlctl eval {run_dir.name} --step {steps[-1] if steps else 0}" + (
                         " (the newest)" if steps else " (the base model)"))


def _gone(run_dir: Path, step: int) -> str:
    """Why a checkpoint step is not there, where the run's events say: rlctl pruned it (keep_last, `ckpt prune`,
    the disk watch), never evaluated. A hostile trial read "no complete checkpoint" as "never saved"."""
    import json

    try:
        lines = (run_dir / "rlctl-events.jsonl").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if not isinstance(e, dict):
            continue
        gone = e.get("steps") if e.get("event") == "pruned" else e.get("pruned")  # in-run prune; the disk watch
        if isinstance(gone, list) and step in gone:
            return (f" (it was saved and then pruned{' by ' + e['by'] if e.get('by') else ''}; no eval of it is "
                    "recorded: [eval] every evaluates each checkpoint before it is pruned, or raise "
                    "checkpoint.keep_last)")
    return ""


def _run_jobs(run_dir: Path, ev: dict[str, Any], step: int | None, all_: bool, ex: Any) -> list[tuple[int, str]]:
    """(step, model) of each job; for a run on an SSH host its checkpoints are listed there (the model path is
    resolved there)."""
    from rlctl.evals.loop import has_weights, model_dir
    from rlctl.runs.checkpoints import find_checkpoints
    from rlctl.runs.state import read_state

    st = read_state(run_dir)
    base = _base_model(run_dir)
    if st.get("executor") == "ssh":
        if ex is None:
            host = st.get("host") or "its host"
            raise RlctlError(f"{run_dir.name} lives on {host}: its checkpoints are there.",
                             hint=f"rlctl eval {run_dir.name} --on {host}")
        runner, answer = ex.remote_checkpoints(run_dir, list_only=True)
        complete = {r["step"]: f"{runner.host.name}:{r['path']}" for r in answer["checkpoints"] if r["complete"]}
    else:
        found = {c.step: c for c in find_checkpoints(st.get("backend") or "", run_dir) if c.complete}
        complete = {s: model_dir(c) for s, c in found.items()}
        wanted = [] if step == 0 or ev.get("evaluator", "rlctl") != "rlctl" else (
            [step] if step is not None else (sorted(found) if all_ else sorted(found)[-1:]))
        for s in wanted:  # rlctl's evaluator loads an HF model (a command evaluator gets the path as it is)
            if s in found and not has_weights(Path(complete[s])):
                from rlctl.backends import get_backend

                adapter = get_backend(str(st.get("backend")))
                said = _export_for_eval(adapter, found[s], run_dir)
                complete[s] = model_dir(found[s])
                if not has_weights(Path(complete[s])):
                    fix = adapter.evaluable_fix(found[s])
                    raise RlctlError(f"{run_dir.name}: checkpoint step {s} ({found[s].path}) holds no model an "
                                     f"evaluator can load (no HF weights){said}.",
                                     hint=fix or "save the model in HF format beside it")
    steps = sorted(complete)
    if step == 0:
        return [(0, base)]
    if step is not None:
        if step not in complete:
            from rlctl.evals.ledger import evaluated

            if evaluated(run_dir, step, [s["name"] for s in ev["sets"]]) is not None:
                return [(step, PRUNED)]  # its result is recorded: shown, never hidden behind the missing checkpoint
            raise RlctlError(f"{run_dir.name} has no complete checkpoint at step {step}{_gone(run_dir, step)}; "
                             f"complete: {', '.join(str(s) for s in steps) or 'none'}.",
                             hint=f"rlctl ckpt list {run_dir.name}")
        return [(step, complete[step])]
    if all_:
        return [(0, base)] + [(s, complete[s]) for s in steps]
    if not steps:
        raise RlctlError(f"{run_dir.name} has no complete checkpoint.", hint=f"rlctl eval {run_dir.name} --step 0 "
                         "evaluates its base model")
    return [(steps[-1], complete[steps[-1]])]


def _export_for_eval(adapter: Any, ckpt: Any, run_dir: Path) -> str:
    """Run the backend's own export of a checkpoint into an HF model (verl: its model merger), where the backend is
    installed; its log is kept under the run's evals/. What happened, for an error message ('' when it ran)."""
    import subprocess
    import sys

    from rlctl.evals.loop import EVALS

    argv = adapter.export_for_eval(ckpt)
    if not argv:
        return ""
    log = run_dir / EVALS / f"export-step-{ckpt.step}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, *argv]
    sys.stderr.write(f"step {ckpt.step}: no HF weights in the checkpoint; writing them with {adapter.name}'s own "
                     f"tool: python {' '.join(cmd[1:])} (log: {log})\n")
    with log.open("w") as fh:
        code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if code == 0:
        return ""
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    return f"; {adapter.name}'s export failed (exit {code}: {tail[0][:200]}; log {log})"


def _base_model(run_dir: Path) -> str:
    import tomllib

    try:
        return str(tomllib.loads((run_dir / "recipe.toml").read_text())["model"]["path"])
    except (OSError, ValueError, KeyError, TypeError):
        raise RlctlError(f"{run_dir}/recipe.toml: no model.path.") from None
