"""Doctor rules on synthetic and real streams; checkpoints listed, pruned safely, watched for disk; compare."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from rlctl.errors import RlctlError
from rlctl.metrics.stream import ingest
from rlctl.runs import checkpoints as ck
from rlctl.runs.doctor import diagnose, diagnose_records
from tests.conftest import FIXTURES


def recs(n, **fns):
    return [{"step": s, "time": 0.0, **{k: f(s) for k, f in fns.items()}} for s in range(1, n + 1)]


def rules(findings):
    return {f.rule for f in findings}


def test_flat_learning():
    f = diagnose_records(recs(20, **{"reward/mean": lambda s: 0.3, "kl": lambda s: 1e-5}))
    assert "flat_learning" in rules(f)
    f = diagnose_records(recs(20, **{"reward/mean": lambda s: 0.01 * s, "kl": lambda s: 1e-5}))
    assert "flat_learning" not in rules(f)


def test_instability_kl_spike_with_falling_entropy():
    data = recs(12, kl=lambda s: 0.01 if s < 12 else 0.5, entropy=lambda s: 2.0 - 0.15 * s)
    f = next(x for x in diagnose_records(data) if x.rule == "instability")
    assert f.severity == "critical" and f.evidence["step"] == 12


def test_loss_and_grad_spikes_name_their_steps():
    data = recs(20, policy_loss=lambda s: 0.01 if s not in (7, 15) else 0.2,
                grad_norm=lambda s: 0.5 if s != 9 else 350.0)
    f = next(x for x in diagnose_records(data) if x.rule == "loss_grad_spikes")
    assert {e["step"] for e in f.evidence["spikes"]} == {7, 9, 15}
    assert "eps_clip" in f.action and "advantage clipping does not help" in f.action


def test_length_collapse_truncation_entropy_zero_variance():
    data = recs(30, **{"response_length/mean": lambda s: 1000 if s <= 10 else 300,
                       "response_length/clip_ratio": lambda s: 0.85, "entropy": lambda s: 2.0 / s,
                       "trl/frac_reward_zero_std": lambda s: 0.9})
    got = rules(diagnose_records(data))
    assert {"length_collapse", "high_truncation", "entropy_collapse", "zero_variance_groups"} <= got


def test_eval_divergence_names_the_best_step():
    data = recs(40, **{"reward/mean": lambda s: 0.3 + 0.01 * s})
    for step, v in ((10, 0.30), (20, 0.354), (30, 0.31), (40, 0.271)):  # the seeds' attempt-26 shape
        data[step - 1]["eval/aime/pass1"] = v
    f = next(x for x in diagnose_records(data) if x.rule == "eval_divergence")
    assert f.severity == "critical" and f.evidence["best_step"] == 20 and "step 20" in f.action


def test_thresholds_come_from_the_recipe(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.toml").write_text("[doctor]\nentropy_collapse = 0.01\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs(5, entropy=lambda s: 2.0 / s)))
    assert "entropy_collapse" not in rules(diagnose(run))


def test_doctor_on_a_real_stream_and_nan(tmp_path, cli):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / "trl/stdout.log", run / "stdout.log")
    (run / "state.json").write_text(json.dumps({"backend": "trl", "status": "finished"}))
    ingest(run, "trl", final=True)
    found = rules(diagnose(run))
    assert "high_truncation" in found  # the tiny model never emits EOS: every completion is cut at 16 tokens
    res = cli("doctor", str(run), "--json")
    assert {f["rule"] for f in json.loads(res.out)["findings"]} == found
    bad = recs(10, **{"reward/mean": lambda s: math.nan if s == 3 else 0.5})
    bad[2]["reward/mean"] = None
    diagnose_records(bad)  # None/NaN values never crash a rule


# ---- checkpoints ----------------------------------------------------------------------------------------------

def trl_ckpts(root: Path, steps, incomplete=()):
    for s in steps:
        d = root / f"checkpoint-{s}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 1000)
        if s not in incomplete:
            (d / "trainer_state.json").write_text("{}")


def make_run(tmp_path, backend="trl", ckdir="checkpoints"):
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"backend": backend, "status": "running"}))
    (run / "recipe.toml").write_text(f'[checkpoint]\ndir = "{ckdir}"\n')
    return run


def test_list_and_prune_keep_newest_complete_and_in_progress(tmp_path, cli):
    run = make_run(tmp_path)
    trl_ckpts(run / "checkpoints", [10, 20, 30, 40, 50], incomplete=[50])
    found = ck.find_checkpoints("trl", run)
    assert [(c.step, c.complete) for c in found] == [(10, True), (20, True), (30, True), (40, True), (50, False)]
    res = cli("ckpt", "prune", str(run), "--keep-last", "2", "--dry-run")
    assert "would delete 2 checkpoint(s)" in res.out and "step 10, step 20" in res.out
    assert str(run / "checkpoints" / "checkpoint-10") in res.out  # says exactly what it will delete
    assert len(ck.find_checkpoints("trl", run)) == 5
    cli("ckpt", "prune", str(run), "--keep-last", "2")
    assert [c.step for c in ck.find_checkpoints("trl", run)] == [30, 40, 50]  # 50 is being written: kept
    with pytest.raises(RlctlError, match="at least 1"):
        ck.prune("trl", run, 0)
    res = cli("ckpt", "list", str(run), "--json")
    assert [c["step"] for c in json.loads(res.out)["checkpoints"]] == [30, 40, 50]


def test_keep_best_keeps_the_checkpoint_at_the_best_eval(tmp_path):
    run = make_run(tmp_path)
    trl_ckpts(run / "checkpoints", [10, 20, 30, 40])
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": 0, "eval/x/acc": v}) + "\n"
                                               for s, v in ((10, 0.2), (20, 0.6), (30, 0.4), (40, 0.3))))
    ck.prune("trl", run, 1, keep_best=True)
    assert [c.step for c in ck.find_checkpoints("trl", run)] == [20, 40]


def test_prune_never_follows_or_counts_symlinks(tmp_path):
    run = make_run(tmp_path)
    trl_ckpts(run / "checkpoints", [20, 30])
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "checkpoint-10").symlink_to(outside)
    (run / "checkpoints" / "checkpoint-99").symlink_to(outside)  # named like a newer step
    assert [c.step for c in ck.find_checkpoints("trl", run)] == [20, 30]
    doomed = ck.prune("trl", run, 1)
    assert [c.step for c in doomed] == [20]  # 30 stays the newest complete one, whatever the links say
    assert outside.exists() and (run / "checkpoints" / "checkpoint-30").is_dir()
    assert (run / "checkpoints" / "checkpoint-10").is_symlink()


def test_prune_never_leaves_the_run_directory(tmp_path, cli):
    """A shared absolute checkpoint.dir (or a resumed run pointing at its parent's) is not the run's to prune."""
    shared = tmp_path / "shared-ckpts"
    trl_ckpts(shared, [10, 20, 30])
    run = make_run(tmp_path, ckdir=str(shared))
    for dry in (True, False):
        with pytest.raises(RlctlError, match="outside the run directory"):
            ck.prune("trl", run, 1, dry_run=dry)
    res = cli("ckpt", "prune", str(run), "--keep-last", "1", "--dry-run")
    assert res.code == 2 and "Traceback" not in res.err and "outside the run directory" in res.err
    res = cli("ckpt", "prune", str(run), "--keep-last", "1")
    assert res.code == 2
    assert sorted(p.name for p in shared.iterdir()) == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    # the disk-pressure rule refuses too (the run is stopped instead), and says so in the events
    Usage = namedtuple("Usage", "total used free")
    import unittest.mock as um

    from rlctl.runs.disk_pressure import check

    with um.patch.object(shutil, "disk_usage", lambda p: Usage(100, 99, 1)):
        short = check(run, {"backend": "trl", "keep_last": 1, "checkpoint_dir": str(shared)})
    assert short is not None and not short.pruned
    assert "outside the run directory" in (run / "rlctl-events.jsonl").read_text()
    assert len(list(shared.iterdir())) == 3


def test_prune_in_a_shared_root_named_for_the_run(tmp_path):
    run = make_run(tmp_path)
    run = run.rename(run.with_name("exp-20261123-051000"))  # a name create_run_dir made: unique
    root = tmp_path / "big-disk" / run.name / "ckpts"
    trl_ckpts(root, [10, 20, 30])
    (run / "recipe.toml").write_text(f'[checkpoint]\ndir = "{root}"\n')
    assert [c.step for c in ck.prune("trl", run, 1)] == [10, 20]
    assert [p.name for p in root.iterdir()] == ["checkpoint-30"]
    # a hand-made run directory named like a common folder claims nothing
    (tmp_path / "x").mkdir()
    tmp_run = make_run(tmp_path / "x")
    shared = tmp_path / "x" / "run-shared"
    trl_ckpts(shared / "run", [1, 2])
    (tmp_run / "recipe.toml").write_text(f'[checkpoint]\ndir = "{shared / "run"}"\n')
    with pytest.raises(RlctlError, match="outside the run directory"):
        ck.prune("trl", tmp_run, 1)


def test_prune_refuses_a_checkpoints_symlink_out_of_the_run(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    trl_ckpts(elsewhere, [10, 20])
    run = make_run(tmp_path)
    (run / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(RlctlError, match="outside the run directory"):
        ck.prune("trl", run, 1)
    assert len(list(elsewhere.iterdir())) == 2


def test_prune_of_a_resumed_run_never_touches_the_parent(tmp_path):
    parent = make_run(tmp_path)
    trl_ckpts(parent / "checkpoints", [10, 20])
    child = tmp_path / "child"
    child.mkdir()
    (child / "state.json").write_text(json.dumps({"backend": "trl", "status": "running"}))
    (child / "recipe.toml").write_text(f'[checkpoint]\ndir = "{parent / "checkpoints"}"\n')
    with pytest.raises(RlctlError, match="outside the run directory"):
        ck.prune("trl", child, 1)
    assert len(list((parent / "checkpoints").iterdir())) == 2


def test_prune_keeps_the_newest_complete_whatever_is_newer(tmp_path):
    run = make_run(tmp_path)
    trl_ckpts(run / "checkpoints", [10, 20, 30, 40], incomplete=[30, 40])
    assert [c.step for c in ck.prune("trl", run, 1)] == [10]
    assert [c.step for c in ck.find_checkpoints("trl", run)] == [20, 30, 40]
    assert ck.plan_prune([], 1) == []
    # a damaged recipe.toml in the run never makes pruning look elsewhere
    (run / "recipe.toml").write_text("checkpoint = 3\n")
    assert ck.checkpoint_dir(run) == run / "checkpoints"


def test_backend_layouts(tmp_path):
    # prime-rl: checkpoints/step_N/trainer (DCP, .metadata last) + run_default/checkpoints/step_N/orchestrator/
    # progress.pt, weights/step_N beside it (the real layout: tests/conformance/test_prime_rl.py)
    root = tmp_path / "prime"
    for s in (5, 10):
        (root / "checkpoints" / f"step_{s}" / "trainer").mkdir(parents=True)
        (root / "run_default" / "checkpoints" / f"step_{s}" / "orchestrator").mkdir(parents=True)
        (root / "run_default" / "checkpoints" / f"step_{s}" / "orchestrator" / "progress.pt").write_bytes(b"p")
        (root / "weights" / f"step_{s}").mkdir(parents=True)
    (root / "checkpoints" / "step_5" / "trainer" / ".metadata").write_bytes(b"m")
    c = ck.find_checkpoints("prime_rl", tmp_path, root)
    assert [(x.step, x.complete, len(x.extra_paths)) for x in c] == [(5, True, 2), (10, False, 2)]
    # verl: global_step_N complete up to latest_checkpointed_iteration.txt
    root = tmp_path / "verl"
    for s in (50, 100):  # the real layout: tests/conformance/test_verl.py
        (root / f"global_step_{s}" / "actor").mkdir(parents=True)
        (root / f"global_step_{s}" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"m")
    (root / "latest_checkpointed_iteration.txt").write_text("50")
    assert [(x.step, x.complete) for x in ck.find_checkpoints("verl", tmp_path, root)] == [(50, True), (100, False)]
    # OpenRLHF: DeepSpeed _actor/global_stepN + HF global_stepN_hf
    root = tmp_path / "orlhf"
    (root / "_actor" / "global_step10").mkdir(parents=True)
    (root / "_actor" / "latest").write_text("global_step10")
    (root / "global_step10_hf").mkdir()
    (root / "global_step10_hf" / "adapter_config.json").write_text("{}")
    (root / "global_step10_hf" / "tokenizer_config.json").write_text("{}")  # written last (tests/conformance)
    c = ck.find_checkpoints("openrlhf", tmp_path, root)
    # extra paths: _actor/global_step10 and _actor/latest (resuming reads it: tests/conformance/test_openrlhf.py)
    assert [(x.step, x.complete, len(x.extra_paths)) for x in c] == [(10, True, 2)]


def test_prime_rl_keep_last_is_enforced_during_the_run(tmp_path):
    run = make_run(tmp_path, "prime_rl", "outputs")
    root = run / "outputs"
    for s in (5, 10, 15, 20):  # prime-rl's layout (tests/conformance/test_prime_rl.py)
        (root / "checkpoints" / f"step_{s}" / "trainer").mkdir(parents=True)
        (root / "checkpoints" / f"step_{s}" / "trainer" / ".metadata").write_bytes(b"m")
        (root / "run_default" / "checkpoints" / f"step_{s}" / "orchestrator").mkdir(parents=True)
        (root / "run_default" / "checkpoints" / f"step_{s}" / "orchestrator" / "progress.pt").write_bytes(b"p")
        (root / "weights" / f"step_{s}").mkdir(parents=True)
    # prime-rl's own keep_last already took step 5's trainer checkpoint and weights; its orchestrator state stays
    shutil.rmtree(root / "checkpoints" / "step_5")
    shutil.rmtree(root / "weights" / "step_5")
    ck.prune_during_run(run, {"backend": "prime_rl", "checkpoint_dir": "outputs", "prune_during_run": True}, 2)
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["step_15", "step_20"]
    assert sorted(p.name for p in (root / "weights").iterdir()) == ["step_15", "step_20"]
    assert sorted(p.name for p in (root / "run_default" / "checkpoints").iterdir()) == ["step_15", "step_20"]
    assert "pruned" in (run / "rlctl-events.jsonl").read_text()


def test_disk_pressure_prunes_to_keep_last_never_below(tmp_path, monkeypatch):
    """A next checkpoint that would not fit: pruning goes to keep_last and no further (issue 32.4: the run is
    stopped after its last complete checkpoint instead); with no keep_last nothing is pruned."""
    from rlctl.runs.disk_pressure import check

    run = make_run(tmp_path)
    trl_ckpts(run / "checkpoints", [10, 20, 30])
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(100, 95, 5))
    assert check(run, {"backend": "trl", "keep_last": None}) is not None
    assert [c.step for c in ck.find_checkpoints("trl", run)] == [10, 20, 30]  # nothing allowed: the run stops
    short = check(run, {"backend": "trl", "keep_last": 2})
    assert short is not None and short.pruned == [10] and short.newest == 30
    assert [c.step for c in ck.find_checkpoints("trl", run)] == [20, 30]  # still short: keep_last stays
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**12, 10, 10**12))
    assert check(run, {"backend": "trl", "keep_last": 2}) is None


# ---- compare --------------------------------------------------------------------------------------------------

def test_metrics_compare_csv_and_plot(tmp_path, cli, monkeypatch):
    runs = tmp_path / "runs"
    for name, base in (("multisignal", 0.5), ("naive", 0.3)):
        d = runs / name
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"backend": "verl", "status": "finished", "started_at": 1}))
        (d / "stdout.log").write_text("".join(f"step:{s} - critic/score/mean:{base + s / 100}\n" for s in range(1, 6)))
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(runs))
    res = cli("metrics", "multisignal", "naive", "--csv", "--keys", "reward/mean")
    lines = res.out.strip().splitlines()
    assert lines[0] == "step,run,key,value" and len(lines) == 11
    assert "5,naive,reward/mean,0.35" in lines
    res = cli("metrics", "multisignal", "naive")
    assert "multisignal: reward/mean=0.55@5" in res.out
    pytest.importorskip("matplotlib")
    out = tmp_path / "cmp.png"
    assert cli("metrics", "multisignal", "naive", "--plot", str(out), "--keys", "reward/mean").code == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    res = cli("metrics", "multisignal", "--plot", str(out), "--keys", "nope")
    assert res.code == 2 and "no run has nope" in res.err and "reward/mean" in res.err


def test_status_table_and_detail_on_a_finished_run(tmp_path, cli, monkeypatch):
    runs = tmp_path / "runs"
    d = runs / "q-1"
    d.mkdir(parents=True)
    shutil.copy(FIXTURES / "trl/stdout.log", d / "stdout.log")
    (d / "state.json").write_text(json.dumps({"backend": "trl", "status": "finished", "started_at": 100.0,
                                              "ended_at": 160.0, "total_steps": 80, "exit_code": 0}))
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(runs))
    res = cli("status")
    assert "q-1" in res.out and "finished" in res.out and "80/80" in res.out and "1:00" in res.out
    det = json.loads(cli("status", "q-1", "--json").out)
    assert det["step"] == 80 and det["metrics"]["reward/mean"]["latest"] == 1
    assert any("truncated" in h["message"] for h in det["health"])
    assert det["doctor"] and det["doctor"].split(":")[0] in {"high_truncation", "zero_variance_groups"}
    assert cli("status", "nope").code == 2


def test_model_tiny_command(tmp_path, cli):
    pytest.importorskip("transformers")
    res = cli("model", "tiny", str(tmp_path / "m"), "--source", "random:llama?hidden=32&layers=1")
    assert res.code == 0
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["hidden_size"] == 32 and cfg["num_hidden_layers"] == 1
    assert (tmp_path / "m" / "tokenizer.json").is_file()
    res = cli("model", "tiny", str(tmp_path / "x"), "--source", "random:gpt9")
    assert res.code == 2 and "unknown architecture" in res.err
    assert not os.path.exists(tmp_path / "x")


def test_wandb_run_id_is_stable_across_resume(tmp_path):
    from rlctl.runs.launch import wandb_run_id

    first = tmp_path / "first-20261122-101010"
    first.mkdir()
    wid = wandb_run_id(first, None)
    assert wid == "first-20261122-101010"
    (first / "state.json").write_text(json.dumps({"wandb_run_id": wid}))
    second = tmp_path / "second-20261122-111111"
    second.mkdir()
    assert wandb_run_id(second, first) == wid


def test_keep_best_ranks_steps_by_a_quality_metric_not_by_any_eval_number(tmp_path):
    # prime-rl v0.8 / OpenRLHF log costs under eval/ too (turns, error %, response length): the best step is the one
    # with the best eval reward, not the one with the longest responses
    run = make_run(tmp_path)
    trl_ckpts(run / "checkpoints", [10, 20, 30, 40])
    rows = ((10, 0.2, 900.0, 1.0), (20, 0.7, 300.0, 1.0), (30, 0.4, 1500.0, 1.0), (40, 0.3, 200.0, 1.0))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "time": 0, "eval/gsm8k/response_length_mean": n, "eval/gsm8k/turns": turns,
                    "eval/gsm8k/reward": r}) + "\n" for s, r, n, turns in rows))
    best = ck.best_checkpoint(run)
    assert (best["step"], best["key"], best["value"]) == (20, "eval/gsm8k/reward", 0.7)
    ck.prune("trl", run, 1)  # keeps the best by default
    assert [c.step for c in ck.find_checkpoints("trl", run)] == [20, 40]


def test_quality_eval_key():
    from rlctl.runs.health import quality_eval_key

    assert quality_eval_key(["eval/a/response_length_mean", "eval/a/error", "eval/a/pass@1"]) == "eval/a/pass@1"
    assert quality_eval_key(["eval/a/turns", "eval/a/error", "eval/a/mean"]) == "eval/a/mean"
    assert quality_eval_key(["eval/a/error", "reward/mean"]) is None


def test_eval_of_a_verl_checkpoint_without_hf_weights_names_verls_merger(tmp_path, cli):
    """verl's checkpoint holds FSDP shards; its actor/huggingface/ has config and tokenizer only (unless "hf_model"
    is saved). `rlctl eval RUN --step N` said nothing useful; now exit 2 with verl's own merger command, and once the
    weights are there (merged, or saved with hf_model) the evaluator is given actor/huggingface."""
    from rlctl.evals.loop import model_dir

    run = make_run(tmp_path, "verl")
    shutil.copyfile(Path(__file__).parents[1] / "recipes" / "verl-qwen2.5-math-1.5b-1xh100.toml", run / "recipe.toml")
    root = run / "checkpoints" / "Qwen2.5-Math-1.5B-pi1-multisignal"  # the recipe's checkpoint.dir
    hf = root / "global_step_6" / "actor" / "huggingface"
    hf.mkdir(parents=True)  # what verl 0.9.1 wrote on the H100 (docs/gpu/verl-3.json's checkpoints)
    (root / "global_step_6" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"m")
    (hf / "config.json").write_text("{}")
    (hf / "tokenizer_config.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text("6")
    res = cli("eval", str(run), "--step", "6")
    assert res.code == 2, res.out + res.err
    assert "holds no model an evaluator can load" in res.err and "python -m verl.model_merger merge --backend fsdp" \
        in res.err and "hf_model" in res.err, res.err
    assert "Traceback" not in res.err
    (hf / "model.safetensors").write_bytes(b"w")
    assert model_dir(ck.find_checkpoints("verl", run)[0]) == str(hf)


def test_eval_of_a_verl_checkpoint_merges_it_with_verls_own_tool_and_scores_chat_prompts(tmp_path):
    _verl_merge_and_eval(tmp_path, lora=False)


def test_eval_of_a_verl_lora_checkpoint_loads_the_adapter_verls_merger_writes_not_the_frozen_base(tmp_path):
    """verl's FSDP LoRA actor saves peft's keys (base_layer + lora_A/lora_B) and lora_train_meta.json; verl's merger
    writes the frozen base to actor/huggingface/ and the adapter to actor/huggingface/lora_adapter/. rlctl's evaluator
    must load base + adapter: evaluating huggingface/ alone scores the untrained base under the trained step's name."""
    _verl_merge_and_eval(tmp_path, lora=True)


def test_eval_of_a_verl_fsdp2_lora_checkpoint_merges_verls_dtensor_shards(tmp_path):
    """verl renders LoRA with actor.strategy=fsdp2: its checkpoint manager then saves each rank's DTensor shards
    (FSDP_version 2 in fsdp_config.json). The checkpoint here is written by verl 0.9.1's own apply_fsdp2 and
    FSDPCheckpointManager over 2 gloo ranks on the CPU (tests/fixtures/verl_fsdp2_save.py); `rlctl eval` merges it
    with verl's merger (its DTensor path) and evaluates base + adapter, the adapter being the whole unsharded one."""
    _verl_merge_and_eval(tmp_path, lora=True, fsdp2=True)


def _verl_merge_and_eval(tmp_path, lora: bool, fsdp2: bool = False):
    """`rlctl eval RUN --step 6` on a checkpoint as verl 0.9.1 saves it (FSDP shard of the actor, fsdp_config.json,
    actor/huggingface/ with config + tokenizer): rlctl runs verl's own model merger (the released wheel, its heavy
    imports stubbed: tests/fixtures/verl_merger), then its evaluator generates on the CPU from verl's eval parquet —
    chat-message prompts rendered with the model's chat template, labels from reward_model.ground_truth — and the
    result lands in the run's stream."""
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import load_file

    from rlctl.recipe.tiny_model import make_tiny
    from tests.conformance._verl_support import CACHE, verl_root

    run = make_run(tmp_path, "verl")
    src = CACHE / "tiny-qwen2"  # rlctl's tiny Qwen2, as tests/test_gpu_verl_workers.py keeps it
    if not (src / "model.safetensors").is_file():
        make_tiny(src)
    actor = run / "checkpoints" / "global_step_6" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    weights = load_file(src / "model.safetensors")
    if fsdp2:
        w = subprocess.run([sys.executable, "-m", "tests.fixtures.verl_fsdp2_save", str(verl_root("0.9.1")),
                            str(src), str(actor)], cwd=Path(__file__).parents[1], capture_output=True, text=True,
                           timeout=300)
        assert w.returncode == 0, w.stderr[-3000:]
        assert json.loads((actor / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 2}
        shards = [torch.load(actor / f"model_world_size_2_rank_{i}.pt", weights_only=False) for i in (0, 1)]
        lora_a = next(k for k in shards[0] if k.endswith("q_proj.lora_A.default.weight"))
        assert type(shards[0][lora_a]).__name__ == "DTensor"
        whole_a = torch.cat([sh[lora_a].to_local() for sh in shards])  # Shard(0) over the 2 ranks
    elif lora:  # peft's names, as verl's FSDP engine wraps the model (q_proj and v_proj targeted, rank 4)
        g = torch.Generator().manual_seed(0)
        wrapped = {}
        for k, v in weights.items():
            if k.endswith(("q_proj.weight", "v_proj.weight")):
                stem = "base_model.model." + k[: -len(".weight")]
                wrapped[f"{stem}.base_layer.weight"] = v
                wrapped[f"{stem}.lora_A.default.weight"] = torch.randn(4, v.shape[1], generator=g).to(v.dtype)
                wrapped[f"{stem}.lora_B.default.weight"] = torch.randn(v.shape[0], 4, generator=g).to(v.dtype)
            else:
                wrapped["base_model.model." + k] = v
        weights = wrapped
        (actor / "lora_train_meta.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM"}))
    if not fsdp2:
        torch.save(weights, actor / "model_world_size_1_rank_0.pt")
        (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
        for f in ("config.json", "generation_config.json", "tokenizer.json"):
            shutil.copy(src / f, actor / "huggingface" / f)
    tok = json.loads((src / "tokenizer_config.json").read_text())
    tok["chat_template"] = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    (actor / "huggingface" / "tokenizer_config.json").write_text(json.dumps(tok))
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("6")
    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": f"{i} + 0 ="}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"index": i}} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (run / "recipe.toml").write_text(f"""name = "v"
[backend]
name = "verl"
version = "0.9.1"
[model]
path = "{src}"
max_model_len = 128
[data]
train = "{tmp_path / 'train.parquet'}"
eval = "{tmp_path / 'test.parquet'}"
input_key = "prompt"
max_prompt_tokens = 32
[rollout]
max_tokens = 4
[eval]
every = 2
temperature = 0.0
[checkpoint]
dir = "checkpoints"
every = 2
""")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent / "fixtures" / "verl_merger"),
           "RLCTL_TEST_REPO": str(Path(__file__).parents[1]), "RLCTL_TEST_VERL_ROOT": str(verl_root("0.9.1"))}
    r = subprocess.run([sys.executable, "-m", "rlctl.cli", "eval", str(run), "--step", "6", "--json"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "with verl's own tool: python -m verl.model_merger merge --backend fsdp" in r.stderr, r.stderr
    hf = actor / "huggingface"
    merged = load_file(hf / "model.safetensors")
    assert set(merged) == set(load_file(src / "model.safetensors"))  # verl's merger wrote the weights there
    res = json.loads(r.stdout)["results"][0]
    if lora:
        adapter = json.loads((hf / "lora_adapter" / "adapter_config.json").read_text())
        assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"], adapter
        assert res["step"] == 6 and res["model"] == str(hf / "lora_adapter") and not res["error"], res
        if fsdp2:
            saved = load_file(hf / "lora_adapter" / "adapter_model.safetensors")
            got = next(v for k, v in saved.items() if k.endswith("layers.0.self_attn.q_proj.lora_A.weight"))
            # the merger writes bf16 (model_merger/base_model_merger.py): the whole adapter, both ranks' rows
            assert "layers.0." in lora_a and torch.equal(got, whole_a.to(got.dtype)), (got.shape, whole_a.shape)
        spec = json.loads((run / "evals" / "step-6.json").read_text())
        assert spec["base_model"] == str(src), spec
    else:
        assert res["step"] == 6 and res["model"] == str(hf) and not res["error"], res
    assert "eval/default/greedy_pass@1" in res["metrics"], res
    spec = json.loads((run / "evals" / "step-6.json").read_text())
    assert spec["label_key"] == "reward_model.ground_truth", spec
    from rlctl.evals.job import read_rows

    assert read_rows(str(tmp_path / "test.parquet"), "prompt", "reward_model.ground_truth", None)[1] == (
        [{"role": "user", "content": "1 + 0 ="}], "1")
