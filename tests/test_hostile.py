"""A hostile user, case by case: each input gets a message that says what, where and the fix, exit 2 (usage or
input error) or 1 (a check failed), and never a traceback. The property test (test_cli_properties.py) covers the
space; these pin the cases the issue names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RECIPES

QUICK = (RECIPES / "quickstart.toml").read_text()


@pytest.fixture
def world(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(RECIPES / "quickstart", tmp_path / "quickstart")
    (tmp_path / "q.toml").write_text(QUICK)
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path


def ok_error(res, *needles, code=2):
    text = res.out + res.err
    assert "Traceback" not in text and "internal error" not in text, text
    assert res.code == code, (res.code, text)
    for n in needles:
        assert n in text, (n, text)


@pytest.mark.parametrize("argv", [["frobnicate"], ["status", "--bogus"], ["logs"], ["logs", "x", "-n", "abc"],
                                  ["ckpt", "prune", "r"], ["launch", "q.toml", "--grace", "nan"],
                                  ["status", "--interval", "0", "--watch"], ["stop", "r", "--grace", "-1"]])
def test_usage_errors_exit_2(cli, world, argv):
    ok_error(cli(*argv, cwd=world))


def test_usage_errors_through_the_console_script(world):
    """typer >= 0.29 keeps click in typer._click: the entry point must still turn its errors into exit 2."""
    for argv in ([], ["frobnicate"], ["status", "--bogus"]):
        r = subprocess.run([sys.executable, "-m", "rlctl.cli", *argv], capture_output=True, text=True, cwd=world,
                           timeout=60)
        assert "Traceback" not in r.stdout + r.stderr and r.returncode == 2, (argv, r.returncode, r.stderr)


def test_os_errors_name_the_path_and_the_fix(cli, world):
    ok_error(cli("preflight", "x" * 300 + ".toml", cwd=world), "File name too long", "shorter file name")
    (world / "loop-a.toml").symlink_to(world / "loop-b.toml")
    (world / "loop-b.toml").symlink_to(world / "loop-a.toml")
    ok_error(cli("render", "loop-a.toml", cwd=world), "loop-a.toml")
    (world / "afile").write_text("x")
    ok_error(cli("render", "q.toml", "--out", "afile/sub", cwd=world), "afile/sub", "not a directory")
    ok_error(cli("preflight", "q.toml", "--plot", "nodir/lr.png", cwd=world), "--plot", "mkdir -p nodir")
    ok_error(cli("preflight", "q.toml", "--plot", "lr.xyz", cwd=world), "--plot", "unknown picture format")


def test_permission_denied_is_named(cli, world, monkeypatch):
    target = world / "q.toml"
    real = Path.open

    def deny(self, *a, **k):  # tests run as root, which ignores modes: simulate what a user gets
        if self == target:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "open", deny)
    ok_error(cli("render", "q.toml", cwd=world), "q.toml", "Permission denied")


def test_fifos_and_devices_never_hang(cli, world):
    os.mkfifo(world / "fifo.toml")
    ok_error(cli("preflight", "fifo.toml", cwd=world), "not a regular file")
    ok_error(cli("preflight", "/dev/zero", cwd=world), "not a regular file")
    os.mkfifo(world / "fifo.jsonl")
    ok_error(cli("preflight", "q.toml", "--set", f'data.train="{world / "fifo.jsonl"}"', cwd=world),
             "fifo.jsonl", "not a regular file")
    run = world / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "state.json").write_text(json.dumps({"status": "finished", "backend": "trl"}))
    os.mkfifo(run / "stdout.log")
    os.mkfifo(run / "metrics.jsonl")
    res = cli("status", "r1", cwd=world)
    assert res.code == 0 and "Traceback" not in res.err


def test_a_damaged_state_breaks_nothing_else(cli, world):
    runs = world / "runs"
    for name, content in {"good": json.dumps({"status": "finished", "backend": "trl", "started_at": 5}),
                          "bad": '{"status": "runn', "binary": "\x00\x01\x02",
                          "types": json.dumps({"status": 3, "started_at": "yesterday", "pid": "x",
                                               "total_steps": "many", "backend": ["trl"]})}.items():
        (runs / name).mkdir(parents=True)
        (runs / name / "state.json").write_text(content)
    res = cli("status", cwd=world)
    assert res.code == 0 and "good" in res.out and "types" in res.out, res.err
    for name in ("bad", "binary", "types"):
        res = cli("status", name, cwd=world)
        assert res.code == 0 and "Traceback" not in res.err and "internal error" not in res.err, res.err


def test_models_data_and_rewards_that_cannot_work(cli, world):
    m = world / "model-list"
    m.mkdir()
    (m / "config.json").write_text("[1, 2]")
    res = cli("preflight", "q.toml", "--set", f'model.path="{m}"', "--only", "reference", cwd=world)
    ok_error(res, "config.json holds a list", "re-download", code=1)
    (m / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2,
                                               "num_attention_heads": 0, "vocab_size": 10}))
    res = cli("preflight", "q.toml", "--set", f'model.path="{m}"', "--only", "reference", cwd=world)
    ok_error(res, "num_attention_heads = 0", code=1)
    res = cli("preflight", "q.toml", "--set", f'model.path="{world / "nope"}"', "--only", "reference", cwd=world)
    ok_error(res, "does not exist", "--set model.path", code=1)
    (world / "trunc.parquet").write_bytes(b"PAR1" + b"\x00" * 40)
    res = cli("preflight", "q.toml", "--set", f'data.train="{world / "trunc.parquet"}"', cwd=world)
    ok_error(res, "trunc.parquet", "not a readable Parquet file", "truncated")
    res = cli("preflight", "q.toml", "--set", f'data.eval="{world / "missing.jsonl"}"', "--only", "reference",
              cwd=world)
    ok_error(res, "data.eval", "does not exist", code=1)
    (world / "quickstart" / "reward.py").write_text("def other(completions, **kw):\n    return [0.0]\n")
    res = cli("preflight", "q.toml", "--only", "reference.reward", cwd=world)
    ok_error(res, "defines no 'reward_func'", 'reward.function_name = "other"', code=1)
    (world / "quickstart" / "reward.py").write_text("import os\n\ndef reward_func(:\n")
    res = cli("preflight", "q.toml", "--only", "reference.reward", cwd=world)
    ok_error(res, "reward.py:3", "not valid Python", code=1)
    (world / "quickstart" / "reward.py").unlink()
    res = cli("preflight", "q.toml", "--only", "reference.reward", cwd=world)
    ok_error(res, "q.toml:", "reward.function", "does not exist", code=1)
    assert not (world / "quickstart" / "__pycache__").exists()  # parsed, never imported


def test_non_finite_numbers_are_refused_with_the_line(cli, world):
    (world / "inf.toml").write_text(QUICK.replace("temperature = 1.0", "temperature = inf"))
    ok_error(cli("preflight", "inf.toml", cwd=world), "inf.toml:", "rollout.temperature", "finite number")
    ok_error(cli("preflight", "q.toml", "--set", "algorithm.kl_coef=nan", cwd=world), "--set",
             "algorithm.kl_coef", "finite number")
    ok_error(cli("render", "q.toml", "--set", "optim.lr=1e400", cwd=world), "optim.lr", "finite number")


def test_only_with_an_unknown_family_is_a_usage_error(cli, world):
    ok_error(cli("preflight", "q.toml", "--only", "nope", cwd=world), "--only nope", "families:", "schedule",
             "reference")


def test_model_tiny_never_overwrites_a_real_model(cli, world):
    m = world / "real-model"
    m.mkdir()
    (m / "config.json").write_text("{}")
    ok_error(cli("model", "tiny", str(m), cwd=world), "not an rlctl tiny model", "Nothing was written")
    assert (m / "config.json").read_text() == "{}"


def test_a_hostile_environment(world, tmp_path):
    """An ASCII-only terminal, NETRC at /dev/zero, a runs root that is a file: answers, not crashes or hangs."""
    base = dict(os.environ, RLCTL_RUNS_DIR=str(world / "runs"))
    base.pop("RLCTL_DEBUG", None)
    (world / "afile").write_text("x")
    cases = [({"PYTHONIOENCODING": "ascii"}, ["preflight", "q.toml"], {0}),
             ({"NETRC": "/dev/zero", "WANDB_API_KEY": ""}, ["preflight", "q.toml", "--set", "logging.wandb.project=p",
                                                           "--only", "env.wandb"], {1}),
             ({"RLCTL_RUNS_DIR": str(world / "afile")}, ["status"], {0}),
             ({"COLUMNS": "abc"}, ["status"], {0})]
    for extra, argv, codes in cases:
        env = {**base, **extra}
        r = subprocess.run([sys.executable, "-m", "rlctl.cli", *argv], capture_output=True, text=True, cwd=world,
                           env=env, timeout=60, stdin=subprocess.DEVNULL)
        text = r.stdout + r.stderr
        assert "Traceback" not in text and "internal error" not in text, (extra, text[-2000:])
        assert r.returncode in codes, (extra, r.returncode, text[-2000:])
