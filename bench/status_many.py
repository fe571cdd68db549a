"""`rlctl status` with many runs: 1,000 finished run directories (plus a damaged and a foreign one) and one
experiment of 8 runs, listed through the index (rlctl/runs/index.py).

Prints, in seconds:
- the listing in-process: no index yet (built from every run directory), with the index, one experiment's runs;
- the whole command (`python -m rlctl.cli status`, a new interpreter) with the index, next to the same command on
  an empty runs directory (the interpreter and CLI start-up every command pays), and the same with the OS page
  cache dropped first where this machine lets us (root and a writable /proc/sys/vm/drop_caches);
- the listing before the index (run_status of every run, which ingests logs) on a sample, scaled to 1,000.

Usage: python bench/status_many.py [--runs 1000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_runs(root: Path, n: int, steps: int = 200) -> None:
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time() - n * 60
    for i in range(n):
        exp = "lr-sweep" if i >= n - 8 else None
        name = f"run{i:04d}-20261125-000000" if exp is None else f"lr-sweep-a{i % 2}-s{i}-20261125-000000"
        d = root / name
        d.mkdir()
        start = t0 + i * 60
        (d / "state.json").write_text(json.dumps({
            "name": name, "status": "finished", "backend": "trl", "executor": "local", "started_at": start,
            "ended_at": start + 50, "exit_code": 0, "total_steps": steps, "attempts": [{"attempt": 1}]}))
        (d / "stdout.log").write_text("".join(f"step {s} loss 0.1 reward {s / steps}\n" for s in range(steps)))
        with (d / "metrics.jsonl").open("w") as fh:  # ingested after the log, as the supervisor does
            for s in range(1, steps + 1):
                fh.write(json.dumps({"step": s, "time": start + s * 0.2, "reward/mean": s / steps, "kl": 0.01,
                                     "entropy": 1.0, "grad_norm": 0.5, "lr": 1e-6}) + "\n")
        if exp:
            (d / "experiment.json").write_text(json.dumps({"experiment": exp, "variant": name}))
    bad = root / "damaged-20261125-000000"
    bad.mkdir()
    (bad / "state.json").write_text('{"status": "runn')  # a crash mid-write elsewhere
    (root / "not-a-run").mkdir()  # someone's own folder
    exp_dir = root / "_experiments" / "lr-sweep"
    exp_dir.mkdir(parents=True)
    runs = sorted(p for p in root.iterdir() if p.name.startswith("lr-sweep"))
    (exp_dir / "manifest.json").write_text(json.dumps({"name": "lr-sweep", "kind": "sweep", "arms": [], "seeds": 4,
                                                       "variants": []}))
    (exp_dir / "queue.json").write_text(json.dumps({"variants": {
        p.name: {"state": "done", "run_dir": str(p)} for p in runs}}))


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def cli_time(runs: Path, *args: str, cold: bool = False, repeat: int = 5) -> float:
    env = {**os.environ, "RLCTL_RUNS_DIR": str(runs), "PYTHONPATH": str(ROOT)}
    best = float("inf")
    for _ in range(repeat):
        if cold and not drop_caches():
            return float("nan")
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rlctl.cli", "status", *args], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--keep", type=Path, default=None)
    a = ap.parse_args()
    base = a.keep or Path(tempfile.mkdtemp(prefix="rlctl-status-bench-"))
    runs, empty = base / "runs", base / "empty"
    empty.mkdir(parents=True, exist_ok=True)
    if not runs.is_dir():
        make_runs(runs, a.runs)
    from rlctl.runs.index import INDEX, rows
    from rlctl.runs.status import summary

    (runs / INDEX).unlink(missing_ok=True)
    t = time.perf_counter()
    listed = rows(summary, runs)
    build = time.perf_counter() - t
    warm = timed(lambda: rows(summary, runs))
    one = timed(lambda: rows(summary, runs, experiment="lr-sweep"))
    assert len(listed) == a.runs + 1, len(listed)  # the damaged run is listed (unknown), the foreign folder is not
    print(f"runs: {a.runs} (+1 damaged, +1 foreign folder), experiment lr-sweep: 8 runs; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"listing in-process, no index (built):   {build:.3f} s")
    print(f"listing in-process, with the index:     {warm:.3f} s")
    print(f"listing in-process, one experiment:     {one:.3f} s")
    if drop_caches():
        t = time.perf_counter()
        rows(summary, runs)
        cold_all = time.perf_counter() - t
        drop_caches()
        t = time.perf_counter()
        rows(summary, runs, experiment="lr-sweep")
        cold_one = time.perf_counter() - t
        print(f"listing in-process, page cache dropped: {cold_all:.3f} s (one experiment: {cold_one:.3f} s)")
    startup = cli_time(empty)
    whole = cli_time(runs)
    exp = cli_time(runs, "--experiment", "lr-sweep")
    print(f"`rlctl status`, empty runs dir (start-up only): {startup:.3f} s")
    print(f"`rlctl status`, {a.runs} runs:                  {whole:.3f} s  (listing {whole - startup:+.3f} s)")
    print(f"`rlctl status --experiment lr-sweep`:         {exp:.3f} s  (listing {exp - startup:+.3f} s)")
    cold = cli_time(runs, cold=True, repeat=1)
    if cold == cold:
        print(f"`rlctl status`, page cache dropped:           {cold:.3f} s")
    else:
        print("page cache not dropped: /proc/sys/vm/drop_caches is not writable here (cold = no index above)")
    from rlctl.runs.state import list_runs, run_status

    sample = list_runs(runs)[:50]
    t = time.perf_counter()
    for p in sample:
        run_status(p)
    old = (time.perf_counter() - t) / len(sample) * a.runs
    print(f"before the index (run_status of every run), scaled from {len(sample)}: {old:.2f} s")


if __name__ == "__main__":
    main()
