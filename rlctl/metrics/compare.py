"""`rlctl metrics`: runs side by side — curves overlaid in one picture, CSV rows, or the latest values."""

from __future__ import annotations

from pathlib import Path

from rlctl.errors import RlctlError
from rlctl.metrics.stream import METRICS, by_step, ingest, iter_metrics
from rlctl.runs.health import series
from rlctl.runs.state import ACTIVE, find_run, read_state, settled_status


def load_series(run_dir: Path, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    state = read_state(run_dir)
    if state.get("backend"):
        ingest(run_dir, state["backend"], final=state.get("status") not in ACTIVE)
    merged = by_step(list(iter_metrics(run_dir / METRICS)))
    return {k: series(merged, k) for k in keys}


def compare(refs: list[str], keys: list[str], plot: Path | None, csv: bool) -> str:
    if not keys:
        raise RlctlError("--keys is empty; e.g. --keys reward/mean,kl")
    if plot is not None:
        from rlctl.ui.plots import check_out

        check_out(plot)
    runs = [find_run(r) for r in refs]
    for r in runs:
        settled_status(r)  # a live run's executor brings its newest metrics here first (a remote run's mirror)
    data = {r.name: load_series(r, keys) for r in runs}
    missing = [k for k in keys if not any(by_key.get(k) for by_key in data.values())]
    if missing:  # a typo must not print `-` or an empty CSV with exit 0
        logged = sorted({k for r in runs if (r / METRICS).is_file() for rec in iter_metrics(r / METRICS)
                         if isinstance(rec, dict) for k, v in rec.items()
                         if k not in ("step", "time", "ts") and isinstance(v, (int, float))})
        raise RlctlError(f"no run has {', '.join(missing)}.",
                         hint=f"the metrics these runs log: {', '.join(logged[:40]) or 'none yet'}")
    if plot is not None:
        from rlctl.ui.plots import plot_runs

        plot_runs(data, keys, plot)
        return f"wrote {plot}"
    if csv:
        rows = ["step,run,key,value"]
        for name, by_key in data.items():
            for key, pts in by_key.items():
                rows += [f"{s},{name},{key},{v!r}" for s, v in pts]
        return "\n".join(rows)
    lines = []
    for name, by_key in data.items():
        parts = []
        for key, pts in by_key.items():
            parts.append(f"{key}={pts[-1][1]:.4g}@{pts[-1][0]}" if pts else f"{key}=-")
        lines.append(f"{name}: " + "  ".join(parts))
    return "\n".join(lines)
