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
