#!/usr/bin/env python3
"""Measure real TRL GRPO runs launched by rlctl itself on a GPU: memory peaks, weight changes, reward curves.

Models are randomly initialised with the public shapes (and vocabularies) of real models, made on the GPU and saved
locally (no download; the tokenizer is rlctl's byte-level one). Every configuration is a recipe launched with
`rlctl launch` (attached), so the runner, the precision render and the NVML sampler are rlctl's own. While it runs,
this script samples NVML every 50 ms (the peak an OOM sees); the runner reports torch's allocated/reserved peaks.
The estimates are computed afterwards, on any machine, by `--report` (the raw figures never depend on them).

    python bench/gpu_memory.py --grid memory-a --out gpu_memory_a.json      # on the GPU machine
    python bench/gpu_memory.py --report docs/gpu/gpu_memory_h100_*.json         # estimate vs measured table
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GiB = 1024**3
WORK = Path(os.environ.get("RLCTL_BENCH_DIR", "/tmp/rlctl-bench"))

SHAPES = {"0.5b": "Qwen/Qwen2.5-0.5B", "1.5b": "Qwen/Qwen2.5-1.5B", "3b": "Qwen/Qwen2.5-3B", "7b": "Qwen/Qwen2.5-7B"}


def cfg(name: str, shape: str, *, lora: int = 0, mb: int = 8, group: int = 8, pps: int = 2, tokens: int = 256,
        gc: bool = True, precision: str = "mixed", lr: float = 1e-6, steps: int = 2, kl: float = 0.0,
        ckpt: bool = False, prompt_tokens: int = 64, dtype: str = "bfloat16") -> dict[str, Any]:
    return {"name": name, "shape": shape, "lora": lora, "mb": mb, "group": group, "pps": pps, "tokens": tokens,
            "gc": gc, "precision": precision, "lr": lr, "steps": steps, "kl": kl, "ckpt": ckpt,
            "prompt_tokens": prompt_tokens, "dtype": dtype}


GRIDS: dict[str, list[dict[str, Any]]] = {
    # issue 18: lr 1e-6, full fine-tune, default (mixed) vs pure bf16; checkpoints after every step
    "precision": [
        cfg("prec-0.5b-mixed-lr1e-6", "0.5b", lr=1e-6, steps=3, ckpt=True, gc=True),
        cfg("prec-0.5b-pure-lr1e-6", "0.5b", lr=1e-6, steps=3, ckpt=True, gc=True, precision="pure"),
    ],
    "memory-a": [
        cfg("0.5b-full-gc-mb8-t256", "0.5b"),
        cfg("0.5b-full-nogc-mb8-t256", "0.5b", gc=False),
        cfg("0.5b-pure-nogc-mb8-t256", "0.5b", gc=False, precision="pure"),
        cfg("0.5b-full-nogc-mb4-t768", "0.5b", gc=False, mb=4, group=4, tokens=768),
        cfg("0.5b-full-gc-mb8-t256-kl", "0.5b", kl=0.04),
        cfg("1.5b-full-gc-mb4-t512", "1.5b", mb=4, tokens=512),
    ],
    "memory-b": [
        cfg("1.5b-lora16-gc-mb8-t256", "1.5b", lora=16),
        cfg("7b-lora8-gc-mb2-t512", "7b", lora=8, mb=2, group=2, pps=2, tokens=512),
        cfg("7b-lora8-nogc-mb2-t512", "7b", lora=8, mb=2, group=2, pps=2, tokens=512, gc=False),
        cfg("3b-full-gc-mb4-t512", "3b", mb=4, tokens=512),
        cfg("1.5b-full-nogc-mb4-t512", "1.5b", mb=4, tokens=512, gc=False),
        cfg("1.5b-pure-gc-mb16-t256", "1.5b", mb=16, group=16, pps=1, precision="pure"),
        cfg("3b-pure-nogc-mb8-t256", "3b", gc=False, precision="pure"),
        cfg("7b-lora8-gc-mb8-t384", "7b", lora=8, mb=8, group=8, pps=1, tokens=384),
        cfg("1.5b-lora16-nogc-mb16-t512", "1.5b", lora=16, gc=False, mb=16, group=16, pps=1, tokens=512),
    ],
    # run after the constants were fixed (commit 4d2d066): held out
    "memory-c": [
        cfg("1.5b-pure-gc-mb16-t256", "1.5b", mb=16, group=16, pps=1, precision="pure"),
        cfg("1.5b-full-nogc-mb2-t512", "1.5b", mb=2, group=4, pps=1, tokens=512, gc=False),
        cfg("3b-pure-nogc-mb8-t256", "3b", gc=False, precision="pure"),
        cfg("7b-lora8-gc-mb8-t384", "7b", lora=8, mb=8, group=8, pps=1, tokens=384),
        cfg("1.5b-lora16-nogc-mb16-t512", "1.5b", lora=16, gc=False, mb=16, group=16, pps=1, tokens=512),
        cfg("0.5b-full-gc-mb16-t512-kl", "0.5b", mb=16, group=16, pps=1, tokens=512, kl=0.04),
    ],
}
# the learnable task: the quickstart's reward (fraction of 'a') on a small random model, on the GPU, 60 steps
LEARN = [
    {"name": "learn-mixed-lr5e-4", "lr": 5e-4, "precision": "mixed"},
    {"name": "learn-pure-lr5e-4", "lr": 5e-4, "precision": "pure"},
    {"name": "learn-mixed-lr5e-5", "lr": 5e-5, "precision": "mixed"},
    {"name": "learn-pure-lr5e-5", "lr": 5e-5, "precision": "pure"},
]


def make_model(shape: str) -> Path:
    out = WORK / "models" / shape
    if (out / "config.json").is_file():
        return out
    code = f"""
import sys, torch
sys.path.insert(0, {str(ROOT)!r})
from transformers import Qwen2Config, Qwen2ForCausalLM
from rlctl.recipe.models import KNOWN
from rlctl.recipe.tiny_model import byte_tokenizer
a = KNOWN[{SHAPES[shape].lower()!r}]
tok = byte_tokenizer()
c = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                max_position_embeddings=a.max_positions, tie_word_embeddings=a.tie_embeddings,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
torch.manual_seed(0)
with torch.device("cuda"):
    m = Qwen2ForCausalLM(c).to(torch.bfloat16)
m.generation_config.eos_token_id = tok.eos_token_id
m.generation_config.pad_token_id = tok.eos_token_id
m.save_pretrained({str(out)!r})
tok.save_pretrained({str(out)!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    return out


def recipe_text(c: dict[str, Any], model: str, data: Path) -> str:
    lora = f"\n[lora]\nrank = {c['lora']}\nalpha = {2 * c['lora']}\n" if c["lora"] else ""
    ckpt = "every = 1\n" if c["ckpt"] else ""
    extra = "\n[backend.trl.extra]\nsave_only_model = true\n" if c["ckpt"] else ""
    return f"""name = "{c['name']}"
[backend]
name = "trl"
{extra}
[model]
path = "{model}"
dtype = "{c['dtype']}"
precision = "{c['precision']}"
max_model_len = {c['prompt_tokens'] + c['tokens']}
{lora}
[data]
train = "{data}"
input_key = "prompt"
max_prompt_tokens = {c['prompt_tokens']}
[rollout]
group_size = {c['group']}
prompts_per_step = {c['pps']}
max_tokens = {c['tokens']}
[algorithm]
kl_coef = {c['kl']}
[optim]
lr = {c['lr']}
schedule = "constant"
[train]
steps = {c['steps']}
train_batch_size = {c['group'] * c['pps']}
micro_batch_size = {c['mb']}
gradient_checkpointing = {"true" if c['gc'] else "false"}
[resources]
gpus_per_node = 1
gpu = "H100-80GB"
[reward]
function = "{ROOT / 'bench/reward_varied.py'}"
[checkpoint]
dir = "checkpoints"
{ckpt}"""


class NvmlPeak(threading.Thread):
    def __init__(self, every: float = 0.05):
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.every = every
        self.before = self.used()
        self.peak = self.before
        self.stop = threading.Event()

    def used(self) -> float:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.h).used / GiB

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.used())
            time.sleep(self.every)


def launch(recipe: Path, name: str, timeout: float) -> tuple[Path | None, str, float]:
    """rlctl launch (attached); if the CLI itself breaks, rlctl render + the rendered launch.sh. -> run dir."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", "RLCTL_GPU_RECORD_S": "1",
           "RLCTL_MODEL_CACHE": str(WORK / "tiny")}
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "rlctl.cli", "launch", str(recipe), "--name", name, "--force"],
                       cwd=WORK, env=env, capture_output=True, text=True, timeout=timeout)
    runs = sorted((WORK / "runs").glob(f"{name}-*"))
    if runs and (runs[-1] / "stdout.log").exists():
        return runs[-1], f"rlctl launch (exit {p.returncode}): {p.stderr[-300:]}", time.time() - t0
    out = WORK / "rendered" / name
    subprocess.run([sys.executable, "-m", "rlctl.cli", "render", str(recipe), "--out", str(out)], cwd=WORK, env=env,
                   capture_output=True, text=True, timeout=120)
    with (out / "stdout.log").open("w") as log:
        q = subprocess.run(["bash", "launch.sh"], cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT,
                           timeout=timeout)
    return out, f"rlctl render + launch.sh (exit {q.returncode}); launch said: {p.stderr[-600:]}", time.time() - t0


def read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def rewards(run: Path) -> list[float]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []:
        rec = json.loads(line)
        if "reward/mean" in rec:
            out.append(rec["reward/mean"])
    if not out:  # rendered fallback: TRL's printed dicts
        import ast

        for line in (run / "stdout.log").read_text(errors="replace").splitlines():
            if line.startswith("{") and "'reward'" in line:
                with contextlib.suppress(ValueError, SyntaxError, KeyError):
                    out.append(float(ast.literal_eval(line)["reward"]))
    return out


def weight_changes(run: Path, model: Path) -> dict[str, Any]:
    from rlctl.runs.weights import compare

    ckpts = sorted((run / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    out: dict[str, Any] = {"checkpoints": [p.name for p in ckpts]}
    if ckpts:
        out["initial_vs_first"] = compare(model, ckpts[0], sample=0).to_json()
    if len(ckpts) >= 2:
        out["first_vs_last"] = compare(ckpts[0], ckpts[-1], sample=0).to_json()
        out["first_vs_last_sampled"] = compare(ckpts[0], ckpts[-1], sample=64).to_json()
    d = subprocess.run([sys.executable, "-m", "rlctl.cli", "doctor", run.name, "--weights", "--json"], cwd=WORK,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    out["doctor"] = d.stdout[-3000:] or d.stderr[-1000:]
    return out


def run_grid(names: list[str], out: Path, budget_s: float) -> None:
    import torch

    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": "x" * 60}) + "\n" for _ in range(64)))
    results: list[dict[str, Any]] = []
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for mod in ("transformers", "trl", "peft", "accelerate"):
        meta[mod] = __import__(mod).__version__
    start = time.time()
    jobs: list[tuple[str, dict[str, Any]]] = []
    for g in names:
        if g == "learn":
            jobs += [("learn", c) for c in LEARN]
        else:
            jobs += [(g, c) for c in GRIDS[g]]
    skip = set(filter(None, os.environ.get("RLCTL_BENCH_SKIP", "").split(",")))
    for grid, c in jobs:
        if c["name"] in skip:
            continue
        left = budget_s - (time.time() - start)
        if left < 45:
            results.append({"config": c["name"], "skipped": "out of time"})
            continue
        rdir = WORK / "recipes"
        rdir.mkdir(exist_ok=True)
        if grid == "learn":
            model_path = "random:qwen2?hidden=128&layers=2&intermediate=256"
            text = (ROOT / "recipes/quickstart.toml").read_text()
            rp = rdir / f"{c['name']}.toml"
            rp.write_text(text.replace('name = "quickstart"', f'name = "{c["name"]}"')
                          .replace('dtype = "float32"', f'dtype = "bfloat16"\nprecision = "{c["precision"]}"')
                          .replace("lr = 5e-3", f"lr = {c['lr']}").replace("steps = 80", "steps = 60")
                          .replace("gpus_per_node = 0", "gpus_per_node = 1").replace('gpu = "cpu"', 'gpu = "H100"')
                          .replace('hidden=64&layers=2', 'hidden=128&layers=2&intermediate=256')
                          .replace('"quickstart/', f'"{ROOT}/recipes/quickstart/'))
            model = None
        else:
            model = make_model(c["shape"])
            model_path = str(model)
            rp = rdir / f"{c['name']}.toml"
            rp.write_text(recipe_text(c, model_path, data))
        sampler = NvmlPeak()
        sampler.start()
        try:
            run, how, wall = launch(rp, c["name"], timeout=max(left - 15, 30))
        except subprocess.TimeoutExpired:
            run, how, wall = None, "timeout", left
        sampler.stop.set()
        sampler.join()
        row: dict[str, Any] = {"config": c["name"], "grid": grid, "params": c, "model": model_path, "launched": how,
                               "wall_s": round(wall, 1), "nvml_before_gib": sampler.before,
                               "nvml_peak_gib": sampler.peak, "nvml_peak_run_gib": sampler.peak - sampler.before}
        if run is not None:
            row["torch"] = read_json(run / "torch_memory.json")
            row["rlctl_gpu_summary"] = read_json(run / "gpu_memory.json")
            log = (run / "stdout.log").read_text(errors="replace")
            row["oom"] = "CUDA out of memory" in log or "OutOfMemoryError" in log
            row["log_tail"] = log[-1500:] if not row["torch"] else ""
            row["rewards"] = rewards(run)
            if c.get("ckpt") and model is not None:
                row["weights"] = weight_changes(run, model)
            if grid == "learn":
                s = subprocess.run([sys.executable, "-m", "rlctl.cli", "status", run.name], cwd=WORK,
                                   capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
                row["status"] = s.stdout[-2000:]
            if c.get("ckpt"):
                import shutil

                shutil.rmtree(run / "checkpoints", ignore_errors=True)
        results.append(row)
        brief = {k: row.get(k) for k in ("config", "nvml_peak_run_gib", "wall_s", "oom")}
        brief["torch"] = row.get("torch")
        print(json.dumps(brief), flush=True)
        out.write_text(json.dumps({**meta, "results": results}, indent=2))
    out.write_text(json.dumps({**meta, "results": results}, indent=2))


# ---------------------------------------------------------------------------------------------------------------
# report: estimates next to measurements (CPU; no torch)


def recipe_for(row: dict[str, Any]):
    from rlctl.recipe.loader import load

    c = row["params"]
    tmp = Path("/tmp/rlctl-bench-report")
    tmp.mkdir(exist_ok=True)
    (tmp / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    p = tmp / f"{c['name']}.toml"
    p.write_text(recipe_text(c, SHAPES[c["shape"]], tmp / "prompts.jsonl"))
    return load(p).recipe


def report(files: list[Path], held_out: set[str]) -> str:
    from rlctl.estimate.memory import trainer_memory
    from rlctl.recipe.models import KNOWN

    rows = []
    seen: set[str] = set()
    for f in files:
        for row in json.loads(f.read_text())["results"]:
            if row.get("grid") in (None, "learn") or not row.get("torch") or row["config"] in seen:
                continue  # learnable-task runs, runs cut off by the time budget, repeats
            seen.add(row["config"])
            r = recipe_for(row)
            est = trainer_memory(r, KNOWN[SHAPES[row["params"]["shape"]].lower()])
            meas = row["nvml_peak_run_gib"]
            t = row.get("torch") or {}
            rows.append((row["config"], est.total / GiB, meas, t.get("torch_peak_allocated_gib"),
                         t.get("torch_peak_reserved_gib"), est.facts["allocated_peak"] / GiB,
                         "held out" if row["config"] in held_out else "fit", row.get("oom")))
    lines = ["| configuration | plan (GiB) | measured NVML peak (GiB) | plan / measured | torch allocated peak | "
             "torch reserved peak | planned allocated | set |", "|---|---|---|---|---|---|---|---|"]
    for name, est, meas, alloc, res, est_alloc, which, oom in rows:
        a = f"{alloc:.2f}" if alloc is not None else "-"
        rs = f"{res:.2f}" if res is not None else "-"
        lines.append(f"| {name}{' (OOM)' if oom else ''} | {est:.2f} | {meas:.2f} | {est / meas:.2f} | {a} | {rs} | "
                     f"{est_alloc:.2f} | {which} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", action="append", default=[], help="precision, memory-a, memory-b, learn")
    ap.add_argument("--out", type=Path, default=Path("gpu_memory.json"))
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for the whole grid")
    ap.add_argument("--report", type=Path, nargs="*")
    ap.add_argument("--held-out", default="")
    ap.add_argument("--smoke", action="append", default=[], help="a configuration name: rlctl launch --smoke of it")
    a = ap.parse_args()
    if a.smoke:
        WORK.mkdir(parents=True, exist_ok=True)
        data = WORK / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": "x" * 60}) + "\n" for _ in range(64)))
        every = {c["name"]: c for g in GRIDS.values() for c in g}
        for name in a.smoke:
            c = every[name]
            rp = WORK / f"smoke-{name}.toml"
            rp.write_text(recipe_text(c, str(make_model(c["shape"])), data))
            p = subprocess.run([sys.executable, "-m", "rlctl.cli", "launch", str(rp), "--smoke", "--name",
                                f"smoke-{name}", "--force"], cwd=WORK, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"})
            print(f"== rlctl launch --smoke {name}: exit {p.returncode}", flush=True)
            print(p.stderr[-700:] + p.stdout[-300:], flush=True)
        return
    if a.report:
        print(report(a.report, set(filter(None, a.held_out.split(",")))))
        return
    run_grid(a.grid, a.out, a.budget)


if __name__ == "__main__":
    main()
