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
    os.mkfifo(run / "in_loop_eval.json")  # the in-loop eval context the stream reads (rlctl.evals.in_loop)
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


# ---- issue 26: patch --dir, absurd numbers, run names, launch.sh without its checkout ----------------------------

MANIFEST = 'backend = "openrlhf"\npackage = "openrlhf"\nversion = "9.9.9"\n\n[[patch]]\nfile = "0001.patch"\n{extra}'
DIFF = "--- a/openrlhf/x.py\n+++ b/openrlhf/x.py\n@@ -1 +1 @@\n-a\n+b\n"


def _patch_dir(root: Path, manifest: str) -> Path:
    d = root / "sets"
    s = d / "openrlhf" / "9.9.9"
    s.mkdir(parents=True, exist_ok=True)
    (s / "0001.patch").write_text(DIFF)
    (s / "manifest.toml").write_text(manifest)
    return d


@pytest.mark.parametrize("extra,needles", [
    ("targets = 5\n", ["manifest.toml:7:", "`targets` must be a list of strings, not an integer"]),
    ('purpose = ["x"]\n', ["manifest.toml:7:", "`purpose` must be a string, not a list"]),
    ('targets = ["../../etc/passwd"]\n', ["manifest.toml:7:", "inside site-packages"]),
    ('frobnicate = 1\n', ["manifest.toml:7:", "`frobnicate` is not a [[patch]] key"]),
])
def test_patch_manifest_wrong_types_name_file_line_and_type(cli, world, extra, needles):
    d = _patch_dir(world, MANIFEST.format(extra=extra))
    for argv in (["patch", "list", "--dir", str(d)], ["patch", "apply", "openrlhf/9.9.9", "--dir", str(d)]):
        ok_error(cli(*argv), *needles)


def test_patch_manifest_top_level_types(cli, world):
    d = _patch_dir(world, MANIFEST.format(extra="").replace('version = "9.9.9"', "version = 9"))
    ok_error(cli("patch", "list", "--dir", str(d)), "manifest.toml:3:", "`version` must be a string, not an integer")
    d = _patch_dir(world, 'backend = "openrlhf"\npackage = "openrlhf"\nversion = "9.9.9"\npatch = 5\n')
    ok_error(cli("patch", "list", "--dir", str(d)), "manifest.toml:4:", "`patch` must be [[patch]] tables")
    d = _patch_dir(world, MANIFEST.format(extra="").replace('package = "openrlhf"', 'package = "open-rlhf"'))
    ok_error(cli("patch", "list", "--dir", str(d)), "manifest.toml:2:", "not a Python package name")


def test_patch_dir_of_garbage_is_an_error_saying_what_is_there(cli, world):
    g = world / "garbage"
    (g / "notes").mkdir(parents=True)
    (g / "README").write_text("hi")
    (g / "b" / "v").mkdir(parents=True)
    (g / "b" / "v" / "x.patch").write_text(DIFF)
    (g / "shallow").mkdir()
    (g / "shallow" / "manifest.toml").write_text("")
    res = cli("patch", "list", "--dir", str(g))
    ok_error(res, "holds no patch set", "README (a file, not a <backend>/ directory)", "b/v/ (no manifest.toml; 1 "
             ".patch files)", "shallow/manifest.toml (one level too shallow", "notes/ (empty)")
    (world / "empty").mkdir()
    ok_error(cli("patch", "list", "--dir", str(world / "empty")), "nothing (an empty directory)")
    one = _patch_dir(world, MANIFEST.format(extra="")) / "openrlhf" / "9.9.9"
    ok_error(cli("patch", "list", "--dir", str(one)), "this is one patch set", f"rlctl patch apply {one}")


def test_patch_dir_with_a_set_and_stray_entries_warns(cli, world):
    d = _patch_dir(world, MANIFEST.format(extra=""))
    (d / "stray.txt").write_text("x")
    (d / ".git").mkdir()
    res = cli("patch", "list", "--dir", str(d))
    assert res.code == 0 and "openrlhf/9.9.9  (user:" in res.out
    assert "warning" in res.err and "stray.txt" in res.err and ".git" not in res.err


@pytest.mark.parametrize("key,value", [("train.steps", "1000000000000"), ("train.episodes", "99999999999999"),
                                       ("resources.gpus_per_node", "1000000"), ("resources.nodes", "10000000000"),
                                       ("rollout.max_tokens", "1000000000000"), ("checkpoint.every", "1e308"),
                                       ("train.seed", "-1"), ("checkpoint.resume", "100000000000")])
def test_absurd_numbers_are_refused_naming_the_limit(cli, world, key, value):
    for cmd in ("preflight", "render"):
        res = cli(cmd, "q.toml", "--set", f"{key}={value}", cwd=world)
        ok_error(res, key.split(".")[-1])
        assert "expected" in res.err or "must be" in res.err


def test_a_dataset_derived_step_count_above_the_limit_fails_fast(cli, world):
    import time

    (world / "e.toml").write_text(QUICK.replace("steps = 80", "episodes = 1000000"))
    t = time.process_time()
    res = cli("preflight", "e.toml", cwd=world)
    assert time.process_time() - t < 10
    ok_error(res, "schedule.steps", "above rlctl's limit of 1000000", code=1)
    ok_error(cli("preflight", "e.toml", "--plot", "lr.png", cwd=world), "no LR curve", "above the limit")


@pytest.mark.parametrize("name,why", [("", "a run needs a name"), ("   ", "only whitespace"), ("a/b", "path separator"),
                                      ("..", "first character"), ("a\0b", "NUL"), ("x" * 101, "at most 100"),
                                      ("-x", "first character"), ("a b", "outside the allowed set")])
def test_launch_refuses_bad_run_names_before_anything_happens(cli, world, name, why):
    ok_error(cli("launch", "q.toml", "--name", name, "--detach", cwd=world), "--name", why)
    assert not (world / "runs").exists() or not any((world / "runs").iterdir())


def test_attach_refuses_bad_run_names(cli, world):
    (world / "train.log").write_text("step 1\n")
    ok_error(cli("attach", str(world / "train.log"), "--backend", "trl", "--name", "../x"), "--name", "path separator")


def test_prime_rl_launch_sh_without_its_checkout_says_what_to_set(cli, world):
    out = world / "rendered"
    res = cli("render", str(RECIPES / "prime-rl-qwen3-8b-2xh100.toml"), "--out", str(out))
    assert res.code in (0, 1), res.err
    env = {k: v for k, v in os.environ.items() if k != "PRIME_RL_DIR"}
    env["WANDB_API_KEY"] = "x"
    r = subprocess.run(["bash", str(out / "launch.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "unbound variable" not in r.stderr, r.stderr
    assert "PRIME_RL_DIR is not set" in r.stderr and "export PRIME_RL_DIR=" in r.stderr
    assert "backend.prime_rl.checkout" in r.stderr
