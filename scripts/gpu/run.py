#!/usr/bin/env python3
"""The GPU carry kit, run side: launch a stack's runs with `rlctl launch`, kill them mid-run, let rlctl restart them,
read what rlctl says about them, sample NVML all along, and write the evidence: docs/gpu/<stack>.json (docs/gpu.md).

    . /tmp/site/trl-vllm/env.sh && python3 run.py trl-vllm --part full --out $OUT      # on the GPU machine
    python3 scripts/gpu/run.py trl-vllm --cpu --out /tmp/evidence                     # the same logic on a CPU

Every figure in the evidence is read here, on the machine that ran: the versions, rlctl's plan (`rlctl preflight
--json`), the raw NVML samples (every GPU, every 50 ms, with the processes on each GPU every second), the verbatim
output of `rlctl status/doctor/ckpt list --json` and `rlctl metrics --csv`, checkpoint bytes on disk and the log's
tail. A run that did not happen writes nothing about itself; a step that failed says how. The evidence accumulates
across calls on the same machine (parts), and each call writes the whole file so far.

Kills: `driver` = SIGKILL of the training driver alone (the backend's main process; Ray actors and vLLM engines left
as a crash leaves them); `all` = SIGKILL of every process of the attempt, rlctl's supervisor included (seed 004's
`pkill -9 python`), then `rlctl resume`. After each, the restart must come from the last complete checkpoint, every
step must be in metrics.jsonl once, and the GPU must be free when the next attempt starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

GiB = 1024**3
KIT = Path(__file__).resolve().parent
STARTED = time.time()


DEADLINE = [float("inf")]  # this call's end (--budget-s): every wait stops there and says so
CURRENT: dict[str, Any] = {}  # the part in progress, written out every 20 s (a call cut short keeps what it saw)


def now() -> float:
    return round(time.time() - STARTED, 3)


def left() -> float:
    return DEADLINE[0] - time.time()


# ---- NVML ------------------------------------------------------------------------------------------------------------
def card() -> str:
    """`resources.gpu` for the card this machine has (the lent machine may be an H100 or an H200: a recipe naming
    another card is planned for that card, seventh sitting); H100-80GB where NVML cannot say (--render-only)."""
    try:
        import pynvml

        from rlctl.estimate.memory import card_name

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        return card_name(name.decode() if isinstance(name, bytes) else str(name),
                         pynvml.nvmlDeviceGetMemoryInfo(h).total / GiB)
    except Exception:
        return "H100-80GB"


class Nvml(threading.Thread):
    """Every GPU's used memory every `every` s, and the compute processes on each GPU every second: raw samples."""

    def __init__(self, every: float = 0.05):
        super().__init__(daemon=True)
        self.every = every
        self.samples: list[list[float]] = []  # [t, used GiB of GPU 0, GPU 1, ...]
        self.procs: list[dict] = []  # {"t", "gpu", "pid", "gib", "cmd"}
        self.cmds: dict[int, str] = {}
        self.stop = threading.Event()
        self.error = None
        self.handles: list[Any] = []
        self.total: list[float] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.total = [pynvml.nvmlDeviceGetMemoryInfo(h).total / GiB for h in self.handles]
            self.names = [str(pynvml.nvmlDeviceGetName(h)) for h in self.handles]
            self.driver = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:  # a CPU machine: no NVML
            self.error = f"{type(e).__name__}: {e}"
            self.nvml = None
            self.names, self.driver = [], None

    def used(self) -> list[float]:
        return [self.nvml.nvmlDeviceGetMemoryInfo(h).used / GiB for h in self.handles] if self.nvml else []

    def processes(self) -> list[dict]:
        out = []
        if not self.nvml:
            return out
        for i, h in enumerate(self.handles):
            with contextlib.suppress(Exception):
                for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid not in self.cmds or len(self.cmds) > 4096:
                        self.cmds[p.pid] = cmdline(p.pid)[:160]
                    out.append({"gpu": i, "pid": p.pid, "gib": round((p.usedGpuMemory or 0) / GiB, 3),
                                "cmd": self.cmds[p.pid]})
        return out

    def run(self) -> None:
        last_procs = 0.0
        while not self.stop.is_set() and self.nvml:
            t = now()
            with contextlib.suppress(Exception):
                self.samples.append([t, *(round(u, 3) for u in self.used())])
            if t - last_procs >= 0.2:
                last_procs = t
                for p in self.processes():
                    self.procs.append({"t": t, **p})
            time.sleep(self.every)

    def window(self, t0: float, t1: float | None = None) -> dict:
        """Peak and first sample per GPU between t0 and t1 (seconds since start)."""
        rows = [s for s in self.samples if s[0] >= t0 and (t1 is None or s[0] <= t1)]
        if not rows:
            return {}
        n = len(rows[0]) - 1
        return {"first_gib": rows[0][1:], "peak_gib": [max(r[i + 1] for r in rows) for i in range(n)],
                "samples": len(rows)}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


# ---- running rlctl ---------------------------------------------------------------------------------------------------
# Every Python process the runs start (the trainer, Ray's actors, vLLM's engine core) loads this sitecustomize
# (PYTHONPATH; Ray's workers inherit the head's environment): once the process has touched CUDA, a daemon thread
# writes torch's own figures (allocated and reserved, now and at their peak) to TORCHMEM/<pid>.json every 0.1 s.
# With NVML's figure per process it splits a process's memory into torch's allocations, the caching allocator's
# slack and what lives outside torch (CUDA context, NCCL): the terms of rlctl's plan. Standard library at import.
TORCHMEM_SITE = r'''
import os, sys, threading, time, json


def _probe():
    out = os.environ.get("RLCTL_TORCHMEM_DIR")
    while "torch" not in sys.modules:
        time.sleep(0.5)
    torch = sys.modules["torch"]
    while not (hasattr(torch, "cuda") and torch.cuda.is_initialized()):
        time.sleep(0.5)
    path = os.path.join(out, f"{os.getpid()}.json")
    try:
        title = open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        title = ""
    while True:
        try:
            dev = torch.cuda.current_device()
            row = {"pid": os.getpid(), "cmd": title, "device": dev, "t": time.time(),
                   "allocated": torch.cuda.memory_allocated(dev), "reserved": torch.cuda.memory_reserved(dev),
                   "max_allocated": torch.cuda.max_memory_allocated(dev),
                   "max_reserved": torch.cuda.max_memory_reserved(dev)}
            try:
                row["cmd_now"] = open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").decode(
                    errors="replace")[:200]
            except OSError:
                pass
            with open(path + ".tmp", "w") as f:
                json.dump(row, f)
            os.replace(path + ".tmp", path)
        except Exception:
            pass
        time.sleep(0.1)


if os.environ.get("RLCTL_TORCHMEM_DIR"):
    threading.Thread(target=_probe, daemon=True, name="rlctl-torchmem").start()

# the sitecustomize this one shadows (the image's own, if any) still runs
_here = os.path.dirname(os.path.abspath(__file__))
for _d in sys.path:
    _f = os.path.join(_d or ".", "sitecustomize.py")
    if os.path.abspath(_d or ".") != _here and os.path.isfile(_f):
        exec(compile(open(_f).read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
'''


def torchmem_env(work: Path, env: dict[str, str]) -> Path:
    """The probe's folder on PYTHONPATH and its output folder in RLCTL_TORCHMEM_DIR; returns the output folder."""
    site = work / "torchmem-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(TORCHMEM_SITE)
    out = work / "torchmem"
    out.mkdir(parents=True, exist_ok=True)
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(site)
    env["RLCTL_TORCHMEM_DIR"] = str(out)
    return out


def torchmem_read(out: Path) -> list[dict]:
    rows = []
    for f in sorted(out.glob("*.json")) if out.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            rows.append(json.loads(f.read_text()))
    return rows


class Ctx:
    def __init__(self, stack: str, work: Path, cpu: bool, log: list[str], render_only: bool = False):
        self.stack, self.work, self.cpu, self.log, self.render_only = stack, work, cpu, log, render_only
        self.env = dict(os.environ)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.torchmem = torchmem_env(work, self.env) if not cpu else None

    def say(self, msg: str) -> None:
        line = f"[{now():7.1f}s] {msg}"
        print(line, flush=True)
        self.log.append(line)

    def rlctl(self, *args: str, timeout: float = 300) -> dict:
        """`rlctl ARGS` from the work directory (README defaults: ./runs); its exit code and output verbatim."""
        t = time.time()
        timeout = min(timeout, max(left(), 20))
        try:
            p = subprocess.run([sys.executable, "-m", "rlctl.cli", *args], cwd=self.work, env=self.env,
                               capture_output=True, text=True, timeout=timeout)
            out = {"argv": ["rlctl", *args], "exit": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-4000:]}
        except subprocess.TimeoutExpired as e:
            out = {"argv": ["rlctl", *args], "exit": None, "timeout_s": timeout,
                   "stdout": (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout,
                   "stderr": ""}
        out["s"] = round(time.time() - t, 2)
        with contextlib.suppress(ValueError, TypeError):
            out["json"] = json.loads(out["stdout"])
        return out


def run_dir(ctx: Ctx, name: str) -> Path | None:
    runs = sorted((ctx.work / "runs").glob(f"{name}-*"))
    return runs[-1] if runs else None


def state(run: Path) -> dict:
    try:
        return json.loads((run / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def metric_steps(run: Path, key: str = "reward/mean") -> list[int]:
    """The step of every record holding `key`, in file order (repeats would show here)."""
    out = []
    with contextlib.suppress(OSError):
        for line in (run / "metrics.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if key in rec and isinstance(rec.get("step"), int):
                    out.append(rec["step"])
    return out


def complete_checkpoints(ctx: Ctx, run: Path) -> list[int]:
    """Steps of the complete checkpoints, as `rlctl ckpt list --json` says."""
    r = ctx.rlctl("ckpt", "list", run.name, "--json", timeout=60)
    rows = (r.get("json") or {}).get("checkpoints") or []
    return sorted(c["step"] for c in rows if c.get("complete") and c.get("step") is not None)


def wait_for(ctx: Ctx, what: str, cond, timeout: float, every: float = 0.2) -> bool:
    t = time.time()
    timeout = min(timeout, max(left(), 0))
    while time.time() - t < timeout:
        if cond():
            return True
        time.sleep(every)
    why = "this call's time (--budget-s) ran out" if left() <= 1 else f"timed out after {timeout:.0f} s"
    ctx.say(f"{why} waiting for {what}")
    return False


class RunOver(Exception):
    """The run ended while a kill point was awaited."""


def attempt_processes(run: Path, with_supervisor: bool) -> list[int]:
    """Every live process of the run's current attempt: its process group (the wrapper, the driver, whatever they
    started there), their descendants wherever they went (Ray workers, vLLM engines started in a new session), and
    with_supervisor the supervisor too. A run of rlctl's Ray executor has no process group of its own: its attempt is
    a job on the head rlctl started for the run, whose process group (`ray start`, the GCS, the raylet, the
    dashboard) holds the job's driver and actors as descendants."""
    import psutil

    st = state(run)
    ref = (st.get("handle") or {}).get("ref") or {}
    pgids = {g for g in (ref.get("pgid") or st.get("pgid"), st.get("ray_head_pid") if st.get("ray_started_head")
                         and not st.get("ray_head_stopped") else None) if g}
    roots: set[int] = set()
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(p.pid) in pgids:
                roots.add(p.pid)
    if with_supervisor and st.get("supervisor_pid"):
        roots.add(int(st["supervisor_pid"]))
    out = set(roots)
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            out.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    out.discard(os.getpid())
    return sorted(out)


def driver_pid(run: Path, marker: str) -> int | None:
    """The backend's main process in the attempt's group: the Python process whose command line holds `marker` (not
    rlctl's wrapper, not the shell a Ray job's entrypoint runs in)."""
    for pid in attempt_processes(run, with_supervisor=False):
        cmd = cmdline(pid)
        exe = Path(cmd.split(" ")[0]).name if cmd else ""
        if marker in cmd and "wrap" not in cmd.split(" -m ")[0] and exe.startswith("python"):
            return pid
    return None


def kill(ctx: Ctx, pids: list[int]) -> list[dict]:
    killed = []
    for pid in pids:
        cmd = cmdline(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append({"pid": pid, "cmd": cmd[:200]})
    ctx.say(f"SIGKILL to {len(killed)} process(es): {[k['pid'] for k in killed]}")
    return killed


def gpu_at(nv: Nvml) -> dict:
    return {"t": now(), "used_gib": [round(u, 3) for u in nv.used()], "processes": nv.processes()}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def log_tail(run: Path, n: int = 120) -> list[str]:
    with contextlib.suppress(OSError):
        return (run / "stdout.log").read_text(errors="replace").splitlines()[-n:]
    return []


# vLLM's own lines about memory and start-up: what the engine says it took, next to NVML and the plan
VLLM_LINES = re.compile(r"(Model loading took|KV cache|Graph capturing|memory profiling|gpu_memory_utilization|"
                        r"Free memory on device|init engine|torch.compile takes|non-torch|weights memory|CUDA graph|"
                        r"sleep mode|woke up|Maximum concurrency|OutOfMemory|out of memory)", re.I)


def vllm_lines(run: Path) -> list[str]:
    out = []
    with contextlib.suppress(OSError):
        for line in (run / "stdout.log").read_text(errors="replace").splitlines():
            if VLLM_LINES.search(line) and len(out) < 200:
                out.append(line[:400])
    return out


def collect(ctx: Ctx, name: str, run: Path, keys: list[str]) -> dict:
    """What rlctl says about a run, verbatim, plus the files' facts."""
    out: dict[str, Any] = {"run_dir": run.name}
    out["status"] = ctx.rlctl("status", run.name, "--json")
    out["doctor"] = ctx.rlctl("doctor", run.name, "--json")
    out["ckpt_list"] = ctx.rlctl("ckpt", "list", run.name, "--json")
    present = set()
    with contextlib.suppress(OSError):
        for line in (run / "metrics.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                present.update(json.loads(line))
    wanted = [k for k in keys if k in present] + sorted(k for k in present if k.startswith("eval/"))
    out["metrics_keys_present"] = sorted(present)
    out["metrics"] = ctx.rlctl("metrics", run.name, "--csv", "--keys", ",".join(wanted or ["reward/mean"]))
    out["state"] = state(run)
    out["gpu_memory_summary"] = _read_json(run / "gpu_memory.json")
    ck = run / "checkpoints"
    out["checkpoint_bytes"] = {p.name: dir_bytes(p) for p in sorted(ck.iterdir()) if p.is_dir()} \
        if ck.is_dir() else {}
    out["log_tail"] = log_tail(run)
    out["vllm_log"] = vllm_lines(run)
    torch_mem = run / "torch_memory.json"
    out["torch_memory"] = _read_json(torch_mem)
    # every CUDA process's own torch figures (the sitecustomize probe), beside NVML's per-process peaks
    out["torch_memory_processes"] = torchmem_read(ctx.torchmem) if ctx.torchmem else []
    evals = run / "evals"
    if evals.is_dir():
        out["evals"] = {p.name: _read_json(p) for p in sorted(evals.glob("*.json"))}
        out["eval_logs"] = {p.name: _why_and_tail(p) for p in sorted(evals.glob("*.log"))}
    return out


WHY = re.compile(r"(Error|error:|memory|Memory|CUDA|Free memory|KV cache|gpu_memory_utilization)")


def _why_and_tail(p: Path) -> dict:
    """A log's lines that say why something failed (errors, memory) and its last 40 lines."""
    lines = p.read_text(errors="replace").splitlines()
    return {"why": [ln[:400] for ln in lines if WHY.search(ln)][-60:], "tail": lines[-40:]}


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def steps_once(run: Path, total: int) -> dict:
    seen = metric_steps(run)
    counts = {s: seen.count(s) for s in sorted(set(seen))}
    return {"expected": list(range(1, total + 1)), "seen": counts,
            "each_once": sorted(seen) == list(range(1, total + 1))}


# ---- recipes ---------------------------------------------------------------------------------------------------------
def write_data(work: Path) -> dict[str, Path]:
    """Prompts with labels (the quickstart's task: the fraction of 'a'), the reward, an eval set."""
    words = ["a", "sing", "sky", "tell", "of", "the", "cats", "sea", "bread", "say", "rain", "map"]
    rows = []
    for i in range(256):
        w = [words[(i * 7 + j * 3) % len(words)] for j in range(1 + i % 4)]
        rows.append({"prompt": " ".join(w) + ":", "label": "a"})
    (work / "data").mkdir(parents=True, exist_ok=True)
    train = work / "data" / "prompts.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    probe = work / "data" / "probe.jsonl"
    probe.write_text("".join(json.dumps(r) + "\n" for r in rows[:16]))
    reward = work / "data" / "reward.py"
    reward.write_text(
        '"""The fraction of \'a\' characters in each completion (the quickstart\'s reward)."""\n\n\n'
        "def reward_func(completions, **kwargs):\n"
        "    out = []\n"
        "    for c in completions:\n"
        "        text = c if isinstance(c, str) else ''.join(m.get('content', '') for m in c)\n"
        "        out.append(text.count('a') / len(text) if text else 0.0)\n"
        "    return out\n")
    return {"train": train, "probe": probe, "reward": reward}


# verl (and OpenRLHF with --apply_chat_template) put the prompts through the tokenizer's chat template: the plain text
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


MODEL_CODE = """
import torch
from transformers import {arch}Config, {arch}ForCausalLM
from rlctl.recipe.models import KNOWN
from rlctl.recipe.tiny_model import byte_tokenizer
a = KNOWN[{shape!r}]
tok = byte_tokenizer()
c = {arch}Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                max_position_embeddings=a.max_positions, tie_word_embeddings=a.tie_embeddings,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                {extra})
torch.manual_seed(0)
with torch.device("cuda"):
    m = {arch}ForCausalLM(c).to(torch.bfloat16)
m.generation_config.eos_token_id = tok.eos_token_id
m.generation_config.pad_token_id = tok.eos_token_id
tok.chat_template = {chat!r}
m.save_pretrained({out!r})
tok.save_pretrained({out!r})
"""


# the architecture of the kit's model per stack: Qwen2 (the shape's own), except prime-rl's, whose trainer runs
# FlashAttention-4 (the only one in reach for v0.8.0: stacks.toml) in its own model classes only, which Qwen2 lacks
# (model.impl = custom: Llama, Qwen3, ...): a Qwen3 model of the same size (head_dim = hidden / heads, no qkv bias)
ARCH = {"prime-rl": ("Qwen3", "head_dim=a.hidden // a.heads, attention_bias=False")}


def make_model(ctx: Ctx, shape: str) -> tuple[str, dict]:
    """A randomly initialised model of a public shape (rlctl.recipe.models.KNOWN) with rlctl's byte-level tokenizer,
    bf16 on disk like the real one (in the stack's ARCH); on a CPU rlctl's own tiny model (`rlctl model tiny`)."""
    arch, extra = ARCH.get(ctx.stack, ("Qwen2", ""))
    name = shape.replace("/", "_") + ("" if arch == "Qwen2" else f"-{arch.lower()}")
    out = ctx.work / "models" / (name if not ctx.cpu else "tiny")
    if (out / "config.json").is_file():
        return str(out), _read_json(out / "config.json") or {}
    if ctx.render_only:  # the shape alone (config + tokenizer): what render and preflight read
        code = MODEL_CODE.replace('with torch.device("cuda"):\n    m = {arch}ForCausalLM(c).to(torch.bfloat16)\n', "")
        code = code.replace("m.generation_config.eos_token_id = tok.eos_token_id\n", "")
        code = code.replace("m.generation_config.pad_token_id = tok.eos_token_id\n", "")
        code = code.replace("m.save_pretrained(", "c.save_pretrained(")
        subprocess.run([sys.executable, "-c", code.format(shape=shape.lower(), out=str(out), chat=CHAT_TEMPLATE,
                                                          arch=arch, extra=extra)],
                       check=True, cwd=ctx.work, env=ctx.env, timeout=300)
        return str(out), _read_json(out / "config.json") or {}
    if ctx.cpu:
        r = ctx.rlctl("model", "tiny", str(out))
        if r["exit"] != 0:
            raise RuntimeError(f"rlctl model tiny failed: {r['stderr']}")
        return str(out), _read_json(out / "config.json") or {}
    code = MODEL_CODE.format(shape=shape.lower(), out=str(out), chat=CHAT_TEMPLATE, arch=arch, extra=extra)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ctx.work, env=ctx.env, timeout=300)
    return str(out), _read_json(out / "config.json") or {}


def trl_recipe(ctx: Ctx, name: str, model: str, data: dict[str, Path], *, steps: int, every: int, lora: int = 0,
               vllm: bool = True, evals: bool = True, keep_last: int = 2) -> str:
    gpu = not ctx.cpu
    lines = [f'name = "{name}"', "[backend]", 'name = "trl"']
    if vllm and gpu:
        lines += ["[backend.trl.extra]", "use_vllm = true", 'vllm_mode = "colocate"']
    lines += ["[model]", f'path = "{model}"', f'dtype = "{"bfloat16" if gpu else "float32"}"',
              f"max_model_len = {256 if gpu else 128}"]
    if lora:
        lines += ["[lora]", f"rank = {lora}", f"alpha = {2 * lora}", 'target_modules = "all-linear"']
    lines += ["[data]", f'train = "{data["train"]}"', f'eval = "{data["probe"]}"', 'input_key = "prompt"',
              'label_key = "label"', "max_prompt_tokens = 32",
              "[rollout]", "group_size = 8", "prompts_per_step = 4", f"max_tokens = {96 if gpu else 16}",
              "temperature = 1.0"]
    if vllm and gpu:
        lines += ["gpu_memory_utilization = 0.3"]
    lines += ["[algorithm]", 'name = "grpo"', "kl_coef = 0.04",
              "[optim]", f"lr = {1e-5 if gpu else 5e-3}", 'schedule = "constant"', "warmup_steps = 0",
              "max_grad_norm = 1.0",
              "[train]", f"steps = {steps}", "train_batch_size = 32", "micro_batch_size = 8",
              "gradient_checkpointing = false",
              "[resources]", "nodes = 1", f"gpus_per_node = {1 if gpu else 0}",
              f'gpu = "{card() if gpu else "cpu"}"']
    if vllm and gpu:
        lines += ["colocate = true"]
    lines += ["[reward]", f'function = "{data["reward"]}"',
              "[checkpoint]", 'dir = "checkpoints"', f"every = {every}", f"keep_last = {keep_last}",
              "[run]", 'restart = "on-failure"', "max_restarts = 3"]
    if evals:
        lines += ["[eval]", f"every = {every}", "baseline = true", 'primary = "probe"',
                  "[eval.sets.probe]", f'data = "{data["probe"]}"', "temperature = 0.0", "n = 1",
                  'grader = "reward"', "threshold = 0.2", f"max_tokens = {32 if gpu else 8}"]
    path = ctx.work / "recipes" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_parquet(work: Path, data: dict[str, Path]) -> dict[str, Path]:
    """verl's data format (a chat prompt, data_source, reward_model.ground_truth) and a reward in its signature."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {}
    for key in ("train", "probe"):
        rows = [json.loads(line) for line in data[key].read_text().splitlines()]
        table = [{"data_source": "a_fraction", "prompt": [{"role": "user", "content": r["prompt"]}],
                  "ability": "toy", "reward_model": {"style": "rule", "ground_truth": r["label"]},
                  "extra_info": {"index": i}} for i, r in enumerate(rows)]
        out[key] = work / "data" / f"{key}.parquet"
        pq.write_table(pa.Table.from_pylist(table), out[key])
    out["reward"] = work / "data" / "verl_reward.py"
    out["reward"].write_text(
        '"""The fraction of \'a\' characters (the quickstart\'s reward) in verl\'s compute_score signature."""\n\n\n'
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    return solution_str.count('a') / len(solution_str) if solution_str else 0.0\n")
    return out


def verl_recipe(ctx: Ctx, name: str, model: str, pq_data: dict[str, Path], *, steps: int, every: int, gpus: int = 1,
                lora: int = 0) -> str:
    # verl's FSDP engine asks transformers for FlashAttention-2 unless override_config says otherwise
    # (workers/config/model.py); flash-attn is source-only and not carried: "FlashAttention2 has been toggled on,
    # but ... doesn't seem to be installed" on the H100 (docs/gpu/verl-2.json)
    lines = [f'name = "{name}"', "[backend]", 'name = "verl"', 'version = "0.9.1"', "[backend.verl.extra]",
             '"+actor_rollout_ref.model.override_config.attn_implementation" = "sdpa"',
             "[model]", f'path = "{model}"', 'dtype = "bfloat16"', "max_model_len = 256"]
    if lora:
        lines += ["[lora]", f"rank = {lora}", f"alpha = {2 * lora}", 'target_modules = "all-linear"']
    lines += ["[data]", f'train = "{pq_data["train"]}"', f'eval = "{pq_data["probe"]}"', 'input_key = "prompt"',
              'label_key = "ground_truth"', "max_prompt_tokens = 32",
              "[rollout]", "group_size = 8", "prompts_per_step = 4", "max_tokens = 96", "temperature = 1.0",
              "gpu_memory_utilization = 0.3",
              "[algorithm]", 'name = "grpo"', "kl_coef = 0.04", "use_kl_loss = true",
              "[optim]", "lr = 1e-5", 'schedule = "constant"',
              "[train]", f"steps = {steps}", "train_batch_size = 32", "micro_batch_size = 8",
              "gradient_checkpointing = false",
              "[resources]", "nodes = 1", f"gpus_per_node = {gpus}", f'gpu = "{card()}"', "colocate = true",
              "[reward]", f'function = "{pq_data["reward"]}"', 'function_name = "compute_score"',
              "[checkpoint]", 'dir = "checkpoints"', f"every = {every}", "keep_last = 2",
              "[run]", 'restart = "on-failure"', "max_restarts = 3",
              "[eval]", f"every = {every}", "temperature = 0.0"]
    path = ctx.work / "recipes" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def openrlhf_data(work: Path, data: dict[str, Path]) -> dict[str, Path]:
    """OpenRLHF's reward file: `reward_func(queries, prompts, labels)` (utils/agent.py loads it from a
    --reward.remote_url ending in .py) returning rewards/scores tensors, the quickstart's fraction of 'a' in the
    response (a query is prompt + response)."""
    reward = work / "data" / "openrlhf_reward.py"
    reward.write_text(
        '"""The fraction of \'a\' in each response (the quickstart\'s reward) in OpenRLHF\'s reward_func."""\n\n'
        "import torch\n\n\n"
        "def reward_func(queries, prompts, labels):\n"
        "    out = []\n"
        "    for q, p in zip(queries, prompts):\n"
        "        text = q[len(p):] if q.startswith(p) else q\n"
        "        out.append(text.count('a') / len(text) if text else 0.0)\n"
        "    r = torch.tensor(out, dtype=torch.float32)\n"
        "    return {'rewards': r, 'scores': r, 'extra_logs': {}}\n")
    return {**data, "reward": reward}


def openrlhf_recipe(ctx: Ctx, name: str, model: str, data: dict[str, Path], *, steps: int, every: int,
                    colocated: bool = False, lora: int = 0) -> str:
    """OpenRLHF 0.10.4 launched by rlctl's Ray executor (a head on loopback for the run, the job submitted through its
    job API): 2 GPUs, one vLLM engine and one actor (+ its reference model), or all on one GPU with the sleep
    flags. sdpa: flash-attn is not carried (its stand-in has no kernels); OpenRLHF's default is flash_attention_2.
    With LoRA the recipe names the bundled patch set openrlhf/0.10.4, which `rlctl launch` applies: unpatched, every
    attempt died at the first weight sync (vLLM: no parameter named 'base_model')."""
    gpu = not ctx.cpu
    lines = [f'name = "{name}"', "[backend]", 'name = "openrlhf"', 'version = "0.10.4"', "[backend.openrlhf.extra]",
             '"ds.attn_implementation" = "sdpa"']
    if colocated:
        lines += ['"vllm.enable_sleep" = true', '"ds.enable_sleep" = true']
    # OpenRLHF sizes vLLM's context to prompt + response tokens (--data.max_len), whatever max_model_len says
    lines += ["[model]", f'path = "{model}"', 'dtype = "bfloat16"', "max_model_len = 128"]
    if lora:
        lines += ["[lora]", f"rank = {lora}", f"alpha = {2 * lora}", 'target_modules = "all-linear"']
    lines += ["[data]", f'train = "{data["train"]}"', f'eval = "{data["probe"]}"', 'input_key = "prompt"',
              'label_key = "label"', "max_prompt_tokens = 32",
              "[rollout]", "group_size = 8", "prompts_per_step = 4", "max_tokens = 96", "temperature = 1.0",
              "engines = 1", "gpu_memory_utilization = 0.3",
              "[algorithm]", 'name = "grpo"', "kl_coef = 0.04", "use_kl_loss = true",
              "[optim]", "lr = 1e-5", 'schedule = "constant"', "warmup_steps = 0", "max_grad_norm = 1.0",
              "[train]", f"steps = {steps}", "train_batch_size = 32", "micro_batch_size = 8",
              "gradient_checkpointing = false", "zero_stage = 2",
              "[resources]", "nodes = 1", f"gpus_per_node = {1 if colocated else 2}",
              f'gpu = "{card() if gpu else "cpu"}"', f"colocate = {'true' if colocated else 'false'}",
              'executor = "ray"',
              "[reward]", f'function = "{data["reward"]}"',
              "[checkpoint]", 'dir = "checkpoints"', f"every = {every}", "keep_last = 2",
              "[run]", 'restart = "on-failure"', "max_restarts = 3",
              "[eval]", f"every = {every}", "temperature = 0.0"]
    if lora:  # no release syncs a LoRA actor to vLLM (preflight lora.vllm_sync): the bundled set's fix does
        lines += ["[patches]", 'set = "openrlhf/0.10.4"']
    path = ctx.work / "recipes" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# ---- one run, launched, killed, resumed ------------------------------------------------------------------------------
TRL_KEYS = ["reward/mean", "reward/std", "kl", "lr", "entropy", "grad_norm", "policy_loss", "clip_ratio",
            "response_length/mean", "time/step", "throughput/tokens_per_s"]


def launched_run(ctx: Ctx, nv: Nvml, name: str, recipe: str, *, total: int, kills: list[tuple[str, int]],
                 marker: str, keys: list[str], step_timeout: float) -> dict:
    """Launch detached; at each kill point (kind, checkpoint step) kill; let rlctl restart; wait for the end."""
    res: dict[str, Any] = {"recipe": Path(recipe).read_text(), "events": [], "call_started": STARTED}
    CURRENT["res"] = res
    ev = res["events"]
    res["preflight"] = ctx.rlctl("preflight", recipe, "--json")
    if ctx.render_only:  # the GPU recipe as rlctl renders it, on any machine: nothing launched, nothing measured
        res["render"] = ctx.rlctl("render", recipe)
        return res
    t0 = now()
    ev.append({"t": t0, "what": "before launch", **gpu_at(nv)})
    launch = ctx.rlctl("launch", recipe, "--detach", "--name", name, timeout=600)
    res["launch"] = launch
    run = run_dir(ctx, name)
    if run is None:
        ctx.say(f"{name}: launch made no run directory (exit {launch['exit']}): {launch['stderr'][-800:]}")
        return res
    ctx.say(f"{name}: launched {run.name}")
    seen: list[int] = []  # the complete checkpoints the last wait saw
    for i, (kind, ckpt) in enumerate(kills):
        # kill i+1 comes in attempt i+1, once checkpoint `ckpt` is complete and a step past it has been logged
        def ready(ckpt=ckpt, attempt=i + 1) -> bool:
            st = state(run)
            if st.get("status") in ("finished", "failed", "stopped"):
                raise RunOver(st.get("status"))
            if (st.get("attempt") or 0) < attempt or st.get("status") != "running":
                return False
            steps = metric_steps(run)
            if not steps or max(steps) < ckpt + 1:
                return False
            done = complete_checkpoints(ctx, run)
            seen[:] = done
            return bool(done) and done[-1] >= ckpt
        try:
            got_there = wait_for(ctx, f"{name}: checkpoint {ckpt} and one more step before kill {i + 1}", ready,
                                 step_timeout, every=0.3)
        except RunOver as over:
            got_there = False
            ctx.say(f"{name}: the run ended ({over}) before kill {i + 1}")
        if not got_there:
            res["kill_error"] = f"kill {i + 1} ({kind}): the run did not get there"
            break
        again = ctx.rlctl("ckpt", "list", run.name, "--json", timeout=60)
        rows = (again.get("json") or {}).get("checkpoints") or []
        done = sorted(c["step"] for c in rows if c.get("complete") and c.get("step") is not None)
        if not done:  # the list the wait saw had them: keep what `ckpt list` said now (seen once on OpenRLHF)
            ev.append({"t": now(), "what": "ckpt list at kill time lists no complete checkpoint", "result": again})
            done = list(seen)
        steps = metric_steps(run)
        attempt = state(run).get("attempt")
        if kind == "driver":
            pid = driver_pid(run, marker)
            pids = [pid] if pid else []
        else:
            pids = attempt_processes(run, with_supervisor=True)
        ctx.say(f"{name}: kill {i + 1} ({kind}) at step {max(steps)}, last complete checkpoint {done[-1]}, "
                f"attempt {attempt}")
        killed = kill(ctx, pids)
        ev.append({"t": now(), "what": f"kill {kind}", "at_step": max(steps), "last_complete_checkpoint": done[-1],
                   "attempt": attempt, "killed": killed, **gpu_at(nv)})
        if kind == "all":
            wait_for(ctx, "the killed processes to be gone", lambda pids=pids: not any(_alive(p) for p in pids), 30)
            ev.append({"t": now(), "what": "after kill all, before resume", **gpu_at(nv),
                       "left_alive": [p for p in pids if _alive(p)],
                       "status": ctx.rlctl("status", run.name, "--json")})
            ev.append({"t": now(), "what": "resume", "result": ctx.rlctl("resume", run.name, timeout=120)})

        def restarted(attempt=attempt) -> bool:
            return (state(run).get("attempt") or 0) > (attempt or 0)
        if wait_for(ctx, f"{name}: the next attempt", restarted, 120, every=0.05):
            st = state(run)
            ev.append({"t": now(), "what": f"attempt {st.get('attempt')} started", "attempt_record":
                       (st.get("attempts") or [{}])[-1], **gpu_at(nv)})

    def ended() -> bool:
        return state(run).get("status") in ("finished", "failed", "stopped", "lost")
    wait_for(ctx, f"{name}: the end of the run", ended, step_timeout * 2 + 120, every=0.5)
    st = state(run)
    ctx.say(f"{name}: {st.get('status')} (exit {st.get('exit_code')}), attempts {st.get('attempt')}")
    # the supervisor's last checkpoint evals run after the trainer ends: give them their time
    wait_for(ctx, f"{name}: the supervisor to exit", lambda: not _alive(state(run).get("supervisor_pid") or 0), 300,
             every=0.5)
    ev.append({"t": now(), "what": "ended", **gpu_at(nv)})
    res["nvml_window"] = nv.window(t0)
    res["process_peaks"] = process_peaks(nv, t0)
    res["collected"] = collect(ctx, name, run, keys)
    res["steps"] = steps_once(run, total)
    res["t"] = [t0, now()]
    return res


def process_peaks(nv: Nvml, t0: float) -> list[dict]:
    """NVML's peak per GPU process since t0 (sampled every 0.2 s), with the process's last command line (Ray's
    actors name themselves there: `ray::PolicyModelActor`)."""
    peaks: dict[tuple[int, int], dict] = {}
    for p in nv.procs:
        if p["t"] < t0:
            continue
        k = (p["gpu"], p["pid"])
        cur = peaks.setdefault(k, {"gpu": p["gpu"], "pid": p["pid"], "peak_gib": 0.0, "first_t": p["t"]})
        cur["peak_gib"] = max(cur["peak_gib"], p["gib"])
        cur["cmd"] = p["cmd"]
    return sorted(peaks.values(), key=lambda r: (r["gpu"], r["first_t"]))


def _alive(pid: int) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    return True


# ---- the parts of each stack -----------------------------------------------------------------------------------------
def part_trl_full(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """Full fine-tune, vLLM colocated: two kills (the driver alone, then every process of the attempt), TRL's own
    in-loop eval; rlctl's evaluator on vLLM for the last checkpoint once the run is over (the GPU is free then)."""
    steps, every = (12, 2) if not ctx.cpu else (6, 2)
    kills = [("driver", 2 * every), ("all", 4 * every)] if not ctx.cpu else [("driver", every), ("all", 2 * every)]
    recipe = trl_recipe(ctx, "trl-full", model, data, steps=steps, every=every, evals=False)
    return run_then_eval(ctx, nv, "trl-full", recipe, total=steps, kills=kills, marker="rlctl.backends.trl.runner",
                       keys=TRL_KEYS, step_timeout=300)


def part_trl_lora(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """LoRA, vLLM colocated, with an eval set: rlctl's checkpoint evaluator runs beside the training (the step-0
    baseline first), then the LoRA checkpoint is evaluated by hand on vLLM."""
    steps, every = (8, 4) if not ctx.cpu else (4, 2)
    recipe = trl_recipe(ctx, "trl-lora", model, data, steps=steps, every=every, lora=16, evals=True)
    return run_then_eval(ctx, nv, "trl-lora", recipe, total=steps, kills=[], marker="rlctl.backends.trl.runner",
                       keys=TRL_KEYS, step_timeout=300)


def run_then_eval(ctx: Ctx, nv: Nvml, name: str, recipe: str, *, total: int, **kw: Any) -> dict:
    """launched_run, then rlctl's evaluator on vLLM for the run's last checkpoint (eval_after)."""
    res = launched_run(ctx, nv, name, recipe, total=total, **kw)
    run = run_dir(ctx, name)
    if run is not None and state(run).get("status") != "finished":
        res["eval_after"] = {"skipped": f"the run is {state(run).get('status')}: no checkpoint at step {total}"}
    elif run is not None:
        res["eval_after"] = eval_after(ctx, nv, run, total)
    return res


def two_kills(every: int) -> list[tuple[str, int]]:
    """The driver alone after checkpoint `every`, then every process of the attempt after 2 x every;
    RLCTL_GPU_KILLS=1: the driver kill only."""
    return [("driver", every), ("all", 2 * every)] if os.environ.get("RLCTL_GPU_KILLS", "2") == "2" else \
        [("driver", every)]


def eval_after(ctx: Ctx, nv: Nvml, run: Path, step: int) -> dict:
    """`rlctl eval RUN --step N --json` on a finished run, with the GPU's memory in its window."""
    if left() < 120:
        return {"skipped": "less than two minutes of this call's time left"}
    t0 = now()
    r = ctx.rlctl("eval", run.name, "--step", str(step), "--json", timeout=600)
    r["nvml_window"] = nv.window(t0)
    log = run / "evals" / f"step-{step}.log"
    r["job_log_tail"] = log.read_text(errors="replace").splitlines()[-60:] if log.is_file() else []
    return r


def part_trl_trainer_only(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """The trainer alone (TRL generating with its own model): the trainer term of the colocated plan, measured."""
    steps = 3 if not ctx.cpu else 2
    recipe = trl_recipe(ctx, "trl-trainer-only", model, data, steps=steps, every=steps, vllm=False, evals=False)
    return launched_run(ctx, nv, "trl-trainer-only", recipe, total=steps, kills=[],
                        marker="rlctl.backends.trl.runner", keys=TRL_KEYS, step_timeout=300)


VERL_KEYS = ["reward/mean", "reward/std", "kl", "lr", "entropy", "grad_norm", "policy_loss", "clip_ratio",
             "response_length/mean", "time/step", "throughput/tokens_per_s", "eval/default/greedy_pass@1"]


def part_verl_1gpu(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """verl's hybrid engine on one GPU (FSDP actor + vLLM asleep while it trains): two kills; its in-loop eval
    (val before train and every `every`); rlctl's evaluator on vLLM for the last checkpoint afterwards."""
    pq_data = write_parquet(ctx.work, data)
    steps, every = 6, 2
    recipe = verl_recipe(ctx, "verl-1gpu", model, pq_data, steps=steps, every=every)
    kills = two_kills(every)
    return run_then_eval(ctx, nv, "verl-1gpu", recipe, total=steps, kills=kills,
                       marker="verl.trainer.main_ppo", keys=VERL_KEYS, step_timeout=420)


def part_verl_lora(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """verl on one GPU with a LoRA adapter: every process of the attempt SIGKILLed (seed 004's `pkill -9 python`)
    after checkpoint 2, `rlctl resume`; rlctl's evaluator on vLLM for the last (LoRA) checkpoint afterwards."""
    pq_data = write_parquet(ctx.work, data)
    steps, every = 4, 2
    recipe = verl_recipe(ctx, "verl-lora", model, pq_data, steps=steps, every=every, lora=16)
    return run_then_eval(ctx, nv, "verl-lora", recipe, total=steps, kills=[("all", every)],
                       marker="verl.trainer.main_ppo", keys=VERL_KEYS, step_timeout=420)


def part_verl_2gpu(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    pq_data = write_parquet(ctx.work, data)
    steps, every = 6, 3
    recipe = verl_recipe(ctx, "verl-2gpu", model, pq_data, steps=steps, every=every, gpus=2)
    return launched_run(ctx, nv, "verl-2gpu", recipe, total=steps, kills=[("driver", every)],
                        marker="verl.trainer.main_ppo", keys=VERL_KEYS, step_timeout=420)


OPENRLHF_KEYS = ["reward/mean", "kl", "lr", "policy_loss", "response_length/mean", "time/step",
                 "eval/default/greedy_pass@1"]


def part_openrlhf_2gpu(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """OpenRLHF on 2 GPUs (one vLLM engine, one actor + reference), launched through rlctl's Ray executor: two kills
    (the job's driver alone, then every process of the attempt with the Ray head), its in-loop eval; rlctl's
    evaluator on vLLM for the last checkpoint afterwards."""
    steps, every = 6, 2
    recipe = openrlhf_recipe(ctx, "openrlhf-2gpu", model, openrlhf_data(ctx.work, data), steps=steps, every=every)
    kills = two_kills(every)
    return run_then_eval(ctx, nv, "openrlhf-2gpu", recipe, total=steps, kills=kills,
                       marker="openrlhf.cli.train_ppo_ray", keys=OPENRLHF_KEYS, step_timeout=420)


def part_openrlhf_lora(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """OpenRLHF on 2 GPUs with a LoRA adapter: every process of the attempt (the Ray head included) SIGKILLed after
    checkpoint 2, `rlctl resume`; rlctl's evaluator on vLLM for the last (LoRA) checkpoint afterwards."""
    steps, every = 4, 2
    recipe = openrlhf_recipe(ctx, "openrlhf-lora", model, openrlhf_data(ctx.work, data), steps=steps, every=every,
                             lora=16)
    kills = [] if os.environ.get("RLCTL_GPU_KILLS") == "0" else [("all", every)]  # 0: a call too short for a restart
    return run_then_eval(ctx, nv, "openrlhf-lora", recipe, total=steps, kills=kills,
                       marker="openrlhf.cli.train_ppo_ray", keys=OPENRLHF_KEYS, step_timeout=420)


def part_openrlhf_colocated(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """OpenRLHF on one GPU: actor, reference and vLLM colocated, vLLM and DeepSpeed asleep in turn."""
    steps, every = 4, 2
    recipe = openrlhf_recipe(ctx, "openrlhf-colocated", model, openrlhf_data(ctx.work, data), steps=steps,
                             every=every, colocated=True)
    return launched_run(ctx, nv, "openrlhf-colocated", recipe, total=steps, kills=[],
                        marker="openrlhf.cli.train_ppo_ray", keys=OPENRLHF_KEYS, step_timeout=420)


# ---- prime-rl -------------------------------------------------------------------------------------------------------
PRIME_ENV = "a-fraction"
# A classic (v0) verifiers environment with the quickstart's task and reward, as a user packages a reward for prime-rl
# (`reward.environment`): verifiers imports it by its id (`a-fraction` -> module a_fraction, utils/env_utils.py) in
# the env server rl starts; run.py puts its folder on PYTHONPATH, as an installed environment package would be.
PRIME_ENV_CODE = '''"""The quickstart's task as a verifiers environment: prompts of words, the reward the fraction of
'a'
in the completion (rlctl's GPU kit, scripts/gpu/run.py)."""

import json
from pathlib import Path

import verifiers as vf
from datasets import Dataset

PROMPTS = Path(__file__).resolve().parent / "prompts.jsonl"


def a_fraction(completion, **kwargs) -> float:
    if isinstance(completion, str):
        text = completion
    else:
        text = "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    return text.count("a") / len(text) if text else 0.0


def load_environment(**kwargs) -> vf.Environment:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    dataset = Dataset.from_list([{"question": r["prompt"], "answer": r["label"]} for r in rows])
    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[a_fraction], weights=[1.0]), **kwargs)
'''


def prime_env(ctx: Ctx, data: dict[str, Path]) -> Path:
    """The environment's module and its prompts in work/envs, that folder on the runs' PYTHONPATH."""
    folder = ctx.work / "envs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{PRIME_ENV.replace('-', '_')}.py").write_text(PRIME_ENV_CODE)
    shutil.copyfile(data["train"], folder / "prompts.jsonl")
    path = ctx.env.get("PYTHONPATH", "")
    if str(folder) not in path.split(":"):
        ctx.env["PYTHONPATH"] = f"{folder}:{path}" if path else str(folder)
    return folder


def prime_recipe(ctx: Ctx, name: str, model: str, data: dict[str, Path], *, steps: int, every: int) -> str:
    """prime-rl v0.8.0 through `rl`: inference (vLLM) on GPU 0, the trainer on GPU 1 (v0.8.0 cannot share a GPU:
    SingleNodeDeploymentConfig.validate_gpu_count), the env server and the orchestrator beside them. What the
    machine cannot have is said in backend.prime_rl.extra: no vllm-router (the `disagg` extra's GitHub-only wheel:
    the engine serves the orchestrator itself), FlashAttention-4 for the trainer (`auto` is FlashAttention-3 on
    Hopper, whose wheel is on a PyTorch test index; v0.8.0 has no sdpa), the model's own chat template (the byte
    tokenizer is no model the renderers package maps). The eval set is for `rlctl eval` on a checkpoint's HF weights
    (weights/step_N): the probe prompts under rlctl's default input key (data.input_key would say something about
    prime-rl's data, which the environment defines)."""
    prime_env(ctx, data)
    probe = ctx.work / "data" / "probe_input.jsonl"
    rows = [json.loads(line) for line in data["probe"].read_text().splitlines()]
    probe.write_text("".join(json.dumps({"input": r["prompt"], "label": r["label"]}) + "\n" for r in rows))
    lines = [f'name = "{name}"', "[backend]", 'name = "prime_rl"', 'version = "0.8.0"', "[backend.prime_rl.extra]",
             '"inference.router" = "None"', '"trainer.model.attn" = "flash_attention_4"',
             '"orchestrator.renderer.name" = "default"',
             "[model]", f'path = "{model}"', 'dtype = "bfloat16"', "max_model_len = 256",
             "[data]", f'train = "{PRIME_ENV}"', "max_prompt_tokens = 32",
             "[rollout]", "group_size = 8", "max_tokens = 96", "temperature = 1.0", "gpu_memory_utilization = 0.5",
             "[algorithm]", 'name = "grpo"', "kl_coef = 0.0",
             "[optim]", "lr = 1e-5", 'schedule = "constant"', "max_grad_norm = 1.0",
             "[train]", f"steps = {steps}", "train_batch_size = 32", "seq_len = 256",
             "gradient_checkpointing = false",
             "[resources]", "nodes = 1", "gpus_per_node = 2", f'gpu = "{card()}"', "inference_gpus = [0]",
             "trainer_gpus = [1]",
             "[reward.environment]", f'id = "{PRIME_ENV}"',
             "[checkpoint]", 'dir = "checkpoints"', f"every = {every}", "keep_last = 2",
             "[run]", 'restart = "on-failure"', "max_restarts = 3"]
    if not os.environ.get("RLCTL_GPU_NO_EVALS"):  # =1: no eval set, so no step-0 baseline (two minutes of vLLM start)
        lines += ["[eval.sets.probe]", f'data = "{probe}"', 'grader = "exact_match"', "temperature = 0.0", "n = 1",
                  "max_tokens = 32"]
    path = ctx.work / "recipes" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


PRIME_KEYS = ["reward/mean", "policy_loss", "entropy", "grad_norm", "lr", "time/step", "throughput/tokens_per_s",
              "response_length/clip_ratio"]


def part_prime_2gpu(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """prime-rl v0.8.0 on 2 GPUs, launched by rlctl (`uv run --project $PRIME_RL_DIR rl @ rl.toml`): two kills (the
    `rl` launcher alone, its inference server, env server, orchestrator and torchrun trainer left behind; then every
    process of the attempt, rlctl's supervisor included, and `rlctl resume`), each restarted from the last complete
    checkpoint (trainer DCP + orchestrator progress); rlctl's evaluator on vLLM for the last checkpoint's weights."""
    steps, every = 6, 2
    recipe = prime_recipe(ctx, "prime-2gpu", model, data, steps=steps, every=every)
    kills = two_kills(every)
    return run_then_eval(ctx, nv, "prime-2gpu", recipe, total=steps, kills=kills, marker="bin/rl @",
                       keys=PRIME_KEYS, step_timeout=600)


def part_prime_1gpu(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """prime-rl v0.8.0 on one GPU: what rlctl says about it. v0.8.0 places inference and the trainer on GPUs of their
    own (SingleNodeDeploymentConfig.validate_gpu_count: num_train_gpus + num_infer_gpus <= gpus_per_node), so a
    one-GPU recipe (colocated) is refused by rlctl's validator before anything starts; the seeds' one-GPU layout is
    v0.3.0's. Kept as a part so the evidence holds rlctl's own words on the GPU machine; nothing is launched."""
    prime_env(ctx, data)
    path = Path(prime_recipe(ctx, "prime-1gpu", model, data, steps=4, every=2))
    text = path.read_text().replace("gpus_per_node = 2", "gpus_per_node = 1")
    text = text.replace("inference_gpus = [0]\ntrainer_gpus = [1]", "colocate = true")
    path.write_text(text)
    return {"recipe": text, "preflight": ctx.rlctl("preflight", str(path), "--json"),
            "render": ctx.rlctl("render", str(path)), "launched": False}


def part_collect(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """The runs an earlier call launched and left going when its time ran out (a detached run goes on on the machine
    between calls): each waited for to its end within this call's time, then read back as a part reads its run."""
    import tomllib

    keys = {"trl-vllm": TRL_KEYS, "verl": VERL_KEYS, "openrlhf": OPENRLHF_KEYS, "prime-rl": PRIME_KEYS}[ctx.stack]
    out: dict[str, Any] = {}
    for run in sorted(p for p in (ctx.work / "runs").glob("*") if (p / "state.json").is_file()):
        t0 = now()

        def over(run=run) -> bool:
            st = state(run)
            return st.get("status") in ("finished", "failed", "stopped", "lost") and \
                not _alive(st.get("supervisor_pid") or 0)
        wait_for(ctx, f"{run.name}: its end", over, max(left() - 90, 0), every=1.0)
        try:
            total = int(tomllib.loads((run / "recipe.toml").read_text())["train"]["steps"])
        except (OSError, KeyError, ValueError, TypeError):
            total = max(metric_steps(run) or [0])
        out[run.name] = {"status": state(run).get("status"), "nvml_window": nv.window(t0),
                         "collected": collect(ctx, run.name, run, keys), "steps": steps_once(run, total)}
    return out


# ---- seed 004's incident with a real engine (issue 32.3 and 32.5) ----------------------------------------------------
SEED004_RL = '''"""seed 004's layout with a real engine: a vLLM OpenAI server on the inference GPU, the trainer on
the other, each step waiting for its rollouts (it retries for ever: seed 004's trainer waited three hours for a
dead engine)."""
import json, os, socket, subprocess, sys, time, urllib.error, urllib.request
from pathlib import Path

ckdir, steps, model, infer_gpu = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
resume = int(sys.argv[sys.argv.index("--resume") + 1]) if "--resume" in sys.argv else 0
here = Path.cwd()
(here / "logs").mkdir(exist_ok=True)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
engine = subprocess.Popen(
    [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
     "--gpu-memory-utilization", "0.5", "--max-model-len", "256", "--enforce-eager"],
    env={**os.environ, "CUDA_VISIBLE_DEVICES": infer_gpu},
    stdout=open(here / "logs" / "inference.log", "a"), stderr=subprocess.STDOUT)
import torch  # noqa: E402

dev = torch.device("cuda:0")  # the trainer's GPU (the run sees both; the engine was given the other)
weights = torch.randn(4096, 4096, device=dev)
state = torch.empty(int(6 * 2**30), dtype=torch.uint8, device=dev)  # a trainer's resident memory


def rollouts(step):
    body = json.dumps({"model": model, "prompt": "a", "max_tokens": 32, "n": 8}).encode()
    while True:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                out = json.loads(r.read())
            return [c["text"] for c in out["choices"]]
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(1)  # not up yet, or gone: wait, as seed 004's trainer did


for step in range(resume + 1, steps + 1):
    texts = rollouts(step)
    for _ in range(50):
        weights = torch.tanh(weights @ weights) * 0.5  # the training step
    torch.cuda.synchronize()
    reward = sum(t.count("a") / max(len(t), 1) for t in texts) / len(texts)
    print(f"step {step} reward {reward:.4f}", flush=True)
    if step % 2 == 0:
        d = ckdir / f"step_{step}"
        d.mkdir(parents=True, exist_ok=True)
        torch.save({"step": step}, d / "state.pt")
        (d / "done").touch()
engine.terminate()
'''


def seed004_recipe(ctx: Ctx, name: str, model: str, data: dict[str, Path], *, steps: int, idle_s: float) -> str:
    """The command backend with seed 004's layout: GPU 1 inference (vLLM), GPU 0 the trainer; a stall when no step
    comes while the engine is gone (its process, or its GPU's memory) for `idle_s`; restarted on a stall."""
    script = ctx.work / "seed004_rl.py"
    script.write_text(SEED004_RL)
    cmd = [sys.executable, str(script), "{checkpoint_dir}", str(steps), model, "1"]
    lines = [f'name = "{name}"', "[backend]", 'name = "command"', "[backend.command]",
             f"command = {json.dumps(cmd)}", "log_pattern = 'step (?P<step>\\d+) reward (?P<reward>\\S+)'",
             'metrics_map = {reward = "reward/mean"}', 'checkpoint_pattern = "step_{step}"',
             'checkpoint_marker = "done"', 'resume_args = ["--resume", "{step}"]',
             'logs = {inference = "logs/inference.log"}',
             'processes = {inference = "vllm\\\\.entrypoints\\\\.openai\\\\.api_server"}',
             "[model]", f'path = "{model}"', "max_model_len = 256",
             "[data]", f'train = "{data["train"]}"', 'input_key = "prompt"', "max_prompt_tokens = 32",
             "[rollout]", "max_tokens = 32", "[train]", f"steps = {steps}",
             "[resources]", "gpus_per_node = 2", f'gpu = "{card()}"', "inference_gpus = [1]", "trainer_gpus = [0]",
             "[checkpoint]", "every = 2",
             "[run]", 'restart = "on-stall"', "max_restarts = 1",
             "[run.stall]", f"inference_idle_s = {idle_s}"]
    path = ctx.work / "recipes" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def part_engine_dies(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """Seed 004's incident for real, on 2 GPUs: the vLLM engine (GPU 1) is SIGKILLed after step 3 while the trainer
    (GPU 0) waits for rollouts for ever; rlctl must call it a stall after `inference_idle_s`, name the cause from
    what it shows (the engine's process gone or its GPU's memory at ~0, the inference log), restart from checkpoint
    2 and finish with every step once. Needs 2 GPUs."""
    steps, idle_s = 6, 30
    recipe = seed004_recipe(ctx, "seed004-engine", model, data, steps=steps, idle_s=idle_s)
    res: dict[str, Any] = {"recipe": Path(recipe).read_text(), "events": [], "call_started": STARTED}
    CURRENT["res"] = res
    ev = res["events"]
    res["preflight"] = ctx.rlctl("preflight", recipe, "--json")
    if ctx.render_only:
        res["render"] = ctx.rlctl("render", recipe)
        return res
    if len(nv.handles) < 2:
        res["error"] = f"needs 2 GPUs, NVML sees {len(nv.handles)}"
        return res
    t0 = now()
    ev.append({"t": t0, "what": "before launch", **gpu_at(nv)})
    res["launch"] = ctx.rlctl("launch", recipe, "--detach", "--name", "seed004-engine", timeout=300)
    run = run_dir(ctx, "seed004-engine")
    if run is None:
        ctx.say(f"seed004-engine: launch made no run directory: {res['launch']['stderr'][-800:]}")
        return res
    if not wait_for(ctx, "seed004-engine: step 3", lambda: max(metric_steps(run) or [0]) >= 3, 420, every=0.3):
        res["kill_error"] = "the run did not reach step 3"
    else:
        engines = [p for p in nv.procs[-40:] if p.get("gpu") == 1]
        pids = sorted({p["pid"] for p in engines})
        ctx.say(f"seed004-engine: SIGKILL of the engine on GPU 1 at step {max(metric_steps(run))}: {pids}")
        ev.append({"t": now(), "what": "kill engine", "at_step": max(metric_steps(run)), "killed": kill(ctx, pids),
                   **gpu_at(nv)})

        def stalled() -> bool:
            return any(a.get("stall") or a.get("outcome") == "stalled" for a in state(run).get("attempts") or [])
        if wait_for(ctx, "seed004-engine: rlctl to call it a stall", stalled, idle_s + 120, every=0.5):
            ev.append({"t": now(), "what": "stalled", "status": ctx.rlctl("status", run.name, "--json"),
                       "doctor": ctx.rlctl("doctor", run.name, "--json"),
                       "logs_inference": ctx.rlctl("logs", run.name, "--component", "inference", "-n", "20"),
                       **gpu_at(nv)})
            if wait_for(ctx, "seed004-engine: the next attempt", lambda: (state(run).get("attempt") or 0) > 1, 120,
                        every=0.05):
                st = state(run)
                ev.append({"t": now(), "what": f"attempt {st.get('attempt')} started",
                           "attempt_record": (st.get("attempts") or [{}])[-1], **gpu_at(nv)})
    wait_for(ctx, "seed004-engine: the end of the run",
             lambda: state(run).get("status") in ("finished", "failed", "stopped", "lost"), 600, every=0.5)
    ev.append({"t": now(), "what": "ended", **gpu_at(nv)})
    res["nvml_window"] = nv.window(t0)
    res["collected"] = collect(ctx, "seed004-engine", run, ["reward/mean"])
    res["steps"] = steps_once(run, steps)
    res["t"] = [t0, now()]
    return res


PARTS = {
    "trl-vllm": {"full": part_trl_full, "lora": part_trl_lora, "trainer-only": part_trl_trainer_only},
    "verl": {"1gpu": part_verl_1gpu, "2gpu": part_verl_2gpu, "lora": part_verl_lora},
    "openrlhf": {"2gpu": part_openrlhf_2gpu, "colocated": part_openrlhf_colocated, "lora": part_openrlhf_lora},
    "prime-rl": {"2gpu": part_prime_2gpu, "1gpu": part_prime_1gpu},
}
# parts run only when named: `collect` (the runs an earlier call left going), `engine-dies` (2 GPUs)
def part_eval_runs(ctx: Ctx, nv: Nvml, model: str, data: dict[str, Path]) -> dict:
    """`rlctl eval RUN --step N` for every ended run an earlier call left on the machine (N: its newest complete
    checkpoint), as a user evaluates a checkpoint after training: the calls that trained ran out of time first."""
    out: dict[str, Any] = {}
    for run in sorted(p for p in (ctx.work / "runs").glob("*") if (p / "state.json").is_file()):
        if state(run).get("status") not in ("finished", "failed", "stopped", "lost"):
            out[run.name] = {"skipped": f"the run is {state(run).get('status')}"}
            continue
        done = complete_checkpoints(ctx, run)
        if not done:
            out[run.name] = {"skipped": "no complete checkpoint"}
            continue
        out[run.name] = {"step": done[-1], "eval_after": eval_after(ctx, nv, run, done[-1])}
    return out


ONLY_ASKED = {"collect": part_collect, "engine-dies": part_engine_dies, "eval-runs": part_eval_runs}
SHAPE = "Qwen/Qwen2.5-0.5B"


def versions(ctx: Ctx) -> dict:
    code = ("import importlib.metadata as m, json, sys; out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "import torch; out['torch.version.cuda'] = torch.version.cuda; out['python'] = sys.version.split()[0]\n"
            "print(json.dumps(out))")
    names = ["rlctl", "torch", "transformers", "vllm", "trl", "peft", "accelerate", "datasets", "verl", "ray",
             "openrlhf", "deepspeed", "tensordict", "hydra-core", "nvidia-ml-py", "pydantic", "typer", "prime-rl",
             "prime-rl-configs", "verifiers", "renderers", "torchtitan", "torchao", "uv"]
    p = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, cwd=ctx.work, env=ctx.env)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": p.stderr[-1000:]}


def machine(nv: Nvml) -> dict:
    out: dict[str, Any] = {"gpus": nv.names, "gpu_total_gib": [round(t, 3) for t in nv.total], "driver": nv.driver,
                           "nvml_error": nv.error, "cpus": os.cpu_count()}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stack", choices=sorted(PARTS))
    ap.add_argument("--part", action="append",
                    help="which parts (default: all, in order; `collect`: the runs an earlier call left going)")
    ap.add_argument("--out", type=Path, required=True, help="docs/gpu/<stack>.json is written under it")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpurun"))
    ap.add_argument("--assemble-report", type=Path, help="assemble.py's report, kept in the evidence")
    ap.add_argument("--cpu", action="store_true", help="the same logic on a CPU: tiny model, no vLLM, no NVML")
    ap.add_argument("--render-only", action="store_true",
                    help="write each part's GPU recipe and data, `rlctl render` and `rlctl preflight` them; no run")
    ap.add_argument("--budget-s", type=float, help="this call's time: waits end there, the evidence so far is written")
    args = ap.parse_args(argv)
    with contextlib.suppress(ValueError, OSError):  # vLLM wants many open files (preflight env.open_files)
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if args.budget_s:
        DEADLINE[0] = time.time() + args.budget_s
    parts = args.part or list(PARTS[args.stack])
    unknown = [p for p in parts if p.split("#")[0] not in {**PARTS[args.stack], **ONLY_ASKED}]
    if unknown:
        ap.error(f"--part {unknown[0]}: {args.stack} has {', '.join([*PARTS[args.stack], *ONLY_ASKED])}")
    work = args.work / args.stack
    work.mkdir(parents=True, exist_ok=True)
    evidence_path = work / "evidence.json"
    ev = _read_json(evidence_path) or {
        "stack": args.stack, "written_by": "scripts/gpu/run.py", "cpu_dry_run": args.cpu, "parts": {}, "log": []}
    ctx = Ctx(args.stack, work, args.cpu, ev["log"], render_only=args.render_only)
    nv = Nvml()
    nv.start()
    ev["machine"] = machine(nv)
    ev["versions"] = versions(ctx)
    manifest = KIT.parent / args.stack / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        ev["kit"] = {k: m.get(k) for k in ("built", "pieces", "whole", "unpacked_bytes", "slimmed", "wheels", "env")}
    if args.assemble_report and args.assemble_report.is_file():
        ev["assemble"] = _read_json(args.assemble_report)
    out_file = args.out / "docs" / "gpu" / f"{args.stack}.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = write_data(work)
        model, config = make_model(ctx, SHAPE)
        ev["model"] = {"shape": (SHAPE + (f" ({ARCH[args.stack][0]} architecture)" if args.stack in ARCH else ""))
                       if not args.cpu else "rlctl model tiny", "path": model, "config": config}
        stop = threading.Event()

        def keep_writing() -> None:
            while not stop.wait(20):
                with contextlib.suppress(Exception):
                    if CURRENT.get("part") and CURRENT.get("res") is not None:
                        ev["parts"][CURRENT["part"]] = {**CURRENT["res"], "in_progress": True}
                    _write(ev, nv, evidence_path, out_file)
        threading.Thread(target=keep_writing, daemon=True).start()
        for part in parts:
            if left() < 60:
                ctx.say(f"part {part}: not started, less than a minute of this call's time left")
                continue
            ctx.say(f"part {part}")
            name = part.split("#")[0]  # `lora#kill`: the part `lora`, its evidence kept under that label
            done = [k for k in ev["parts"] if k.split("#")[0] == name]
            key = part if not done or "#" in part else f"{part}#{len(done) + 1}"  # a part run again: kept beside
            CURRENT.update(part=key, res=None)
            t = time.time()
            try:
                res = {**PARTS[args.stack], **ONLY_ASKED}[name](ctx, nv, model, data)
            except Exception as e:  # a part that broke says how; the others still run
                import traceback

                res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            res["wall_s"] = round(time.time() - t, 1)
            CURRENT.update(part=None, res=None)
            ev["parts"][key] = res
            _write(ev, nv, evidence_path, out_file)
        stop.set()
    finally:
        nv.stop.set()
        nv.join(timeout=2)
        _write(ev, nv, evidence_path, out_file)
    ctx.say(f"evidence: {out_file}")
    return 0


def _write(ev: dict, nv: Nvml, evidence_path: Path, out_file: Path) -> None:
    """The evidence so far, with every NVML sample taken on this machine (kept across calls in the work dir)."""
    old = ev.get("nvml") or {}
    samples = {"interval_s": nv.every, "started": STARTED, "columns": ["t_s"] + [f"gpu{i}_used_gib" for i in
                                                                               range(len(nv.handles))]}
    calls = list(old.get("calls", []))
    calls = [c for c in calls if c.get("started") != STARTED]
    calls.append({**samples, "samples": nv.samples, "processes": nv.procs})
    ev["nvml"] = {"calls": calls}
    text = json.dumps(ev, indent=None, separators=(",", ":"))
    evidence_path.write_text(text)
    shutil.copyfile(evidence_path, out_file)


if __name__ == "__main__":
    sys.exit(main())
