"""An experiment's directory, `<runs root>/_experiments/<EXP>/`: manifest.json (what was asked: arms, their
recipe diffs, seeds, variants, git commit, patch sets, placement), written by the rlctl command only, and
queue.json (what the queue did: each variant's run directory, slot and state), written by the queue process only.
One writer per file, each write a temp file renamed over the old one: a crash leaves the old or the new file."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError

EXPERIMENTS = "_experiments"
MANIFEST = "manifest.json"
QUEUE = "queue.json"
LOG = "queue.log"
NAME_RE = r"[A-Za-z0-9][A-Za-z0-9._-]*"


def experiments_root(runs: Path | None = None) -> Path:
    from rlctl.runs.state import runs_root

    return (runs or runs_root()) / EXPERIMENTS


def check_name(name: str) -> str:
    if not re.fullmatch(NAME_RE, name) or len(name) > 100:
        raise RlctlError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (at most 100).")
    return name


def exp_dir(name: str, runs: Path | None = None) -> Path:
    return experiments_root(runs) / check_name(name)


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_manifest(d: Path) -> dict[str, Any]:
    m = read_json(d / MANIFEST)
    if not m:
        raise RlctlError(f"{d}: no readable {MANIFEST}; not an experiment.",
                         hint="rlctl experiment list shows the experiments")
    return m


def write_manifest(d: Path, manifest: dict[str, Any]) -> None:
    from rlctl.core.run_places import remember

    d.mkdir(parents=True, exist_ok=True)
    write_json(d / MANIFEST, manifest)
    remember(d.parent.parent)  # its runs directory: found by name from anywhere before its first run starts


def read_queue(d: Path) -> dict[str, Any]:
    q = read_json(d / QUEUE)
    q.setdefault("variants", {})
    return q


def find_experiment(ref: str, runs: Path | None = None) -> Path:
    p = Path(ref)
    if p.is_dir() and (p / MANIFEST).is_file():
        return p
    root = experiments_root(runs)
    if re.fullmatch(NAME_RE, ref) and (root / ref / MANIFEST).is_file():
        return root / ref
    if runs is None and re.fullmatch(NAME_RE, ref):  # as find_run: the other runs directories of this user
        from rlctl.core.run_places import known_roots

        found = [r / EXPERIMENTS / ref for r in known_roots() if (r / EXPERIMENTS / ref / MANIFEST).is_file()]
        if len(found) == 1:
            return found[0]
        if found:
            raise RlctlError(f"{ref!r} names {len(found)} experiments: {', '.join(str(f) for f in found)}.",
                             hint="give the experiment's directory")
    known = sorted(x.name for x in root.iterdir() if (x / MANIFEST).is_file()) if root.is_dir() else []
    raise RlctlError(f"no experiment {ref!r} under {root}.",
                     hint=f"known: {', '.join(known[-8:]) or 'none'} (rlctl experiment list)")


def list_experiments(runs: Path | None = None) -> list[Path]:
    root = experiments_root(runs)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if (p / MANIFEST).is_file()), key=lambda p: p.stat().st_mtime)


def new_manifest(name: str, kind: str, arms: list[Any], seeds: int, vs: list[Any], placement: dict[str, Any],
                 question: str | None = None, inert: dict[str, Any] | None = None) -> dict[str, Any]:
    """`inert`: the keys the arms differ in that cannot act (variants.inert_record), for compare to say."""
    from rlctl.runs.rundir import git_info

    recipe_dir = Path(arms[0].recipe).parent if arms and Path(arms[0].recipe).exists() else Path.cwd()
    return {
        "name": name, "kind": kind, "created_at": time.time(), "question": question,
        "arms": [a.to_dict() for a in arms], "seeds": seeds, "variants": [v.to_dict() for v in vs],
        "git": git_info(recipe_dir) or git_info(Path.cwd()),
        "patches": sorted({a.patches for a in arms if a.patches}),
        "placement": placement,
        "inert": inert or {},
    }


# a run's settled statuses after which nothing runs it (a lost one waits for a resume)
ENDED = ("finished", "failed", "stopped", "lost")


def variant_status(d: Path, manifest: dict[str, Any] | None = None, queue: dict[str, Any] | None = None,
                   told: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Each variant with its queue record and its run's status: as `told` (run name -> status: `rlctl status`'s rows,
    settled by each run's executor, so a run whose processes all died is `lost`, not the `running` its state.json
    still says; cli.experiments.settled_variants), else as recorded (cheap: enough to count the queue's states)."""
    from rlctl.runs.state import read_state

    manifest = manifest or read_manifest(d)
    queue = queue or read_queue(d)
    # a queue whose record says running but whose process is gone (kill -9, a reboot): nothing will start what
    # waits on it; its resume is the way on, as for its running variants (rlctl status's `next`)
    dead = queue.get("state") == "running" and not queue_alive(d)
    rows = []
    for v in manifest.get("variants", []):
        q = queue["variants"].get(v["id"], {})
        run_dir = q.get("run_dir")
        status = (told or {}).get(Path(run_dir).name) if run_dir else None
        if run_dir and status is None:
            status = read_state(Path(run_dir)).get("status")
        state = q.get("state", "queued")
        if state == "running" and told and status in ENDED:  # the queue's record lags (or its queue is dead):
            state = "lost" if status == "lost" else "done"  # the variant's column agrees with its run's settled status
        waits = dead and not run_dir and state in ("queued", "launching")  # launching: died mid-launch, no run
        rows.append({**v, "queue": "stalled" if waits else state, "run_dir": run_dir, "slot": q.get("slot"),
                     "status": status, "error": q.get("error"),
                     "unreachable_since": q.get("unreachable_since"),
                     "next": f"rlctl experiment resume {d.name}" if waits else None})
    return rows


def queue_alive(d: Path) -> int | None:
    """The pid of the live queue process of this experiment, or None."""
    from rlctl.runs.state import process_alive

    q = read_json(d / QUEUE)
    pid, ct = q.get("pid"), q.get("create_time")
    return pid if isinstance(pid, int) and q.get("state") == "running" and process_alive(pid, ct) else None
