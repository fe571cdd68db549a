"""model.precision: rendered faithfully by TRL, followed by the plan, and pure bf16 + a tiny lr is caught."""

from __future__ import annotations

import json
import struct

import pytest

from rlctl import preflight as pf
from rlctl.backends import get_backend
from rlctl.preflight.precision import moving_fraction_local, moving_fraction_normal
from rlctl.recipe.planning import prepare
from tests.conftest import RECIPES

QUICK = RECIPES / "quickstart.toml"
VERL = RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"
GPU = ["resources.gpus_per_node=1", 'resources.gpu="H100-80GB"', "model.dtype=bfloat16"]


def grpo(*sets):
    prep = prepare(QUICK, list(sets))
    return json.loads(prep.backend.render(prep.recipe, prep.dataset_size).files["trl_config.json"])


def check(recipe, *sets):
    res = [r for r in pf.run(prepare(recipe, list(sets)), ["precision"]) if r.check == "precision.bf16_updates"]
    return res[0] if res else None


def test_default_is_mixed_fp32_master_with_bf16_autocast():
    cfg = grpo(*GPU)
    assert cfg["precision"] == "mixed"
    assert cfg["grpo"]["model_init_kwargs"] == {"dtype": "float32"} and cfg["grpo"]["bf16"] is True


def test_pure_loads_parameters_in_bf16():
    cfg = grpo(*GPU, "model.precision=pure")
    assert cfg["grpo"]["model_init_kwargs"] == {"dtype": "bfloat16"} and cfg["grpo"]["bf16"] is True


def test_lora_keeps_a_bf16_base():
    cfg = grpo(*GPU, "lora.rank=8")
    assert cfg["grpo"]["model_init_kwargs"] == {"dtype": "bfloat16"}  # PEFT keeps the adapters in fp32


def test_cpu_has_no_autocast():
    cfg = grpo()
    assert cfg["grpo"]["bf16"] is False and cfg["grpo"]["fp16"] is False
    assert cfg["grpo"]["model_init_kwargs"] == {"dtype": "float32"}


def test_fp16_compute():
    cfg = grpo(*GPU, "model.dtype=float16")
    assert cfg["grpo"]["fp16"] is True and cfg["grpo"]["bf16"] is False


def test_adapters_answer_param_dtype():
    trl = prepare(QUICK, [*GPU, "model.precision=pure"])
    assert get_backend("trl").param_dtype(trl.recipe) == "bfloat16"
    assert get_backend("trl").param_dtype(prepare(QUICK, GPU).recipe) == "float32"


def test_backend_that_does_not_render_pure_says_so():
    prep = prepare(VERL, ["model.precision=pure"])
    assert get_backend("verl").param_dtype(prep.recipe) == "float32"  # what it really runs
    res = {r.check: r for r in pf.run(prep, ["precision"])}
    assert res["precision.supported"].verdict == "warn" and "not honoured" in res["precision.supported"].figure
    assert res["precision.bf16_updates"].verdict == "ok"
    assert "precision.supported" not in {r.check for r in pf.run(prepare(VERL), ["precision"])}


def test_moving_fraction_matches_the_h100_measurement():
    # measured: 1.6% of a Qwen2.5-0.5B-shaped model (init std 0.02) changed at lr 1e-6 in pure bf16
    assert 0.008 < moving_fraction_normal(1e-6, 2**8.5) < 0.025
    assert moving_fraction_normal(1e-4, 2**8.5) > 0.8


def test_pure_bf16_full_finetune_with_rl_lr_warns():
    r = check(QUICK, *GPU, "model.path=Qwen/Qwen2.5-0.5B", "model.precision=pure", "optim.lr=1e-6")
    assert r.verdict == "warn" and 'model.precision = "mixed"' in r.fix
    assert r.data["moving_fraction"] < 0.05 and r.data["lr_for_90_percent"] > 1e-5


def test_mixed_and_large_lr_and_lora_do_not_warn():
    assert check(VERL).verdict == "ok"
    assert check(QUICK, *GPU, "model.precision=pure", "optim.lr=5e-4").verdict == "ok"
    assert check(QUICK, *GPU, "model.precision=pure", "lora.rank=8") is None


def _safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, values) in tensors.items():
        fmt = {"F32": "f"}[dtype]
        raw = struct.pack(f"<{len(values)}{fmt}", *values)
        header[name] = {"dtype": dtype, "shape": [len(values) // 2, 2], "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_moving_fraction_reads_a_local_model(tmp_path):
    _safetensors(tmp_path / "model.safetensors", {"w": ("F32", [1e-5, -1e-5, 0.5, -0.5] * 8)})
    assert moving_fraction_local(str(tmp_path), 1e-6, 2**8.5) == pytest.approx(0.5)


# ---- doctor --weights: do the checkpoints change? -----------------------------------------------------------------

def _bf16(values):
    out = []
    for v in values:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        out.append(struct.pack("<H", bits >> 16))
    return b"".join(out)


def _bf16_file(path, tensors):
    header, blobs, off = {}, [], 0
    for name, values in tensors.items():
        raw = _bf16(values)
        header[name] = {"dtype": "BF16", "shape": [len(values)], "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_compare_counts_changed_tensors_and_values(tmp_path):
    from rlctl.runs.weights import compare, verdict

    a = [0.01 * (i % 7 - 3) for i in range(4000)]
    _bf16_file(tmp_path / "a", {"x": a, "y": a, "z": a})
    _bf16_file(tmp_path / "b", {"x": [v + 0.5 for v in a], "y": a, "z": a})
    c = compare(tmp_path / "a", tmp_path / "b")
    assert (c.tensors, c.tensors_changed) == (3, 1) and c.fraction_elements_changed == pytest.approx(1 / 3)
    assert verdict(c)[0] == "warn"
    _bf16_file(tmp_path / "c", {"x": a, "y": a, "z": a})
    assert verdict(compare(tmp_path / "a", tmp_path / "c"))[0] == "critical"


def test_compare_bf16_with_fp32_and_sampling(tmp_path):
    from rlctl.runs import weights

    vals = [0.25 * (i % 5) for i in range(3000)]
    _bf16_file(tmp_path / "a", {"w": vals})
    _safetensors(tmp_path / "b.safetensors", {"w": ("F32", vals)})
    c = weights.compare(tmp_path / "a", tmp_path / "b.safetensors")
    assert c.elements_changed == 0  # the same numbers in another dtype
    old = weights.WHOLE_ELEMENTS
    weights.WHOLE_ELEMENTS = 100
    try:
        s = weights.compare(tmp_path / "a", tmp_path / "b.safetensors", sample=4)
    finally:
        weights.WHOLE_ELEMENTS = old
    assert s.sampled and s.elements_compared == 4 * weights.WINDOW


def test_doctor_weights_tells_frozen_from_learning(tmp_path, cli):
    run = tmp_path / "runs" / "r-20260101-000000"
    ck = run / "checkpoints"
    a = [0.02 * ((i * 37) % 11 - 5) for i in range(2000)]
    _bf16_file(ck / "checkpoint-1", {"w": a})
    _bf16_file(ck / "checkpoint-2", {"w": a})
    for n in (1, 2):
        (ck / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")  # what makes a TRL checkpoint complete
    (run / "state.json").write_text(json.dumps({"name": run.name, "status": "finished", "backend": "trl"}))
    (run / "recipe.toml").write_text('[checkpoint]\ndir = "checkpoints"\n')
    (run / "metrics.jsonl").write_text("")
    res = cli("doctor", str(run), "--weights", "--json")
    found = [f for f in json.loads(res.out)["findings"] if f["rule"] == "weights_frozen"]
    assert found and found[0]["severity"] == "critical" and res.code == 1
    _bf16_file(ck / "checkpoint-2", {"w": [v + 0.001 for v in a]})
    res = cli("doctor", str(run), "--weights", "--json")
    found = [f for f in json.loads(res.out)["findings"] if f["rule"] == "weights_frozen"]
    assert found[0]["severity"] == "ok"


def test_nothing_in_common_is_not_called_frozen(tmp_path):
    from rlctl.runs.weights import compare, verdict

    _bf16_file(tmp_path / "a", {"x": [0.1] * 10})
    _bf16_file(tmp_path / "b", {"y": [0.1] * 10})
    severity, line = verdict(compare(tmp_path / "a", tmp_path / "b"))
    assert severity == "warn" and "no tensor in common" in line
