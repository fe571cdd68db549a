"""A run's eval ledger, <run>/evals/evals.json: which steps were evaluated (ok, failed, skipped), the failures, the
job running now. Read by the supervisor's evals, by in-run pruning (never delete a checkpoint still to evaluate) and
by status."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

EVALS = "evals"
LEDGER = "evals.json"


def read_ledger(run_dir: Path) -> dict[str, Any]:
    if not (run_dir / EVALS / LEDGER).is_file():  # missing, or a FIFO that would block
        return {}
    try:
        d = json.loads((run_dir / EVALS / LEDGER).read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def write_ledger(run_dir: Path, ledger: dict[str, Any]) -> None:
    # `by_hand` (rlctl eval, here or --on a host) is appended by other processes than a running supervisor, whose
    # in-memory copy lacks it: the longer list on disk is kept
    on_disk = read_ledger(run_dir).get("by_hand")
    if isinstance(on_disk, list) and len(on_disk) > len(ledger.get("by_hand") or []):
        ledger = {**ledger, "by_hand": on_disk}
    d = run_dir / EVALS
    d.mkdir(exist_ok=True)
    tmp = d / (LEDGER + ".tmp")
    tmp.write_text(json.dumps(ledger, indent=2) + "\n")
    os.replace(tmp, d / LEDGER)


def evaluated(run_dir: Path, step: int, sets: list[str]) -> dict[str, float] | None:
    """The results of `step` on every one of `sets` when the run's checkpoint evals or an `rlctl eval` already
    evaluated it (an ok entry in the ledger for each set), else None: what is done is not run again silently."""
    ledger = read_ledger(run_dir)
    done = ledger.get("done") if isinstance(ledger.get("done"), dict) else {}
    entries = [done.get(str(step))] + [e for e in ledger.get("by_hand") or [] if isinstance(e, dict)
                                       and e.get("step") == step]
    keys = {k for e in entries if isinstance(e, dict) and e.get("outcome") == "ok"
            for k in e.get("metrics") or [] if isinstance(k, str) and k.count("/") >= 2}
    if not sets or not set(sets) <= {k.split("/")[1] for k in keys}:
        return None
    wanted = {k for k in keys if k.split("/")[1] in sets}
    values: dict[str, float] = {}
    from rlctl.metrics.stream import METRICS

    try:
        with (run_dir / METRICS).open("rb") as fh:
            for line in fh:
                if b'"eval/' not in line:  # most records are training steps
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("step") == step:
                    values.update({k: float(v) for k, v in rec.items() if k in wanted
                                   and isinstance(v, (int, float)) and not isinstance(v, bool)})  # the latest wins
    except OSError:
        return None
    return values or None
