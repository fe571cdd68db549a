"""`rlctl render`: golden files for the seeds' setups, version dialects, validation against backend definitions."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tomllib

import pytest

from rlctl.backends import get_backend
from rlctl.backends._static import argparse_flags, dataclass_fields, pydantic_key_paths
from rlctl.backends.base import LaunchPlan, load_snapshot
from rlctl.recipe.planning import prepare
from tests.conftest import RECIPES, ROOT

GOLDEN = ROOT / "tests" / "golden"
SEED_RECIPES = sorted(p.name for p in RECIPES.glob("*.toml"))


def normalized(text: str) -> str:
    return text.replace(str(RECIPES), "<RECIPES>")


@pytest.mark.parametrize("name", SEED_RECIPES)
def test_render_matches_golden(cli, name):
    res = cli("render", str(RECIPES / name))
    assert res.code == 0, res.err
    golden = GOLDEN / (name.removesuffix(".toml") + ".txt")
    text = normalized(res.out)
    if os.environ.get("RLCTL_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.is_file(), f"no golden file {golden}; run with RLCTL_UPDATE_GOLDEN=1 and review the diff"
    assert text == golden.read_text()


@pytest.mark.parametrize("name", SEED_RECIPES)
def test_seed_recipes_validate_clean_against_their_version(name):
    prep = prepare(RECIPES / name)
    errors = [f for f in prep.backend.validate(prep.plan, None) if f.level == "error"]
    assert errors == []


def test_openrlhf_seed_flags_as_the_seed_ran_them():
    plan = prepare(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml").plan
    argv = plan.argv
    assert argv[:3] == ["ray", "job", "submit"]
    entry = argv[argv.index("--") + 1:]
    assert entry[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]

    def val(flag):
        return entry[entry.index(flag) + 1]

    assert val("--vllm_num_engines") == "2" and val("--vllm_tensor_parallel_size") == "2"
    assert val("--actor_num_gpus_per_node") == "4"
    assert val("--vllm_gpu_memory_utilization") == "0.85"
    assert val("--n_samples_per_prompt") == "8" and val("--rollout_batch_size") == "16"
    assert val("--train_batch_size") == "16" and val("--micro_train_batch_size") == "1"
    assert val("--eps_clip") == "0.1" and val("--init_kl_coef") == "0.001"
    assert val("--generate_max_len") == "4096" and val("--prompt_max_len") == "1024"
    assert val("--zero_stage") == "3"
    # the seed ran --max_ckpt_num 3; its OOD probe (data.eval) is an eval set now, so rlctl rotates to keep_last = 3
    # plus the best-eval checkpoint, and OpenRLHF's own rotation (by age) gets a count it never reaches (issue 24)
    assert val("--max_ckpt_num") == "2147483647"
    assert "--disable_ds_ckpt" in entry and "--gradient_checkpointing" in entry
    i = entry.index("--target_modules")
    assert entry[i + 1:i + 5] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    # truthy turns W&B on; it is never the key itself (it is logged and sent as W&B config): the key reaches the job
    # as WANDB_API_KEY in the Ray runtime env, and OpenRLHF then skips wandb.login(key=<this value>)
    assert "--use_wandb" in entry and val("--use_wandb") == "env:WANDB_API_KEY"


def test_openrlhf_newest_renders_dotted_flags_that_exist():
    # the recipe's patch set is 0.9.3's: another release takes none (patching.recipe_set)
    prep = prepare(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml", ["backend.version=0.11.2",
                                                                         "backend.openrlhf.extra={}", 'patches.set=""'])
    entry = prep.plan.argv
    assert "--rollout.n_samples_per_prompt" in entry and "--n_samples_per_prompt" not in entry
    assert "--actor.adam.lr" in entry and "--ds.lora.rank" in entry
    assert entry[entry.index("--data.max_len") + 1] == str(1024 + 4096)
    errors = [f for f in prep.backend.validate(prep.plan, None) if f.level == "error"]
    assert errors == []


def test_flag_absent_from_version_is_reported_with_the_version(cli):
    # the seeds' --offload came from their own patch; stock OpenRLHF 0.9.3 has no such flag
    res = cli("render", str(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml"),
              "--set", "backend.openrlhf.extra.offload=true")
    assert res.code == 1
    assert "flag `--offload` does not exist in openrlhf 0.9.3" in res.err
    assert "snapshot of openrlhf==0.9.3" in res.err


def test_flat_flag_on_dotted_version_is_reported():
    prep = prepare(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml", ["backend.version=0.11.2", 'patches.set=""'])
    errors = [f for f in prep.backend.validate(prep.plan, None) if f.level == "error"]
    assert [f.key for f in errors] == ["--gradient_checkpointing_use_reentrant"]
    assert "0.11.2" in errors[0].message and "--actor.gradient_checkpointing_reentrant" in errors[0].fix


def test_prime_rl_v03_layout_matches_seed_config():
    prep = prepare(RECIPES / "prime-rl-qwen2.5-7b-1xh100-shared.toml")
    cfg = tomllib.loads(prep.plan.files["rl.toml"])
    # run in the prime-rl checkout's uv project from the run directory (tests/conformance/test_prime_rl.py)
    assert prep.plan.argv == ["uv", "run", "--project", "${PRIME_RL_DIR}", "rl", "@", "rl.toml"]
    assert cfg["inference_gpu_ids"] == [0] and cfg["trainer_gpu_ids"] == [0]
    assert cfg["max_steps"] == 1000
    assert cfg["output_dir"] == "outputs/checkpoints"  # checkpoint.dir: prime-rl writes everything under it
    assert cfg["trainer"]["model"]["seq_len"] == 2048
    assert cfg["trainer"]["model"]["ac"] == {"freq": 1}
    assert cfg["trainer"]["model"]["lora"] == {"rank": 8, "alpha": 32, "dropout": 0.0}
    assert cfg["trainer"]["loss"] == {"kl_tau": 0.0}
    assert cfg["orchestrator"]["batch_size"] == 8 and cfg["orchestrator"]["rollouts_per_example"] == 2
    assert cfg["orchestrator"]["seq_len"] == 2048
    assert cfg["orchestrator"]["sampling"]["max_tokens"] == 2000
    assert cfg["inference"]["gpu_memory_utilization"] == 0.5
    assert cfg["inference"]["model"] == {"max_model_len": 4096, "enforce_eager": True, "dtype": "bfloat16",
                                         "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}


def test_prime_rl_new_layout_and_wrong_section_key():
    prep = prepare(RECIPES / "prime-rl-qwen3-8b-2xh100.toml", ["backend.version=0.8.0", "backend.prime_rl.extra={}"])
    cfg = tomllib.loads(prep.plan.files["rl.toml"])
    assert cfg["orchestrator"]["group_size"] == 8
    assert cfg["orchestrator"]["train"]["sampling"]["max_completion_tokens"] == 4096
    assert cfg["deployment"] == {"type": "single_node", "num_train_gpus": 1, "num_infer_gpus": 1, "gpus_per_node": 2}
    assert cfg["orchestrator"]["train"]["source"][0]["legacy"]["id"] == "seconds-0/beautiful-soup-env"
    assert cfg["trainer"]["loss"] == {"type": "default", "kl_tau": 0.0}  # v0.8.0's default is 1e-3
    assert [f for f in prep.backend.validate(prep.plan, None) if f.level == "error"] == []
    # the seeds' mistake: seq_len at the top of the orchestrator vs where v0.3 wants it is fine, but
    # `orchestrator.lora_name` (an older layout) does not exist in v0.3.0
    prep = prepare(RECIPES / "prime-rl-qwen3-8b-2xh100.toml", ['backend.prime_rl.extra={"orchestrator.lora_name"="x"}'])
    errors = [f for f in prep.backend.validate(prep.plan, None) if f.level == "error"]
    assert [f.key for f in errors] == ["orchestrator.lora_name"]
    assert "prime-rl 0.3.0" in errors[0].message


def test_verl_overrides_as_the_seed_ran_them():
    plan = prepare(RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml").plan
    over = dict(a.split("=", 1) for a in plan.argv[3:])
    assert plan.argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert over["data.train_batch_size"] == "64"
    assert over["data.max_response_length"] == "1536" and over["data.max_prompt_length"] == "1024"
    assert over["actor_rollout_ref.actor.ppo_mini_batch_size"] == "64"
    assert over["actor_rollout_ref.rollout.n"] == "4"
    assert over["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.65"
    assert over["actor_rollout_ref.rollout.max_num_batched_tokens"] == "16384"
    assert over["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert over["trainer.total_training_steps"] == "220"
    assert over["trainer.resume_mode"] == "disable" and over["trainer.val_before_train"] == "True"
    assert over["trainer.save_freq"] == "50" and over["trainer.test_freq"] == "50"
    assert over["trainer.logger"] == "[console,wandb]"


def test_unknown_verl_key_is_reported():
    prep = prepare(RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml",
                   ['backend.verl.extra={"actor_rollout_ref.rollout.max_num_seqs_typo"=1}'])
    errors = [f for f in prep.backend.validate(prep.plan, None) if f.level == "error"]
    assert len(errors) == 1 and "verl 0.9.1" in errors[0].message


def test_render_out_writes_runnable_script_without_secrets(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "sk-very-secret-123")
    out = tmp_path / "out"
    res = cli("render", str(RECIPES / "prime-rl-qwen3-8b-2xh100.toml"), "--out", str(out))
    assert res.code == 0, res.err
    script = out / "launch.sh"
    assert script.stat().st_mode & stat.S_IXUSR
    assert (out / "rl.toml").is_file()
    text = script.read_text()
    assert '--project "${PRIME_RL_DIR}" rl @ rl.toml' in text
    assert "${WANDB_API_KEY:?" in text
    for f in out.iterdir():
        assert "sk-very-secret-123" not in f.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_script_refuses_to_run_without_the_secret(tmp_path):
    plan = LaunchPlan("x", None, ["true"], env={"WANDB_API_KEY": "${WANDB_API_KEY}", "A": "b c"})
    plan.write(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    r = subprocess.run(["bash", str(tmp_path / "launch.sh")], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "WANDB_API_KEY must be set" in r.stderr
    r = subprocess.run(["bash", str(tmp_path / "launch.sh")], env={**env, "WANDB_API_KEY": "k"})
    assert r.returncode == 0


def test_render_json(cli):
    res = cli("render", str(RECIPES / "quickstart.toml"), "--json")
    data = json.loads(res.out)
    assert data["backend"] == "trl" and data["total_steps"] == 80
    cfg = json.loads(data["files"]["trl_config.json"])
    assert cfg["grpo"]["num_generations"] == 8 and cfg["grpo"]["max_steps"] == 80


def test_trl_keys_validate_against_the_installed_trl():
    pytest.importorskip("trl")
    from rlctl.backends._static import installed_version

    prep = prepare(RECIPES / "quickstart.toml")
    known, version, source = prep.backend.definitions(installed_version("trl"), installed_version("trl"))
    assert source.startswith("installed")
    assert {"num_generations", "learning_rate", "max_steps", "beta"} <= known
    prep = prepare(RECIPES / "quickstart.toml", ['backend.trl.extra={max_prompt_length=10}'])
    errors = [f for f in prep.backend.validate(prep.plan, installed_version("trl")) if f.level == "error"]
    assert [f.key for f in errors] == ["max_prompt_length"]


# ---- the static readers, on sources shaped like the backends' ----------------------------------------------


def test_argparse_flags_reads_loops_and_multiline_calls():
    src = '''
import argparse
p = argparse.ArgumentParser()
p.add_argument("--a", type=int, default=1)
p.add_argument(
    "--b.c",
    action="store_true",
)
for prefix in ("actor", "critic"):
    p.add_argument(f"--{prefix}.adam.lr", type=float, default=1e-6 if prefix == "actor" else 9e-6)
'''
    flags = argparse_flags(src)
    assert set(flags) == {"--a", "--b.c", "--actor.adam.lr", "--critic.adam.lr"}
    assert flags["--a"] == {"type": "int", "default": 1}
    assert flags["--b.c"]["action"] == "store_true"


def test_pydantic_paths_follow_imports_and_aliases():
    sources = {
        "pkg.a": "from pydantic import BaseModel\nclass LoRAConfig(BaseModel):\n    rank: int = 8\n"
                 "class ModelConfig(BaseModel):\n    lora: LoRAConfig | None = None\n",
        "pkg.b": "from pkg.a import ModelConfig as MC\nfrom typing import Annotated\n"
                 "class LoRAConfig(BaseModel):\n    name: str = ''\n"
                 "class Root(BaseModel):\n    model: Annotated[MC, Field()] = MC()\n    x: dict = {}\n",
    }
    paths = pydantic_key_paths(sources, "Root")
    assert paths == {"model": "table", "model.lora": "table", "model.lora.rank": "value", "x": "value"}


def test_dataclass_fields_include_bases():
    sources = {"m": "class Base:\n    a: int = 1\nclass Child(Base):\n    b: int = 2\n    _private: int = 0\n"}
    assert dataclass_fields(sources, "Child") == ["a", "b"]


def test_snapshots_match_what_the_script_would_read():
    snap = load_snapshot("openrlhf", "0.9.3")
    assert "--n_samples_per_prompt" in snap["flags"] and "--offload" not in snap["flags"]
    snap = load_snapshot("openrlhf", "0.11.2")
    assert "--actor.adam.lr" in snap["flags"] and "--n_samples_per_prompt" not in snap["flags"]
    snap = load_snapshot("trl", "1.16.0")
    assert "num_generations" in snap["keys"] and "learning_rate" in snap["keys"]


def test_backends_are_registered_as_entry_points():
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="rlctl.backends")}
    assert {"openrlhf", "prime_rl", "verl", "trl"} <= names
    for n in names & {"openrlhf", "prime_rl", "verl", "trl"}:
        b = get_backend(n)
        assert b.name == n and b.known_versions


# ---- what preflight finds in the recipe alone is said at render too (issue 30 point 2.15) ---------------------------

@pytest.mark.parametrize("name,sets", [
    ("quickstart.toml", ["optim.warmup_steps=100000"]),
    ("verl-qwen2.5-math-1.5b-1xh100.toml", ["optim.warmup_steps=300"]),
    ("prime-rl-qwen3-8b-2xh100.toml", ["optim.warmup_ratio=1"]),
])
def test_render_says_a_warmup_longer_than_the_run(cli, name, sets):
    res = cli("render", str(RECIPES / name), *[a for s in sets for a in ("--set", s)])
    assert res.code == 1, (res.out, res.err)
    assert "error: schedule.warmup: warmup" in res.err and ">= the whole run" in res.err


@pytest.mark.parametrize("name", ["prime-rl-qwen3-8b-2xh100.toml", "verl-qwen2.5-math-1.5b-1xh100.toml",
                                  "command-torchrun-dr-grpo.toml", "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml"])
def test_render_says_a_trainer_without_gpus(cli, name):
    res = cli("render", str(RECIPES / name), "--set", "resources.trainer_gpus=[]")
    assert res.code == 1, (res.out, res.err)
    assert "resources.trainer_gpus = []: the trainer gets no GPU" in res.err, res.err
    assert res.err.count("the trainer gets no GPU") == 1  # said once, not by render and again by its checks


def test_render_refuses_the_tensor_parallel_sizes_verls_workers_refuse(cli):
    """TP that does not divide the hybrid worker group (engine_workers.py init_model) or spans part of a node
    (rollout/replica.py RolloutReplica.__init__) is refused by render, as OpenRLHF's and prime-rl's are."""
    seed = str(RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml")
    res = cli("render", seed, "--set", "resources.gpus_per_node=3", "--set", "rollout.tensor_parallel=2",
              "--set", "rollout.prompts_per_step=6", "--set", "train.train_batch_size=24")
    assert res.code == 1 and "self.world_size % infer_world_size == 0" in res.err, res.err
    res = cli("render", seed, "--set", "resources.nodes=3", "--set", "resources.gpus_per_node=4", "--set",
              "rollout.tensor_parallel=6", "--set", "train.train_batch_size=48", "--set", "rollout.prompts_per_step=12")
    assert res.code == 1 and "self.world_size % self.gpus_per_replica_node == 0" in res.err, res.err
    res = cli("render", seed, "--set", "resources.nodes=2", "--set", "resources.gpus_per_node=2", "--set",
              "rollout.tensor_parallel=4", "--set", "resources.executor=ray")
    assert res.code == 0, res.err  # a TP group over two whole nodes runs (one vLLM server per node)
