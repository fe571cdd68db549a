"""Sweep placement on real GPUs (issue 25, point 2): variants start as capacity frees up, on one machine by GPU index,
no two runs on the same GPU, each given a GPU only when nvidia-smi shows the memory its plan says free.

Needs a machine with >= 2 NVIDIA GPUs, torch with CUDA, and rlctl importable (PYTHONPATH or installed; this script
does not put the repository on sys.path, so the rlctl that runs is the one the environment names, and the summary
says which). `--dry` runs the same logic on a CPU machine: CUDA_VISIBLE_DEVICES=0,1 stands for two GPUs, a fake
`nvidia-smi` on PATH reports their memory (GPU 1 nearly full in phase 2), and the trainer runs on the CPU.

Phase 1: a command-backend recipe (1 GPU per run, a model config whose memory plan is a few GiB) whose trainer is a
small torch program on `cuda` that takes the memory its plan says and runs matmuls for --seconds; `rlctl sweep`
of --variants variants (grid x seeds) with placement by GPU index; every trainer records CUDA_VISIBLE_DEVICES, the
GPU's UUID (torch) and its start and end. Checks: every run finished; each ran on exactly the GPU its slot names
(CUDA_VISIBLE_DEVICES == slot, UUID == nvidia-smi's UUID of that index); no two runs overlapped on one physical GPU
(by the trainers' own clocks, and by nvidia-smi's process list sampled every second); both GPUs were used.
Phase 2: a hog (plain torch) holds GPU 1 until less than the plan is free there; a sweep of --variants2 variants
must then run all on GPU 0, one after another.

Phase 3 (--phase3): a grid over resources.gpus_per_node = 2, 1 with 2 seeds: a 2-GPU run gets both GPUs
(CUDA_VISIBLE_DEVICES=0,1, two devices seen) and nothing runs beside it; 1-GPU runs share the machine as in phase 1.

Prints a JSON summary; --out DIR gets it (summary.json) and the logs.
Usage: python bench/gpu_placement.py --out DIR [--dry] [--variants 4] [--variants2 3] [--seconds 20] [--phase3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

SMI_QUERY = "index,name,memory.total,memory.used,memory.free,driver_version"

TRAINER = r'''
import argparse, json, os, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--record", required=True)
ap.add_argument("--name", required=True)
ap.add_argument("--seed", type=int, required=True)
ap.add_argument("--lr", type=float, required=True)
ap.add_argument("--gib", type=float, required=True)   # what to take on the GPU (the plan less the CUDA context)
ap.add_argument("--seconds", type=float, required=True)
ap.add_argument("--dry", action="store_true")
a = ap.parse_args()
t0 = time.time()
import torch
rec = {"name": a.name, "seed": a.seed, "lr": a.lr, "pid": os.getpid(), "start": t0,
       "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
       "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER")}
if a.dry:
    dev = "cpu"
    rec.update(device_count=len((rec["cuda_visible_devices"] or "").split(",")),
               uuid="GPU-FAKE-" + str(rec["cuda_visible_devices"]).split(",")[0], free_before_gib=None, total_gib=None)
else:
    dev = "cuda"
    torch.cuda.init()
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    u = str(p.uuid)
    rec.update(device_count=torch.cuda.device_count(), uuid=u if u.startswith("GPU-") else "GPU-" + u, gpu_name=p.name,
               free_before_gib=free / 2**30, total_gib=total / 2**30)
held = None
if not a.dry:
    held = torch.empty(int(a.gib * 2**30), dtype=torch.uint8, device=dev)
    held.fill_(1)
torch.manual_seed(a.seed)
x = torch.randn(1024, 1024, device=dev)
steps, step, end = 0, 0, t0 + a.seconds
while time.time() < end:
    step += 1
    y = x @ x.T
    reward = float(y.mean().tanh()) * 0 + min(1.0, a.lr * step)
    if dev == "cuda":
        torch.cuda.synchronize()
    print(f"step {step} | reward {reward:.4f}", flush=True)
    time.sleep(0.5)
if not a.dry:
    rec["max_reserved_gib"] = torch.cuda.max_memory_reserved(0) / 2**30
rec.update(end=time.time(), steps=step)
tmp = a.record + ".tmp"
with open(tmp, "w") as f:
    json.dump(rec, f)
os.replace(tmp, a.record)
'''

HOG = r'''
import os, sys, time, torch
leave = float(sys.argv[1])  # GiB to leave free on the (one visible) GPU
free, total = torch.cuda.mem_get_info(0)
take = max(int(free - leave * 2**30), 0)
held = torch.empty(take, dtype=torch.uint8, device="cuda")
held.fill_(7)
torch.cuda.synchronize()
u = str(torch.cuda.get_device_properties(0).uuid)
print(f"hog holds {take / 2**30:.2f} GiB on {torch.cuda.get_device_properties(0).name} "
      f"{u if u.startswith('GPU-') else 'GPU-' + u}", flush=True)
while True:
    time.sleep(1)
'''

# a Qwen2.5-0.5B-shaped config: a memory plan of a few GiB, no weights needed (the command backend never loads it)
MODEL_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
                "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
                "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}

FAKE_SMI = r'''#!/bin/sh
# fake nvidia-smi for --dry: two 80 GB GPUs; GPU 1 nearly full while the file HOG exists
dir=$(dirname "$0")
case "$*" in
  *query-compute-apps*) exit 0 ;;
  *uuid*) echo "0, GPU-FAKE-0, 00000000:00:01.0"; echo "1, GPU-FAKE-1, 00000000:00:02.0"; exit 0 ;;
esac
if [ -e "$dir/HOG" ]; then f1=1000; u1=80559; else f1=81000; u1=559; fi
echo "0, Fake H100 80GB HBM3, 81559, 559, 81000, 580.00"
echo "1, Fake H100 80GB HBM3, 81559, $u1, $f1, 580.00"
'''


def sh(args: list[str], env: dict | None = None, timeout: float = 60) -> str:
    try:
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
        return p.stdout + (("\n[stderr] " + p.stderr) if p.stderr.strip() else "")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"[{type(e).__name__}: {e}]"


class Monitor(threading.Thread):
    """nvidia-smi's compute processes every second: which pids held memory on which GPU UUID, and when."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[dict] = []
        self.stop_flag = False

    def run(self) -> None:
        while not self.stop_flag:
            t = time.time()
            out = sh(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                     timeout=10)
            procs = []
            for line in out.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 3 and parts[0].isdigit():
                    procs.append({"pid": int(parts[0]), "uuid": parts[1], "used_mib": parts[2]})
            self.samples.append({"t": t, "procs": procs})
            time.sleep(1.0)


def write_workdir(w: Path, seconds: float, dry: bool) -> None:
    w.mkdir(parents=True, exist_ok=True)
    (w / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (w / "model").mkdir(exist_ok=True)
    (w / "model" / "config.json").write_text(json.dumps(MODEL_CONFIG))
    (w / "trainer.py").write_text(TRAINER)
    (w / "hog.py").write_text(HOG)


def recipe_text(w: Path, gib: float, seconds: float, dry: bool) -> str:
    cmd = [sys.executable, str(w / "trainer.py"), "--record", "{run_dir}/gpu_record.json", "--name", "{run_dir}",
           "--seed", "{seed}", "--lr", "{lr}", "--gib", f"{gib:.3f}", "--seconds", str(seconds),
           *(["--dry"] if dry else [])]
    return f"""
name = "gpuplace"
[backend]
name = "command"
[backend.command]
command = {json.dumps(cmd)}
log_pattern = 'step (?P<step>\\d+) \\| reward (?P<reward>\\S+)'
metrics_map = {{reward = "reward/mean"}}
[model]
path = {json.dumps(str(w / "model"))}
dtype = "bfloat16"
max_model_len = 512
[data]
train = "prompts.jsonl"
max_prompt_tokens = 64
[rollout]
group_size = 4
prompts_per_step = 2
max_tokens = 256
[train]
steps = 1000
train_batch_size = 8
micro_batch_size = 8
seed = 42
[optim]
lr = 0.01
[resources]
gpus_per_node = 1
gpu = "H100-80GB"
"""


def plan_gib(w: Path, recipe: Path) -> tuple[float | None, list]:
    """The memory plan rlctl's preflight makes for one variant of the recipe (what the queue will ask free)."""
    from rlctl.experiments.variants import grid_arms, preflight_all, variants

    arms = grid_arms(str(recipe), [], [])
    problems, needs = preflight_all(arms, variants("plan", arms, 1))
    return next(iter(needs.values()))["gib"], [p.__dict__ for p in problems]


def sweep(w: Path, env: dict, name: str, lrs: list[str], seeds: int, log: Path, grid: tuple[str, ...] = ()) -> dict:
    t0 = time.time()
    args = [sys.executable, "-m", "rlctl.cli", "sweep", "recipe.toml", "--grid", "optim.lr=" + ",".join(lrs),
            *[x for g in grid for x in ("--grid", g)], "--seeds", str(seeds), "--name", name, "--force", "--wait"]
    p = subprocess.run(args, cwd=w, env=env, capture_output=True, text=True, timeout=480)
    log.write_text(f"$ {' '.join(args)}\nexit {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}\n")
    exp = w / "runs" / "_experiments" / name
    show = subprocess.run([sys.executable, "-m", "rlctl.cli", "experiment", "show", name], cwd=w, env=env,
                          capture_output=True, text=True, timeout=120)
    with log.open("a") as f:
        f.write(f"--- experiment show\n{show.stdout}{show.stderr}\n")
        qlog = exp / "queue.log"
        f.write(f"--- queue.log\n{qlog.read_text() if qlog.is_file() else '(none)'}\n")
    manifest = json.loads((exp / "manifest.json").read_text()) if (exp / "manifest.json").is_file() else {}
    queue = json.loads((exp / "queue.json").read_text()) if (exp / "queue.json").is_file() else {}
    return {"exit": p.returncode, "wall_s": round(time.time() - t0, 1), "manifest": manifest, "queue": queue}


def _norm(u: str | None) -> str:
    """A GPU UUID as nvidia-smi writes it (GPU-xxxxxxxx-...), whether or not torch put the prefix on."""
    u = (u or "").strip().lower()
    return u if u.startswith("gpu-") else "gpu-" + u


def smi_uuids(env: dict) -> dict[int, str]:
    out = sh(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"], env=env)
    res = {}
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            res[int(parts[0])] = parts[1]
    return res


def check_phase(res: dict, w: Path, uuids: dict[int, str], samples: list[dict], only_gpu: int | None = None) -> dict:
    """The checks of one sweep: finished, right GPU, no overlap on a physical GPU, memory as planned."""
    m, q = res["manifest"], res["queue"]
    needs = (m.get("placement") or {}).get("needs") or {}
    arm_sets = {a["id"]: a.get("sets") or [] for a in m.get("arms", [])}
    runs, problems = [], []
    for v in m.get("variants", []):
        r = (q.get("variants") or {}).get(v["id"], {})
        run_name = Path(r.get("run_dir") or "").name
        recf = Path(r.get("run_dir") or "/nonexistent") / "gpu_record.json"
        rec = json.loads(recf.read_text()) if run_name and recf.is_file() else {}
        slot_gpus = (r.get("slot") or {}).get("gpus") or []
        row = {"variant": v["id"], "run": run_name, "state": r.get("state"), "status": r.get("status"),
               "slot": slot_gpus, "plan_gib": (needs.get(v["id"]) or {}).get("gib"),
               "cuda_visible_devices": rec.get("cuda_visible_devices"),
               "cuda_device_order": rec.get("cuda_device_order"), "device_count": rec.get("device_count"),
               "uuid": rec.get("uuid"), "pid": rec.get("pid"), "start": rec.get("start"), "end": rec.get("end"),
               "free_before_gib": rec.get("free_before_gib"), "max_reserved_gib": rec.get("max_reserved_gib"),
               "launched_at": r.get("launched_at"), "ended_at": r.get("ended_at")}
        runs.append(row)
        if r.get("status") != "finished":
            problems.append(f"{v['id']}: status {r.get('status')} (state {r.get('state')})")
        if not rec:
            problems.append(f"{v['id']}: no trainer record")
            continue
        if not slot_gpus or rec.get("cuda_visible_devices") != ",".join(map(str, slot_gpus)):
            problems.append(f"{v['id']}: slot {slot_gpus} but CUDA_VISIBLE_DEVICES={rec.get('cuda_visible_devices')}")
        if rec.get("device_count") != len(slot_gpus):
            problems.append(f"{v['id']}: saw {rec.get('device_count')} GPUs, its slot has {len(slot_gpus)}")
        sets = dict(x.split("=", 1) for x in arm_sets.get(v.get("arm"), []) if "=" in x)
        want = sets.get("resources.gpus_per_node", 1)
        if len(slot_gpus) != int(want):
            problems.append(f"{v['id']}: asks {want} GPU(s), its slot has {slot_gpus}")
        if slot_gpus and _norm(uuids.get(slot_gpus[0])) != _norm(rec.get("uuid")):
            problems.append(f"{v['id']}: slot GPU {slot_gpus[0]} is {uuids.get(slot_gpus[0])} by nvidia-smi, "
                            f"the trainer ran on {rec.get('uuid')}")
        if only_gpu is not None and slot_gpus != [only_gpu]:
            problems.append(f"{v['id']}: placed on {slot_gpus}, expected only GPU {only_gpu}")
    # no two runs' lifetimes overlap on one physical GPU (the trainers' own clocks)
    by_uuid: dict[str, list[dict]] = {}
    for r in runs:
        if r["uuid"] and r["start"]:
            by_uuid.setdefault(r["uuid"], []).append(r)
    for u, rs in by_uuid.items():
        rs.sort(key=lambda r: r["start"])
        for a, b in zip(rs, rs[1:], strict=False):
            if b["start"] < a["end"]:
                problems.append(f"{a['variant']} and {b['variant']} overlap on {u}: "
                                f"{a['start']:.1f}-{a['end']:.1f} vs {b['start']:.1f}-{b['end']:.1f}")
    # no two runs whose slots share a GPU index ran at once (multi-GPU slots: the first UUID is not all of it)
    timed = [r for r in runs if r["start"] and r["end"] and r["slot"]]
    for i, a in enumerate(timed):
        for b in timed[i + 1:]:
            if set(a["slot"]) & set(b["slot"]) and a["start"] < b["end"] and b["start"] < a["end"]:
                problems.append(f"{a['variant']} {a['slot']} and {b['variant']} {b['slot']} ran at once on a shared "
                                "GPU")
    # the same by nvidia-smi's process list (independent of the trainers)
    ours = {r["pid"]: r["variant"] for r in runs if r["pid"]}
    smi_overlap, seen_on, smi_mib = [], {}, {}
    for s in samples:
        per: dict[str, list[str]] = {}
        for p in s["procs"]:
            if p["pid"] in ours:
                per.setdefault(_norm(p["uuid"]), []).append(ours[p["pid"]])
                seen_on.setdefault(ours[p["pid"]], set()).add(_norm(p["uuid"]))
                if p["used_mib"].isdigit():
                    smi_mib[ours[p["pid"]]] = max(smi_mib.get(ours[p["pid"]], 0), int(p["used_mib"]))
        for u, vs in per.items():
            if len(vs) > 1:
                smi_overlap.append({"t": s["t"], "uuid": u, "variants": vs})
    if smi_overlap:
        problems.append(f"nvidia-smi saw two of our runs on one GPU at once {len(smi_overlap)} times")
    for r in runs:  # nvidia-smi saw the pid on the GPU the trainer named (pids in a container may not match)
        r["smi_max_used_mib"] = smi_mib.get(r["variant"])
        if r["variant"] in seen_on and seen_on[r["variant"]] != {_norm(r["uuid"])}:
            problems.append(f"{r['variant']}: nvidia-smi saw it on {sorted(seen_on[r['variant']])}")
    for r in runs:  # each got a GPU with its plan free (what the trainer saw free after its own CUDA context)
        if r["plan_gib"] and r["free_before_gib"] is not None and r["free_before_gib"] + 1.0 < r["plan_gib"]:
            problems.append(f"{r['variant']}: {r['free_before_gib']:.1f} GiB free at start, plan {r['plan_gib']:.1f}")
    max_parallel = 0
    pts = sorted([(r["start"], 1) for r in runs if r["start"]] + [(r["end"], -1) for r in runs if r["end"]])
    cur = 0
    for _, d in pts:
        cur += d
        max_parallel = max(max_parallel, cur)
    pl = m.get("placement") or {}
    return {"exit": res["exit"], "wall_s": res["wall_s"], "queue_state": q.get("state"),
            "parallel": pl.get("parallel"), "gpu_ids": pl.get("gpu_ids"), "preflight_problems": m.get("preflight"),
            "runs": runs, "gpus_used": sorted({tuple(r["slot"]) for r in runs}),
            "max_runs_at_once": max_parallel, "smi_samples": len(samples),
            "smi_saw_our_pids": sorted(seen_on), "smi_overlaps": smi_overlap[:5], "problems": problems,
            "ok": not problems and res["exit"] == 0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--variants", type=int, default=4, help="phase 1: 2 lrs x variants/2 seeds")
    ap.add_argument("--variants2", type=int, default=3, help="phase 2: 1 lr x this many seeds")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--phase1-only", action="store_true", help="no hog phase (e.g. a baseline of another rlctl)")
    ap.add_argument("--phase3", action="store_true", help="also runs of 2 GPUs next to runs of 1 (a grid over "
                    "resources.gpus_per_node = 2, 1 with 2 seeds)")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    w = Path(os.environ.get("GPUPLACE_WORK") or (Path("/tmp") / f"gpuplace-{os.getpid()}"))
    w.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(RLCTL_RUNS_DIR=str(w / "runs"), RLCTL_CONFIG_DIR=str(w / "config"), PYTHONUNBUFFERED="1")
    if a.dry:
        (w / "bin").mkdir(exist_ok=True)
        (w / "bin" / "nvidia-smi").write_text(FAKE_SMI)
        (w / "bin" / "nvidia-smi").chmod(0o755)
        env["PATH"] = f"{w / 'bin'}:{env['PATH']}"
        env["CUDA_VISIBLE_DEVICES"] = "0,1"  # two "GPUs" for local_gpu_ids
        os.environ.update(PATH=env["PATH"], CUDA_VISIBLE_DEVICES="0,1")
    os.environ.update(RLCTL_RUNS_DIR=env["RLCTL_RUNS_DIR"], RLCTL_CONFIG_DIR=env["RLCTL_CONFIG_DIR"])
    os.chdir(w)  # never the repository: `-m rlctl.cli` there would import its rlctl, not the environment's

    import rlctl
    from rlctl.core.gpus import list_gpus
    from rlctl.experiments.queue import local_gpu_free_gib, local_gpu_ids

    summary: dict = {"dry": a.dry, "rlctl": rlctl.__file__, "python": sys.version.split()[0],
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import torch

        summary["torch"] = torch.__version__
    except ImportError:
        summary["torch"] = None
    summary["nvidia_smi_raw"] = sh(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
                                   env=env)
    summary["nvidia_smi_uuid_raw"] = sh(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                                        env=env)
    summary["list_gpus"] = list_gpus()
    summary["local_gpu_ids"] = local_gpu_ids()
    summary["local_gpu_free_gib"] = local_gpu_free_gib()
    uuids = smi_uuids(env)
    summary["smi_uuids"] = uuids
    if not a.dry:  # does CUDA's default order (FASTEST_FIRST) name the same GPU as nvidia-smi's index?
        order = {}
        for i in sorted(uuids):
            e = {k: v for k, v in env.items() if k != "CUDA_DEVICE_ORDER"}
            e["CUDA_VISIBLE_DEVICES"] = str(i)
            order[i] = _norm(sh([sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0).uuid)"],
                                env=e).strip())
        summary["cuda_default_order_uuid_by_index"] = order
        summary["cuda_default_order_matches_smi"] = all(order[i] == _norm(uuids[i]) for i in uuids)

    write_workdir(w, a.seconds, a.dry)
    # the plan first with a placeholder allocation (the command line does not change the plan), then the real one
    (w / "recipe.toml").write_text(recipe_text(w, 0.0, a.seconds, a.dry))
    gib, plan_problems = plan_gib(w, w / "recipe.toml")
    summary["plan_gib"] = gib
    summary["plan_preflight_problems"] = plan_problems
    if not gib:
        summary["error"] = "no memory plan for the recipe"
        print(json.dumps(summary, indent=1, default=str))
        return 1
    take = max(gib - 0.75, 0.25)  # the plan counts the CUDA context (0.8 GiB); the trainer takes the rest
    summary["trainer_takes_gib"] = take
    (w / "recipe.toml").write_text(recipe_text(w, take, a.seconds, a.dry))

    mon = Monitor()
    mon.start()
    # phase 1: both GPUs free; 2 lrs x seeds
    seeds1 = max(a.variants // 2, 1)
    r1 = sweep(w, env, "place1", ["0.01", "0.02"], seeds1, out / "phase1.log")
    summary["phase1"] = check_phase(r1, w, uuids, list(mon.samples))
    if len(summary["phase1"]["gpus_used"]) < 2:
        summary["phase1"]["problems"].append("only one GPU was used with two free")
        summary["phase1"]["ok"] = False

    if a.phase1_only:
        mon.stop_flag = True
        summary["ok"] = summary["phase1"]["ok"]
        return finish(summary, out, w)
    # phase 2: a hog leaves less than the plan free on GPU 1
    leave = gib / 2
    hog_env = dict(env, CUDA_VISIBLE_DEVICES="1", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    hog = None
    if a.dry:
        (w / "bin" / "HOG").write_text("")
        summary["hog"] = "fake (nvidia-smi reports GPU 1 with 1000 MiB free)"
    else:
        hog = subprocess.Popen([sys.executable, str(w / "hog.py"), f"{leave:.3f}"], env=hog_env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = hog.stdout.readline()
        summary["hog"] = line.strip()
    summary["free_gib_with_hog"] = local_gpu_free_gib()
    summary["nvidia_smi_raw_with_hog"] = sh(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
                                            env=env)
    n1 = len(mon.samples)
    try:
        r2 = sweep(w, env, "place2", ["0.03"], a.variants2, out / "phase2.log")
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        (w / "bin" / "HOG").unlink(missing_ok=True)
    summary["phase2"] = check_phase(r2, w, uuids, list(mon.samples[n1:]), only_gpu=0)
    fg = summary["free_gib_with_hog"] or {}
    if not (fg.get(1, 1e9) < gib <= fg.get(0, 0)):
        summary["phase2"]["problems"].append(f"the hog did not leave GPU 1 below the plan ({fg}, plan {gib})")
        summary["phase2"]["ok"] = False
    if summary["phase2"]["max_runs_at_once"] > 1:
        summary["phase2"]["problems"].append("phase 2 ran more than one at once on GPU 0")
        summary["phase2"]["ok"] = False
    summary["ok"] = summary["phase1"]["ok"] and summary["phase2"]["ok"]
    if a.phase3:  # 2-GPU runs take both GPUs alone; 1-GPU runs fill the GPUs otherwise
        n2 = len(mon.samples)
        r3 = sweep(w, env, "place3", ["0.04"], 2, out / "phase3.log", grid=("resources.gpus_per_node=2,1",))
        summary["phase3"] = check_phase(r3, w, uuids, list(mon.samples[n2:]))
        sizes = sorted(len(r["slot"]) for r in summary["phase3"]["runs"])
        if sizes != [1, 1, 2, 2]:
            summary["phase3"]["problems"].append(f"slot sizes {sizes}, expected two of 1 GPU and two of 2")
            summary["phase3"]["ok"] = False
        if summary["phase3"]["max_runs_at_once"] < 2:  # the two 1-GPU runs fit side by side
            summary["phase3"]["problems"].append("the 1-GPU runs never ran side by side on the two GPUs")
            summary["phase3"]["ok"] = False
        summary["ok"] = summary["ok"] and summary["phase3"]["ok"]
    mon.stop_flag = True
    return finish(summary, out, w)


def finish(summary: dict, out: Path, w: Path) -> int:
    summary["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = json.dumps(summary, indent=1, default=str)
    (out / "summary.json").write_text(text)
    with tarfile.open(out / "runs.tar.gz", "w:gz") as t:  # the run directories' records and logs, for the record
        for p in (w / "runs").rglob("*"):
            if p.is_file() and p.stat().st_size < 2_000_000 and p.suffix in (".json", ".jsonl", ".log", ".txt", ""):
                t.add(p, arcname=str(p.relative_to(w)))
    print(text)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
