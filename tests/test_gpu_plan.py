"""What each GPU holds, planned and measured: trainer, rollout vLLM and rlctl's checkpoint evaluator (issue 31.3,
issue 30 2.13).

The H100 figures (issue 31): TRL 1.16 with vLLM 0.26.0 colocated (vllm_mode "colocate", TRL's default) on a
Qwen2.5-0.5B-shaped model, 0.3 of the GPU for vLLM: planned trainer 11.4 + vLLM 23.8 = 35.2 GiB, NVML peak 34.0
GiB above the 0.47 GiB in use before the run (79.6 GiB NVML total) — printed as "plan UNDERestimated by 66%"
(the trainer alone against the colocated peak). The checkpoint evaluator then started a second vLLM on the training
GPU with vLLM's default gpu_memory_utilization and no plan. The samples here are recorded as a run records them
(rlctl.metrics.gpu.GpuSampler through NVML's interface: gpu_memory.json and gpu/<i>/memory_*_gib in
metrics.jsonl); vLLM's start check is vLLM 0.26.0's own code (vllm/v1/worker/utils.py request_memory, from the
released wheel).
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest

from tests.conftest import RECIPES

GiB = 1024**3
NVML_TOTAL = 79.6  # what NVML reports for an H100 80GB HBM3 (torch and vLLM see 79.18)
BEFORE = 0.47  # NVML used before the run: the driver's own reservation on that card

TRL_COLOCATED = """
name = "trl-vllm"
[backend]
name = "trl"
[backend.trl.extra]
use_vllm = true                  # GRPOConfig.vllm_mode defaults to "colocate": vLLM inside the training process
[model]
path = "Qwen/Qwen2.5-0.5B"
dtype = "bfloat16"
max_model_len = 1024
[data]
train = "prompts.jsonl"
input_key = "prompt"
label_key = "label"
max_prompt_tokens = 32
[rollout]
group_size = 8
prompts_per_step = 8
max_tokens = 256
gpu_memory_utilization = 0.3
[train]
steps = 20
train_batch_size = 64
micro_batch_size = 4
gradient_checkpointing = false
[resources]
gpus_per_node = 1
gpu = "H100-80GB"
[checkpoint]
dir = "checkpoints"
every = 4
"""
EVAL_SET = """
[eval.sets.ood]
data = "ood.jsonl"
[run]
stop_when = ["eval_divergence:2"]
"""


def _fake_nvml(monkeypatch, used: dict[int, list[float]]) -> None:
    """NVML's interface over recorded samples: used GiB per GPU index, one value per call."""
    its = {i: iter(v) for i, v in used.items()}
    last = {i: v[-1] for i, v in used.items()}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: len(used),
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=NVML_TOTAL * GiB, free=0,
                                                                used=next(its[h], last[h]) * GiB))
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def _run(tmp_path: Path, monkeypatch, recipe: str, used: dict[int, list[float]], env: dict[str, str] | None = None,
         eval_at: tuple[int, ...] = (), name: str = "trl-vllm") -> Path:
    """A finished run under ./runs as the supervisor leaves it: its recipe, NVML samples (those at `eval_at` taken
    while a checkpoint eval job ran beside the training), summary, metrics and state."""
    from rlctl.metrics.gpu import GpuSampler

    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    (run / "recipe.toml").write_text(recipe)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": 1000.0 + s, "reward/mean": 0.1})
                                               + "\n" for s in range(1, 21)))
    _fake_nvml(monkeypatch, used)
    s = GpuSampler(run, {"RLCTL_GPU_RECORD_S": "0", **(env or {})})
    n = max(len(v) for v in used.values()) - 1  # the first value is "before the run"
    for k in range(n):
        s.tick(**({"eval_running": True} if k + 1 in eval_at else {}))
    s.close()
    (run / "stdout.log").write_text("step 20 done\n")
    (run / "state.json").write_text(json.dumps({"name": name, "status": "finished", "backend": "trl",
                                                "exit_code": 0, "started_at": time.time() - 60,
                                                "ended_at": time.time(), "total_steps": 20}))
    return run


def _status_line(cli, tmp_path: Path, name: str = "trl-vllm") -> str:
    res = cli("status", name, cwd=tmp_path)
    assert res.code == 0, res.err
    return next(x for x in res.out.splitlines() if "GPU memory" in x).strip()


# ---- the closing memory line compares like with like --------------------------------------------------------------

def test_colocated_peak_is_compared_with_trainer_plus_vllm(tmp_path, monkeypatch, cli):
    """Issue 31: 34.0 GiB measured against 11.4 + 23.8 = 35.2 planned is within 4%, not "UNDERestimated by 66%"."""
    from rlctl.metrics.gpu import verdict_line

    run = _run(tmp_path, monkeypatch, TRL_COLOCATED, {0: [BEFORE, 12.0, BEFORE + 34.0, 30.0]})
    plan = json.loads((run / "gpu_memory.json").read_text())["plan"]
    assert round(plan["trainer_gib"], 1) == 11.4  # the trainer as planned on the H100
    line = verdict_line(run)
    assert "UNDER" not in line and "66%" not in line, line
    assert line.startswith("GPU memory: peak 34.5 GiB of 79.6 (GPU 0)"), line
    assert "plan said trainer 11.4 + rollout vLLM 23.8 = 35.2 GiB on that GPU: within 15%" in line, line
    assert _status_line(cli, tmp_path) == line  # `rlctl status RUN` prints the same


def test_with_the_evaluator_beside_the_training_the_peak_counts_it_too(tmp_path, monkeypatch):
    """Samples taken while a checkpoint eval job ran beside the training are compared with trainer + rollout vLLM +
    eval vLLM; the others with trainer + rollout vLLM."""
    from rlctl.metrics.gpu import verdict_line

    run = _run(tmp_path, monkeypatch, TRL_COLOCATED + EVAL_SET, {0: [BEFORE, 20.0, BEFORE + 34.0, 41.5, 31.0]},
               eval_at=(3,))
    ev = json.loads((run / "gpu_memory.json").read_text())["plan"]["eval"]
    line = verdict_line(run)
    assert line.startswith("GPU memory: peak 34.5 GiB of 79.6 (GPU 0, while no checkpoint eval ran), plan said "
                           "trainer 11.4 + rollout vLLM 23.8 = 35.2 GiB on that GPU: within 15%"), line
    beside = ev["footprint_beside_gib"]
    assert (f"with the checkpoint evaluator beside it: peak 41.5 GiB, plan said trainer 11.4 + rollout vLLM 23.8 + "
            f"eval vLLM {beside:.1f} = {35.2 + beside:.1f} GiB: within 15%") in line, line


def test_engines_on_their_own_gpus_each_against_its_role(tmp_path, monkeypatch):
    """prime-rl on 2 H100s (vLLM on GPU 0, the trainer on GPU 1, as rendered): each GPU against its own role."""
    from rlctl.estimate.memory import trainer_memory, vllm_memory
    from rlctl.metrics.gpu import verdict_line
    from rlctl.recipe.models import resolve_arch
    from rlctl.recipe.planning import prepare

    text = (RECIPES / "prime-rl-qwen3-8b-2xh100.toml").read_text()
    r = prepare(RECIPES / "prime-rl-qwen3-8b-2xh100.toml").recipe
    arch = resolve_arch(r.model.path)
    trainer = trainer_memory(r, arch).total / GiB
    engine = vllm_memory(r, arch, 79.18 * GiB).budget / GiB
    # measured: each GPU within a few % of its role's plan, far from the other's
    run = _run(tmp_path, monkeypatch, text, {0: [BEFORE, BEFORE + engine * 0.98], 1: [BEFORE, BEFORE + trainer * 1.05]},
               name="prime")
    line = verdict_line(run)
    assert f"(GPU 0), plan said rollout vLLM {engine:.1f} GiB on that GPU: within 15%" in line, line
    assert f"(GPU 1), plan said trainer {trainer:.1f} GiB on that GPU: within 15%" in line, line
    assert "estimated by" not in line


def test_roles_placed_by_ray_are_paired_with_gpus_by_size(tmp_path, monkeypatch):
    """OpenRLHF without colocation: Ray's placement groups pick which GPU holds the actor and which the engine; the
    closing line pairs them by size and says so."""
    from rlctl.metrics.gpu import verdict_line

    text = (RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml").read_text().replace(
        "gpus_per_node = 8", "gpus_per_node = 2").replace("engines = 2", "engines = 1").replace(
        "tensor_parallel = 2", "tensor_parallel = 1").replace("trainer_gpus = [4, 5, 6, 7]", "trainer_gpus = [1]")
    run = _run(tmp_path, monkeypatch, text, {0: [BEFORE, 40.0], 1: [BEFORE, 72.0]}, name="orl")
    plan = json.loads((run / "gpu_memory.json").read_text())["plan"]
    assert plan["placed"] is False and {g["index"] for g in plan["gpus"]} == {None}
    line = verdict_line(run)
    assert "GPU 1" in line and "rollout vLLM" in line and "GPU 0" in line and "trainer" in line, line
    assert "paired with GPUs by size" in line, line


@pytest.mark.parametrize("samples", [[BEFORE], [BEFORE, BEFORE, BEFORE + 0.01]])
def test_a_run_that_died_before_loading_is_not_measured(tmp_path, monkeypatch, cli, samples):
    """No memory of the run ever on the GPU (it died importing, or before its first sample): no "inf%"."""
    from rlctl.metrics.gpu import verdict_line

    run = _run(tmp_path, monkeypatch, TRL_COLOCATED, {0: samples})
    line = verdict_line(run)
    assert "inf" not in line and "estimated" not in line, line
    assert line.startswith("GPU memory: not measured: the run ended before loading anything on the GPU"), line
    assert _status_line(cli, tmp_path) == line


# ---- the checkpoint evaluator is planned ---------------------------------------------------------------------------

def _preflight(cli, write, text: str, *sets: str) -> dict:
    recipe = write("r.toml", text)
    res = cli("preflight", str(recipe), "--only", "memory", "--only", "placement.gpus", "--json",
              *[x for s in sets for x in ("--set", s)])
    assert res.code in (0, 1), res.err
    return {r["check"]: r for r in json.loads(res.out)["results"]}


def test_preflight_plans_trainer_rollout_and_eval_vllm_on_the_gpu(cli, write):
    res = _preflight(cli, write, TRL_COLOCATED + EVAL_SET)
    # TRL's vLLM is colocated by TRL's own default (vllm_mode "colocate"), resources.colocate unset: the trainer
    # keeps its GPU (placement) and both are checked together, as vLLM's start check sees them (memory.colocation)
    assert res["placement.gpus"]["verdict"] == "ok", res["placement.gpus"]
    assert res["memory.colocation"]["verdict"] == "ok"
    gpus = res["memory.gpus"]
    ev = gpus["data"]["eval"]
    assert gpus["verdict"] == "ok", gpus
    beside = ev["footprint_beside_gib"]
    assert gpus["figure"].startswith(f"GPU 0: trainer 11.4 + rollout vLLM 23.8 + eval vLLM {beside:.1f} = "
                                     f"{35.2 + beside:.1f} of 79.2 GiB; checkpoint evals beside the training run: "
                                     f"gpu_memory_utilization {ev['utilization_beside']}"), gpus["figure"]
    # the three together leave the margin for the plan's error, on the card
    assert ev["shared_total_gib"] + beside <= 79.18 - 1.0
    # without eval sets, the split is the run's own
    plain = _preflight(cli, write, TRL_COLOCATED)["memory.gpus"]
    assert plain["figure"] == "GPU 0: trainer 11.4 + rollout vLLM 23.8 = 35.2 of 79.2 GiB" and "eval" not in \
        plain["data"]


def _vllm_source(path: str) -> str:
    """A file of the released vLLM 0.26.0 wheel (pip download --no-deps, cached), read without importing vLLM."""
    cache = Path(os.environ.get("RLCTL_TEST_WHEELS", Path.home() / ".cache" / "rlctl-tests" / "wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("vllm-0.26.0-*.whl"))
    if not wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
                            "vllm==0.26.0"], capture_output=True, text=True)
        wheels = sorted(cache.glob("vllm-0.26.0-*.whl"))
        assert r.returncode == 0 and wheels, f"cannot download vllm==0.26.0: {r.stderr.strip()[-300:]}"
    with zipfile.ZipFile(wheels[0]) as zf:
        return zf.read(path).decode()


def _vllm_function(path: str, name: str, namespace: dict) -> object:
    tree = ast.parse(_vllm_source(path))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def test_the_evaluators_utilization_passes_vllms_own_start_check(tmp_path):
    """The eval job beside the training run asks vLLM for the utilization the plan leaves: vLLM 0.26.0's start check
    (request_memory) passes with the training run at its planned peak — and at the peak measured on the H100 —
    where vLLM's default 0.9 (what the evaluator asked for before) refuses; and the three together stay on the
    card."""
    from rlctl.backends import get_backend
    from rlctl.evals.loop import evals_spec, job_files, write_job
    from rlctl.recipe.loader import load

    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(TRL_COLOCATED + EVAL_SET)
    r = load(recipe_file).recipe
    ev = evals_spec(r, get_backend("trl"))
    sets = ev["sets"]
    write_job(tmp_path / "evals", ev, 4, "/ckpt/checkpoint-4", sets, tmp_path)
    spec = json.loads(job_files(tmp_path / "evals", 4)[0].read_text())
    utilization = (spec.get("engine_args") or {}).get("gpu_memory_utilization", 0.9)  # vLLM's default when unset

    fmt = _vllm_function("vllm/utils/mem_utils.py", "format_gib", {"GiB_bytes": GiB})
    request_memory = _vllm_function("vllm/v1/worker/utils.py", "request_memory",
                                    {"math": math, "format_gib": fmt, "MemorySnapshot": object, "CacheConfig": object})
    total = int(79.18 * GiB)  # torch.accelerator.get_memory_info's total on an H100 80GB
    for training in (35.2, 34.0):  # the training run on that GPU: planned, measured (trainer + rollout vLLM)
        snap = types.SimpleNamespace(total_memory=total, free_memory=total - int(training * GiB), device_="cuda:0")
        requested = request_memory(snap, types.SimpleNamespace(gpu_memory_utilization=utilization))
        assert training * GiB + requested + 0.78 * GiB <= total  # its CUDA context beside its budget
    with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
        request_memory(snap, types.SimpleNamespace(gpu_memory_utilization=0.9))


def test_the_eval_job_gives_vllm_the_planned_arguments(monkeypatch):
    """What rlctl.evals.generate hands vllm.LLM: the plan's utilization, context and batch (vLLM itself is not
    installed on the CPU: its LLM class is replaced by one that records its arguments)."""
    from rlctl.evals.generate import Generator

    seen: dict = {}

    class LLM:
        def __init__(self, **kw):
            seen.update(kw)

        def generate(self, prompts, params, lora_request=None):
            out = types.SimpleNamespace
            return [out(outputs=[out(text="x", token_ids=[1])]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=lambda **k: k))
    args = {"gpu_memory_utilization": 0.097, "max_model_len": 1024, "max_num_batched_tokens": 8192}
    Generator("/m", None, "bfloat16", 0, "vllm", args).generate(["p"], 1, 0.0, 4)
    assert {k: seen[k] for k in args} == args


def test_preflight_fails_with_a_fix_when_the_evaluator_cannot_fit(cli, write, monkeypatch):
    """vLLM for rollouts at 0.8 beside the trainer leaves no room for the evaluator, and no other GPU is free (NVML
    sees one H100, in use): FAIL, with the rollout utilization that makes room computed — and it does. With a second
    GPU idle: WARN, evals wait for it."""
    text = TRL_COLOCATED.replace("gpu_memory_utilization = 0.3", "gpu_memory_utilization = 0.8") + EVAL_SET
    _fake_nvml(monkeypatch, {0: [35.0], 1: [BEFORE]})
    warn = _preflight(cli, write, text)["memory.gpus"]
    assert warn["verdict"] == "warn" and "GPU 1 is free now" in warn["figure"] and 'eval.gpu = "1"' in warn["fix"]
    _fake_nvml(monkeypatch, {0: [35.0]})
    res = _preflight(cli, write, text)
    assert res["memory.colocation"]["verdict"] == "ok"  # trainer and rollout vLLM fit together
    gpus = res["memory.gpus"]
    assert gpus["verdict"] == "fail", gpus
    assert "no room for the checkpoint evaluator's vLLM beside the training run" in gpus["figure"]
    assert "no other GPU is free" in gpus["figure"] and "eval vLLM" not in gpus["figure"]
    u = gpus["set"]["rollout.gpu_memory_utilization"]
    assert f"set rollout.gpu_memory_utilization = {u:.2f}" in gpus["fix"] and "eval.gpu" in gpus["fix"]
    fixed = _preflight(cli, write, text, f"rollout.gpu_memory_utilization={u}")
    assert fixed["memory.gpus"]["verdict"] == "ok" and fixed["memory.vllm"]["verdict"] != "fail"
    # the evaluator on a GPU of its own (eval.gpu outside the run's GPUs): planned there, nothing shared
    own = _preflight(cli, write, text.replace("[eval.sets.ood]", '[eval]\ngpu = "1"\n[eval.sets.ood]'))
    assert own["memory.gpus"]["verdict"] == "ok" and "GPU 1 (eval.gpu, not the run's): eval vLLM" in \
        own["memory.gpus"]["figure"]


def test_the_evaluator_waits_only_when_the_plan_says_it_does_not_fit():
    """Beside the training run with the planned utilization; when the plan leaves no room: on a GPU with nothing on
    it, else wait; before training (the baseline) and after it (the checkpoints left) on the GPU alone."""
    from rlctl.evals.loop import placement

    fits = {"utilization_beside": 0.097, "utilization_alone": 0.3, "max_model_len": 1024,
            "max_num_batched_tokens": 8192, "run_devices": ["0"]}
    full = {**fits, "utilization_beside": None}
    assert placement(fits, None, True) == (None, {"gpu_memory_utilization": 0.097, "max_model_len": 1024,
                                                 "max_num_batched_tokens": 8192})
    asked = []
    assert placement(full, None, True, lambda ex: asked.append(ex) or []) is None  # wait
    assert asked == [{"0"}]  # a free GPU is looked for among the others
    assert placement(full, None, True, lambda ex: ["3"])[0] == "3"
    assert placement(full, None, True, lambda ex: ["3"])[1]["gpu_memory_utilization"] == 0.3
    for training in (False, None):  # before/after training; `rlctl eval` by hand (vLLM's own check decides)
        assert placement(full, None, training)[1]["gpu_memory_utilization"] == 0.3
    assert placement(fits, "5", True)[1]["gpu_memory_utilization"] == 0.3  # eval.gpu = a GPU of its own
    assert placement(None, "5", True) == ("5", {})  # no plan (a CPU recipe): as before


def test_a_resumed_supervisor_keeps_the_peaks_the_killed_one_saw(tmp_path, monkeypatch):
    """On an H100 (docs/gpu/trl-vllm-3.json): SIGKILL of every process, then `rlctl resume`; the new supervisor's
    sampler started afresh, so the closing line said 'peak 0.5 GiB ... while no checkpoint eval ran: not loaded'
    although the killed attempts had trained at 37.3 GiB. The resumed sampler carries the run's peaks on."""
    from rlctl.metrics.gpu import GpuSampler, read_summary

    run = tmp_path / "runs" / "trl-vllm"
    run.mkdir(parents=True)
    (run / "recipe.toml").write_text(TRL_COLOCATED)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "time": 1000.0, "reward/mean": 0.1}) + "\n")
    _fake_nvml(monkeypatch, {0: [0.469, 37.284, 37.284]})  # attempts 1-2: training, no eval beside it
    first = GpuSampler(run, {"RLCTL_GPU_RECORD_S": "0"})
    first.tick()
    first.tick()  # then SIGKILLed: never closed
    _fake_nvml(monkeypatch, {0: [0.469, 38.92, 36.8]})  # attempt 3 under the resumed supervisor, an eval beside
    second = GpuSampler(run, {"RLCTL_GPU_RECORD_S": "0"})
    second.tick(eval_running=True)
    second.tick(eval_running=True)
    second.close()
    g = read_summary(run)["gpus"]["0"]
    assert g["peak_without_eval_gib"] == 37.284 and g["peak_with_eval_gib"] == 38.92, g
    assert g["peak_gib"] == 38.92 and g["used_before_gib"] == 0.469, g


def test_preflight_reads_the_gpus_once_and_says_them_once(cli, write, monkeypatch):
    """`rlctl preflight` asked NVML in env.gpus, again in memory.gpus (which GPU is free for the evaluator) and again
    in every re-run that vets a fix; the machine's GPUs were said by both checks. Now: one read per preflight, the
    GPUs listed by env.gpus, memory.gpus referring to it."""
    text = TRL_COLOCATED.replace("gpu_memory_utilization = 0.3", "gpu_memory_utilization = 0.8") + EVAL_SET
    recipe = write("r.toml", text)
    for used, says in (({0: [35.0], 1: [BEFORE]}, "GPU 1 is free now"), ({0: [35.0]}, "no other GPU is free")):
        _fake_nvml(monkeypatch, used)
        fake, reads = sys.modules["pynvml"], []
        monkeypatch.setattr(fake, "nvmlInit", lambda reads=reads: reads.append(1))
        r = cli("preflight", str(recipe))
        assert r.code in (0, 1), r.err
        lines = {ln.split()[1]: ln for ln in r.out.splitlines() if ln[:4] in ("OK  ", "WARN", "FAIL")}
        assert says in lines["memory.gpus"], r.out
        assert len(reads) == 1, (len(reads), r.out)
        assert "NVIDIA H100" in lines["env.gpus"] and "NVIDIA H100" not in lines["memory.gpus"], r.out
        if len(used) > 1:
            assert "free now: GPU 1" in lines["env.gpus"] and "env.gpus" in lines["memory.gpus"], r.out
