"""A run's checkpoints: list, prune."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated

import typer

from rlctl.cli._app import JsonOpt, RunArg, _echo, ckpt_app
from rlctl.core.sizes import human_bytes
from rlctl.errors import RlctlError


@ckpt_app.command("list")
def ckpt_list(run: RunArg, as_json: JsonOpt = False) -> None:
    """Each checkpoint: step, size, complete or not, and which eval scored best."""
    from rlctl.core.checkpoint import Checkpoint
    from rlctl.runs.checkpoints import best_checkpoint, final_saves, find_checkpoints
    from rlctl.runs.state import find_run, read_state

    run_dir = find_run(run)
    backend = read_state(run_dir).get("backend", "")
    ckpts = find_checkpoints(backend, run_dir)
    best = best_checkpoint(run_dir)
    rows = [{"step": c.step, "complete": c.complete, "bytes": c.size(), "path": str(c.path)} for c in ckpts]
    # the final model (a save without a step): listed, never pruned
    rows += [{"step": None, "name": p.name, "complete": True, "bytes": Checkpoint(0, p, True).size(), "path": str(p)}
             for p in final_saves(backend, run_dir)]
    if read_state(run_dir).get("executor") == "ssh":  # the run lives on an SSH host: its checkpoints are there
        from rlctl import executors

        runner, answer = executors.get("ssh").remote_checkpoints(run_dir, list_only=True)
        rows = [{**r, "path": f"{runner.host.name}:{r['path']}"}
                for r in [*answer["checkpoints"], *(answer.get("finals") or [])]]
        best = answer.get("best", best)  # judged where the checkpoints are: here there are none
    if as_json:
        _echo(json.dumps({"checkpoints": rows, "best_eval": best}, indent=2))
        return
    if not rows:
        _echo(f"{run_dir.name}: no checkpoints")
    for r in rows:
        where = f"step {r['step']:>7}" if r["step"] is not None else f"{r['name']:>12}"
        done = "complete" if r["complete"] else "INCOMPLETE"
        _echo(f"{where}  {done:<10}  {human_bytes(r['bytes']):>8}  {r['path']}")
    if best:
        _echo(f"best eval: {best['key']} = {best['value']:.4g} at step {best['step']}"
              + (" (the base model)" if best["step"] == 0 else ""))
    st = read_state(run_dir)
    if st.get("status") == "stopped" and any(r["step"] is None for r in rows):  # "final" is where it was stopped
        last = ((st.get("attempts") or [{}])[-1] or {}).get("last_step")
        _echo(f"note: {run_dir.name} was stopped" + (f" at step {last}" + (f" of {st['total_steps']}"
              if st.get("total_steps") else "") if last is not None else "")
              + ": its final save is the model then, not the end of its training")


@ckpt_app.command("prune")
def ckpt_prune(
    run: RunArg,
    keep_last: Annotated[int, typer.Option("--keep-last", help="Complete checkpoints to keep (>= 1).")],
    keep_best: Annotated[bool, typer.Option("--keep-best/--no-keep-best", help="Keep the checkpoint with the best "
                                            "eval (the default); --no-keep-best deletes it too.")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be deleted.")] = False,
) -> None:
    """Delete old checkpoints; never the newest complete one, one being written, anything outside the run, nor
    (unless --no-keep-best) the one with the best eval."""
    from rlctl.runs.checkpoints import best_checkpoint, prune
    from rlctl.runs.state import find_run, read_state

    if keep_last < 1:  # before anything is said of what would be kept
        raise typer.BadParameter("must be at least 1: the newest complete checkpoint is never deleted.",
                                 param_hint="--keep-last")
    run_dir = find_run(run)
    if _there(run_dir, ["ckpt", "prune", "--keep-last", str(keep_last), *([] if keep_best else ["--no-keep-best"]),
                        *(["--dry-run"] if dry_run else [])]):
        return
    backend = read_state(run_dir).get("backend", "")
    best = best_checkpoint(run_dir, backend) if keep_best else None  # the rule prune keeps it by
    if best is not None and best["step"] > 0:
        _echo(f"keeping step {best['step']}: the best eval ({best['key']} = {best['value']:.4g}); "
              "--no-keep-best deletes it too")
    doomed = prune(backend, run_dir, keep_last, keep_best, dry_run=True)
    sizes = {c.step: c.size() for c in doomed}
    for c in doomed:
        _echo(f"{'would delete' if dry_run else 'deleting'} step {c.step:>7}  {human_bytes(sizes[c.step]):>8}  "
              + "  ".join(str(p) for p in c.paths()))
    if not dry_run and doomed:
        doomed = prune(backend, run_dir, keep_last, keep_best, dry_run=False)
        if doomed:  # as the in-run prune records it: `rlctl eval RUN --step N` says the step was pruned
            import time

            with contextlib.suppress(OSError), (run_dir / "rlctl-events.jsonl").open("a") as fh:
                fh.write(json.dumps({"time": time.time(), "event": "pruned", "steps": [c.step for c in doomed],
                                     "by": "rlctl ckpt prune"}) + "\n")
    verb = "would delete" if dry_run else "deleted"
    _echo(f"{verb} {len(doomed)} checkpoint(s), {human_bytes(sum(sizes.values()))}: "
          + (", ".join(f"step {c.step}" for c in doomed) or "nothing"))


def _there(run_dir: Path, args: list[str]) -> bool:
    """A run on an SSH host: its checkpoints are there, and so is the rule that prunes them — the host's rlctl runs
    the same command on the run's directory there (its output said here, line by line with the host's name)."""
    from rlctl import executors
    from rlctl.runs.state import read_state

    state = read_state(run_dir)
    name = state.get("executor")
    ex = executors.get(name) if name in executors.registry() else None
    where = ex.supervised_on(state) if ex is not None and getattr(ex, "remote", False) else None
    if where is None:
        return False
    host, remote_dir = where
    code, out, err = ex.run_remote_rlctl(host, [*args[:2], remote_dir, *args[2:]])
    for line in out.splitlines():
        _echo(f"{host}: {line}")
    if code != 0:
        typer.echo(f"{host}: {(err or out).strip().removeprefix('rlctl: ')}", err=True)
        raise typer.Exit(code)
    return True


@ckpt_app.command("pull", epilog="Example: rlctl ckpt pull gptoss-a30 --step 130 --to ./a30-step130")
def ckpt_pull(
    run: RunArg,
    step: Annotated[int | None, typer.Option("--step", help="Which checkpoint (default: the newest complete).")]
    = None,
    to: Annotated[Path | None, typer.Option("--to", help="Local directory (default: the local run directory's "
                                            "checkpoint root).")] = None,
) -> None:
    """Copy a complete checkpoint of a run on an SSH host here: resumable (rsync --partial), then every file's size
    and sha256 checked. LoRA runs move the adapter the backend saved, nothing more."""
    from rlctl import executors
    from rlctl.runs.state import find_run, read_state

    run_dir = find_run(run)
    if read_state(run_dir).get("executor") != "ssh":
        raise RlctlError(f"{run_dir.name} ran on this machine: its checkpoints are already here.",
                         hint=f"rlctl ckpt list {run_dir.name}")
    dest, pick = executors.get("ssh").ckpt_pull(run_dir, step, to)
    size = sum(f["size"] for f in pick["files"])
    _echo(f"pulled step {pick['step']} of {run_dir.name}: {len(pick['files'])} files, {human_bytes(size)}, "
          f"verified (sizes and sha256) -> {dest}")


@ckpt_app.command("push", epilog="Example: rlctl ckpt push gptoss-a30 --step 130 --to spare")
def ckpt_push(
    run: RunArg,
    to: Annotated[str, typer.Option("--to", help="SSH host to copy it to (rlctl hosts list).")],
    step: Annotated[int | None, typer.Option("--step", help="Which checkpoint (default: the newest complete).")]
    = None,
) -> None:
    """Copy a complete checkpoint of a run to an SSH host (from wherever the run lives, through here), verified
    there; `rlctl launch RECIPE --on HOST --resume RUN` then resumes from it."""
    from rlctl import executors
    from rlctl.runs.state import find_run

    _echo(executors.get("ssh").ckpt_push(find_run(run), step, to))
