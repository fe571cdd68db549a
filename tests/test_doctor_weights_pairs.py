"""`doctor --weights` finds the weights to compare: stepped checkpoints, a step-less final save, the start weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rlctl.runs.weights import nothing_to_compare, run_pair, weights_finding


def safetensors(path: Path, values: list[float]) -> None:
    """A one-tensor F32 safetensors file, written by hand (the format: 8-byte header length, JSON header, data)."""
    data = struct.pack(f"<{len(values)}f", *values)
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, len(data)]}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def run_with(tmp_path: Path, model: str = "example/not-downloaded") -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"backend": "trl", "status": "finished"}))
    (run / "recipe.toml").write_text(f'[model]\npath = "{model}"\n[checkpoint]\ndir = "checkpoints"\n')
    return run


def checkpoint(run: Path, name: str, values: list[float], stepped: bool = True) -> Path:
    d = run / "checkpoints" / name
    safetensors(d / "model.safetensors", values)
    if stepped:
        (d / "trainer_state.json").write_text("{}")
    return d


def test_one_checkpoint_and_a_final_save_are_two(tmp_path, cli):
    run = run_with(tmp_path)
    first = checkpoint(run, "checkpoint-40", [0.0, 1.0, 2.0])
    final = checkpoint(run, "final", [0.5, 1.5, 2.5], stepped=False)
    assert run_pair(run) == (first, final)
    res = cli("doctor", str(run), "--weights")
    assert "1/1 tensors changed" in res.out and "between checkpoint-40 and final" in res.out


def test_a_final_save_of_the_last_step_is_not_frozen_weights(tmp_path):
    run = run_with(tmp_path)
    checkpoint(run, "checkpoint-80", [0.0, 1.0])
    checkpoint(run, "final", [0.0, 1.0], stepped=False)
    f = weights_finding(run)
    assert f.severity == "warn" and "probably the same step" in f.message


def test_the_start_weights_are_the_before(tmp_path):
    model = tmp_path / "model"
    safetensors(model / "model.safetensors", [0.0, 0.0])
    run = run_with(tmp_path, model=str(model))
    only = checkpoint(run, "checkpoint-10", [0.1, 0.0])
    assert run_pair(run) == (model, only)
    assert weights_finding(run).severity in ("ok", "warn")  # half the values moved: "most weights did not move"


def test_nothing_to_compare_says_what_it_found(tmp_path):
    run = run_with(tmp_path)
    checkpoint(run, "checkpoint-10", [0.1])
    assert weights_finding(run) is None  # not a finding: nothing is known about the weights
    assert "only checkpoint-10 has safetensors weights" in nothing_to_compare(run)


def test_nothing_to_compare_of_a_run_on_a_host_says_where_its_checkpoints_are(tmp_path):
    """`doctor r1 --weights` for a run trained on box1 looked in this machine's (empty) checkpoint directory and
    advised keeping two checkpoints, which the run had: it says they are on box1 and how to bring them here."""
    from rlctl.core.state import write_state

    run = run_with(tmp_path)
    write_state(run, executor="ssh", handle={"executor": "ssh", "ref": {"host": "box1", "run_dir": "/w/runs/r1"}})
    said = nothing_to_compare(run)
    assert "checkpoints are on box1" in said and "rlctl ckpt pull" in said and "Keep at least two" not in said, said


def adapter(run: Path, name: str, lora_a: list[float], lora_b: list[float]) -> Path:
    """A PEFT adapter checkpoint: adapter_model.safetensors with one lora_A/lora_B pair (F32, as PEFT saves)."""
    d = run / "checkpoints" / name
    d.mkdir(parents=True, exist_ok=True)
    blobs = [struct.pack(f"<{len(v)}f", *v) for v in (lora_a, lora_b)]
    names = ["base_model.model.layers.0.q_proj.lora_A.weight", "base_model.model.layers.0.q_proj.lora_B.weight"]
    header, off = {}, 0
    for n, b in zip(names, blobs, strict=True):
        header[n] = {"dtype": "F32", "shape": [len(b) // 4], "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header).encode()
    (d / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    (d / "trainer_state.json").write_text("{}")
    return d


def lora_run_with_a_flat_kl(tmp_path: Path) -> Path:
    """A LoRA run whose metrics show the sign `frozen_weights` reads (the KL to the reference exactly 0)."""
    run = run_with(tmp_path)
    with (run / "recipe.toml").open("a") as fh:
        fh.write("[lora]\nr = 8\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "kl": 0.0, "lr": 1e-6, "loss": 0.1 * s}) + "\n"
                                               for s in range(1, 13)))
    return run


def test_a_lora_run_whose_adapter_moved_has_one_weights_message(tmp_path, cli):
    """`doctor --weights` on a LoRA run said "frozen_weights" (from the metrics) and "28/28 tensors changed" (from the
    checkpoints) at once. The checkpoints are the proof: one message, about the adapter, and no frozen finding."""
    run = lora_run_with_a_flat_kl(tmp_path)
    adapter(run, "checkpoint-10", [0.1, 0.2], [0.0, 0.0])
    adapter(run, "checkpoint-20", [0.11, 0.19], [0.01, -0.02])
    res = cli("doctor", str(run), "--weights")
    assert "frozen_weights" not in res.out and "2/2 adapter tensors changed" in res.out, res.out
    assert res.out.count("weights_frozen") == 1 and res.code == 0, res.out


def test_a_lora_run_whose_adapter_did_not_move_is_one_critical_finding(tmp_path, cli):
    run = lora_run_with_a_flat_kl(tmp_path)
    adapter(run, "checkpoint-10", [0.1, 0.2], [0.0, 0.0])
    adapter(run, "checkpoint-20", [0.1, 0.2], [0.0, 0.0])
    res = cli("doctor", str(run), "--weights")
    assert "frozen_weights" not in res.out and res.out.count("weights_frozen") == 1, res.out
    assert "the LoRA adapter did not change" in res.out and "KL to the reference" in res.out and res.code == 1, res.out


def test_between_takes_the_runs_steps_or_says_which_there_are(tmp_path, cli):
    """New-user trial: `--between 10 --between 20` (steps, as a user reads them off `rlctl ckpt list`) were taken for
    paths. A number that is no path is the run's checkpoint at that step; an unknown step names the steps there are
    and their paths (exit 2)."""
    run = run_with(tmp_path)
    checkpoint(run, "checkpoint-10", [0.0, 1.0])
    checkpoint(run, "checkpoint-20", [0.5, 1.5])
    res = cli("doctor", str(run), "--between", "10", "--between", "20", cwd=tmp_path)
    assert "1/1 tensors changed" in res.out and "between checkpoint-10 and checkpoint-20" in res.out, res.out + res.err
    res = cli("doctor", str(run), "--between", "10", "--between", "30", cwd=tmp_path)
    assert res.code == 2 and "Traceback" not in res.err, res.out + res.err
    assert "30" in res.err and "checkpoint-20" in res.err and "10, 20" in res.err, res.err
