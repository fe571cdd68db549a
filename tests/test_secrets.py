"""Secrets: one rule (rlctl.backends.base.is_secret_name) decides, everywhere — environment, `--set`, backend extras,
argv records, sinks' config — and no secret value reaches any file rlctl writes or any sink."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from rlctl.backends.base import is_secret_name
from rlctl.errors import RecipeError
from rlctl.recipe.loader import load
from rlctl.runs.rundir import mask_argv, masked_recipe_data
from tests.conftest import RECIPES

SECRET_NAMES = ["HF_TOKEN", "DB_PASSWORD", "env.DB_PASSWORD", "WANDB_API_KEY", "OPENAI_KEY", "AWS_SECRET_ACCESS_KEY",
                "hub_token", "--wandb-api-key", "--api_key", "SENTRY_DSN", "MY_PASS", "auth", "GH_PAT_SECRET"]
NOT_SECRET = ["input_key", "label_key", "prompt_key", "reward_key", "max_tokens", "TOKENIZERS_PARALLELISM",
              "tokenizer", "keep_last", "PASSAGE", "NCCL_IB_GID_INDEX", "--use_wandb", "monkey"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET)
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_argv_record_masks_by_the_same_rule():
    argv = ["rlctl", "launch", "r.toml", "--set", "env.DB_PASSWORD=hunter2", "--set=env.X_TOKEN=abc",
            "HF_TOKEN=zz", "--api-key", "sk-1", "--api-key=sk-2", "--set", "data.input_key=prompt", "see tok-9876"]
    masked = mask_argv(argv, {"SOME_TOKEN": "tok-9876"})
    text = " ".join(masked)
    for secret in ("hunter2", "abc", "zz", "sk-1", "sk-2", "tok-9876"):
        assert secret not in text
    assert "data.input_key=prompt" in masked  # a data field is not a secret


def test_recipe_record_masks_every_secret_named_key():
    data = {"env": {"DB_PASSWORD": "pw", "A": "1"}, "reward": {"environment": {"args": {"api_key": "k"}}},
            "backend": {"trl": {"extra": {"hub_token": "t", "input_key": "p"}}}}
    out = json.dumps(masked_recipe_data(data))
    assert '"pw"' not in out and '"k"' not in out and '"t"' not in out
    assert "${DB_PASSWORD}" in out and '"p"' in out


def test_a_literal_secret_outside_env_is_an_error_naming_the_line(tmp_path):
    base = RECIPES / "quickstart.toml"
    r = tmp_path / "r.toml"
    r.write_text(f'extends = "{base}"\n\n[backend.trl.extra]\nhub_token = "hf_planted_0000"\n')
    with pytest.raises(RecipeError, match=r"r\.toml:4: `backend\.trl\.extra\.hub_token` holds a secret") as e:
        load(r)
    assert "hf_planted_0000" not in str(e.value)
    with pytest.raises(RecipeError, match="^--set reward.environment.args.api_key: `reward.environment.args.api_key` "
                                                "holds a secret"):
        load(base, ["reward.function=''", "reward.environment.id=x", "reward.environment.args.api_key=sk-1"])
    load(base, ["env.DB_PASSWORD=pw"])  # in [env] a secret goes to the run's environment only


PLANTED = {
    "env": "planted-env-token-5f3a9c",  # SERVICE_TOKEN in the environment, referenced from [env]
    "set": "planted-set-password-77d1",  # --set env.DB_PASSWORD=...
    "wandb": "planted-wandb-key-0123456789abcdef01234567",  # WANDB_API_KEY in the environment
    "extra": "planted-extra-hubtoken-9e9e",  # backend.trl.extra.hub_token: refused
}

REWARD = '''import hashlib, os
def reward_func(completions, **kwargs):
    seen = hashlib.sha256(os.environ.get("DB_PASSWORD", "").encode()).hexdigest() == "{digest}"
    seen = seen and os.environ.get("SERVICE_TOKEN", "") != ""
    with open(os.path.join(os.environ["RLCTL_RUN_DIR"], "secrets-reached-the-run"), "w") as fh:
        fh.write("yes" if seen else "no")
    return [float(str(c).count("a")) / max(len(str(c)), 1) for c in completions]
'''


@pytest.mark.slow
def test_quickstart_launch_writes_no_planted_secret(tmp_path):
    pytest.importorskip("trl")
    runs = tmp_path / "runs"
    env = dict(os.environ, RLCTL_RUNS_DIR=str(runs), SERVICE_TOKEN=PLANTED["env"], WANDB_API_KEY=PLANTED["wandb"],
               WANDB_MODE="offline", WANDB_SILENT="true", RLCTL_MODEL_CACHE=str(tmp_path / "models"),
               HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    shutil.copytree(RECIPES / "quickstart", tmp_path / "quickstart")
    (tmp_path / "quickstart" / "reward.py").write_text(
        REWARD.replace("{digest}", hashlib.sha256(PLANTED["set"].encode()).hexdigest()))
    shutil.copy(RECIPES / "quickstart.toml", tmp_path / "q.toml")
    recipe = tmp_path / "q.toml"
    recipe.write_text(recipe.read_text() + '\n[env]\nSERVICE_TOKEN = "${SERVICE_TOKEN}"\n')
    wandb_sink = []
    try:
        import wandb  # noqa: F401

        wandb_sink = ["--set", 'logging.rlctl_sinks=["wandb"]', "--set", "logging.wandb.project=p",
                      "--set", "logging.wandb.offline=true"]
    except ImportError:
        pass

    def rlctl(*args):
        return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)

    # a secret under a backend's extra is refused before anything is written
    r = rlctl("launch", str(recipe), "--smoke", "--set", f"backend.trl.extra.hub_token={PLANTED['extra']}")
    assert r.returncode == 2 and "holds a secret" in r.stderr and "Traceback" not in r.stderr
    assert PLANTED["extra"] not in r.stderr + r.stdout
    assert not runs.exists() or not any(runs.iterdir())

    r = rlctl("launch", str(recipe), "--smoke", "--set", f"env.DB_PASSWORD={PLANTED['set']}", *wandb_sink)
    assert r.returncode == 0, r.stderr[-3000:]
    for secret in PLANTED.values():
        assert secret not in r.stdout + r.stderr
    (run,) = [d for d in runs.iterdir() if d.is_dir()]
    assert (run / "secrets-reached-the-run").read_text() == "yes"  # the run had them, in its environment
    files = [f for f in run.rglob("*") if f.is_file() and not f.is_symlink()]
    assert len(files) > 5
    for f in files:
        data = f.read_bytes()
        for what, secret in PLANTED.items():
            assert secret.encode() not in data, f"{what} secret in {f.relative_to(run)}"
    env_json = json.loads((run / "env.json").read_text())
    assert any("DB_PASSWORD=<masked>" in a for a in env_json["argv"])
    assert "${DB_PASSWORD}" in (run / "recipe.toml").read_text()


def test_ray_executor_keeps_secrets_out_of_the_job_and_its_spec(tmp_path, monkeypatch, capsys):
    """No Ray needed: what the Ray executor would submit. Secrets (a ${REF} of the plan, or a secret name) are
    never among the job's runtime env variables nor in the spec written to the run directory; the head rlctl starts
    gets their values in its environment; a cluster given by address is not sent them, and launch says so."""
    from types import SimpleNamespace

    from rlctl.backends.base import LaunchPlan
    from rlctl.executors.ray import LocalHead, RayExecutor, secret_values

    monkeypatch.setenv("MY_TOKEN_SOURCE", "tok-not-real-1")
    monkeypatch.setenv("WANDB_API_KEY", "wk-not-real-2")
    plan = LaunchPlan("x", None, ["python3", "train.py"], env={"SERVICE_TOKEN": "${MY_TOKEN_SOURCE}", "A": "b",
                                                                 "WANDB_API_KEY": "${WANDB_API_KEY}"})
    env = {**os.environ, "SERVICE_TOKEN": "tok-not-real-1", "A": "b", "RLCTL_RUN_DIR": str(tmp_path)}
    recipe = SimpleNamespace(resources=SimpleNamespace(ray_address=None, pip=[], gpus_per_node=0))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = RayExecutor().prepare(tmp_path, {}, env, plan, recipe, None)
    assert "SERVICE_TOKEN" not in spec["env_keys"] and "WANDB_API_KEY" not in spec["env_keys"]
    assert "A" in spec["env_keys"] and "RLCTL_RUN_DIR" in spec["env_keys"]
    assert spec["secret_env"] == {"SERVICE_TOKEN": "MY_TOKEN_SOURCE", "WANDB_API_KEY": "WANDB_API_KEY"}
    assert "not-real" not in json.dumps(spec)
    values = secret_values(spec["secret_env"])
    assert values == {"SERVICE_TOKEN": "tok-not-real-1", "WANDB_API_KEY": "wk-not-real-2"}
    head = LocalHead(tmp_path, 0, values)
    assert head.secrets["SERVICE_TOKEN"] == "tok-not-real-1"  # the head's environment: inherited by the job
    shutil.rmtree(head.temp_dir, ignore_errors=True)
    recipe.resources.ray_address = "http://head.example:8265"
    spec = RayExecutor().prepare(tmp_path, {}, env, plan, recipe, None)
    assert "not sent to the Ray cluster at http://head.example:8265" in capsys.readouterr().err
    assert "SERVICE_TOKEN" not in spec["env_keys"]


def test_an_extra_put_directly_under_backend_is_one_error_saying_where_extras_go(tmp_path):
    """`[backend] extra = { hub_token = "x" }` gave the secret refusal beside "unknown key `backend.extra`. Did you
    mean `backend.name`?": one error now, at its line, naming [backend.trl.extra] and the secret's advice."""
    r = tmp_path / "r.toml"
    r.write_text(f'extends = "{RECIPES / "quickstart.toml"}"\n\n[backend]\nextra = {{ hub_token = "x" }}\n')
    with pytest.raises(RecipeError) as e:
        load(r)
    msg = str(e.value)
    assert msg.startswith(f"{r}:4: ") and msg.count(f"{r}:") == 1, msg
    assert "[backend.trl.extra]" in msg and "backend.name" not in msg, msg
    assert "`backend.extra.hub_token` holds a secret" in msg and "export HF_TOKEN" in msg, msg
    r.write_text(f'extends = "{RECIPES / "quickstart.toml"}"\n\n[backend.extra]\nbeta = 0.1\n')
    with pytest.raises(RecipeError, match=r"r\.toml:3: .*\[backend\.trl\.extra\]") as e:
        load(r)
    assert "\n" not in str(e.value).split("\n  fix:")[0], str(e.value)
