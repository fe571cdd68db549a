"""verl conformance: every bundled verl recipe and a matrix of variants, rendered by rlctl for each release it knows,
then run through that release's own code (tests/conformance/_verl_support.py): Hydra compose of the packaged
ppo_trainer config with the rendered overrides, validate_config, the reward loader, the v1 trainer's dataloader and
fit loop (iterations, saves, validations), the FSDP engine's LR scheduler and the checkpoint rotation. Each concept
of the recipe is read back from what verl resolved and compared with what the recipe says.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rlctl.backends import get_backend
from rlctl.backends.base import UnknownVersion
from rlctl.recipe.loader import load
from rlctl.runs import checkpoints as ck
from tests.conformance import _verl_support as vs

pytest.importorskip("hydra")
pytest.importorskip("omegaconf")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
BUNDLED = sorted(RECIPES.glob("verl-*.toml"))
SEED = RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"
VERL = get_backend("verl")
VERSIONS = VERL.known_versions
DATASET = 128  # the seed's pi1_r128.parquet: 128 prompts
A = "actor_rollout_ref"

# name -> (--set overrides, recipe mutations that --set cannot express)
VARIANTS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "seed": ([], {}),
    "lora": (["lora.rank=32", "lora.alpha=64", 'lora.target_modules=["q_proj","v_proj"]'], {}),
    "lora_all_linear": (["lora.rank=8"], {}),
    "dr_grpo": (["algorithm.name=dr_grpo"], {}),
    "reinforce_baseline": (["algorithm.name=reinforce_baseline"], {}),
    "ppo": (["algorithm.name=ppo", "checkpoint.keep_last=3"], {"tiny_model": True}),
    "kl_in_reward": (["algorithm.use_kl_loss=false", "algorithm.kl_estimator=k1", "algorithm.kl_coef=0.02"], {}),
    # eps_clip set: one optimizer step per rollout here (the clip cannot act), two passes in ppo_epochs (it can)
    "no_kl": (["algorithm.kl_coef=0", "algorithm.eps_clip=0.28"], {}),
    "minibatches": (["train.train_batch_size=64", "checkpoint.every=40", "eval.every=20"], {}),
    "ppo_epochs": (["train.epochs_per_rollout=2", "train.train_batch_size=128", "optim.warmup_steps=20",
                    "algorithm.eps_clip=0.1"], {}),
    "cosine_warmup": (["optim.schedule=cosine_with_min_lr", "optim.warmup_steps=20", "optim.min_lr_ratio=0.1"], {}),
    "cosine_ratio": (["optim.schedule=cosine", "optim.warmup_ratio=0.05"], {}),
    "episodes": (["train.train_batch_size=128"], {"steps": None, "episodes": 3}),
    "split": (["resources.colocate=false"], {}),
    "multi_node": (["resources.nodes=2", "resources.gpus_per_node=8", "rollout.tensor_parallel=2"], {}),
    "resume_latest": (["checkpoint.resume=latest", "checkpoint.keep_last=2"], {}),
    "resume_step": (["checkpoint.resume=100"], {}),
    "wandb_offline": (["logging.wandb.offline=true", "logging.wandb.entity=team"], {}),
    "no_wandb": ([], {"wandb": None}),
    "no_eval": ([], {"eval": None}),
    "tensorboard": (["logging.tensorboard=tb"], {}),
    "top_p_offload": (["rollout.top_p=0.9", "train.offload=true", "rollout.enforce_eager=true"], {}),
    "no_optimizer_state": (["checkpoint.save_optimizer=false"], {}),
    # a key appended to an open dict with Hydra's `+` (no flash-attn on the box: verl's FSDP engine otherwise asks
    # transformers for FlashAttention-2; found on an H100, docs/gpu/verl-2.json)
    "append_sdpa": ([], {"extra": {"+actor_rollout_ref.model.override_config.attn_implementation": "sdpa"}}),
    # bypass mode: the old log-probs are the rollout's (vLLM's), not recomputed: the ratio is not 1, the clip acts
    "bypass": (["algorithm.eps_clip=0.1"], {"extra": {"algorithm.rollout_correction.bypass_mode": True}}),
}

SELECT = [
    "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.use_kl_in_reward",
    "algorithm.kl_penalty", "algorithm.kl_ctrl.kl_coef", "data.train_batch_size", "data.max_prompt_length",
    "data.max_response_length", "data.train_files", "data.val_files", "data.prompt_key", "data.val_max_samples",
    f"{A}.rollout.n", f"{A}.rollout.response_length", f"{A}.rollout.prompt_length", f"{A}.rollout.temperature",
    f"{A}.rollout.top_p", f"{A}.rollout.gpu_memory_utilization", f"{A}.rollout.tensor_model_parallel_size",
    f"{A}.rollout.enforce_eager", f"{A}.rollout.max_model_len", f"{A}.model.path", f"{A}.model.lora_rank",
    f"{A}.model.lora_alpha", f"{A}.actor.strategy", f"{A}.ref.strategy", f"{A}.rollout.load_format",
    f"{A}.model.target_modules", f"{A}.actor.use_kl_loss", f"{A}.actor.kl_loss_coef", f"{A}.actor.kl_loss_type",
    f"{A}.actor.ppo_mini_batch_size", f"{A}.actor.ppo_epochs", f"{A}.actor.loss_agg_mode", f"{A}.actor.clip_ratio",
    f"{A}.actor.loss_scale_factor", f"{A}.actor.clip_ratio_low", f"{A}.actor.clip_ratio_high",
    f"{A}.actor.policy_loss.loss_mode", "algorithm.rollout_correction.bypass_mode",
    f"{A}.actor.optim.lr", f"{A}.actor.fsdp_config.param_offload", f"{A}.actor.checkpoint.save_contents",
    "critic.model.path", "critic.ppo_mini_batch_size", "trainer.logger", "trainer.project_name",
    "trainer.experiment_name", "trainer.default_local_dir", "trainer.max_actor_ckpt_to_keep",
    "trainer.max_critic_ckpt_to_keep", "trainer.resume_mode", "trainer.resume_from_path", "trainer.nnodes",
    "trainer.n_gpus_per_node", "trainer.save_freq", "trainer.test_freq", "trainer.total_epochs",
    "reward.custom_reward_function.path", "reward.custom_reward_function.name",
]

ODD_EXTRA = 'backend.verl.extra={"actor_rollout_ref.actor.use_dynamic_bsz"=false}'
REWARD = '''
def my_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": float(solution_str == ground_truth), "probe": "rlctl"}
'''
PROBE = {"data_source": "x", "solution_str": "42", "ground_truth": "42"}


def recipe_for(version: str, sets: list[str], mutate: dict[str, Any], path: Path = SEED, reward: Path | None = None):
    extra = [f"backend.version={version}"]
    if reward is not None:
        extra += [f"reward.function={reward}", "reward.function_name=my_score"]
    r = load(path, extra + sets).recipe
    if "steps" in mutate:
        r.train.steps = mutate["steps"]
    if "episodes" in mutate:
        r.train.episodes = mutate["episodes"]
    if "wandb" in mutate:
        r.logging.wandb = mutate["wandb"]
    if "eval" in mutate:
        r.data.eval = mutate["eval"]
    if "extra" in mutate:
        r.backend.extra().update(mutate["extra"])
    if mutate.get("tiny_model"):  # verl's critic config loads the model's HF config: a local tiny model
        r.model.path = str(TINY)
    return r


TINY = vs.CACHE / "tiny-qwen2"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from rlctl.recipe.tiny_model import make_tiny

    d = tmp_path_factory.mktemp("verl-conformance")
    (d / "reward.py").write_text(REWARD)
    if not (TINY / "config.json").is_file():
        make_tiny(TINY)
    return d


@pytest.fixture(scope="module")
def verl_results(workdir):
    """{version: {job id: result}}: one verl subprocess per release, run side by side."""
    def jobs_for(version: str) -> list[dict[str, Any]]:
        jobs = []
        for path in BUNDLED:
            r = recipe_for(version, [], {}, path)
            jobs.append({"id": f"bundled:{path.name}", "overrides": VERL.render(r, DATASET).argv[3:],
                         "select": SELECT, "dataset_size": DATASET, "cwd": str(workdir)})
        for name, (sets, mutate) in VARIANTS.items():
            r = recipe_for(version, sets, mutate, reward=workdir / "reward.py")
            jobs.append({"id": name, "overrides": VERL.render(r, DATASET).argv[3:], "select": SELECT,
                         "dataset_size": DATASET, "reward_probe": PROBE, "cwd": str(workdir)})
        # the renders rlctl used to produce (issue 12): verl's own code shows what they did
        r = recipe_for(version, [], {}, reward=workdir / "reward.py")
        old = [a for a in VERL.render(r, DATASET).argv[3:] if not a.startswith(("trainer.total_epochs",
                                                                              "reward.custom_reward_function"))]
        old += ["trainer.total_epochs=1", f"+custom_reward_function.path={workdir / 'reward.py'}",
                "+custom_reward_function.name=my_score"]
        jobs.append({"id": "old_render", "overrides": old, "select": SELECT, "dataset_size": DATASET,
                     "reward_probe": PROBE, "cwd": str(workdir)})
        r = recipe_for(version, ["algorithm.name=ppo"], {})
        old = [a for a in VERL.render(r, DATASET).argv[3:] if not a.startswith("critic.")]
        jobs.append({"id": "old_ppo_no_critic", "overrides": old, "cwd": str(workdir)})
        # a rollout that does not split over the GPUs (dynamic batch size off): verl refuses, so does rlctl
        r = recipe_for(version, ["resources.gpus_per_node=3", ODD_EXTRA], {})
        jobs.append({"id": "odd_gpus", "overrides": VERL.render(r, DATASET).argv[3:], "cwd": str(workdir)})
        # retention: saves every 10 iterations, keep 2, then a restart (a new process, a new checkpoint manager)
        # (no eval set: with one, rlctl rotates instead, below)
        r = recipe_for(version, ["checkpoint.every=10", "checkpoint.keep_last=2", "checkpoint.dir=ckpt-" + version],
                       {"eval": None})
        jobs.append({"id": "retention", "overrides": VERL.render(r, DATASET).argv[3:], "cwd": str(workdir),
                     "checkpoints": [[10, 20, 30, 40], [50, 60]]})
        # with an eval set verl keeps every checkpoint (rlctl prunes, keeping the best-eval one)
        r = recipe_for(version, ["checkpoint.every=10", "checkpoint.keep_last=2", f"checkpoint.dir=evals-{version}"],
                       {})
        jobs.append({"id": "retention_evals", "overrides": VERL.render(r, DATASET).argv[3:], "cwd": str(workdir),
                     "checkpoints": [[10, 20, 30, 40], [50, 60]]})
        # the same, then rlctl prunes to keep_last, then verl resumes (resume = latest): it must find its step
        r = recipe_for(version, ["checkpoint.every=10", "checkpoint.keep_last=2", "checkpoint.resume=latest",
                                 f"checkpoint.dir=resume-{version}/ckpt"], {"eval": None})
        jobs.append({"id": "retention_resume", "overrides": VERL.render(r, DATASET).argv[3:], "cwd": str(workdir),
                     "checkpoints": [[10, 20, 30, 40], [50, 60]], "prune_keep_last": 2, "resume": True})
        r = recipe_for(version, ["checkpoint.resume=50", f"checkpoint.dir=resume-{version}/ckpt"], {})
        jobs.append({"id": "resume_probe_step", "overrides": VERL.render(r, DATASET).argv[3:], "cwd": str(workdir),
                     "resume": True})
        r = recipe_for(version, ["checkpoint.resume=off", f"checkpoint.dir=resume-{version}/ckpt"], {})
        jobs.append({"id": "resume_probe_off", "overrides": VERL.render(r, DATASET).argv[3:], "cwd": str(workdir),
                     "resume": True})
        return jobs

    def run(version: str) -> dict[str, Any]:
        try:
            vs.verl_root(version)
        except RuntimeError as e:
            pytest.skip(str(e))
        return {res["id"]: res for res in vs.run_jobs(version, jobs_for(version))}

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(VERSIONS, pool.map(run, VERSIONS), strict=True))


def _ok(res: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in res, res.get("error")
    return res["values"]


def close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-18), (i, x, y)


# ---------------------------------------------------------------------------------------------------------------
# 1. accepted by verl's own code


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("job", [f"bundled:{p.name}" for p in BUNDLED] + list(VARIANTS))
def test_composes_and_validates(verl_results, version, job):
    """Hydra composes the packaged ppo_trainer with the rendered overrides and validate_config passes."""
    _ok(verl_results[version][job])


@pytest.mark.parametrize("version", VERSIONS)
def test_what_rlctl_used_to_render(verl_results, version):
    """Issue 12's findings, shown by verl's code: total_epochs=1 stops the seed's 220-step run after 2 iterations
    (128 prompts // 64), a top-level custom_reward_function is never loaded, and PPO without critic settings
    fails validate_config."""
    old = verl_results[version]["old_render"]
    assert len(old["loop"]["steps"]) == 2 and old["loop"]["total_training_steps"] == 220
    assert old["reward"] is None
    assert "validate_config" in verl_results[version]["old_ppo_no_critic"]["error"]


@pytest.mark.parametrize("version", VERSIONS)
def test_placement_rules_agree_with_validate_config(verl_results, version):
    """rlctl's placement rule fails where verl's validate_config fails (a rollout not divisible over the GPUs), and
    catches what verl only asserts after the first rollout (engine_workers.py train_mini_batch: mini-batch % dp)."""
    from rlctl.backends.verl import placement_rules

    assert "real_train_batch_size" in verl_results[version]["odd_gpus"]["error"]
    assert [x.verdict for x in placement_rules(load(SEED, ["resources.gpus_per_node=3", ODD_EXTRA]).recipe)] == [
        "fail", "fail"]
    assert placement_rules(load(SEED, []).recipe) == []
    late = placement_rules(load(SEED, ["resources.gpus_per_node=8", "train.train_batch_size=4",
                                       "rollout.prompts_per_step=8"]).recipe)
    assert [("train_mini_batch" in x.figure) for x in late] == [True]


def test_multi_node_needs_a_cluster(tmp_path):
    from rlctl.backends.verl import nodes_rule

    empty = {"RAY_TMPDIR": str(tmp_path)}  # no `ray start` on this machine
    two = load(SEED, ["resources.nodes=2", "resources.gpus_per_node=8"]).recipe
    fail = nodes_rule(two, empty)
    assert [x.verdict for x in fail] == ["fail"] and "_check_resource_available" in fail[0].figure
    assert [x.verdict for x in nodes_rule(two, {**empty, "RAY_ADDRESS": "10.0.0.1:6379"})] == ["ok"]
    ray = load(SEED, ["resources.nodes=2", "resources.executor=ray", "resources.ray_address=http://h:8265"]).recipe
    assert nodes_rule(ray, empty) == []
    assert nodes_rule(load(SEED, []).recipe, empty) == []


def test_multi_node_joins_the_cluster_ray_start_brought_up(tmp_path, monkeypatch):
    """Issue 30 point 2.15: verl's documented multi-node path is `ray start --head` on one node, `ray start
    --address=...` on the others, then main_ppo on the head: its `ray.init()` (no address) joins that cluster, found
    through the address file `ray start` writes. Ray's own lookup decides (ray/_private/services.py
    canonicalize_bootstrap_address), on this machine's temp dir as `ray start` would have left it."""
    services = pytest.importorskip("ray._private.services")
    from rlctl.backends.verl import nodes_rule, ray_temp_dir

    two = load(SEED, ["resources.nodes=2", "resources.gpus_per_node=8"]).recipe
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    environ = {"RAY_TMPDIR": str(tmp_path)}
    marker = ray_temp_dir(environ) / "ray_current_cluster"
    assert services.canonicalize_bootstrap_address(None) is None  # Ray would start a new one here
    assert [x.verdict for x in nodes_rule(two, environ)] == ["fail"]
    marker.parent.mkdir(parents=True)
    marker.write_text("10.0.0.7:6379")  # what `ray start` writes (scripts.py: write_ray_address)
    assert services.canonicalize_bootstrap_address(None) == "10.0.0.7:6379"  # Ray joins it
    joined = nodes_rule(two, environ)
    assert [x.verdict for x in joined] == ["ok"] and "10.0.0.7:6379" in joined[0].figure


# ---------------------------------------------------------------------------------------------------------------
# 2. meaning: each concept read back from what verl resolved


def _variant(version: str, name: str, workdir: Path):
    sets, mutate = VARIANTS[name]
    return recipe_for(version, sets, mutate, reward=workdir / "reward.py")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_meaning(verl_results, workdir, version, name):
    res = verl_results[version][name]
    v = _ok(res)
    r = _variant(version, name, workdir)
    plan = VERL.render(r, DATASET)
    k = VERL.optimizer_steps_per_logged_step(r)
    loop = res["loop"]

    # reward function reached: verl's own loader (verl/trainer/ppo/reward.py get_custom_reward_fn) calls ours
    assert res["reward"] == {"score": 1.0, "probe": "rlctl"}
    # optimizer steps per iteration, as verl's update_actor counts them (engine_workers.py: data.shape[0] //
    # mini_batch_size_per_gpu * epochs, with trainer_base._update_actor's mini_batch = ppo_mini_batch_size x n)
    n = v[f"{A}.rollout.n"]
    verl_k = (v["data.train_batch_size"] * n) // (v[f"{A}.actor.ppo_mini_batch_size"] * n) * v[f"{A}.actor.ppo_epochs"]
    assert verl_k == k
    # total optimizer steps: iterations verl's fit loop really ran x optimizer steps each
    iterations = len(loop["steps"])
    assert iterations * k == VERL.total_steps(r, DATASET) == plan.total_steps
    if r.train.steps is not None:
        assert iterations * k == r.train.steps
    else:
        assert iterations == DATASET // r.rollout.prompts_per_step * r.train.episodes
    assert loop["optim_total_training_steps"] == iterations  # LR horizon: one scheduler step per iteration
    # LR curve (warmup included): verl's scheduler, held for each iteration's k optimizer steps
    per_step = [lr for lr in res["lrs"] for _ in range(k)]
    close(VERL.schedule(r, DATASET), per_step)
    peak = max(res["lrs"])
    assert math.isclose(peak, r.optim.lr, rel_tol=1e-9)
    first_peak = next(i for i, lr in enumerate(res["lrs"]) if math.isclose(lr, peak, rel_tol=1e-12))
    assert first_peak * k == VERL.warmup_steps(r, iterations * k)
    if r.optim.warmup_steps:
        assert first_peak * k == r.optim.warmup_steps
    if r.optim.schedule == "cosine_with_min_lr":
        assert math.isclose(min(res["lrs"][first_peak:]), r.optim.lr * r.optim.min_lr_ratio, rel_tol=0.02)
    # checkpoints: where, how often (in optimizer steps), how many kept, resume
    assert v["trainer.default_local_dir"] == r.checkpoint.dir
    unhonoured = {f.key for f in VERL.unhonoured(r)}
    if r.checkpoint.every:  # in optimizer steps; rounded to whole iterations only with a finding
        every = r.checkpoint.every if r.checkpoint.every % k == 0 else max(r.checkpoint.every // k, 1) * k
        assert (every == r.checkpoint.every) == ("checkpoint.every" not in unhonoured)
        assert [s * k for s in loop["saves"][:-1]] == list(range(every, iterations * k, every))
        assert loop["saves"][-1] == iterations  # the last step is saved too
    if r.eval.every and r.data.eval:
        every = r.eval.every if r.eval.every % k == 0 else max(r.eval.every // k, 1) * k
        assert (every == r.eval.every) == ("eval.every" not in unhonoured)
        assert [s * k for s in loop["tests"][1:-1]] == list(range(every, iterations * k, every))
    # with eval sets rlctl rotates (keeping the best-eval checkpoint): verl's null, keep all
    own = None if VERL.rotation_by_rlctl(r) else r.checkpoint.keep_last
    assert v["trainer.max_actor_ckpt_to_keep"] == own
    assert v["trainer.resume_mode"] == {"off": "disable", "latest": "auto"}.get(str(r.checkpoint.resume), "resume_path")
    if v["trainer.resume_mode"] == "resume_path":
        assert v["trainer.resume_from_path"] == f"{r.checkpoint.dir}/global_step_{r.checkpoint.resume}"
    if not r.checkpoint.save_optimizer:
        assert "optimizer" not in v[f"{A}.actor.checkpoint.save_contents"]
    # W&B on/off and where the key comes from (the environment of verl's TaskRunner, never the config)
    wb = r.logging.wandb
    assert ("wandb" in v["trainer.logger"]) == bool(wb)
    assert ("tensorboard" in v["trainer.logger"]) == bool(r.logging.tensorboard)
    if wb:
        assert v["trainer.project_name"] == wb.project and v["trainer.experiment_name"] == (wb.name or r.name)
        assert plan.env.get("WANDB_MODE") == ("offline" if wb.offline else None)
        assert plan.env.get("WANDB_API_KEY") == (None if wb.offline else "${WANDB_API_KEY}")
        assert plan.env.get("WANDB_ENTITY") == wb.entity
    assert not any("WANDB_API_KEY" in a for a in plan.argv)
    # KL
    kl = r.algorithm.kl_coef > 0
    assert res["use_reference_policy"] == kl
    assert v[f"{A}.actor.use_kl_loss"] == (kl and r.algorithm.use_kl_loss)
    assert v["algorithm.use_kl_in_reward"] == (kl and not r.algorithm.use_kl_loss)
    if v[f"{A}.actor.use_kl_loss"]:
        assert v[f"{A}.actor.kl_loss_coef"] == r.algorithm.kl_coef
        assert v[f"{A}.actor.kl_loss_type"] == {"k1": "kl", "k2": "mse"}.get(r.algorithm.kl_estimator, "low_var_kl")
    if v["algorithm.use_kl_in_reward"]:
        assert v["algorithm.kl_ctrl.kl_coef"] == r.algorithm.kl_coef and v["algorithm.kl_penalty"] == "kl"
    # group size, batch, lengths, sampling
    assert n == r.rollout.group_size and v["data.train_batch_size"] == r.rollout.prompts_per_step
    assert v[f"{A}.actor.ppo_mini_batch_size"] * n == r.train.train_batch_size
    assert v["data.max_prompt_length"] == v[f"{A}.rollout.prompt_length"] == r.data.max_prompt_tokens
    assert v["data.max_response_length"] == v[f"{A}.rollout.response_length"] == r.rollout.max_tokens
    assert v[f"{A}.rollout.temperature"] == r.rollout.temperature and v[f"{A}.rollout.top_p"] == r.rollout.top_p
    assert v[f"{A}.rollout.gpu_memory_utilization"] == r.rollout.gpu_memory_utilization
    assert v[f"{A}.rollout.tensor_model_parallel_size"] == r.rollout.tensor_parallel
    assert v[f"{A}.rollout.max_model_len"] == r.model.max_model_len
    assert v[f"{A}.actor.fsdp_config.param_offload"] == r.train.offload
    assert v[f"{A}.actor.optim.lr"] == r.optim.lr
    # the clip range verl's vanilla policy loss uses (trainer/ppo/core_algos.py compute_policy_loss_vanilla:
    # clip_ratio_low / clip_ratio_high when not None, which the packaged actor.yaml sets to 0.2, else clip_ratio)
    assert v[f"{A}.actor.policy_loss.loss_mode"] == "vanilla"
    for side in ("low", "high"):
        used = v[f"{A}.actor.clip_ratio_{side}"]
        assert (used if used is not None else v[f"{A}.actor.clip_ratio"]) == r.algorithm.eps_clip, side
    # where it can act (Backend.inert): the ratio is exactly 1 at the only update of a rollout when verl takes one
    # optimizer step per iteration (k above, from its composed config) and recomputes the old log-probs with the
    # actor (trainer_base._compute_old_log_prob: not in bypass mode, which takes the rollout's)
    one_update = verl_k == 1 and not v["algorithm.rollout_correction.bypass_mode"]
    inert = {i.key for i in VERL.inert(VERL.effective(r).recipe)}
    assert ("algorithm.eps_clip" in inert) == one_update, (name, verl_k, inert)
    assert (v["trainer.nnodes"], v["trainer.n_gpus_per_node"]) == (r.resources.nodes, r.resources.gpus_per_node)
    # without eval data verl still builds a validation set: never its gsm8k default, never run
    assert v["data.train_files"] == r.data.train and v["data.val_files"] == (r.data.eval or r.data.train)
    if not r.data.eval:
        assert v["data.val_max_samples"] == 1 and loop["tests"] == [] and v["trainer.test_freq"] == -1
    # model, LoRA, algorithm
    assert v[f"{A}.model.path"] == r.model.path
    if r.lora:
        assert (v[f"{A}.model.lora_rank"], v[f"{A}.model.lora_alpha"]) == (r.lora.rank, r.lora.alpha)
        assert v[f"{A}.model.target_modules"] == r.lora.target_modules
        # FSDP2, and vLLM loading the base itself: the adapter reaches vLLM (test_verl_lora_sync.py)
        assert (v[f"{A}.actor.strategy"], v[f"{A}.ref.strategy"], v[f"{A}.rollout.load_format"]) == (
            "fsdp2", "fsdp2", "auto")
    else:
        assert v[f"{A}.model.lora_rank"] == 0
        assert (v[f"{A}.actor.strategy"], v[f"{A}.rollout.load_format"]) == ("fsdp", "dummy")  # verl's defaults
    adv = {"grpo": "grpo", "dr_grpo": "grpo", "reinforce_baseline": "reinforce_plus_plus_baseline", "ppo": "gae"}
    assert v["algorithm.adv_estimator"] == adv[r.algorithm.name]
    assert v["algorithm.norm_adv_by_std_in_grpo"] == (r.algorithm.name != "dr_grpo")
    if r.algorithm.name == "dr_grpo":  # Dr. GRPO: token sum over a constant (the generation budget)
        assert v[f"{A}.actor.loss_agg_mode"] == "seq-mean-token-sum-norm"
        assert v[f"{A}.actor.loss_scale_factor"] == r.rollout.max_tokens
    assert res["use_critic"] == (r.algorithm.name == "ppo")
    if r.algorithm.name == "ppo":
        assert v["critic.model.path"] == r.model.path
        assert v["trainer.max_critic_ckpt_to_keep"] == own
        assert v["critic.ppo_mini_batch_size"] == v[f"{A}.actor.ppo_mini_batch_size"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.name)
def test_bundled_recipe_means_what_it_says(verl_results, version, path):
    res = verl_results[version][f"bundled:{path.name}"]
    v = _ok(res)
    r = recipe_for(version, [], {}, path)
    k = VERL.optimizer_steps_per_logged_step(r)
    assert v["reward.custom_reward_function.path"] == r.reward.function
    assert v["reward.custom_reward_function.name"] == r.reward.function_name
    assert len(res["loop"]["steps"]) * k == r.train.steps == VERL.total_steps(r, DATASET)
    close(VERL.schedule(r, DATASET), [lr for lr in res["lrs"] for _ in range(k)])
    assert [(f.level, f.key) for f in VERL.unhonoured(r)] == []


@pytest.mark.parametrize("version", VERSIONS)
def test_progress_counts_the_unit_verl_logs(verl_results, workdir, version):
    """verl logs `step:N` per iteration (trainer_base.fit: logger.log(step=global_steps)); rlctl's ETA multiplies."""
    r = _variant(version, "minibatches", workdir)
    res = verl_results[version]["minibatches"]
    assert VERL.optimizer_steps_per_logged_step(r) == 4
    assert res["loop"]["steps"] == list(range(1, 220 // 4 + 1))


# ---------------------------------------------------------------------------------------------------------------
# 3. exact versions


def test_known_versions_have_generated_snapshots():
    import importlib.util

    spec = importlib.util.spec_from_file_location("snapshot_verl", ROOT / "scripts" / "snapshot_verl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for version in VERSIONS:
        try:
            vs.verl_root(version)
        except RuntimeError as e:
            pytest.skip(str(e))
        committed = json.loads((ROOT / "rlctl/backends/verl/snapshots" / f"{version}.json").read_text())
        fresh = json.loads(json.dumps(mod.snapshot(version)))
        assert committed == fresh, f"regenerate: python scripts/snapshot_verl.py {version}"
    assert sorted(p.stem for p in (ROOT / "rlctl/backends/verl/snapshots").glob("*.json")) == sorted(VERSIONS)


def test_newest_release_is_known():
    """`pip index versions verl`: the newest release on PyPI is one rlctl renders exactly (skipped offline)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "verl"], capture_output=True, text=True)
    if r.returncode != 0 or "Available versions" not in r.stdout:
        pytest.skip("PyPI not reachable")
    newest = r.stdout.split("(", 1)[1].split(")", 1)[0]
    assert newest in VERSIONS, f"verl {newest} is out: snapshot it and add it to known_versions"


def test_an_appended_key_is_checked_where_hydra_appends_it():
    """`+key=value` adds a key under an existing node (verl's open `override_config` dict): rlctl accepts it there,
    and refuses it under a node verl's config lacks, or for a key that exists already (Hydra refuses both)."""
    r = load(SEED, []).recipe
    ok = "+actor_rollout_ref.model.override_config.attn_implementation"
    for key, refused in ((ok, False), ("+actor_rollout_ref.model.no_such_node.x", True),
                         ("+actor_rollout_ref.rollout.n", True)):
        r.backend.extra().clear()
        r.backend.extra()[key] = "sdpa"
        errors = [f for f in VERL.validate(VERL.render(r, DATASET), None) if f.level == "error"]
        assert [f.key for f in errors] == ([key] if refused else []), errors


def test_unknown_version_is_an_error_not_a_guess(cli):
    with pytest.raises(UnknownVersion, match=r"verl 0\.8\.0 is not known to rlctl; known: 0\.9\.0, 0\.9\.1"):
        VERL.render(load(SEED, ["backend.version=0.8.0"]).recipe)
    res = cli("render", str(SEED), "--set", "backend.version=0.9.2")
    assert res.code == 2 and "verl 0.9.2 is not known to rlctl" in res.err and "Traceback" not in res.err


@pytest.mark.parametrize("version", VERSIONS)
def test_each_release_validates_against_its_own_keys(version):
    r = load(SEED, [f"backend.version={version}"]).recipe
    plan = VERL.render(r, DATASET)
    assert plan.version == version and VERL.validate(plan, None) == []
    # a key only 0.9.1 has is refused for 0.9.0 (and named with the release)
    r = load(SEED, [f"backend.version={version}",
                    'backend.verl.extra={"actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation"'
                    '=true}']).recipe
    errors = VERL.validate(VERL.render(r, DATASET), None)
    assert bool(errors) == (version == "0.9.0")
    if errors:
        assert "verl 0.9.0" in errors[0].message


# ---------------------------------------------------------------------------------------------------------------
# 4. nothing silent


@pytest.mark.parametrize("sets,key,level", [
    (["resources.colocate=false"], "resources.colocate", "warn"),
    (["lora.rank=8", "lora.dropout=0.1"], "lora.dropout", "warn"),
    (["optim.schedule=linear"], "optim.schedule", "error"),
    (["train.train_batch_size=64", "train.steps=221"], "train.steps", "error"),
    (["train.train_batch_size=64", "optim.warmup_steps=10"], "optim.warmup_steps", "error"),
    (["train.train_batch_size=96"], "train.train_batch_size", "error"),
    (["train.train_batch_size=64", "checkpoint.every=50"], "checkpoint.every", "warn"),
    (["resources.trainer_gpus=[0]", "resources.inference_gpus=[0]"], "resources.trainer_gpus", "warn"),
    (["checkpoint.final_dir=final"], "checkpoint.final_dir", "warn"),
    (["data.label_key=answer"], "data.label_key", "warn"),
    (["model.dtype=float32"], "model.dtype", "warn"),
    (["train.zero_stage=3"], "train.zero_stage", "warn"),
    (["algorithm.name=ppo"], "algorithm.name", "warn"),
])
def test_unhonoured_keys_are_findings(sets, key, level):
    r = load(SEED, sets).recipe
    found = {(f.key, f.level) for f in VERL.unhonoured(r)}
    assert (key, level) in found


def test_unhonoured_reaches_render_and_preflight(cli):
    res = cli("render", str(SEED), "--set", "lora.rank=8", "--set", "lora.dropout=0.1", "--json")
    assert res.code == 0, res.err
    assert any(f["key"] == "lora.dropout" for f in json.loads(res.out)["findings"])
    res = cli("preflight", str(SEED), "--set", "optim.schedule=linear", "--only", "env.flags", "--json")
    results = json.loads(res.out)["results"]
    assert res.code == 1 and any(x["verdict"] == "fail" and "no linear decay" in x["figure"] for x in results)


# ---------------------------------------------------------------------------------------------------------------
# 5. retention on disk, on the layout verl's own _save_checkpoint and checkpoint manager produce


@pytest.mark.parametrize("version", VERSIONS)
def test_retention_on_verls_layout(verl_results, workdir, version, tmp_path):
    import shutil

    assert "error" not in verl_results[version]["retention"]
    root = tmp_path / "run" / "ckpt"
    shutil.copytree(workdir / f"ckpt-{version}", root)
    r = load(SEED, ["checkpoint.every=10", "checkpoint.keep_last=2", 'data.eval=""']).recipe
    found = VERL.checkpoints(root)
    # verl rotated actor/ within each process lifetime, but a restart starts a new manager: 30 and 40 stay, and the
    # rotated steps keep global_step_N/data.pt
    assert [(c.step, c.complete) for c in found] == [(10, False), (20, False), (30, True), (40, True), (50, True),
                                                     (60, True)]
    assert sorted(p.name for p in (root / "global_step_10").iterdir()) == ["data.pt"]
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "60"
    assert sorted(p.name for p in (root / "global_step_60" / "actor").iterdir()) == [
        "extra_state_world_size_1_rank_0.pt", "fsdp_config.json", "huggingface", "model_world_size_1_rank_0.pt",
        "optim_world_size_1_rank_0.pt"]
    # so rlctl prunes during the run, and the disk check counts keep_last
    assert VERL.prune_during_run(r) and VERL.kept_checkpoints(r) == 2
    doomed = ck.prune("verl", tmp_path / "run", 2, root=root)
    assert [c.step for c in doomed] == [10, 20, 30, 40]
    assert [(c.step, c.complete) for c in VERL.checkpoints(root)] == [(50, True), (60, True)]


@pytest.mark.parametrize("version", VERSIONS)
def test_rotation_by_rlctl_keeps_the_best_eval_checkpoint(verl_results, workdir, version, tmp_path):
    """keep_last with an eval set (issue 24): verl, run with the rendered config, rotates nothing away; rlctl's pruning
    keeps the keep_last newest plus the checkpoint marked best."""
    import shutil

    from rlctl.core.state import write_state

    assert "error" not in verl_results[version]["retention_evals"]
    run = tmp_path / "run-20261125-000000"
    root = run / "ckpt"
    shutil.copytree(workdir / f"evals-{version}", root)
    r = load(SEED, ["checkpoint.every=10", "checkpoint.keep_last=2"]).recipe
    assert VERL.rotation_by_rlctl(r) and VERL.prune_during_run(r) and VERL.kept_checkpoints(r) == 3
    assert [(c.step, c.complete) for c in VERL.checkpoints(root)] == [(s, True) for s in (10, 20, 30, 40, 50, 60)]
    write_state(run, backend="verl", best_checkpoint={"step": 20, "key": "eval/default/greedy_pass@1", "value": 0.6})
    doomed = ck.prune("verl", run, 2, keep_best=True, root=root)
    assert [c.step for c in doomed] == [10, 30, 40]
    assert [(c.step, c.complete) for c in VERL.checkpoints(root)] == [(20, True), (50, True), (60, True)]

@pytest.mark.parametrize("version", VERSIONS)
def test_resume_after_rlctl_pruning(verl_results, workdir, version):
    """After verl's saves (with a restart) and rlctl's in-run pruning, verl's own _load_checkpoint resumes from the
    newest step (resume = latest), from the step named (resume = N), or not at all (resume = off)."""
    res = verl_results[version]["retention_resume"]
    assert res["pruned"] == [10, 20, 30, 40]
    root = workdir / f"resume-{version}" / "ckpt"
    assert res["resume"] == {"global_steps": 60, "actor": str(root / "global_step_60" / "actor"), "data": True}
    assert verl_results[version]["resume_probe_step"]["resume"]["global_steps"] == 50
    assert verl_results[version]["resume_probe_step"]["resume"]["actor"] == str(root / "global_step_50" / "actor")
    assert verl_results[version]["resume_probe_off"]["resume"] == {"global_steps": 0}


def test_checkpoint_size_counts_what_verl_writes():
    """Actor fp32 shards (+ Adam), the HF export when save_contents has hf_model, the critic's shards for ppo."""
    from types import SimpleNamespace

    arch = SimpleNamespace(params=1e9, lora_params=lambda rank, modules: 1e7)
    size = lambda *sets: VERL.checkpoint_bytes(arch, load(SEED, list(sets)).recipe)[0]  # noqa: E731
    assert size() == 12e9 and size("checkpoint.save_optimizer=false") == 4e9
    assert size('backend.verl.extra={"actor_rollout_ref.actor.checkpoint.save_contents"=["model","hf_model"]}') == \
        14e9
    assert size("algorithm.name=ppo") == 24e9 and size("lora.rank=8") == 4e9 + 8e7


def test_half_written_checkpoint_is_incomplete(tmp_path):
    """A step past the tracker, or with a rank's model shard missing, is not a checkpoint to resume from."""
    for step, ranks in ((10, (0, 1)), (20, (0,)), (30, (0, 1))):
        d = tmp_path / f"global_step_{step}" / "actor"
        d.mkdir(parents=True)
        for rank in ranks:
            (d / f"model_world_size_2_rank_{rank}.pt").write_bytes(b"m")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("20")
    assert [(c.step, c.complete) for c in VERL.checkpoints(tmp_path)] == [(10, True), (20, False), (30, False)]


# ---------------------------------------------------------------------------------------------------------------
# 6. W&B: where the key comes from, and preflight when none can reach the job


def test_wandb_key_must_reach_the_job():
    from rlctl.backends.verl import wandb_reaches_job

    ray = load(SEED, ["resources.executor=ray"]).recipe  # the head rlctl starts inherits the key
    assert [x.verdict for x in wandb_reaches_job(ray, {})] == ["fail"]
    assert [x.verdict for x in wandb_reaches_job(ray, {"WANDB_API_KEY": "k"})] == ["ok"]
    # a cluster rlctl did not start is never sent the key (runtime env = the job record): its nodes must have it
    remote = load(SEED, ["resources.executor=ray", "resources.ray_address=http://head:8265"]).recipe
    res = wandb_reaches_job(remote, {"WANDB_API_KEY": "k"})
    assert [x.verdict for x in res] == ["warn"] and "not sent" in res[0].figure and "docs/ray.md" in res[0].fix
    local = load(SEED, []).recipe
    assert wandb_reaches_job(local, {"WANDB_API_KEY": "k"}) == []
    assert [x.verdict for x in wandb_reaches_job(local, {"RAY_ADDRESS": "auto"})] == ["warn"]
    offline = load(SEED, ["logging.wandb.offline=true", "resources.executor=ray"]).recipe
    assert wandb_reaches_job(offline, {}) == []


def test_wandb_env_check_through_the_adapter(monkeypatch):
    from rlctl.preflight import Context
    from rlctl.recipe.planning import prepare

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    prep = prepare(SEED, ["resources.executor=ray"])  # the head rlctl starts: it would inherit a key, there is none
    def wandb(prep):  # the env family also says which attention verl's workers load (env.flash_attn)
        return [x.verdict for x in VERL.preflight(Context(prep), "env") if x.check == "env.wandb_job"]

    assert wandb(prep) == ["fail"]
    assert [x.set for x in VERL.preflight(Context(prep), "env") if x.check == "env.wandb_job"] == [
        {"logging.wandb.offline": True}]
    # a cluster rlctl did not start is never sent the key: its nodes must have it (docs/ray.md), so a warning
    prep = prepare(SEED, ["resources.executor=ray", "resources.ray_address=http://head:8265"])
    assert wandb(prep) == ["warn"]
