#!/usr/bin/env python3
"""rlctl's benchmarks: print figures (never pass/fail).

    python bench/run_all.py [--log-mb 200] [--status-sizes 10,100,1000] [--print-mb 200] [--json out.json]
                            [--only ingest]

- CLI latency: median wall time of `rlctl --help`, `render` and `preflight` on the seed recipes, next to
  `python -c pass` (the floor) and `ray --help` when Ray is installed.
- Log ingestion MB/s for each backend's format on a generated log (wall and CPU time, best of 3): `rlctl attach LOG
  --backend NAME` as a user times it (the whole command), ingestion alone in-process, and `wc -l` on the same file,
  with the load average (the machine may be shared).
- `rlctl status` latency against log size: it reads from the end, so it should stay flat.
- Launch pass-through: a child printing N MB as fast as it can, under rlctl's supervisor vs redirected to a file.
- The memory plan vs the peaks measured on an H100 (docs/gpu/gpu_memory_h100_*.json, docs/memory.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RECIPES = ROOT / "recipes"

LINES = {
    "verl": "(TaskRunner pid=16292) step:{s} - actor/entropy:0.323 - actor/kl_loss:0.001 - actor/pg_loss:0.001 - "
            "actor/pg_clipfrac:0.001 - actor/grad_norm:0.020 - actor/lr:1e-06 - critic/score/mean:0.558 - "
            "critic/advantages/mean:-0.016 - response_length/mean:288.698 - response_length/clip_ratio:0.000 - "
            "timing_s/gen:74.020 - timing_s/update_actor:14.302 - timing_s/step:96.551",
    "prime_rl": "02:33:26 SUCCESS Step {s} | Time: 73.77s | Reward: 0.3887 | Throughput: 2408.9 tokens/s | "
                "Seq. Length: 345.6 tokens/sample | Async Level: 1 | Max. Off-Policy Level: 0",
    "openrlhf": "(PPOTrainer pid=4242) INFO 01-06 09:20:11 ppo_trainer.py:321] ✨ Global step {s}: {{'policy_loss': "
                "-0.0123, 'actor_lr': 5e-07, 'kl': 0.0004, 'reward': 0.43, 'return': 0.4, 'response_length': 1830.5, "
                "'total_length': 2100.0, 'correctness': 0.5}}",
    "trl": "{{'loss': '0.0123', 'grad_norm': '0.51', 'learning_rate': '1e-06', 'reward': '0.43', 'reward_std': "
           "'0.2', 'completions/mean_length': '288.7', 'kl': '0.001', 'entropy': '0.9', 'step': {s}}}",
    # the command backend's runner writes these into backend_metrics.jsonl (what its adapter reads)
    "command": '{{"rlctl_command": {{"step": {s}, "policy_loss": 0.0123, "reward/mean": 0.43, "kl": 0.001, '
               '"lr": 1e-06, "grad_norm": 0.51, "response_length/mean": 288.7, "entropy": 0.9}}}}',
}
LOG_FILE = {"command": "backend_metrics.jsonl"}
NOISE = ("Generating rollouts (train):  50%|█████     | 64/128 [00:00<00:00, 350.17it/s]\r"
         "Generating rollouts (train): 100%|██████████| 128/128 [00:00<00:00, 225.79it/s]")


def timed(cmd: list[str], n: int = 7, env: dict | None = None) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cli_latency() -> list[tuple[str, float]]:
    rl = [sys.executable, "-m", "rlctl.cli"]
    exe = shutil.which("rlctl")
    if exe:
        rl = [exe]
    rows = [("python -c pass (floor)", timed([sys.executable, "-c", "pass"])),
            ("rlctl --help", timed([*rl, "--help"]))]
    for name in ("openrlhf-gpt-oss-20b-grpo-lora-8xh100", "verl-qwen2.5-math-1.5b-1xh100"):
        rows.append((f"rlctl render {name}", timed([*rl, "render", str(RECIPES / f"{name}.toml")])))
        rows.append((f"rlctl preflight {name}", timed([*rl, "preflight", str(RECIPES / f"{name}.toml")])))
    if shutil.which("ray"):
        rows.append(("ray --help", timed(["ray", "--help"], n=3)))
    return rows


FILLER = ["INFO 01-06 09:20:11 vllm_engine.py:112] Avg prompt throughput: 1523.4 tokens/s, Avg generation "
          "throughput: 2210.9 tokens/s, Running: 64 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 41.2%",
          "(WorkerDict pid=12345) [rank0]:[W1106 09:20:11] Warning: some kernel fell back to a slower path",
          "Generating rollouts (train):  62%|██████▎   | 80/128 [00:00<00:00, 188.79it/s]"]


def write_log(path: Path, backend: str, mb: int, filler_per_metric: int = 0) -> int:
    line = LINES[backend]
    target = mb * 1024 * 1024
    written, step, chunk = 0, 0, []
    with path.open("w", encoding="utf-8") as fh:
        while written < target:
            for _ in range(1000):
                step += 1
                chunk.append(line.format(s=step))
                if step % 7 == 0:
                    chunk.append(NOISE)
                chunk.extend(FILLER[i % 3] for i in range(filler_per_metric))
            text = "\n".join(chunk) + "\n"
            chunk = []
            fh.write(text)
            written += len(text.encode())
    return step


def _rlctl() -> list[str]:
    """rlctl as a user runs it: the console script beside this interpreter (else `python -m rlctl.cli`), its modules
    compiled to bytecode as an installed wheel has them (an editable install under PYTHONDONTWRITEBYTECODE would
    compile them on every start)."""
    import compileall

    compileall.compile_dir(str(ROOT / "rlctl"), quiet=1)
    exe = Path(sys.executable).with_name("rlctl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "rlctl.cli"]


def _child(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of a command run to its end: its user + system time, as `time` reports them."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def ingestion(mb: int, filler: int = 0) -> list[tuple[str, float, float, float, float, float]]:
    """(backend, attach wall MB/s, attach CPU MB/s, ingest wall MB/s, ingest CPU MB/s, wc -l MB/s), the best of 3 runs
    each (the machine is shared): `rlctl attach LOG --backend NAME` as a user times it (a new process: start-up,
    run directory, ingestion, summary), ingestion alone in this process (its CPU figure counts only its own time),
    and `wc -l` on the same file."""
    from rlctl.metrics.stream import ingest

    rlctl = _rlctl()
    rows = []
    for backend in LINES:
        with tempfile.TemporaryDirectory() as d:
            run = Path(d)
            log = run / LOG_FILE.get(backend, "stdout.log")
            write_log(log, backend, mb, filler)
            size = log.stat().st_size / 1e6
            walls, cpus, wcs, attach = [], [], [], []
            for i in range(3):
                t = time.perf_counter()
                subprocess.run(["wc", "-l", str(log)], stdout=subprocess.DEVNULL)
                wcs.append(time.perf_counter() - t)
                for f in (run / "metrics.jsonl", run / ".ingest.json"):
                    f.unlink(missing_ok=True)
                t, c = time.perf_counter(), time.process_time()
                st = ingest(run, backend, final=True)
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
                assert st is not None and st.records > 0
                user = run / "user"  # a user's working directory: the run goes to ./runs
                user.mkdir(exist_ok=True)
                attach.append(_child([*rlctl, "attach", str(log), "--backend", backend, "--name", f"a{i}"], user))
            rows.append((backend, size / min(w for w, _ in attach), size / min(c for _, c in attach),
                         size / min(walls), size / min(cpus), size / min(wcs)))
    return rows


def status_latency(sizes_mb: list[int]) -> list[tuple[int, float]]:
    from rlctl.runs.state import run_status

    rows = []
    rec = json.dumps({"step": 0, "time": 0.0, "reward/mean": 0.5, "kl": 0.001, "policy_loss": 0.01,
                      "grad_norm": 0.5, "entropy": 0.9, "lr": 1e-6, "response_length/mean": 300.0})
    for mb in sizes_mb:
        with tempfile.TemporaryDirectory() as d:
            run = Path(d)
            n = mb * 1024 * 1024 // (len(rec) + 1)
            block = "\n".join(rec.replace('"step": 0', f'"step": {i}') for i in range(1000)) + "\n"
            with (run / "metrics.jsonl").open("w") as fh:
                for _ in range(max(n // 1000, 1)):
                    fh.write(block)
            # the raw log has been ingested already: an equally large stdout.log at the recorded offset
            with (run / "stdout.log").open("wb") as fh:
                fh.truncate(mb * 1024 * 1024)
            st = (run / "stdout.log").stat()
            (run / ".ingest.json").write_text(json.dumps({"stdout.log": {"offset": st.st_size, "inode": st.st_ino}}))
            (run / "state.json").write_text(json.dumps({"backend": "verl", "status": "finished", "started_at": 1}))
            times = []
            for _ in range(5):
                t = time.perf_counter()
                run_status(run)
                times.append(time.perf_counter() - t)
            rows.append((mb, statistics.median(times)))
    return rows


PRINTER = ("import sys\nline = ('step:1 - critic/score/mean:0.5 - ' + 'x' * 200 + '\\n').encode()\n"
           "n = {mb} * 1024 * 1024 // len(line)\nw = sys.stdout.buffer.write\nfor _ in range(n):\n    w(line)\n")


def passthrough(mb: int) -> tuple[float, float]:
    from rlctl.executors.local import Supervisor

    code = PRINTER.format(mb=mb)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "direct.log"
        t = time.perf_counter()
        with out.open("wb") as fh:
            subprocess.run([sys.executable, "-c", code], stdout=fh)
        direct = time.perf_counter() - t
        run = Path(d) / "run"
        run.mkdir()
        sup = Supervisor(run, {"argv": [sys.executable, "-c", code], "backend": "verl"}, dict(os.environ))
        t = time.perf_counter()
        sup.start()
        sup.proc.wait()
        child = time.perf_counter() - t  # the child's own run time under rlctl
        sup.loop()
        return direct, child


def memory_report() -> str:
    """Today's plan next to the peaks measured on an H100 (raw data in docs/gpu/gpu_memory_h100_*.json); the
    configurations held out from fitting are the ones docs/memory.md marks so."""
    import re

    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_memory import report

    files = sorted((ROOT / "docs" / "gpu").glob("gpu_memory_h100_*.json"))
    doc = (ROOT / "docs" / "memory.md").read_text()
    held = set(re.findall(r"^\| ([\w.-]+) \|.*\| held out \|$", doc, flags=re.M))
    return report(files, held) if files else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-mb", type=int, default=200)
    ap.add_argument("--status-sizes", default="10,100,1000")
    ap.add_argument("--print-mb", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only", choices=["ingest"], help="only the log-ingestion figures")
    a = ap.parse_args()
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"# rlctl benchmarks on {machine}\n")
    out: dict = {"machine": machine}

    if a.only != "ingest":
        rows = cli_latency()
        out["cli_latency_s"] = dict(rows)
        print("| command | median wall (s) |\n|---|---|")
        for name, t in rows:
            print(f"| {name} | {t:.3f} |")

    for filler, label in ((0, "every line a metrics line (worst case)"), (20, "1 metrics line in 21 (typical)")):
        load = os.getloadavg()[0]
        rows2 = ingestion(a.log_mb, filler)
        out[f"ingest_mb_s_filler{filler}"] = {b: {"attach": aw, "attach_cpu": ac, "rlctl": r, "rlctl_cpu": c,
                                                  "wc -l": w, "load": load} for b, aw, ac, r, c, w in rows2}
        print(f"\n| {a.log_mb} MB log, {label} (load {load:.1f}) | `rlctl attach` MB/s: wall (CPU) "
              "| ingest alone MB/s: wall (CPU) | wc -l MB/s |\n|---|---|---|---|")
        for b, aw, ac, r, c, w in rows2:
            print(f"| {b} | {aw:.0f} ({ac:.0f}) | {r:.0f} ({c:.0f}) | {w:.0f} |")

    if a.only == "ingest":
        if a.json:
            a.json.write_text(json.dumps(out, indent=2))
        return
    sizes = [int(x) for x in a.status_sizes.split(",") if x]
    rows3 = status_latency(sizes)
    out["status_latency_s"] = {str(mb): t for mb, t in rows3}
    print("\n| metrics + log size | rlctl status latency (s) |\n|---|---|")
    for mb, t in rows3:
        print(f"| {mb} MB | {t:.4f} |")

    direct, under = passthrough(a.print_mb)
    out["passthrough_s"] = {"redirected": direct, "under_rlctl": under, "ratio": under / direct}
    print(f"\n| child printing {a.print_mb} MB | seconds |\n|---|---|")
    print(f"| redirected to a file | {direct:.2f} |\n| under rlctl's supervisor | {under:.2f} |\n"
          f"| ratio | {under / direct:.2f} |")

    mem = memory_report()
    if mem:
        print("\nTRL GRPO on an H100 80GB, the plan against the measured peak (docs/memory.md):\n")
        print(mem)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
