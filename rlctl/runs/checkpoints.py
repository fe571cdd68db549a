"""Checkpoints of a run, per backend layout: where they are, which are complete, and pruning to keep_last.

Pruning never deletes the newest complete checkpoint, a checkpoint still being written (anything newer than the
newest complete one), nor anything outside the run's checkpoint directory: symlinks and paths that resolve
elsewhere are refused.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

from rlctl.core.checkpoint import Checkpoint
from rlctl.errors import RlctlError


def checkpoint_dir(run_dir: Path, configured: str | None = None) -> Path:
    """The checkpoint directory of a run: as recorded in its recipe, relative paths inside the run directory."""
    if configured is None:
        try:
            import tomllib

            section = tomllib.loads((run_dir / "recipe.toml").read_text()).get("checkpoint")
            configured = section.get("dir") if isinstance(section, dict) else None
        except (OSError, ValueError, RecursionError):
            configured = None
    if not isinstance(configured, str) or not configured or "\x00" in configured:
        configured = None
    p = Path(configured or "checkpoints")
    return p if p.is_absolute() else run_dir / p


MARKER_MAX = 1 << 20


def root_markers(root: Path) -> list[Path]:
    """The small files at the top of a checkpoint root that go with any checkpoint copied out of it (a `latest`
    pointer, the command backend's layout descriptor `.rlctl-checkpoints.json`): what a resume from a copy reads
    besides the checkpoint itself. Regular files under 1 MiB, no links."""
    try:
        return sorted(p for p in root.iterdir()
                      if p.is_file() and not p.is_symlink() and p.stat().st_size < MARKER_MAX)
    except OSError:
        return []


def find_checkpoints(backend: str, run_dir: Path, root: Path | None = None) -> list[Checkpoint]:
    """The run's checkpoints in the backend's own layout (its adapter knows it), oldest first."""
    from rlctl.backends import get_backend

    try:
        adapter = get_backend(backend)
    except RlctlError:
        return []
    root = root or checkpoint_dir(run_dir)
    return adapter.checkpoints(root) if root.is_dir() else []


WEIGHTS = ("adapter_model.safetensors", "model.safetensors", "model-*-of-*.safetensors")


def final_saves(backend: str, run_dir: Path) -> list[Path]:
    """Folders of weights without a step in the checkpoint directory — the final model a backend saves at the end
    (TRL's `final/`, a `step_final/`) — oldest first. Pruning never touches them: they are not stepped checkpoints."""
    root = checkpoint_dir(run_dir)
    known = {p for c in find_checkpoints(backend, run_dir) for p in c.paths()}
    try:
        found = [d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and d not in known
                 and any(next(d.glob(w), None) for w in WEIGHTS)] if root.is_dir() else []
        return sorted(found, key=lambda d: d.stat().st_mtime)
    except OSError:
        return []


def latest_complete(backend: str, run_dir: Path) -> Checkpoint | None:
    done = [c for c in find_checkpoints(backend, run_dir) if c.complete]
    return done[-1] if done else None


def restart_point(backend: str, run_dir: Path) -> tuple[Checkpoint | None, list[str]]:
    """The checkpoint a restart resumes from — the one the backend will really load (None: the start) — and what
    rlctl changed in the run's checkpoint root to make it load that one (in words; [] when nothing). The newest
    complete checkpoint the backend can resume from (Backend.resume_checkpoint); where the backend's own resume reads
    a pointer in the root rather than the step rlctl renders (OpenRLHF's DeepSpeed `latest`), the pointer is made to
    name it (Backend.point_resume) — only in a root that is the run's own (prunable_root), never a shared one; then
    the backend says what it will load (Backend.resumes_from), and that is the answer, whatever was chosen."""
    from rlctl.backends import get_backend

    try:
        adapter = get_backend(backend)
    except RlctlError:
        return None, []
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return None, []
    chosen = adapter.resume_checkpoint(root, adapter.checkpoints(root))
    changes: list[str] = []
    try:
        prunable_root(run_dir, root)
    except RlctlError:
        shared = True
    else:
        shared = False
        try:
            changes = adapter.point_resume(root, chosen)
        except OSError as e:
            changes = [f"could not change {root} ({e})"]
    loaded = adapter.resumes_from(root, chosen)
    if shared and (loaded and loaded.step) != (chosen and chosen.step):
        changes = [f"{root} is not the run's own: left as it is"]
    return loaded, changes


def best_from_stream(run_dir: Path, backend: str, primary: str | None = None,
                     root: Path | None = None) -> dict[str, Any] | None:
    """The complete checkpoint (or step 0, the base model) whose primary eval in the stream is highest:
    {"step", "key", "value", "path"}. The key: `primary`, else the primary set's of the run's recipe, resolved to what
    the stream holds; a run whose recipe declares no eval sets (an attached run) is judged by its first
    quality-looking eval key, never by a cost (lengths, errors, turns)."""
    from rlctl.evals.sets import primary_key_from_run, resolve_key
    from rlctl.metrics.stream import METRICS, by_step, iter_metrics
    from rlctl.runs.health import quality_eval_key

    merged = by_step(list(iter_metrics(run_dir / METRICS)))
    seen: dict[str, None] = {}
    for rec in merged.values():
        seen.update(dict.fromkeys(rec))
    declared = primary or primary_key_from_run(run_dir)
    key = resolve_key(declared, seen) if declared else quality_eval_key(seen)
    if not key:
        return None
    ckpts = {c.step: c for c in find_checkpoints(backend, run_dir, root) if c.complete}
    best: dict[str, Any] | None = None
    for step, rec in merged.items():
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or (step != 0 and step not in ckpts):
            continue
        # a tie goes to a checkpoint, never to the base model (step 0), and among checkpoints to the earliest
        if best is None or v > best["value"] or (v == best["value"] and best["step"] == 0 and step != 0):
            best = {"step": step, "key": key, "value": float(v),
                    "path": str(ckpts[step].path) if step in ckpts else None}
    return best


def best_checkpoint(run_dir: Path, backend: str | None = None, root: Path | None = None) -> dict[str, Any] | None:
    """The run's best checkpoint, {"step", "key", "value", "path"} — the one rule `ckpt prune`, in-run rotation, the
    disk watch, `launch --resume` and `ckpt list` share: the mark in state.json (rlctl marks it from the stream
    whenever evals land: rlctl.evals.loop.mark_best) while it names a complete checkpoint (or step 0: the base model
    beat them all), else the same rule computed from the stream now (best_from_stream). None: no eval to rank by."""
    from rlctl.core.state import read_state

    state = read_state(run_dir)
    backend = backend if backend is not None else str(state.get("backend") or "")
    mark = state.get("best_checkpoint")
    if isinstance(mark, dict) and isinstance(mark.get("key"), str) and isinstance(mark.get("value"), (int, float)):
        step = mark.get("step")
        if step == 0:  # the base model's mark, perhaps written before a checkpoint that ties it was complete
            fresh = best_from_stream(run_dir, backend, mark["key"], root=root)
            if fresh is not None and fresh["step"] != 0 and fresh["value"] >= mark["value"]:
                return fresh
            return mark
        if isinstance(step, int) and not isinstance(step, bool) and any(
                c.step == step and c.complete for c in find_checkpoints(backend, run_dir, root)):
            return mark
    return best_from_stream(run_dir, backend, root=root)


def _real(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, RuntimeError) as e:
        raise RlctlError(f"refusing to prune: {p} cannot be resolved ({e}).",
                         hint="fix the symlink loop or the path; nothing was deleted.") from None


# what create_run_dir makes: <name>-<YYYYmmdd-HHMMSS>[-N], never reused — only such a name can claim a shared root
UNIQUE_RUN_NAME = re.compile(r".+-\d{8}-\d{6}(-\d+)?")


def prunable_root(run_dir: Path, root: Path) -> Path:
    """The checkpoint root pruning may delete in: inside the run directory, or a shared root explicitly named for
    this run (a path component equal to the run's unique name, e.g. /mnt/ckpt/<run-name>/). Anything else — a
    shared `checkpoint.dir` used by several runs, a resumed run's parent, a `checkpoints` symlink leading out of
    the run — is refused: rlctl never deletes what another run may own."""
    run_real = _real(run_dir)
    root_real = _real(root)
    if root_real == run_real or run_real in root_real.parents:
        return root_real
    if UNIQUE_RUN_NAME.fullmatch(run_dir.name) and run_dir.name in root_real.parts:
        return root_real
    raise RlctlError(
        f"refusing to prune {root}: it is outside the run directory {run_dir} (resolves to {root_real}) and not "
        f"named for the run; other runs may keep checkpoints there. Nothing was deleted.",
        hint=f"give each run its own checkpoint directory (relative checkpoint.dir, or one ending in "
             f"/{run_dir.name}), or delete by hand after checking `rlctl ckpt list {run_dir.name}`.")


def _safe_to_delete(path: Path, root: Path) -> None:
    """`path` is a real directory (or file) strictly inside `root` (already resolved), reached without symlinks."""
    if path.is_symlink():
        raise RlctlError(f"refusing to delete {path}: it is a symlink.")
    resolved = _real(path)
    root_resolved = _real(root)
    if resolved == root_resolved or root_resolved not in resolved.parents:
        raise RlctlError(f"refusing to delete {path}: it is not inside the checkpoint directory {root}.")
    if _real(path.parent) != resolved.parent:  # a symlinked directory on the way
        raise RlctlError(f"refusing to delete {path}: a symlink lies on its path.")


def plan_prune(ckpts: list[Checkpoint], keep_last: int, keep_steps: set[int] | None = None) -> list[Checkpoint]:
    """Which checkpoints to delete to keep the `keep_last` newest complete ones (plus `keep_steps`)."""
    if keep_last < 1:
        raise RlctlError("--keep-last must be at least 1: the newest complete checkpoint is never deleted.")
    complete = [c for c in ckpts if c.complete]
    if not complete:
        return []
    newest_complete = complete[-1].step
    keep = {c.step for c in complete[-keep_last:]} | (keep_steps or set()) | {newest_complete}
    # anything newer than the newest complete one is being written: leave it alone
    return [c for c in ckpts if c.step not in keep and c.step < newest_complete]


def prune(backend: str, run_dir: Path, keep_last: int, keep_best: bool = True, dry_run: bool = False,
          root: Path | None = None, keep_steps: set[int] | None = None) -> list[Checkpoint]:
    """Delete all but the `keep_last` newest complete checkpoints, `keep_steps`, and (unless keep_best is off) the
    run's best checkpoint (best_checkpoint). Returns what was (with dry_run: would be) deleted."""
    root = root or checkpoint_dir(run_dir)
    if keep_last < 1:
        plan_prune([], keep_last)  # the same message, before anything is looked at
    if not root.is_dir():
        return []
    root = prunable_root(run_dir, root)
    ckpts = find_checkpoints(backend, run_dir, root)
    keep_steps = set(keep_steps or ())
    best = best_checkpoint(run_dir, backend, root) if keep_best else None
    if best is not None and best["step"] > 0:  # step 0: the base model beat every checkpoint, none is kept for it
        keep_steps.add(best["step"])
    doomed = plan_prune(ckpts, keep_last, keep_steps)
    for c in doomed:
        for p in c.paths():
            _safe_to_delete(p, root)
    if not dry_run:
        for c in doomed:
            for p in c.paths():
                _safe_to_delete(p, root)  # again, just before: nothing swapped in since the plan
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
    return doomed


def prune_during_run(run_dir: Path, spec: dict[str, Any], keep_last: int,
                     protect: set[int] | frozenset[int] = frozenset()) -> None:
    """Called by the supervisor: enforce keep_last where the backend keeps more on its own (its adapter says so at
    launch, as spec["prune_during_run"]), quietly."""
    if not spec.get("prune_during_run"):
        return
    pending: set[int] = set()
    if (spec.get("evals") or {}).get("sets"):  # never delete one rlctl has still to evaluate (or is evaluating)
        from rlctl.evals.ledger import read_ledger

        done = read_ledger(run_dir).get("done") or {}
        pending = {c.step for c in find_checkpoints(spec.get("backend", ""), run_dir) if str(c.step) not in done}
    pending |= set(protect)  # e.g. the newest synced checkpoint (the supervisor knows it): kept here too
    try:
        doomed = prune(spec.get("backend", ""), run_dir, keep_last,
                       root=checkpoint_dir(run_dir, spec.get("checkpoint_dir")), keep_steps=pending)
    except (RlctlError, OSError):
        return
    if doomed:
        with (run_dir / "rlctl-events.jsonl").open("a") as fh:
            fh.write(json.dumps({"time": time.time(), "event": "pruned", "steps": [c.step for c in doomed]}) + "\n")
