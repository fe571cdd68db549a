"""Patch sets against the real released OpenRLHF 0.9.3 source in a temporary site-packages."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import py_compile
import shutil
import stat
import sys
import types
from pathlib import Path

import pytest

from rlctl import patching
from rlctl.backends.openrlhf.metrics import parse as parse_openrlhf
from rlctl.errors import PatchError
from rlctl.resources import patches_dir

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch not installed")
SET = patches_dir() / "openrlhf" / "0.9.3"
EM = "openrlhf/trainer/ppo_utils/experience_maker.py"
TRAINER = "openrlhf/trainer/ppo_trainer.py"
DS = "openrlhf/utils/deepspeed/deepspeed.py"
ACTOR = "openrlhf/trainer/ray/ppo_actor.py"
SAVE_FIX = "0003-save-model-lora-zero3-shards.patch"
SYNC_FIX = "0004-broadcast-lora-merged-to-vllm.patch"
N = 4  # patches in the bundled 0.9.3 set


@pytest.fixture
def site(released_source, tmp_path):
    """A site-packages directory holding the released openrlhf 0.9.3 (package + dist-info), and a --python."""
    purelib = released_source("openrlhf", "0.9.3")
    wheel_root = purelib.parent.parent if purelib.name == "purelib" else purelib
    sp = tmp_path / "site-packages"
    sp.mkdir()
    shutil.copytree(purelib / "openrlhf", sp / "openrlhf")
    for d in wheel_root.glob("*.dist-info"):
        shutil.copytree(d, sp / d.name)
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH="{sp}" exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return sp, str(py)


def tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_locate_finds_the_package_without_importing_it(site):
    sp, py = site
    inst = patching.locate("openrlhf", py)
    assert inst.site == sp and inst.version == "0.9.3"
    with pytest.raises(PatchError, match="not installed"):
        patching.locate("no_such_package_xyz", py)


def test_bundled_set_status_apply_idempotent_revert(site, tmp_path):
    sp, py = site
    before = tree_hash(sp)
    ps = patching.load_set(SET)
    inst = patching.locate("openrlhf", py)
    # seed 001's save_model and LoRA weight sync fixes ship with the set, and the set says so (preflight's disk and
    # lora checks then trust it)
    assert [e.file.name for e in ps.patches][2:] == [SAVE_FIX, SYNC_FIX]
    assert ps.fixes == ["disk.lora_zero3", "lora.vllm_sync"]
    states, note = patching.status(ps, inst)
    assert [s.state for s in states] == ["not applied"] * N and note is None
    assert tree_hash(sp) == before  # status changes nothing

    out = patching.apply(ps, inst)
    assert out.changed == [e.file.name for e in ps.patches] and out.skipped == []
    assert [s.state for s in patching.status(ps, inst)[0]] == ["applied"] * N
    em = (sp / EM).read_text()
    assert "if isinstance(value, bool) or not isinstance(value, (int, float)):" in em
    assert 'os.environ.get("RLCTL_METRICS_FILE")' in (sp / TRAINER).read_text()
    assert "_rlctl_full_model_files(output_dir)" in (sp / DS).read_text()
    assert "_rlctl_merged(layer, param)" in (sp / ACTOR).read_text()
    for t in (EM, TRAINER, DS, ACTOR):
        py_compile.compile(str(sp / t), cfile=str(tmp_path / "check.pyc"), doraise=True)
    rec = json.loads((sp / ".rlctl-patches-openrlhf.json").read_text())
    assert set(rec["openrlhf/0.9.3"]["applied"]) == {e.file.name for e in ps.patches}

    again = patching.apply(ps, inst)
    assert again.changed == [] and len(again.skipped) == N

    patching.revert(ps, inst)
    after = tree_hash(sp)
    assert after == before  # byte for byte, record removed too


def test_patched_metrics_hook_writes_json_lines_rlctl_reads(site, tmp_path, monkeypatch):
    """Run the patched save_logs_and_checkpoints (taken from the patched file) and parse what it wrote."""
    sp, py = site
    patching.apply(patching.load_set(SET), patching.locate("openrlhf", py))
    src = (sp / TRAINER).read_text()
    fn = next(n for n in ast.walk(ast.parse(src))
              if isinstance(n, ast.FunctionDef) and n.name == "save_logs_and_checkpoints")
    ns: dict = {"os": os, "torch": pytest.importorskip("torch"), "ray": None}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "patched", "exec"), ns)

    class Args:
        logging_steps = 1
        save_steps = 10**9

    class Trainer:
        args = Args()
        wandb_logger = None
        tensorboard_logger = None

    out = tmp_path / "backend_metrics.jsonl"
    monkeypatch.setenv("RLCTL_METRICS_FILE", str(out))
    import torch

    ns["save_logs_and_checkpoints"](Trainer(), 3, {"policy_loss": 0.25, "reward": torch.tensor(0.5),
                                                   "kl": float("nan"), "generated_samples": ["text", 1.0]})
    line = out.read_text().strip()
    assert json.loads(line) == {"global_step": 3, "policy_loss": 0.25, "reward": 0.5, "kl": None}
    assert parse_openrlhf(line) == {"step": 3, "policy_loss": 0.25, "reward/mean": 0.5, "kl": None}


class _Config:
    tie_word_embeddings = False

    def to_json_file(self, path: str) -> None:
        Path(path).write_text("{}")


class _Tokenizer:
    def save_pretrained(self, d: str) -> None:
        (Path(d) / "tokenizer_config.json").write_text("{}")


def _patched_save(sp: Path, out: Path, lora: bool) -> None:
    """The patched strategy.save_model of the release, under ZeRO-3 on rank 0, with a model whose save_pretrained
    writes what seed 001 saw a PeftModel leave (the adapter and the full model's shards) and, without LoRA, the
    full model. What runs is OpenRLHF's code; torch is real, peft/deepspeed/dist are stubs (tests/conformance)."""
    import torch

    from tests.conformance._openrlhf_support import OpenRLHF

    weights = {"w.weight": torch.zeros(2), "w.lora_A.weight": torch.ones(2)}
    with OpenRLHF("0.9.3", {"openrlhf.utils.deepspeed.deepspeed"}, root=sp) as o:
        ds = o.module("openrlhf.utils.deepspeed.deepspeed")
        ds.get_peft_model_state_dict = lambda model, sd: {k: v for k, v in sd.items() if "lora_" in k}  # peft's

        class Model(ds.PeftModel if lora else object):  # ds.PeftModel: the stubbed peft's class save_model checks
            config = _Config()

            def state_dict(self):
                return dict(weights)

            def save_pretrained(self, d, state_dict=None, **kw):
                if lora:
                    (Path(d) / "adapter_model.safetensors").write_bytes(b"a")
                    (Path(d) / "adapter_config.json").write_text("{}")
                for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
                    (Path(d) / n).write_bytes(b"s" * 1000)
                (Path(d) / "model.safetensors.index.json").write_text("{}")

        engine = types.SimpleNamespace(module=Model(), _consolidated_16bit_state_dict=lambda: dict(weights))
        strategy = ds.DeepspeedStrategy.__new__(ds.DeepspeedStrategy)
        strategy.args = types.SimpleNamespace(zero_stage=3, ds_tensor_parallel_size=1)
        strategy.stage, strategy.ds_tensor_parallel_size = 3, 1
        strategy.is_rank_0 = lambda: True
        strategy.save_model(engine, _Tokenizer(), str(out))


def test_patched_save_model_removes_the_lora_zero3_shards(site, tmp_path, capsys):
    """Seed 001 §4: a LoRA save under ZeRO-3 leaves full-model shards next to the adapter; the bundled set's save
    fix removes them (and their index), keeps the adapter, config and tokenizer, and says what it removed."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sp, py = site
    patching.apply(patching.load_set(SET), patching.locate("openrlhf", py))
    out = tmp_path / "global_step10_hf"
    out.mkdir()
    (out / "pytorch_model.bin").write_bytes(b"theirs")  # in the directory before the save: not the save's to remove
    _patched_save(sp, out, lora=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json", "adapter_model.bin", "config.json", "pytorch_model.bin", "tokenizer_config.json"]
    assert (out / "pytorch_model.bin").read_bytes() == b"theirs"
    assert "rlctl: removed 3 full-model weight files" in capsys.readouterr().out

    full = tmp_path / "full_hf"  # without LoRA the full model is what the save is for: every file stays
    _patched_save(sp, full, lora=False)
    assert sorted(p.name for p in full.iterdir()) == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "tokenizer_config.json"]


def _four_patch_set(tmp_path: Path, sp: Path, break_third: bool) -> patching.PatchSet:
    """Four patches over four files of the real source; the third can be made not to apply."""
    d = tmp_path / "userset" / "openrlhf" / "0.9.3"
    d.mkdir(parents=True)
    shutil.copy(SET / "0001-experience-maker-numeric-extra-logs.patch", d / "a.patch")
    shutil.copy(SET / "0002-metrics-jsonl.patch", d / "b.patch")
    files = {"c.patch": "openrlhf/cli/train_ppo_ray.py", "d.patch": "openrlhf/models/loss.py"}
    for name, target in files.items():
        first = (sp / target).read_text().splitlines()[0]
        if break_third and name == "c.patch":  # removes a line the file does not have: cannot apply
            body = f"--- a/{target}\n+++ b/{target}\n@@ -1,1 +1,1 @@\n-{first} # not in the file\n+# rlctl\n"
        else:
            body = f"--- a/{target}\n+++ b/{target}\n@@ -1,1 +1,2 @@\n {first}\n+# rlctl test line\n"
        (d / name).write_text(body)
    entries = "\n".join(f'[[patch]]\nfile = "{n}"\npurpose = "test {n}"\n' for n in
                        ("a.patch", "b.patch", "c.patch", "d.patch"))
    (d / "manifest.toml").write_text(f'backend = "openrlhf"\npackage = "openrlhf"\nversion = "0.9.3"\n{entries}')
    return patching.load_set(d, "user")


def test_third_of_four_failing_leaves_the_tree_untouched(site, tmp_path):
    sp, py = site
    ps = _four_patch_set(tmp_path, sp, break_third=True)
    inst = patching.locate("openrlhf", py)
    before = tree_hash(sp)
    states, _ = patching.status(ps, inst)
    assert [s.state for s in states] == ["not applied", "not applied", "conflicting", "not applied"]
    with pytest.raises(PatchError, match="c.patch is conflicting"):
        patching.apply(ps, inst)
    assert tree_hash(sp) == before


def test_failure_mid_apply_restores_every_file(site, tmp_path, monkeypatch):
    """The pre-check passes, then the third patch fails while applying (e.g. disk full): full restore."""
    sp, py = site
    ps = _four_patch_set(tmp_path, sp, break_third=False)
    inst = patching.locate("openrlhf", py)
    before = tree_hash(sp)
    real = patching._run_patch
    calls = {"n": 0}

    def flaky(args, site_dir, patch_file):
        if "--dry-run" not in args:
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError(28, "No space left on device")
        return real(args, site_dir, patch_file)

    monkeypatch.setattr(patching, "_run_patch", flaky)
    with pytest.raises(PatchError, match="restored"):
        patching.apply(ps, inst)
    assert calls["n"] == 3
    assert tree_hash(sp) == before


def test_permission_denied_changes_nothing(site, tmp_path, monkeypatch):
    sp, py = site
    inst = patching.locate("openrlhf", py)
    before = tree_hash(sp)
    target = sp / TRAINER
    if os.geteuid() == 0:  # root ignores modes: make access() report what a read-only install reports
        real = os.access
        monkeypatch.setattr(patching.os, "access", lambda p, m: False if str(p) == str(target) else real(p, m))
    else:
        target.chmod(stat.S_IRUSR)
    with pytest.raises(PatchError, match="not writable"):
        patching.apply(patching.load_set(SET), inst)
    assert tree_hash(sp) == before


def test_partly_applied_and_conflicting(site, tmp_path):
    sp, py = site
    d = tmp_path / "combo"
    d.mkdir()
    (d / "both.patch").write_text((SET / "0001-experience-maker-numeric-extra-logs.patch").read_text()
                                  + (SET / "0002-metrics-jsonl.patch").read_text())
    (d / "manifest.toml").write_text('backend = "openrlhf"\npackage = "openrlhf"\nversion = "0.9.3"\n'
                                     '[[patch]]\nfile = "both.patch"\n')
    combo = patching.load_set(d)
    inst = patching.locate("openrlhf", py)
    assert patching.status(combo, inst)[0][0].state == "not applied"
    patching.apply(patching.load_set(SET), inst)
    patching._run_patch(["-R"], sp, SET / "0002-metrics-jsonl.patch")  # undo one file by hand
    assert patching.status(combo, inst)[0][0].state == "partly applied"
    text = (sp / TRAINER).read_text().replace("self.tensorboard_logger.log_train(global_step, logs_dict)",
                                              "self.tensorboard_logger.log_train(global_step, dict(logs_dict))")
    (sp / TRAINER).write_text(text)
    states = [s.state for s in patching.status(patching.load_set(SET), inst)[0]]
    assert states == ["applied", "conflicting", "applied", "applied"]


def test_reinstall_wiping_patches_is_reported(site):
    sp, py = site
    pristine = (sp / EM).read_bytes()
    ps = patching.load_set(SET)
    inst = patching.locate("openrlhf", py)
    patching.apply(ps, inst)
    (sp / EM).write_bytes(pristine)  # what `pip install --force-reinstall openrlhf==0.9.3` does
    states, _ = patching.status(ps, inst)
    assert states[0].state == "not applied" and "reinstalled" in states[0].note
    assert states[1].state == "applied"


def test_version_mismatch(site):
    sp, py = site
    meta = next(sp.glob("openrlhf-0.9.3.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.9.3", "Version: 0.9.4"))
    inst = patching.locate("openrlhf", py)
    assert inst.version == "0.9.4"
    _, note = patching.status(patching.load_set(SET), inst)
    assert note == "set is for openrlhf 0.9.3, installed is 0.9.4"
    before = tree_hash(sp)
    with pytest.raises(PatchError, match="is for openrlhf 0.9.3, installed is 0.9.4"):
        patching.apply(patching.load_set(SET), inst)
    assert tree_hash(sp) == before


def test_malformed_patch_and_bad_manifests(site, tmp_path):
    sp, py = site
    d = tmp_path / "bad"
    d.mkdir()
    (d / "x.patch").write_text("this is not a diff at all\n")
    (d / "manifest.toml").write_text('backend = "openrlhf"\npackage = "openrlhf"\nversion = "0.9.3"\n'
                                     '[[patch]]\nfile = "x.patch"\ntargets = ["openrlhf/x.py"]\n')
    with pytest.raises(PatchError, match=r"manifest.toml:5: .*x.patch changes nothing"):  # refused on loading
        patching.load_set(d)
    (d / "x.patch").write_text("--- a/openrlhf/x.py\n+++ b/openrlhf/x.py\n@@ -1,2 +1,2 @@\ngarbage\n")
    inst = patching.locate("openrlhf", py)
    with pytest.raises(PatchError, match="not a valid patch"):
        patching.status(patching.load_set(d), inst)
    (d / "manifest.toml").write_text('backend = "openrlhf"\npackage = "openrlhf"\nversion = "0.9.3"\n'
                                     '[[patch]]\nfile = "missing.patch"\n')
    with pytest.raises(PatchError, match="missing.patch, which does not exist"):
        patching.load_set(d)
    (d / "manifest.toml").write_text("backend = [")
    with pytest.raises(PatchError, match="malformed TOML"):
        patching.load_set(d)
    with pytest.raises(PatchError, match="not a patch set"):
        patching.load_set(tmp_path)


def test_cli_patch_commands(site, cli, tmp_path):
    sp, py = site
    res = cli("patch", "list")
    assert res.code == 0 and "openrlhf/0.9.3" in res.out and "0002-metrics-jsonl.patch" in res.out
    res = cli("patch", "status", "--backend", "openrlhf", "--python", py, "--json")
    data = json.loads(res.out)
    assert data["installed"] == "0.9.3" and {p["state"] for p in data["patches"]} == {"not applied"}
    res = cli("patch", "apply", "openrlhf/0.9.3", "--python", py, "--dry-run")
    assert res.code == 0 and f"would apply {N}" in res.out and "checking file" in res.out
    assert [s.state for s in patching.status(patching.load_set(SET), patching.locate("openrlhf", py))[0]] == \
        ["not applied"] * N
    assert cli("patch", "apply", "openrlhf/0.9.3", "--python", py).code == 0
    assert "applied 0" in cli("patch", "apply", "openrlhf/0.9.3", "--python", py).out
    assert cli("patch", "revert", "openrlhf/0.9.3", "--python", py).code == 0
    res = cli("patch", "apply", "nope/1.0", "--python", py)
    assert res.code == 2 and "no patch set" in res.err
    res = cli("patch", "status", "--backend", "openrlhf", "--python", str(tmp_path / "no-python"))
    assert res.code == 2 and "cannot run" in res.err and "Traceback" not in res.err


# ---- interrupted transactions: real signals to a real `rlctl patch` process ---------------------------------------

FAKE_PATCH = """#!/bin/sh
# GNU patch, then (for a real change) a mark and a pause: the test signals rlctl while it is mid-transaction
"$REAL_PATCH" "$@"; rc=$?
case " $* " in *" --dry-run "*) exit $rc;; esac
n=$(ls "$MARKS" | wc -l)
touch "$MARKS/changed-$n"
sleep "$PAUSE"
exit $rc
"""


def _slow_patch_env(tmp_path, pause="3"):
    import shutil as _sh

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "patch").write_text(FAKE_PATCH)
    (bindir / "patch").chmod(0o755)
    marks = tmp_path / "marks"
    if marks.exists():
        _sh.rmtree(marks)
    marks.mkdir()
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", REAL_PATCH=_sh.which("patch"),
               MARKS=str(marks), PAUSE=pause)
    return env, marks


def _start(verb, py, env, cwd):
    import subprocess

    return subprocess.Popen([sys.executable, "-m", "rlctl.cli", "patch", verb, "openrlhf/0.9.3", "--python", py],
                            env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_first_change(marks, proc, timeout=60):
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(marks.iterdir()):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("the transaction never started")


@pytest.mark.parametrize("signame,group", [("SIGINT", True), ("SIGTERM", False), ("SIGHUP", False)])
def test_signal_mid_apply_restores_every_file(site, tmp_path, signame, group):
    import signal

    sp, py = site
    before = tree_hash(sp)
    env, marks = _slow_patch_env(tmp_path)
    proc = _start("apply", py, env, tmp_path)
    _wait_for_first_change(marks, proc)
    assert tree_hash(sp) != before  # the first patch is in: really mid-transaction
    sig = getattr(signal, signame)
    (os.killpg if group else os.kill)(proc.pid, sig)  # Ctrl-C reaches the whole group; TERM/HUP only rlctl
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"interrupted by {signame}" in err and "restored" in err and "Traceback" not in err
    assert tree_hash(sp) == before
    assert not list(sp.glob(".rlctl-patches-openrlhf.journal*"))


def test_signal_mid_revert_restores_the_applied_state(site, tmp_path):
    import signal

    sp, py = site
    patching.apply(patching.load_set(SET), patching.locate("openrlhf", py))
    applied = tree_hash(sp)
    env, marks = _slow_patch_env(tmp_path)
    proc = _start("revert", py, env, tmp_path)
    _wait_for_first_change(marks, proc)
    os.kill(proc.pid, signal.SIGHUP)  # a dropped SSH session
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert tree_hash(sp) == applied


def test_sigkill_mid_apply_is_repaired_by_patch_status(site, tmp_path, cli):
    import signal

    sp, py = site
    before = tree_hash(sp)
    env, marks = _slow_patch_env(tmp_path, pause="30")
    proc = _start("apply", py, env, tmp_path)
    _wait_for_first_change(marks, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # no handler can run: only the journal is left
    proc.communicate(timeout=30)
    assert (sp / ".rlctl-patches-openrlhf.journal" / "journal.json").is_file()
    assert tree_hash(sp) != before
    res = cli("patch", "status", "openrlhf/0.9.3", "--python", py)
    assert res.code == 0, res.err
    assert "interrupted apply of openrlhf/0.9.3" in res.out and "rolled back" in res.out
    assert {line.split()[0] for line in res.out.splitlines()[2:]} == {"not"}  # every patch: not applied
    after = tree_hash(sp)
    assert after == before
    # and the set applies cleanly afterwards
    assert cli("patch", "apply", "openrlhf/0.9.3", "--python", py).code == 0


def test_a_journal_of_a_live_transaction_is_left_alone(site, tmp_path):
    sp, py = site
    inst = patching.locate("openrlhf", py)
    ps = patching.load_set(SET)
    j = patching._Journal.begin(inst, ps, "apply", [EM])
    meta = json.loads((j.path / "journal.json").read_text())
    meta["pid"] = os.getppid()  # a live process that is not us
    meta["pid_create_time"] = None
    (j.path / "journal.json").write_text(json.dumps(meta))
    with pytest.raises(PatchError, match="another rlctl"):
        patching.apply(ps, inst)
    shutil.rmtree(j.path)
