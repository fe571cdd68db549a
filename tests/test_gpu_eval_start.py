"""rlctl's checkpoint evaluator beside a training run whose memory is changing (issue 31; docs/gpu.md).

On an H100 (docs/gpu/trl-vllm-3.json) the planned evaluator (gpu_memory_utilization 0.068 beside TRL + vLLM) ran at
steps 0 and 6 and failed at vLLM's engine start at steps 2 and 4. The recorded NVML samples say why, read with vLLM
0.24's own start-up arithmetic (its wheel, not imported): each of the two started as a killed attempt was being
restarted, and the restarted trainer grew by tens of GiB while the evaluator's engine profiled its memory; vLLM counts
what the device gains in that window as its own, so its KV cache came out negative. The plan's margin is not the
cause (no margin short of the trainer's whole start holds). The fix is in the evaluator's start: beside the training it
waits until the current attempt has logged a step, and an eval vLLM refused for memory there is started again.
"""

from __future__ import annotations

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

from rlctl.core.state import write_state
from rlctl.evals import loop

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "docs" / "gpu" / "trl-vllm-3.json"
GiB = 1024**3
VLLM = "0.24.0"  # the release the H100 ran (the evidence's versions)


def _vllm_source(path: str) -> str:
    """A file of the released vLLM wheel (pip download --no-deps, cached), read without importing vLLM."""
    cache = Path(os.environ.get("RLCTL_TEST_WHEELS", Path.home() / ".cache" / "rlctl-tests" / "wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"vllm-{VLLM}-*.whl"))
    if not wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
                            f"vllm=={VLLM}"], capture_output=True, text=True)
        wheels = sorted(cache.glob(f"vllm-{VLLM}-*.whl"))
        assert r.returncode == 0 and wheels, f"cannot download vllm=={VLLM}: {r.stderr.strip()[-300:]}"
    with zipfile.ZipFile(wheels[0]) as zf:
        return zf.read(path).decode()


def _vllm_function(path: str, name: str, namespace: dict) -> object:
    import ast

    tree = ast.parse(_vllm_source(path))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


@pytest.fixture(scope="module")
def vllm_start():
    """vLLM 0.24's request_memory (the start check) and _check_enough_kv_cache_memory (the KV cache check), and the
    line of determine_available_memory that sizes the KV cache, read from its wheel."""
    fmt = _vllm_function("vllm/utils/mem_utils.py", "format_gib", {"GiB_bytes": GiB})
    request = _vllm_function("vllm/v1/worker/utils.py", "request_memory",
                             {"math": math, "format_gib": fmt, "MemorySnapshot": object, "CacheConfig": object})
    check = _vllm_function("vllm/v1/core/kv_cache_utils.py", "_check_enough_kv_cache_memory",
                           {"format_gib": fmt, "Callable": object})
    worker = _vllm_source("vllm/v1/worker/gpu_worker.py")
    # the KV cache is what was requested less everything the device gained since the worker's snapshot
    assert "self.requested_memory\n            - profile_result.non_kv_cache_memory" in worker
    assert "non_torch_memory = result.non_torch_increase" in _vllm_source("vllm/utils/mem_utils.py")
    return request, check


def _recorded() -> tuple[dict, dict]:
    ev = json.loads(EVIDENCE.read_text())
    return ev, ev["parts"]["full#2"]


def _windows(ev: dict, part: dict) -> dict[int, dict]:
    """Each in-run eval: its window, its engine (the VLLM::EngineCore that first shows on the GPU in it), and the GPU
    memory of everything else when that engine first shows (vLLM's snapshot is taken right after its CUDA context)
    and when the engine first reaches its largest size (its profile runs done: the KV cache is sized then, or
    refused)."""
    call = ev["nvml"]["calls"][0]
    samples, procs, t0 = call["samples"], call["processes"], call["started"]
    out = {}
    for name, res in part["collected"]["evals"].items():
        if not name.endswith(".out.json") or not name.startswith("step-"):
            continue
        a, b = res["started_at"] - t0, res["ended_at"] - t0
        engines = [p for p in procs if a <= p["t"] <= b and p["cmd"].startswith("VLLM::EngineCore")]
        pid = engines[0]["pid"]
        mine = [p for p in engines if p["pid"] == pid]

        def others(t: float, mine=mine) -> float:
            used = min(samples, key=lambda s: abs(s[0] - t))[1]
            own = min(mine, key=lambda rec: abs(rec["t"] - t))["gib"]
            return used - own

        peak = next(p for p in mine if p["gib"] == max(q["gib"] for q in mine))
        out[res["step"]] = {"window": (a, b), "ok": not res["errors"], "others_at_snapshot": others(mine[0]["t"]),
                            "others_after_profile": others(peak["t"])}
    return out


def test_the_failed_evals_met_a_trainer_growing_beside_vllms_start(vllm_start):
    """The recorded run: steps 0 and 6 (ok) had nothing else change on the GPU while their engine started; steps 2
    and 4 (failed) each had the restarted trainer gain more than the evaluator's whole budget, so vLLM 0.24's own
    checks give them no KV cache ("No available memory for the cache blocks"), whatever the model and activations
    took. The budget itself passes vLLM's start check, and left room on the card (the plan was not short)."""
    request, check = vllm_start
    ev, part = _recorded()
    total = int(79.18 * GiB)  # torch's total on an H100 80GB
    wins = _windows(ev, part)
    assert sorted(wins) == [0, 2, 4, 6]
    for step, w in wins.items():
        gained = (w["others_after_profile"] - w["others_at_snapshot"]) * GiB
        free = total - int(w["others_at_snapshot"] * GiB)
        snap = types.SimpleNamespace(total_memory=total, free_memory=free, device_="cuda:0")
        requested = request(snap, types.SimpleNamespace(gpu_memory_utilization=0.068))  # passes: room was there
        available = requested - max(gained, 0) - int(0.93 * GiB)  # the 0.5B's bf16 weights, activations aside
        if w["ok"]:
            assert abs(gained) < 0.5 * GiB and available > 0, (step, w)
            check(available, lambda: 1, 256, lambda m: 256)  # one request of 256 tokens fits
        else:
            assert gained > requested, (step, w)  # the trainer's start, not the plan's margin
            with pytest.raises(ValueError, match="No available memory for the cache blocks"):
                check(available, lambda: 1, 256, lambda m: 256)


def test_the_recorded_starts_against_the_rule_the_evaluator_now_follows():
    """Step 4's eval started the moment attempt 3 started (after every process was killed): under the rule it waits
    for that attempt's first step. Step 2's started while attempt 1 was training (it is started the same way under the
    rule); the kill came 14 s later, during its engine's start: that one is started again."""
    ev, part = _recorded()
    wins = _windows(ev, part)
    started = {e["what"]: e for e in part["events"] if e["what"].startswith("attempt ")}
    kills = [e for e in part["events"] if e["what"].startswith("kill ")]
    a3 = started["attempt 3 started"]
    assert abs(wins[4]["window"][0] - a3["t"]) < 1.0  # the same instant
    rec = a3["attempt_record"]
    assert not loop.training_settled([rec], rec["from_step"])  # nothing logged since attempt 3 began
    assert loop.training_settled([{"attempt": 1, "from_step": None}], 2)  # step 2's checkpoint was complete
    assert wins[2]["window"][0] < kills[0]["t"] < wins[2]["window"][1]  # the driver kill during step 2's start


REFUSAL = ("(EngineCore pid=1692) ValueError: No available memory for the cache blocks. Try increasing "
           "`gpu_memory_utilization` when initializing the engine")


@pytest.fixture()
def evals(tmp_path, monkeypatch):
    """The supervisor's CheckpointEvals on a TRL run beside vLLM (the plan of the H100 recipe), one complete
    checkpoint at step 2 and a supervisor whose attempts and logged step the test sets. The eval job is a process
    that writes a log as vLLM's failed start writes it (or results, when told to succeed)."""
    from rlctl.backends import get_backend
    from rlctl.recipe.loader import load
    from tests.test_gpu_plan import TRL_COLOCATED

    recipe = tmp_path / "r.toml"
    (tmp_path / "probe.jsonl").write_text('{"prompt": "a", "label": "a"}\n')
    recipe.write_text(TRL_COLOCATED.replace("every = 4", "every = 2").replace(
        'train = "prompts.jsonl"', f'train = "prompts.jsonl"\neval = "{tmp_path / "probe.jsonl"}"')
        + "[eval]\nevery = 2\n")
    spec = loop.evals_spec(load(recipe).recipe, get_backend("trl"))
    assert spec["vllm_plan"]["utilization_beside"] and spec["vllm_plan"]["run_devices"] == ["0"]
    run = tmp_path / "run"
    ck = run / "checkpoints" / "checkpoint-2"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    (ck / "config.json").write_text("{}")
    write_state(run, backend="trl")
    events: list[dict] = []
    sup = types.SimpleNamespace(run_dir=run, spec={"backend": "trl", "evals": spec}, attempts=[], step=None,
                                stop_requested_at=None, state=lambda **kw: write_state(run, **kw),
                                event=lambda **kw: events.append(kw), _mark_log=lambda text: None)
    sup._ingested_step = lambda: sup.step
    outcome = {"ok": False}

    def start_job(spec_file, log, gpu):
        out = json.loads(spec_file.read_text())["output"]
        code = (f"import json; json.dump({{'metrics': {{'eval/default/greedy_pass@1': 0.5}}}}, open({out!r}, 'w'))"
                if outcome["ok"] else f"print({REFUSAL!r}); raise SystemExit(1)")
        with open(log, "ab") as fh:
            return subprocess.Popen([sys.executable, "-c", code], stdout=fh, stderr=subprocess.STDOUT)

    monkeypatch.setattr(loop, "start_job", start_job)
    ce = loop.CheckpointEvals(sup)
    return ce, sup, events, outcome


def _settle(ce) -> None:
    deadline = time.time() + 60
    while ce.job is not None and time.time() < deadline:
        ce._poll()
        time.sleep(0.05)


def test_beside_training_the_evaluator_waits_for_the_attempts_first_step_and_retries_a_memory_refusal(evals):
    ce, sup, events, outcome = evals
    sup.attempts = [{"attempt": 3, "started_at": time.time(), "from_step": 0}]
    sup.step = 0  # attempt 3 started, nothing logged yet: its memory is still growing
    ce.tick()
    assert ce.job is None and events[-1]["event"] == "eval_waiting" and "first step" in events[-1]["why"]
    sup.step = 1
    ce.tick()
    assert ce.job is not None and ce.beside
    _settle(ce)
    assert "2" not in ce.ledger.get("done", {}) and ce.ledger["start_retries"] == {"2": 1}
    assert events[-1]["event"] == "eval_retry" and "No available memory for the cache blocks" in events[-1]["error"]
    sup.attempts.append({"attempt": 4, "started_at": time.time(), "from_step": 2})  # killed and restarted meanwhile
    sup.step = 2
    ce.tick()
    assert ce.job is None  # attempt 4 has logged nothing past its checkpoint yet
    sup.step = 3
    for _ in range(2):  # refused twice more: the last one is recorded as failed, with vLLM's line
        ce.tick()
        _settle(ce)
    done = ce.ledger["done"]["2"]
    assert done["outcome"] == "failed" and "(vLLM: No available memory for the cache blocks" in done["error"]


def test_an_eval_started_again_after_a_refusal_records_its_metrics(evals):
    ce, sup, events, outcome = evals
    sup.attempts, sup.step = [{"attempt": 1, "started_at": time.time(), "from_step": None}], 2
    ce.tick()
    _settle(ce)
    assert ce.ledger["start_retries"] == {"2": 1}
    outcome["ok"] = True
    ce.tick()
    _settle(ce)
    assert ce.ledger["done"]["2"]["outcome"] == "ok"
    assert json.loads((sup.run_dir / "metrics.jsonl").read_text())["eval/default/greedy_pass@1"] == 0.5
