"""OpenRLHF conformance: what rlctl renders, fed to OpenRLHF's own code, for every release rlctl knows.

For each release 0.9.3 ... newest (wheels fetched from PyPI once, cached; see _openrlhf_support.py), every bundled
OpenRLHF recipe and a matrix of variants (LoRA/full, each algorithm, colocated/split, resume, W&B on/offline,
multi-node, train.steps, warmup steps, schedules) is rendered by rlctl and run through the release's real
`train_ppo_ray` parser, its post-parse checks and train() up to its first Ray work. Then each concept is read back
from the parsed namespace (or from OpenRLHF's own code run on it) and compared with the recipe:
reward function reached (OpenRLHF's own SingleTurnAgentExecutor loads it), optimizer steps and logged steps (its
max_steps expression, its fit() loop), warmup and the LR curve (its own get_scheduler call, evaluated, on
transformers' real scheduler), checkpoint dir and retention, W&B on/off and the key's way in, KL, group size,
lengths (train()'s own vLLM context).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rlctl.backends.openrlhf import NO_ROTATION, WANDB_FLAG_VALUE, OpenRLHFBackend
from rlctl.backends.openrlhf.releases import release
from rlctl.backends.openrlhf.steps import plan_steps
from rlctl.recipe.planning import prepare
from tests.conformance._openrlhf_support import (
    SAVE_MODULES,
    OpenRLHF,
    actor_scheduler_call,
    dest,
    max_steps_expr,
    wheel_root,
)
from tests.conftest import RECIPES, ROOT

BACKEND = OpenRLHFBackend()
VERSIONS = BACKEND.known_versions
BUNDLED = sorted(p.name for p in RECIPES.glob("openrlhf-*.toml"))
PROMPTS = 203  # not a multiple of prompts_per_step: the trainer drops each episode's last partial rollout
REWARD = '''
def reward_func(queries, prompts, labels):
    return [float(len(q) % 7) for q in queries]
'''
BASE = """
name = "conf"
[backend]
name = "openrlhf"
version = "{version}"
[model]
path = "Qwen/Qwen2.5-0.5B"
max_model_len = 1536
[data]
train = "{data}"
max_prompt_tokens = 512
[rollout]
group_size = 4
prompts_per_step = 8
max_tokens = 1024
engines = 2
tensor_parallel = 1
gpu_memory_utilization = 0.6
[algorithm]
name = "grpo"
kl_coef = 0.01
[optim]
lr = 2e-6
[train]
episodes = 2
train_batch_size = 16
micro_batch_size = 2
[resources]
nodes = 1
gpus_per_node = 4
executor = "ray"
[reward]
function = "{reward}"
[checkpoint]
dir = "{ckpt}"
every = 5
keep_last = 2
save_optimizer = false
"""
VARIANTS: dict[str, list[str]] = {
    "full": [],
    "lora": ["lora.rank=16", "lora.alpha=32", 'lora.target_modules=["q_proj","v_proj"]', "lora.dropout=0.05"],
    "lora_all_linear": ["lora.rank=8"],
    "dr_grpo": ['algorithm.name="dr_grpo"'],
    "reinforce_baseline": ['algorithm.name="reinforce_baseline"'],
    # the critic is a RayActorGroup of its own (train_ppo_ray.py): actor 1 + critic 1 + vLLM 2 = 4 GPUs (issue 22)
    "ppo": ['algorithm.name="ppo"', "resources.trainer_gpus=[2]", "resources.inference_gpus=[0,1]"],
    "no_kl": ["algorithm.kl_coef=0.0", 'algorithm.kl_estimator="k1"', "algorithm.use_kl_loss=false"],
    "colocated": ["resources.colocate=true", "rollout.engines=4"],
    "split_pinned": ["resources.trainer_gpus=[2,3]", "resources.inference_gpus=[0,1]"],
    "multinode": ["resources.nodes=2", "rollout.engines=4", "rollout.prompts_per_step=16"],
    "resume": ['checkpoint.resume="latest"', "checkpoint.save_optimizer=true"],
    "wandb": ['logging.wandb={project="p", name="n", entity="e"}'],
    "wandb_offline": ['logging.wandb={project="p", offline=true}'],
    "steps": ["train.steps=30"],
    "steps_inexact": ["train.steps=31"],
    "warmup_steps": ["optim.warmup_steps=7"],
    "warmup_ratio": ["optim.warmup_ratio=0.1"],
    "constant": ['optim.schedule="constant"'],
    "cosine": ['optim.schedule="cosine"'],
    "linear": ['optim.schedule="linear"'],
    "min_lr_ratio": ["optim.min_lr_ratio=0.0"],
    "epochs": ["train.epochs_per_rollout=2"],
    # a rollout of 8 x 4 = 32 samples, one optimizer step of 32: the clip cannot act (eps_clip set: said)
    "one_step": ["train.train_batch_size=32", "algorithm.eps_clip=0.1"],
    "eval_top_p_tb": ['data.eval="{data}"', "eval.every=3", "rollout.top_p=0.9", 'logging.tensorboard="tb"',
                      "optim.weight_decay=0.01", "train.offload=true"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("openrlhf")
    data = d / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}", "label": str(i)}) + "\n" for i in range(PROMPTS)))
    reward = d / "reward.py"
    reward.write_text(REWARD)
    return {"data": data, "reward": reward, "ckpt": d / "ckpt", "dir": d}


def recipe_file(files: dict, version: str) -> Path:
    p = files["dir"] / f"base-{version}.toml"
    if not p.exists():
        p.write_text(BASE.format(version=version, data=files["data"], reward=files["reward"], ckpt=files["ckpt"]))
    return p


def entry(prep) -> list[str]:
    argv = BACKEND.entrypoint(prep.plan)
    assert argv[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]
    return argv[3:]


def flag(version: str, concept: str) -> str:
    f = release(version).flag(concept)
    assert f, f"openrlhf {version} has no flag for {concept}"
    return f


def value(args: Any, version: str, concept: str) -> Any:
    return dest(args, flag(version, concept))


def close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b), (len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15), f"step {i + 1}: {x} != {y}"


def real_lrs(name: str, kwargs: dict[str, Any], lr: float, steps: int) -> list[float]:
    """transformers' real scheduler, built as the release builds it, stepped once per optimizer step."""
    import torch
    from transformers.optimization import get_scheduler

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = get_scheduler(name, opt, **kwargs)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_recipe_parses_and_means_it(version, name, files):
    sets = [f"backend.version={version}", f"data.train={json.dumps(str(files['data']))}",
            f"reward.function={json.dumps(str(files['reward']))}", f"data.eval={json.dumps(str(files['data']))}"]
    if version != "0.9.3":  # the seed's patch set is 0.9.3's: another release takes none (patching.recipe_set)
        sets.append('patches.set=""')
    prep = prepare(RECIPES / name, sets)
    dialect_extra = {k: v for k, v in prep.recipe.backend.extra().items() if f"--{k}" in release(version).flags}
    prep.recipe.backend.extra().clear()  # the seed's extras are flat flags: keep those this release has
    prep.recipe.backend.extra().update(dialect_extra)
    prep.plan = BACKEND.render(prep.recipe, prep.dataset_size)
    with OpenRLHF(version) as o:
        args, train_locals, _ = o.parse(entry(prep))
        check_meaning(o, version, prep, args, train_locals)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_parses_and_means_it(version, variant, files):
    sets = [s.replace("{data}", str(files["data"])) for s in VARIANTS[variant]]
    prep = prepare(recipe_file(files, version), sets)
    errors = [f for f in BACKEND.unhonoured(prep.recipe) if f.level == "error"]
    with OpenRLHF(version) as o:
        args, train_locals, _ = o.parse(entry(prep))
        if any(f.key == "optim.schedule" for f in errors):
            # the finding is true: the release's own scheduler call fails on transformers' real scheduler
            s = plan_steps(prep.recipe, prep.dataset_size)
            name, kwargs = actor_scheduler_call(o, args, max_steps_expr(o, args, s.prompts))
            with pytest.raises(TypeError):
                real_lrs(name, kwargs, prep.recipe.optim.lr, 1)
            return
        assert errors == [], errors
        check_meaning(o, version, prep, args, train_locals)


def check_meaning(o: OpenRLHF, v: str, prep, args: Any, train_locals: dict[str, Any]) -> None:
    r = prep.recipe
    rel = release(v)
    # group size, batch sizes, algorithm
    assert value(args, v, "n_samples_per_prompt") == r.rollout.group_size
    assert value(args, v, "rollout_batch_size") == r.rollout.prompts_per_step
    assert value(args, v, "train_batch_size") == r.train.train_batch_size
    assert value(args, v, "micro_train_batch_size") == r.train.micro_batch_size
    assert value(args, v, "max_epochs") == r.train.epochs_per_rollout
    est = {"grpo": "group_norm", "dr_grpo": "dr_grpo", "reinforce_baseline": "reinforce_baseline", "ppo": "gae"}
    assert value(args, v, "advantage_estimator") == est[r.algorithm.name]
    critic = dest(args, "--critic.model_name_or_path" if rel.dotted else "--critic_pretrain")
    # the post-parse checks give the critic the actor's model with a reward file, and no critic otherwise
    assert critic == (r.model.path if r.algorithm.name == "ppo" else None)
    assert value(args, v, "eps_clip") == r.algorithm.eps_clip
    # the clip range PolicyLoss gets (clip_eps_low/high from eps_clip_low_high, which the post-parse checks fill
    # from eps_clip), and where it can act (Backend.inert): the actor makes each rollout's old log-probs right before
    # training on it, so the ratio moves only where an optimizer step (every train_batch_size samples) falls inside
    # a rollout's max_epochs passes: train_ppo_ray's parsed counts
    low_high = dest(args, "--actor.eps_clip_low_high" if rel.dotted else "--eps_clip_low_high")
    assert tuple(low_high) == (r.algorithm.eps_clip, r.algorithm.eps_clip)
    per_rollout = (value(args, v, "rollout_batch_size") * value(args, v, "n_samples_per_prompt")
                   * value(args, v, "max_epochs"))
    inert = {i.key for i in BACKEND.inert(BACKEND.effective(r).recipe)}
    assert ("algorithm.eps_clip" in inert) == (value(args, v, "train_batch_size") % per_rollout == 0), inert
    assert value(args, v, "entropy_loss_coef") == r.algorithm.entropy_coef
    # KL
    assert value(args, v, "init_kl_coef") == r.algorithm.kl_coef
    assert value(args, v, "use_kl_loss") == (r.algorithm.use_kl_loss and r.algorithm.kl_coef > 0)
    k = r.algorithm.kl_estimator
    assert value(args, v, "kl_estimator") == ("k3" if k == "low_var_kl" else k)
    # lengths: vLLM's context as train() computes it, the response limit, the prompt limit
    assert train_locals["max_len"] == r.data.max_prompt_tokens + r.rollout.max_tokens
    if rel.flag("generate_max_len"):
        assert value(args, v, "generate_max_len") == r.rollout.max_tokens
        assert value(args, v, "prompt_max_len") == r.data.max_prompt_tokens
    else:
        assert value(args, v, "max_new_tokens") == r.rollout.max_tokens
        assert value(args, v, "max_len") - value(args, v, "max_new_tokens") == r.data.max_prompt_tokens
    assert value(args, v, "temperature") == r.rollout.temperature
    assert value(args, v, "top_p") == r.rollout.top_p
    assert value(args, v, "seed") == r.train.seed
    # placement
    per_node = r.trainer_gpu_count // r.resources.nodes
    assert value(args, v, "actor_num_nodes") == r.resources.nodes
    assert value(args, v, "actor_num_gpus_per_node") == per_node
    assert (value(args, v, "ref_num_nodes"), value(args, v, "ref_num_gpus_per_node")) == (r.resources.nodes, per_node)
    if r.algorithm.name == "ppo":
        assert value(args, v, "critic_num_nodes") == r.resources.nodes
        assert value(args, v, "critic_num_gpus_per_node") == per_node
    assert value(args, v, "vllm_num_engines") == r.rollout.engines
    assert value(args, v, "vllm_tp") == r.rollout.tensor_parallel
    assert value(args, v, "vllm_mem") == r.rollout.gpu_memory_utilization
    assert value(args, v, "colocate_all") == r.resources.colocate
    # model, LoRA, precision
    assert value(args, v, "pretrain") == r.model.path
    if r.lora:
        assert value(args, v, "lora_rank") == r.lora.rank
        assert value(args, v, "lora_alpha") == r.lora.alpha
        assert value(args, v, "target_modules") == r.lora.target_modules  # "all-linear" stays the string peft wants
        assert value(args, v, "lora_dropout") == r.lora.dropout
    else:
        assert value(args, v, "lora_rank") == 0
    assert value(args, v, "zero_stage") == r.train.zero_stage
    assert value(args, v, "adam_offload") == r.train.offload
    assert value(args, v, "l2") == r.optim.weight_decay
    assert value(args, v, "max_norm") == r.optim.max_grad_norm
    # reward function reached: OpenRLHF's own executor loads it from the parsed --remote_rm_url
    urls = value(args, v, "remote_rm_url")
    assert urls == [r.reward.function]
    executor = o.module("openrlhf.utils.agent").SingleTurnAgentExecutor(urls)
    import importlib.util

    spec = importlib.util.spec_from_file_location("expected_reward", r.reward.function)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert executor.reward_func(["abc", "defgh"], None, None) == mod.reward_func(["abc", "defgh"], None, None)
    # data and eval
    assert value(args, v, "prompt_data") == r.data.train
    assert value(args, v, "input_key") == r.data.input_key
    assert value(args, v, "eval_dataset") == r.data.eval
    if r.data.eval:
        # --eval_steps counts global steps (rollouts), eval.every optimizer steps
        assert value(args, v, "eval_steps") == (BACKEND.every_rollouts(r.eval.every, r) if r.eval.every else -1)
        assert value(args, v, "eval_temperature") == r.eval.temperature
        assert value(args, v, "eval_n_samples_per_prompt") == r.eval.n_samples
    # checkpoints: where, how often, what OpenRLHF itself rotates, resume
    ck = r.checkpoint
    assert value(args, v, "ckpt_path") == ck.dir
    assert value(args, v, "save_path") == (ck.final_dir or f"{ck.dir}/final")
    assert value(args, v, "save_hf_ckpt") is True
    assert value(args, v, "disable_ds_ckpt") == (not ck.save_optimizer)
    assert value(args, v, "save_steps") == (BACKEND.every_rollouts(ck.every, r) if ck.every else -1)
    # with eval sets rlctl rotates (keeping the best-eval checkpoint): OpenRLHF's count is one it never reaches
    assert value(args, v, "max_ckpt_num") == (NO_ROTATION if BACKEND.rotation_by_rlctl(r) else ck.keep_last or 3)
    assert value(args, v, "load_checkpoint") == (ck.resume != "off")
    if rel.best_checkpoints and ck.keep_last and r.data.eval:
        assert value(args, v, "best_metric_key") == "none"  # no best_global_stepN_hf exports past keep_last
    assert BACKEND.prune_during_run(r) == bool(ck.keep_last)  # OpenRLHF never deletes global_stepN_hf
    # W&B: on/off as the trainer decides it, the flag never the key, the key in the job's env (online only)
    gate = value(args, v, "wandb_key")
    wb = r.logging.wandb
    assert bool(gate) == (wb is not None)
    env = prep.plan.env
    if wb:
        assert gate == WANDB_FLAG_VALUE
        assert value(args, v, "wandb_project") == wb.project
        assert value(args, v, "wandb_run_name") == (wb.name or r.name)
        assert value(args, v, "wandb_org") == wb.entity
        if wb.offline:
            assert env.get("WANDB_MODE") == "offline" and "WANDB_API_KEY" not in env
        else:
            assert env.get("WANDB_API_KEY") == "${WANDB_API_KEY}" and "WANDB_MODE" not in env
    else:
        assert "WANDB_API_KEY" not in env
    assert value(args, v, "tensorboard") == r.logging.tensorboard
    if prep.dataset_size is None:
        return
    # steps: OpenRLHF's own max_steps expression over the prompts it loads (after --max_samples), and its fit()
    # loop: one global_step per full rollout (the last partial one of an episode is dropped), the actor stepping
    # the optimizer once per train_batch_size samples over max_epochs passes of each rollout
    prompts = min(int(value(args, v, "max_samples")), prep.dataset_size)
    episodes = value(args, v, "num_episodes")
    max_steps = max_steps_expr(o, args, prompts)
    rollouts = prompts // value(args, v, "rollout_batch_size") * episodes
    samples = rollouts * value(args, v, "rollout_batch_size") * value(args, v, "n_samples_per_prompt")
    optimizer_steps = samples * value(args, v, "max_epochs") // value(args, v, "train_batch_size")
    s = plan_steps(r, prep.dataset_size)
    assert (s.horizon, s.total, s.rollouts) == (max_steps, optimizer_steps, rollouts)
    assert prep.plan.total_steps == optimizer_steps
    if r.train.steps is not None and not any(f.key == "train.steps" for f in BACKEND.unhonoured(r)):
        assert optimizer_steps == r.train.steps
    if s.per_rollout == int(s.per_rollout):
        assert BACKEND.optimizer_steps_per_logged_step(r) * rollouts == optimizer_steps
    # warmup and the LR curve: the release's own scheduler call, on transformers' real scheduler
    name, kwargs = actor_scheduler_call(o, args, max_steps)
    assert kwargs["num_training_steps"] == max_steps
    assert kwargs["num_warmup_steps"] == BACKEND.warmup_steps(r, optimizer_steps)
    if r.optim.warmup_steps is not None:
        assert kwargs["num_warmup_steps"] == r.optim.warmup_steps
    close(BACKEND.schedule(r, prep.dataset_size), real_lrs(name, kwargs, r.optim.lr, optimizer_steps))


# ---------------------------------------------------------------------------------------------------------------
# versions


def test_known_versions_are_every_release_since_0_9_3_with_its_own_snapshot():
    from rlctl.backends._static import argparse_flags
    from rlctl.backends.base import load_snapshot
    from scripts.snapshot_openrlhf import Source, facts

    for v in VERSIONS:
        snap = load_snapshot("openrlhf", v)
        assert snap is not None and snap["version"] == v
        cli = (wheel_root(v) / "openrlhf" / "cli" / "train_ppo_ray.py").read_text()
        assert snap["flags"] == json.loads(json.dumps(argparse_flags(cli), default=str)), v
        wheel = next((Path(os.environ.get("RLCTL_TEST_WHEELS", Path.home() / ".cache" / "rlctl-tests" / "wheels"))
                      ).glob(f"openrlhf-{v}-*.whl"))
        assert snap["facts"] == facts(Source(wheel)), f"snapshot of {v} is stale: scripts/snapshot_openrlhf.py {v}"


def test_newest_release_on_pypi_is_known():
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "openrlhf"], capture_output=True, text=True)
    line = next((x for x in r.stdout.splitlines() if x.startswith("Available versions:")), None)
    if r.returncode != 0 or line is None:
        pytest.skip(f"PyPI not reachable: {r.stderr.strip()[-200:]}")
    from rlctl.backends.base import version_key

    released = [x.strip() for x in line.split(":", 1)[1].split(",")]
    wanted = {x for x in released if version_key(x) >= version_key("0.9.3")}
    missing = sorted(wanted - set(VERSIONS), key=version_key)
    assert not missing, (f"openrlhf {', '.join(missing)} on PyPI but unknown to rlctl: run scripts/"
                         f"snapshot_openrlhf.py {' '.join(missing)}, add them to KNOWN_VERSIONS, run this suite")


def test_unknown_version_is_an_error_not_a_guess(cli, files):
    res = cli("render", str(recipe_file(files, "0.9.3")), "--set", "backend.version=0.10.7")
    assert res.code != 0
    assert "openrlhf 0.10.7 is not known to rlctl; known: 0.9.3" in res.err and "0.11.2" in res.err


@pytest.mark.parametrize("version", ["0.9.3", "0.9.8", "0.10.1.post2", "0.10.2", "0.11.2"])
def test_each_release_validates_against_its_own_flags(version, files):
    prep = prepare(recipe_file(files, version))
    assert [f for f in BACKEND.validate(prep.plan, None) if f.level == "error"] == []
    other = "0.11.2" if not release(version).dotted else "0.9.3"
    plan = BACKEND.render(prepare(recipe_file(files, other)).recipe, PROMPTS)
    plan.version = version
    errors = [f for f in BACKEND.validate(plan, None) if f.level == "error"]
    assert errors and all(version in f.message for f in errors)


def test_lengths_flags_per_release():
    # --prompt_max_len/--generate_max_len exist up to 0.9.7; 0.9.8 replaced them with --max_len/--max_new_tokens
    for v in VERSIONS:
        flags = release(v).flags
        old = v in ("0.9.3", "0.9.4", "0.9.5", "0.9.6", "0.9.7")
        assert ("--generate_max_len" in flags) == old and ("--prompt_max_len" in flags) == old, v
        assert ("--max_new_tokens" in flags or "--rollout.max_new_tokens" in flags) == (not old), v


# ---------------------------------------------------------------------------------------------------------------
# unhonoured keys


@pytest.mark.parametrize("sets,key,versions", [
    (['reward.function_name="score"'], "reward.function_name", VERSIONS),
    (["reward.environment"], "reward.environment", VERSIONS),
    (['optim.schedule="linear"'], "optim.schedule", VERSIONS[:VERSIONS.index("0.10.4")]),
    (['optim.schedule="cosine"'], "optim.schedule", VERSIONS[:VERSIONS.index("0.10.2")]),
    (["optim.min_lr_ratio=0.0"], "optim.min_lr_ratio", VERSIONS[:VERSIONS.index("0.10.2")]),
    (['checkpoint.resume=20', "checkpoint.save_optimizer=true"], "checkpoint.resume", VERSIONS),
    (['checkpoint.resume="latest"'], "checkpoint.resume", VERSIONS),
    (["rollout.group_size=1"], "rollout.group_size", VERSIONS),
    (["rollout.max_num_batched_tokens=8192"], "rollout.max_num_batched_tokens", VERSIONS),
    (["model.max_model_len=4096"], "model.max_model_len", VERSIONS),
    (['resources.trainer_gpus=[2,3]'], "resources.trainer_gpus", VERSIONS),
    (['resources.colocate=true'], "resources.colocate", VERSIONS),
    (['model.dtype="float32"'], "model.dtype", VERSIONS),
    (['data.eval="x.jsonl"'], "eval.every", VERSIONS),
    (['env={NCCL_DEBUG="INFO"}'], "env.NCCL_DEBUG", VERSIONS[:VERSIONS.index("0.9.10")]),
])
def test_unhonoured_keys_are_findings(sets, key, versions, files):
    for v in VERSIONS:
        recipe = prepare(recipe_file(files, v), [s for s in sets if s != "reward.environment"]).recipe
        if "reward.environment" in sets:
            from rlctl.recipe.schema import RewardEnvironment

            recipe.reward.function = None
            recipe.reward.environment = RewardEnvironment(id="gsm8k")
        keys = [f.key for f in BACKEND.unhonoured(recipe)]
        assert (key in keys) == (v in versions), (v, keys)


def test_bundled_recipe_has_no_unhonoured_errors():
    for name in BUNDLED:
        prep = prepare(RECIPES / name)
        assert [f for f in BACKEND.unhonoured(prep.recipe) if f.level == "error"] == []


def test_job_env_names_conflicting_ray_init_vars_with_the_override(files):
    # train() calls ray.init(runtime_env={"env_vars": {"NCCL_DEBUG": ..., ...}}); Ray refuses to merge a driver env
    # naming a variable the job's runtime env has (ray/_private/worker.py, _merge_runtime_env) unless told to
    prep = prepare(recipe_file(files, "0.11.2"), ['env={NCCL_DEBUG="INFO", A="1"}'])
    assert prep.plan.env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    prep = prepare(recipe_file(files, "0.11.2"), ['env={A="1"}'])
    assert "RAY_OVERRIDE_JOB_RUNTIME_ENV" not in prep.plan.env


# ---------------------------------------------------------------------------------------------------------------
# progress


@pytest.mark.parametrize("version", ["0.9.3", "0.10.4", "0.11.2"])
def test_where_the_clip_acts_with_async_training_gspo_and_its_rollout_ratio(version, files):
    """One optimizer step per rollout (32 samples, train batch 32): the clip cannot act, with async training too (the
    training actor makes each rollout's experience, old log-probs included, when it takes it off the queue:
    ppo_trainer_async.py TrainingActor.fit -> train_step); GSPO with the vLLM importance-sampling correction takes
    the ratio against the rollout's own log-probs (models/loss.py PolicyLoss.forward), so there it acts. Each command
    is one train_ppo_ray parses and accepts."""
    rel = release(version)
    one_step = ["train.train_batch_size=32", "algorithm.eps_clip=0.1"]
    async_on = "train.async_enable" if rel.dotted else "async_train"
    gspo = ("actor.policy_loss_type" if rel.dotted else "policy_loss_type", '"gspo"')
    corrected = (("algo.advantage.is_correction_level", '"token"') if "--algo.advantage.is_correction_level"
                 in rel.flags else ("algo.advantage.is_correction_enable", "true") if rel.dotted
                 else ("enable_vllm_is_correction", "true"))
    cases = {"sync": ({}, True), "async": ({async_on: "true"}, True), "gspo": (dict([gspo]), True),
             "gspo_corrected": (dict([gspo, corrected]), False)}
    with OpenRLHF(version) as o:
        for name, (extra, cannot_act) in cases.items():
            table = ", ".join(f'"{k}" = {v}' for k, v in extra.items())
            prep = prepare(recipe_file(files, version), [*one_step, f"backend.openrlhf.extra={{{table}}}"])
            o.parse(entry(prep))  # train_ppo_ray accepts it
            inert = {i.key for i in BACKEND.inert(prep.recipe)}
            assert ("algorithm.eps_clip" in inert) == cannot_act, (name, inert)


@pytest.mark.parametrize("sets,per", [([], 2), (["train.epochs_per_rollout=2"], 4), (["rollout.group_size=2"], 1)])
def test_progress_counts_the_rollouts_openrlhf_logs(sets, per, files):
    recipe = prepare(recipe_file(files, "0.9.3"), sets).recipe
    assert BACKEND.optimizer_steps_per_logged_step(recipe) == per


# ---------------------------------------------------------------------------------------------------------------
# secrets: the key reaches a `ray job submit` job without being written down


def test_launch_sh_passes_the_key_in_the_runtime_env_built_at_launch(files, tmp_path):
    prep = prepare(recipe_file(files, "0.9.3"), ['logging.wandb={project="p"}', 'env={A="b c"}'])
    out = tmp_path / "run"
    prep.plan.write(out)
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "ray").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$RAY_ARGS_OUT"\n')
    (fakebin / "ray").chmod(0o755)
    env = {"PATH": f"{fakebin}:{os.environ['PATH']}", "RAY_ARGS_OUT": str(tmp_path / "args"),
           "WANDB_API_KEY": "k-not-a-real-key-123"}
    r = subprocess.run(["bash", str(out / "launch.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "args").read_text().splitlines()
    runtime_env = json.loads(argv[argv.index("--runtime-env-json") + 1])
    # never on the `ray job submit` command line nor in the job record: the cluster's nodes have it (docs/ray.md)
    assert "WANDB_API_KEY" not in runtime_env["env_vars"] and "k-not-a-real-key-123" not in "\n".join(argv)
    assert "# not sent: WANDB_API_KEY" in (out / "launch.sh").read_text()
    assert runtime_env["env_vars"]["A"] == "b c" and runtime_env["working_dir"] == "."
    assert argv[argv.index("--use_wandb") + 1] == WANDB_FLAG_VALUE
    for f in out.rglob("*"):
        assert "k-not-a-real-key-123" not in f.read_text()
    env.pop("WANDB_API_KEY")
    r = subprocess.run(["bash", str(out / "launch.sh")], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "WANDB_API_KEY must be set" in r.stderr


def test_local_executor_runs_a_submit_that_carries_the_key(files, tmp_path):
    # resources.executor = "local": rlctl's local process runs `ray job submit` itself; its argv (written into the run
    # directory's spec) names the variables, the values come from the process environment when it runs
    prep = prepare(recipe_file(files, "0.10.2"), ['logging.wandb={project="p"}', 'resources.executor="local"'])
    plan = BACKEND.prepare_launch(prep.plan, tmp_path)
    assert plan.argv[:2] == ["bash", "-c"] and "k-not-a-real-key-456" not in json.dumps(plan.argv)
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "ray").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$RAY_ARGS_OUT"\n')
    (fakebin / "ray").chmod(0o755)
    env = {"PATH": f"{fakebin}:{os.environ['PATH']}", "RAY_ARGS_OUT": str(tmp_path / "args"),
           "WANDB_API_KEY": "k-not-a-real-key-456", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(plan.argv, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "args").read_text().splitlines()
    runtime_env = json.loads(argv[argv.index("--runtime-env-json") + 1])
    assert "WANDB_API_KEY" not in runtime_env["env_vars"] and "k-not-a-real-key-456" not in "\n".join(argv)
    assert argv[argv.index("--logger.wandb.key") + 1] == WANDB_FLAG_VALUE
    # rlctl's Ray executor submits the entrypoint itself: the plan stays as rendered
    prep = prepare(recipe_file(files, "0.10.2"), ['logging.wandb={project="p"}'])
    assert BACKEND.prepare_launch(prep.plan, tmp_path) is prep.plan


def test_rlctl_ray_executor_gets_the_key_from_the_plan_env(files):
    # rlctl's own executor (rlctl/executors/ray.py) passes every plan.env name, resolved from the launching
    # environment, as the job's runtime_env env_vars
    prep = prepare(recipe_file(files, "0.11.2"), ['logging.wandb={project="p"}'])
    assert prep.plan.env["WANDB_API_KEY"] == "${WANDB_API_KEY}"
    assert BACKEND.secret_env(prep.recipe) == ["WANDB_API_KEY"]
    assert BACKEND.secret_env(prepare(recipe_file(files, "0.11.2"), ['logging.wandb={project="p", offline=true}'])
                              .recipe) == []


@pytest.mark.parametrize("offline,key,executor,verdict", [
    (False, None, "ray", "fail"), (False, "k", "ray", "ok"), (True, None, "ray", "ok"),
    # `ray job submit` to a cluster rlctl did not start: the key is not sent, the nodes must have it
    (False, "k", "local", "warn"), (False, None, "local", "warn"), (True, None, "local", "ok")])
def test_preflight_fails_when_no_key_can_reach_the_job(files, monkeypatch, offline, key, executor, verdict):
    if key:
        monkeypatch.setenv("WANDB_API_KEY", key)
    else:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    prep = prepare(recipe_file(files, "0.9.3"), [f'logging.wandb={{project="p", offline={str(offline).lower()}}}',
                                                 f'resources.executor="{executor}"'])
    ctx = types.SimpleNamespace(recipe=prep.recipe)
    res = [x for x in BACKEND.preflight(ctx, "env") if x.check == "env.wandb_job"]
    assert [x.verdict for x in res] == [verdict]
    if verdict == "fail":  # the fix `--fix` can apply: logging offline needs no key (trial 9)
        assert res[0].set == {"logging.wandb.offline": True}


# ---------------------------------------------------------------------------------------------------------------
# checkpoints on disk: OpenRLHF's own save code (ppo_actor.save_checkpoint -> DeepspeedStrategy.save_ckpt rotation),
# with DeepSpeed's engine and the HF export stubbed to write what they write


def _fake_engine_class(deepspeed_mod):
    class Engine(deepspeed_mod.DeepSpeedEngine):
        def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, **kw):
            # DeepSpeed runtime/engine.py: the tag directory's states, then `latest` (holding the tag) when asked
            d = Path(save_dir) / tag
            d.mkdir(parents=True, exist_ok=True)
            (d / "mp_rank_00_model_states.pt").write_bytes(b"m")
            (d / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o")
            if save_latest:
                (Path(save_dir) / "latest").write_text(tag)

    return Engine


def _save_model(model, tokenizer, output_dir, **kw):
    # utils/deepspeed/deepspeed.py save_model: model.save_pretrained (adapter or weights), config.json, tokenizer
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text("{}")
    (out / "adapter_model.safetensors").write_bytes(b"w")
    (out / "config.json").write_text("{}")
    (out / "tokenizer_config.json").write_text("{}")


@pytest.mark.parametrize("version", ["0.9.3", "0.9.8", "0.9.9", "0.10.1.post2", "0.10.2", "0.11.2"])
@pytest.mark.parametrize("save_optimizer", [False, True])
def test_checkpoint_layout_and_retention_on_disk(version, save_optimizer, files, tmp_path):
    from rlctl.runs.checkpoints import plan_prune

    ckpt = tmp_path / "ckpt"
    prep = prepare(recipe_file(files, version), [f"checkpoint.dir={json.dumps(str(ckpt))}", "checkpoint.keep_last=2",
                                                 f"checkpoint.save_optimizer={str(save_optimizer).lower()}"])
    with OpenRLHF(version) as o:
        args, _, _ = o.parse(entry(prep))
    with OpenRLHF(version, SAVE_MODULES) as o:
        ds = o.module("openrlhf.utils.deepspeed.deepspeed")
        actor_mod = o.module("openrlhf.trainer.ray.ppo_actor")
        strategy = ds.DeepspeedStrategy.__new__(ds.DeepspeedStrategy)
        strategy.args = args
        strategy.is_rank_0 = lambda: True
        strategy.print = lambda *a, **k: None
        strategy.save_model = _save_model
        actor = types.SimpleNamespace(model=_fake_engine_class(sys.modules["deepspeed"])())
        me = types.SimpleNamespace(strategy=strategy, actor=actor, ema_model=None, tokenizer=object(),
                                   disable_ds_ckpt=not save_optimizer, save_hf_ckpt=True)
        for i, step in enumerate(range(5, 35, 5)):
            actor_mod.PolicyModelActor.save_checkpoint(me, f"global_step{step}", {"global_step": step})
            for p in [*ckpt.glob("global_step*"), *ckpt.glob("_actor/global_step*")]:
                if p.name.startswith(f"global_step{step}"):
                    os.utime(p, (1000 + i, 1000 + i))  # later saves are newer (the rotation sorts by mtime)
    hf = sorted((p.name for p in ckpt.glob("global_step*_hf")), key=lambda n: int(n[11:-3]))
    assert hf == [f"global_step{s}_hf" for s in range(5, 35, 5)]  # OpenRLHF deleted none
    ds_dirs = sorted((p.name for p in (ckpt / "_actor").glob("global_step*")), key=lambda n: int(n[11:]))
    if save_optimizer:
        assert ds_dirs == ["global_step25", "global_step30"]  # --max_ckpt_num 2 rotates DeepSpeed states only
        assert (ckpt / "_actor" / "latest").read_text() == "global_step30"
    else:
        assert not (ckpt / "_actor").exists()
    found = BACKEND.checkpoints(ckpt)
    assert [c.step for c in found] == list(range(5, 35, 5)) and all(c.complete for c in found)
    if save_optimizer:
        # resuming reads _actor/latest: it belongs to the checkpoint it names, and a staged copy takes it along
        from rlctl.runs.launch import stage_checkpoint

        assert ckpt / "_actor" / "latest" in found[-1].paths()
        staged = tmp_path / "new-run-ckpt"
        stage_checkpoint(found[-1], ckpt, staged)
        assert (staged / "_actor" / "latest").read_text() == "global_step30"
        assert (staged / "_actor" / "global_step30").is_dir() and (staged / "global_step30_hf").is_dir()
    assert BACKEND.prune_during_run(prep.recipe)
    doomed = plan_prune(found, prep.recipe.checkpoint.keep_last)
    kept = [c.step for c in found if c not in doomed]
    assert len(kept) == BACKEND.kept_checkpoints(prep.recipe) == 2 and kept == [25, 30]
    # a half-written export (no tokenizer yet) is not complete
    half = ckpt / "global_step35_hf"
    half.mkdir()
    (half / "adapter_config.json").write_text("{}")
    assert not BACKEND.checkpoints(ckpt)[-1].complete


@pytest.mark.parametrize("version", ["0.9.3", "0.11.2"])
@pytest.mark.parametrize("every,saves", [(16, [2, 4, 6]), (20, [2, 4, 6])])
def test_checkpoint_every_counts_optimizer_steps_where_openrlhf_saves_per_rollout(version, every, saves, files):
    """OpenRLHF saves when `global_step % save_steps == 0`, one global step a rollout (PPOTrainer's
    save_logs_and_checkpoints, run here over the rollouts): checkpoint.every (optimizer steps) is rendered in global
    steps, so a run of 6 rollouts x 8 optimizer steps saves where the recipe asked, and the disk check counts those
    saves. 20 is not a multiple of 8: it rounds to 16, and rlctl says so."""
    prep = prepare(recipe_file(files, version), [f"checkpoint.every={every}", "checkpoint.keep_last=null",
                                                 "rollout.prompts_per_step=16", "rollout.group_size=8",
                                                 "train.train_batch_size=16", "train.micro_batch_size=1",
                                                 "train.epochs_per_rollout=1"])
    r = prep.recipe
    assert plan_steps(r, None).per_rollout == 8  # 16 prompts x 8 samples / 16
    with OpenRLHF(version) as o:
        args, _, _ = o.parse(entry(prep))
    with OpenRLHF(version, {"openrlhf.trainer.ppo_trainer", "openrlhf.utils.logging_utils"}) as o:
        trainer = o.module("openrlhf.trainer.ppo_trainer")
        saved: list[int] = []
        group = types.SimpleNamespace(async_run_method=lambda method_name, tag, **kw: saved.append(int(tag[11:])) or [])
        me = types.SimpleNamespace(args=args, wandb_logger=None, tensorboard_logger=None, actor_model_group=group,
                                   critic_model_group=None, best_eval_metric_key=None, best_eval_metric_value=None,
                                   _latest_eval_metric_value=None)
        sys.modules["ray"].get = lambda refs: refs
        for global_step in range(1, 7):  # fit(): train_step returns global_step + 1 per rollout
            trainer.BasePPOTrainer.save_logs_and_checkpoints(me, global_step, {})
    assert saved == saves
    assert [s * 8 for s in saved] == [s for s in range(8, 49, 8) if s % (every // 8 * 8) == 0]
    assert BACKEND.saved_checkpoints(r, 48) == len(saves)
    assert BACKEND.checkpoint_copies(r, 48).kept == len(saves)
    rounded = [f for f in BACKEND.unhonoured(r) if f.key == "checkpoint.every"]
    assert bool(rounded) == bool(every % 8) and all("16" in f.message for f in rounded)


def test_bundled_recipe_disk_count_is_what_stays(files):
    prep = prepare(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml")
    # keep_last = 3 and its OOD probe is an eval set: the 3 newest plus the best-eval checkpoint (issue 24)
    assert BACKEND.prune_during_run(prep.recipe) and BACKEND.kept_checkpoints(prep.recipe) == 4


def test_contexts_leave_no_stub_behind():
    from tests.conformance._openrlhf_support import StubModule

    before = set(sys.modules)
    with OpenRLHF("0.11.2") as o:
        o.parse(["--actor.model_name_or_path", "m", "--reward.remote_url", "r.py"])
    assert not [n for n, m in sys.modules.items() if isinstance(m, StubModule)]
    assert not [n for n in set(sys.modules) - before if n.split(".")[0] == "openrlhf"]


ORDER_PROBE = """
import sys, types
from tests.conformance._openrlhf_support import SAVE_MODULES, OpenRLHF, is_stub
before = dict(sys.modules)
with OpenRLHF("0.11.2") as o:
    o.parse(["--actor.model_name_or_path", "m", "--reward.remote_url", "r.py"])
with OpenRLHF("0.11.2", SAVE_MODULES) as o:
    o.module("openrlhf.utils.deepspeed.deepspeed"), o.module("openrlhf.trainer.ray.ppo_actor")
changed = [n for n, m in before.items() if sys.modules.get(n) is not m]
held = sorted(n for n, m in list(sys.modules.items()) if any(is_stub(v) for v in list(vars(m).values())))
print("changed", changed, "held", held)
from trl import GRPOConfig  # TRL after OpenRLHF in one process, as pytest runs the suite
GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4, use_cpu=True, report_to=[])
assert not changed and not held
"""


def test_trl_after_the_openrlhf_contexts_sees_no_stub():
    """Test order must not matter: OpenRLHF's contexts (parse, then the save modules) run first, in a fresh
    interpreter, leave no module that holds a stub (transformers' training_args bound accelerate's stub, and TRL's
    GRPOConfig then died on `int * num_processes`), and every module loaded before them is the same object after."""
    pytest.importorskip("trl")
    r = subprocess.run([sys.executable, "-c", ORDER_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


def test_docs_flag_table_is_generated_from_the_snapshots():
    from scripts.snapshot_openrlhf import flag_table

    doc = (ROOT / "docs" / "backends" / "openrlhf.md").read_text()
    assert flag_table() in doc, "docs/backends/openrlhf.md: paste `python scripts/snapshot_openrlhf.py --doc`"
    for v in VERSIONS:
        assert v in doc


@pytest.mark.parametrize("version", ["0.9.3", "0.9.8", "0.10.1.post2", "0.10.2", "0.11.2"])
@pytest.mark.parametrize("sets,key", [
    (["rollout.group_size=1"], "rollout.group_size"),  # post-parse: group estimators need n_samples_per_prompt > 1
    (["resources.colocate=true"], "resources.colocate"),  # train(): actor GPUs == engines x TP when colocated
    (["rollout.prompts_per_step=1", "rollout.group_size=2", "train.train_batch_size=2", "rollout.micro_batch_size=1",
      "resources.gpus_per_node=8", "rollout.engines=1"], "rollout.prompts_per_step"),  # sample batches >= actors
])
def test_error_findings_are_what_openrlhf_itself_rejects(version, sets, key, files):
    prep = prepare(recipe_file(files, version), sets)
    assert key in [f.key for f in BACKEND.unhonoured(prep.recipe) if f.level == "error"]
    with OpenRLHF(version) as o, pytest.raises(AssertionError):
        o.parse(entry(prep))


@pytest.mark.parametrize("version", ["0.9.3", "0.11.2"])
def test_rotation_by_rlctl_keeps_the_best_eval_checkpoint(version, files, tmp_path):
    """keep_last with an eval set (issue 24): OpenRLHF's own save_ckpt, run with the rendered --max_ckpt_num, deletes
    no DeepSpeed state; rlctl's pruning then keeps the keep_last newest plus the checkpoint marked best, whole."""
    from rlctl.core.state import write_state
    from rlctl.runs.checkpoints import prune

    run = tmp_path / "run-20261125-000000"
    ckpt = run / "checkpoints"
    prep = prepare(recipe_file(files, version), [f"checkpoint.dir={json.dumps(str(ckpt))}", "checkpoint.keep_last=2",
                                                 "checkpoint.save_optimizer=true", "eval.every=5",
                                                 f"data.eval={json.dumps(str(files['data']))}"])
    assert BACKEND.rotation_by_rlctl(prep.recipe) and BACKEND.prune_during_run(prep.recipe)
    assert any(f.key == "checkpoint.keep_last" and "rotation by rlctl, keeps the best-eval checkpoint" in f.message
               for f in prep.validate())
    with OpenRLHF(version) as o:
        args, _, _ = o.parse(entry(prep))
    assert value(args, version, "max_ckpt_num") == NO_ROTATION
    with OpenRLHF(version, SAVE_MODULES) as o:
        ds = o.module("openrlhf.utils.deepspeed.deepspeed")
        actor_mod = o.module("openrlhf.trainer.ray.ppo_actor")
        strategy = ds.DeepspeedStrategy.__new__(ds.DeepspeedStrategy)
        strategy.args = args
        strategy.is_rank_0 = lambda: True
        strategy.print = lambda *a, **k: None
        strategy.save_model = _save_model
        actor = types.SimpleNamespace(model=_fake_engine_class(sys.modules["deepspeed"])())
        me = types.SimpleNamespace(strategy=strategy, actor=actor, ema_model=None, tokenizer=object(),
                                   disable_ds_ckpt=False, save_hf_ckpt=True)
        for i, step in enumerate(range(5, 35, 5)):
            actor_mod.PolicyModelActor.save_checkpoint(me, f"global_step{step}", {"global_step": step})
            for p in [*ckpt.glob("global_step*"), *ckpt.glob("_actor/global_step*")]:
                if p.name.startswith(f"global_step{step}"):
                    os.utime(p, (1000 + i, 1000 + i))
    ds_dirs = sorted(int(p.name[11:]) for p in (ckpt / "_actor").glob("global_step*"))
    assert ds_dirs == list(range(5, 35, 5))  # OpenRLHF rotated nothing away
    write_state(run, backend="openrlhf", best_checkpoint={"step": 10, "key": "eval/default/greedy_pass@1",
                                                          "value": 0.9})
    prune("openrlhf", run, 2, keep_best=True, root=ckpt)
    assert sorted(int(p.name[11:]) for p in (ckpt / "_actor").glob("global_step*")) == [10, 25, 30]
    assert sorted(int(p.name[11:-3]) for p in ckpt.glob("global_step*_hf")) == [10, 25, 30]
    assert BACKEND.kept_checkpoints(prep.recipe) == 3  # keep_last + the best, in the disk estimate


@pytest.mark.parametrize("version", ["0.9.3", "0.10.2", "0.11.2"])
def test_eval_without_a_reward_file_is_rejected_by_openrlhf_too(version, files):
    prep = prepare(recipe_file(files, version), [f"data.eval={json.dumps(str(files['data']))}"])
    prep.recipe.reward.function = None
    rm_flag = "reward.model_name_or_path" if release(version).dotted else "reward_pretrain"
    prep.recipe.backend.extra()[rm_flag] = "rm"
    prep.plan = BACKEND.render(prep.recipe, prep.dataset_size)
    assert "data.eval" in [f.key for f in BACKEND.unhonoured(prep.recipe) if f.level == "error"]
    with OpenRLHF(version) as o, pytest.raises(AssertionError, match="eval_dataset"):
        o.parse(entry(prep))


@pytest.mark.parametrize("version", ["0.9.3", "0.11.2"])
def test_all_linear_reaches_peft_as_the_shorthand(version, files):
    """lora.target_modules = "all-linear": rendered as no flag, parsed as the string peft expands; the old rendering
    (`--target_modules all-linear`) parses as a one-element list, a module name peft does not find."""
    peft = pytest.importorskip("peft")
    import transformers

    prep = prepare(recipe_file(files, version), ["lora.rank=8"])
    with OpenRLHF(version) as o:
        args, _, _ = o.parse(entry(prep))
        old = entry(prep) + [flag(version, "target_modules"), "all-linear"]
        old_args, _, _ = o.parse(old)
    cfg = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=64)

    def peft_model(targets):  # models/actor.py: LoraConfig(task_type=CAUSAL_LM, r, lora_alpha, target_modules, ...)
        config = peft.LoraConfig(task_type=peft.TaskType.CAUSAL_LM, r=8, lora_alpha=16, target_modules=targets,
                                 lora_dropout=0.0, bias="none")
        return peft.get_peft_model(transformers.Qwen2ForCausalLM(cfg), config)

    assert value(args, version, "target_modules") == "all-linear"
    assert peft_model(value(args, version, "target_modules")).peft_config["default"].target_modules
    assert value(old_args, version, "target_modules") == ["all-linear"]
    with pytest.raises(ValueError):
        peft_model(value(old_args, version, "target_modules"))
