"""prime-rl conformance: every bundled prime-rl recipe and a matrix of variants, rendered by rlctl for each tag it
knows, validated with `jsonschema` against that tag's RLConfig JSON Schema (rlctl/backends/prime_rl/schemas/, made
from prime-rl's real sources by scripts/prime_rl_schema.py), checked by the re-encoded cross-field validators (each
test cites the file:line at the tag), and read back the way prime-rl loads it — the TOML plus the schema's defaults
plus its shared-field propagation — to assert that each concept means what the recipe says.

Paths cited: v0.3.0 under src/prime_rl/, v0.8.0 under packages/prime-rl-configs/src/prime_rl/ (configs) and
src/prime_rl/ (runtime), of github.com/PrimeIntellect-ai/prime-rl at the tag.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import jsonschema  # the dev extra: CI must validate, never skip
import pytest

from rlctl.backends import get_backend
from rlctl.backends.base import UnknownVersion
from rlctl.backends.prime_rl import CHECKOUT_ENV, deep_merge, layout
from rlctl.backends.prime_rl import checkpoints as pck
from rlctl.backends.prime_rl.schema import load_schema, nulls, resolved
from rlctl.recipe.loader import load

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
BUNDLED = sorted(RECIPES.glob("prime-rl-*.toml"))
TWO_GPU = RECIPES / "prime-rl-qwen3-8b-2xh100.toml"
SHARED = RECIPES / "prime-rl-qwen2.5-7b-1xh100-shared.toml"
PRIME = get_backend("prime_rl")
VERSIONS = PRIME.known_versions

SPLIT = ["resources.gpus_per_node=2", "resources.colocate=false", "resources.inference_gpus=[0]",
         "resources.trainer_gpus=[1]"]
ONE_GPU = ["resources.gpus_per_node=1", "resources.colocate=true", "resources.inference_gpus=[0]",
           "resources.trainer_gpus=[0]", "rollout.gpu_memory_utilization=0.5"]

# name -> (--set overrides, assignments --set cannot express: "section.key" -> value; None removes a table). Based on
# the 2xH100 seed without its v0.3-only extras; every variant must be accepted by every tag (those a tag rejects are
# tested below, one by one).
VARIANTS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "seed": ([], {}),
    "full": ([], {"lora": None}),
    "lora-targets": (['lora.target_modules=["q_proj","v_proj"]', "lora.dropout=0.05"], {}),
    "cosine-warmup": (['optim.schedule="cosine"', "optim.warmup_steps=20"], {}),
    "cosine-min-lr": (['optim.schedule="cosine_with_min_lr"', "optim.warmup_steps=20", "optim.min_lr_ratio=0.2"], {}),
    "linear-ratio": (['optim.schedule="linear"', "optim.warmup_ratio=0.05"], {}),
    "constant-warmup": (["optim.warmup_steps=10"], {}),
    "kl": (["algorithm.kl_coef=0.02"], {}),
    "no-kl": (["algorithm.kl_coef=0.0"], {}),
    "resume": (["checkpoint.resume=20"], {}),
    "wandb-offline": (["logging.wandb.offline=true"], {}),
    "wandb-off": ([], {"logging.wandb": None}),
    "offload": (["train.offload=true"], {}),
    "no-ac": (["train.gradient_checkpointing=false"], {}),
    "tp2-4gpu": (["resources.gpus_per_node=4", "resources.inference_gpus=[0,1]", "resources.trainer_gpus=[2,3]",
                  "rollout.tensor_parallel=2"], {}),
    "no-ckpt": ([], {"checkpoint.every": None, "checkpoint.keep_last": None}),
}


def render(path: Path, version: str, sets: list[str] = (), mutations: dict[str, Any] | None = None,
           extra: bool = False):
    base = [] if extra else ["backend.prime_rl.extra={}"]
    r = load(path, [*base, f'backend.version="{version}"', *sets]).recipe
    for dotted, value in (mutations or {}).items():
        *parents, leaf = dotted.split(".")
        obj = r
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, leaf, value)
    plan = PRIME.render(r)
    return r, plan, tomllib.loads(plan.files["rl.toml"])


def errors(plan) -> list[Any]:
    return [f for f in PRIME.validate(plan, None) if f.level == "error"]


def schema_errors(cfg: dict, version: str) -> list[str]:
    cfg = nulls(cfg)  # "None" is null to prime-rl's BaseConfig
    v = jsonschema.Draft202012Validator(load_schema(version))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(cfg)]


def effective(cfg: dict, version: str, concept: str) -> Any:
    """A concept as prime-rl's trainer/orchestrator see it after its shared-field propagation (v0.3.0 rl.py:256-376
    auto_setup_*; v0.8.0 utils/validation.py:67-196 propagate_shared_fields), on the TOML + schema defaults."""
    full = resolved(cfg, version)
    t, o = full["trainer"], full["orchestrator"]
    shared = cfg  # shared blocks: only what the file sets (their defaults are None = "not shared")

    def pick(shared_path: str, sub: Any) -> Any:
        node: Any = shared
        for k in shared_path.split("."):
            if not isinstance(node, dict) or k not in node:
                return sub
            node = node[k]
        return node

    if concept == "max_steps":
        return pick("max_steps", t.get("max_steps")), pick("max_steps", o.get("max_steps"))
    if concept == "output_dir":
        out = pick("output_dir", None)
        return (out or t["output_dir"]), (f"{out}/run_default" if out else o["output_dir"])
    if concept == "ckpt":
        return {k: pick(f"ckpt.{k}", (t.get("ckpt") or {}).get(k)) for k in ("interval", "keep_last", "resume_step")} \
            if ("ckpt" in cfg or t.get("ckpt")) else None
    if concept == "wandb":
        w_t, w_o = cfg.get("trainer", {}).get("wandb"), cfg.get("orchestrator", {}).get("wandb")
        if "wandb" not in cfg and w_t is None:
            return None
        return {"offline_trainer": pick("wandb.offline", (w_t or {}).get("offline", False)),
                "offline_orchestrator": pick("wandb.offline", (w_o or {}).get("offline", False)),
                "project": pick("wandb.project", (w_t or {}).get("project"))}
    if concept == "kl_tau":
        return t["loss"]["kl_tau"]
    if concept == "group_size":
        return o["rollouts_per_example"] if layout(version) == "v0.3" else o["group_size"]
    if concept == "max_tokens":
        return o["sampling"]["max_tokens"] if layout(version) == "v0.3" else o["train"]["sampling"][
            "max_completion_tokens"]
    if concept == "temperature":
        return o["sampling"]["temperature"] if layout(version) == "v0.3" else o["train"]["sampling"]["temperature"]
    if concept == "env":
        if layout(version) == "v0.3":
            e = o["env"][0]
            return e["id"], e.get("args", {})
        src = o["train"]["source"][0]
        return src["legacy"]["id"], src["legacy"].get("args", {})
    raise KeyError(concept)


# ---- 1. every render is accepted by the tag's own schema and validators -------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_matrix_validates_against_the_tags_schema(version, name):
    sets, mutations = VARIANTS[name]
    r, plan, cfg = render(TWO_GPU, version, sets, mutations)
    assert schema_errors(cfg, version) == []
    assert [f.message for f in errors(plan)] == []


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("placement", ["split", "one-gpu"])
@pytest.mark.parametrize("full", [False, True])
def test_placements_per_tag(version, placement, full):
    """v0.3.0 shares one GPU between trainer and inference (inference_gpu_ids = trainer_gpu_ids = [0]); v0.8.0's
    deployment cannot: SingleNodeDeploymentConfig.validate_gpu_count, configs/rl.py:176-184 at v0.8.0."""
    r, plan, cfg = render(TWO_GPU, version, SPLIT if placement == "split" else ONE_GPU, {"lora": None} if full else {})
    assert schema_errors(cfg, version) == []  # the schema alone cannot see it
    found = errors(plan)
    if placement == "one-gpu" and version == "0.8.0":
        assert [f.key for f in found] == ["resources"]
        assert "configs/rl.py:176-184" in found[0].message
    else:
        assert found == []
    if layout(version) == "v0.3":
        assert (cfg["inference_gpu_ids"], cfg["trainer_gpu_ids"]) == (([0], [1]) if placement == "split" else
                                                                      ([0], [0]))
    else:
        assert cfg["deployment"] == {"type": "single_node", "num_train_gpus": 1, "num_infer_gpus": 1,
                                     "gpus_per_node": 2 if placement == "split" else 1}


@pytest.mark.parametrize("recipe", BUNDLED, ids=lambda p: p.stem)
def test_bundled_recipes_are_accepted_by_the_tag_they_pin(recipe):
    r, plan, cfg = render(recipe, "0.3.0", extra=True)
    assert r.backend.version == "0.3.0"
    assert schema_errors(cfg, "0.3.0") == []
    assert errors(plan) == []


def test_bundled_recipes_on_v080_are_rejected_as_prime_rl_would():
    """The seeds' v0.3 extras and the shared GPU on v0.8.0: what prime-rl v0.8.0's RLConfig raises (checked against
    the real classes with scripts/prime_rl_schema.py --check), rlctl says before launch."""
    _, plan, _ = render(TWO_GPU, "0.8.0", extra=True)
    assert sorted(f.key for f in errors(plan)) == ["inference.model.enable_auto_tool_choice", "orchestrator.buffer"]
    _, plan, _ = render(SHARED, "0.8.0", extra=True)
    found = errors(plan)
    assert sorted(f.key for f in found) == ["inference.model.enable_auto_tool_choice", "model.path", "resources"]
    renderer = next(f for f in found if f.key == "model.path")
    assert "configs/orchestrator.py:630-662" in renderer.message and "renderer.name" in renderer.fix


@pytest.mark.parametrize("version", VERSIONS)
def test_schema_rejects_unknown_keys_types_and_constraints(version):
    _, plan, cfg = render(TWO_GPU, version)
    for bad, _key in (({"trainer": {"model": {"lora": {"rnak": 8}}}}, "trainer.model.lora.rnak"),
                     ({"orchestrator": {"top_p": 0.9}}, "orchestrator.top_p")):
        c = tomllib.loads(plan.files["rl.toml"])
        deep_merge(c, next(iter(bad)), bad[next(iter(bad))])
        assert schema_errors(c, version)
    c = tomllib.loads(plan.files["rl.toml"])
    c["trainer"]["loss"]["kl_tau"] = -1.0  # Field(ge=0)
    assert any("kl_tau" in e for e in schema_errors(c, version))
    c = tomllib.loads(plan.files["rl.toml"])
    c["ckpt"]["keep_last"] = 0  # Field(ge=1)
    assert any("keep_last" in e for e in schema_errors(c, version))
    c = tomllib.loads(plan.files["rl.toml"])
    c["max_steps"] = "many"
    assert schema_errors(c, version)


# ---- 2. meaning: each concept read back as prime-rl resolves it -------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_concepts_mean_what_the_recipe_says(version, name):
    sets, mutations = VARIANTS[name]
    r, plan, cfg = render(TWO_GPU, version, sets, mutations)
    assert effective(cfg, version, "max_steps") == (r.train.steps, r.train.steps) == (plan.total_steps,) * 2
    assert effective(cfg, version, "group_size") == r.rollout.group_size
    assert effective(cfg, version, "max_tokens") == r.rollout.max_tokens
    assert effective(cfg, version, "temperature") == r.rollout.temperature
    full_cfg = resolved(cfg, version)
    assert full_cfg["orchestrator"]["batch_size"] == r.train.train_batch_size
    assert full_cfg["trainer"]["model"]["seq_len"] == full_cfg["orchestrator"]["seq_len"] == r.train_seq_len
    assert full_cfg["inference"]["model"]["max_model_len"] == r.model.max_model_len
    assert full_cfg["trainer"]["optim"]["lr"] == r.optim.lr
    assert full_cfg["trainer"]["optim"]["max_norm"] == r.optim.max_grad_norm
    assert full_cfg["trainer"]["optim"]["weight_decay"] == r.optim.weight_decay  # default 0.01 otherwise
    # reward: the environment is reached, with its args
    assert effective(cfg, version, "env") == (r.reward.environment.id, dict(r.reward.environment.args))
    # KL: v0.3.0's kl_tau defaults to 0 (trainer/rl/config.py:55), v0.8.0's to 1e-3 (configs/trainer.py:468)
    assert effective(cfg, version, "kl_tau") == r.algorithm.kl_coef
    # checkpoint dir and retention: everything lives under output_dir = checkpoint.dir
    assert effective(cfg, version, "output_dir") == (r.checkpoint.dir, f"{r.checkpoint.dir}/run_default")
    ck = effective(cfg, version, "ckpt")
    if r.checkpoint.every or r.checkpoint.keep_last or r.checkpoint.resume != "off":
        assert ck == {"interval": r.checkpoint.every, "keep_last": r.checkpoint.keep_last,
                      "resume_step": r.checkpoint.resume if isinstance(r.checkpoint.resume, int) else None}
    else:
        assert ck is None  # checkpointing off, as prime-rl's default
    # LoRA
    lora = full_cfg["trainer"]["model"].get("lora")
    if r.lora is None:
        assert lora is None
    else:
        assert (lora["rank"], lora["alpha"], lora["dropout"]) == (r.lora.rank, r.lora.alpha, r.lora.dropout)
    # W&B on / off / offline, and where the key comes from
    wb = effective(cfg, version, "wandb")
    if r.logging.wandb is None:
        assert wb is None and "WANDB_API_KEY" not in plan.env
    else:
        assert wb == {"offline_trainer": r.logging.wandb.offline, "offline_orchestrator": r.logging.wandb.offline,
                      "project": r.logging.wandb.project}
        assert ("WANDB_API_KEY" in plan.env) is (not r.logging.wandb.offline)
        if version == "0.8.0":  # SharedWandbConfig.validate_not_offline, configs/rl.py:84-93
            assert not cfg.get("wandb", {}).get("offline")
    # activation checkpointing and offload
    m = full_cfg["trainer"]["model"]
    ac_on = m.get("ac") is not None or m.get("ac_offloading") is not None  # :262-267 at v0.8.0
    assert ac_on is r.train.gradient_checkpointing
    assert full_cfg["trainer"]["model"]["fsdp_cpu_offload"] is r.train.offload
    if version == "0.8.0":  # cpu_offload_mutual_exclusion, configs/trainer.py:276-279
        assert not (full_cfg["trainer"]["model"]["fsdp_cpu_offload"] and full_cfg["trainer"]["model"][
            "optim_cpu_offload"])


def test_kl_tau_default_changed_on_v080_and_rlctl_always_says_it():
    for version, default in (("0.3.0", 0.0), ("0.8.0", 1e-3)):
        _, _, cfg = render(TWO_GPU, version, ["algorithm.kl_coef=0.0"])
        without = dict(cfg, trainer=dict(cfg["trainer"]))
        without["trainer"].pop("loss")
        assert resolved(without, version)["trainer"]["loss"]["kl_tau"] == default
        assert resolved(cfg, version)["trainer"]["loss"]["kl_tau"] == 0.0


def _prime_rl_lr_curve(sched: dict, lr: float, max_steps: int) -> list[float]:
    """prime-rl's trainer/scheduler.py (setup_constant/linear/cosine_scheduler, identical at v0.3.0 and v0.8.0) run
    with torch on the scheduler table prime-rl resolved."""
    torch = pytest.importorskip("torch")
    from torch.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, LinearLR, SequentialLR

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    kind = sched["type"]
    if kind == "constant":
        s = ConstantLR(opt, factor=1.0)
    else:
        warmup, min_lr = sched["warmup_steps"], sched["min_lr"]
        f = min_lr / lr if min_lr > 0 else 1e-8
        scheds, miles = [], []
        if warmup > 0:
            scheds.append(LinearLR(opt, start_factor=f, end_factor=1.0, total_iters=warmup))
            miles.append(warmup)
        if kind == "cosine":
            scheds.append(CosineAnnealingLR(opt, T_max=max_steps - warmup, eta_min=min_lr))
        elif sched["decay_steps"] > 0:
            start = max_steps - sched["decay_steps"]
            scheds.append(LinearLR(opt, start_factor=1.0, end_factor=1.0, total_iters=start - warmup))
            scheds.append(LinearLR(opt, start_factor=1.0, end_factor=f, total_iters=sched["decay_steps"] - 1))
            miles.append(start)
        s = scheds[0] if len(scheds) == 1 else SequentialLR(opt, scheds, milestones=miles)
    out = []
    for _ in range(max_steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("sets", [["optim.warmup_steps=10"], ['optim.schedule="cosine"', "optim.warmup_steps=20"],
                                  ['optim.schedule="linear"', "optim.warmup_ratio=0.1"], ['optim.schedule="constant"'],
                                  ['optim.schedule="cosine_with_min_lr"', "optim.min_lr_ratio=0.2"]])
def test_lr_curve_and_warmup_are_what_preflight_reports(version, sets):
    r, plan, cfg = render(TWO_GPU, version, ["train.steps=120", *sets])
    full = resolved(cfg, version)
    sched = full["trainer"]["scheduler"]
    want_warmup = PRIME.warmup_steps(r, 120)
    assert sched.get("warmup_steps", 0) == want_warmup
    curve = _prime_rl_lr_curve(sched, full["trainer"]["optim"]["lr"], full["max_steps"])
    ours = PRIME.schedule(r, None)
    floor = r.optim.lr * r.optim.min_lr_ratio if r.optim.schedule == "cosine_with_min_lr" else 0.0
    assert sched.get("min_lr", 0.0) == pytest.approx(floor)  # cosine and linear end at 0, as in the other backends
    assert len(ours) == len(curve) == 120
    assert all(abs(a - b) <= 1e-12 + 1e-6 * abs(b) for a, b in zip(ours, curve, strict=True))


# ---- 3. exact versions -----------------------------------------------------------------------------------------

def test_known_versions_render_their_own_dialect_and_unknown_is_an_error():
    assert {"0.3.0", "0.8.0"} <= set(VERSIONS)
    _, _, old = render(TWO_GPU, "0.3.0")
    _, _, new = render(TWO_GPU, "0.8.0")
    assert "inference_gpu_ids" in old and "rollouts_per_example" in old["orchestrator"]
    assert "deployment" in new and "group_size" in new["orchestrator"] and "sampling" not in new["orchestrator"]
    for v in ("0.5.0", "0.8.1", "0.3"):
        with pytest.raises(UnknownVersion, match="known: 0.3.0, 0.8.0"):
            render(TWO_GPU, v)


def test_each_schema_names_its_source_tag():
    for v in VERSIONS:
        meta = load_schema(v)["x-rlctl"]
        assert f"v{v} (" in meta["source"] and meta["generator"] == "scripts/prime_rl_schema.py"
        assert load_schema(v)["additionalProperties"] is False


# ---- 3b. extras merge deeply ---------------------------------------------------------------------------------------

def test_nested_extra_table_merges_instead_of_replacing():
    r = load(TWO_GPU, ['backend.version="0.3.0"',
                       'backend.prime_rl.extra={inference={model={tool_call_parser="hermes"}}}']).recipe
    cfg = tomllib.loads(PRIME.render(r).files["rl.toml"])
    assert cfg["inference"]["model"]["tool_call_parser"] == "hermes"
    assert cfg["inference"]["model"]["max_model_len"] == r.model.max_model_len  # kept
    assert cfg["inference"]["gpu_memory_utilization"] == r.rollout.gpu_memory_utilization


# ---- 4. nothing silent -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_unhonoured_recipe_keys_are_said(version):
    def keys(*sets, reward_function=None):
        r = load(TWO_GPU, ["backend.prime_rl.extra={}", f'backend.version="{version}"', *sets]).recipe
        if reward_function:
            r.reward.environment = None
            r.reward.function = reward_function
        return {f.key: f.level for f in PRIME.unhonoured(r)}

    assert keys() == {"data.train": "warn"} or keys() == {}  # the seed's data.train is the environment's id
    assert keys("rollout.top_p=0.9")["rollout.top_p"] == "error"  # no top_p in either tag's sampling config
    assert keys('algorithm.name="dr_grpo"')["algorithm.name"] == "error"
    assert keys("algorithm.eps_clip=0.3")["algorithm.eps_clip"] == "warn"
    no_env = keys(reward_function="r.py")
    assert no_env["reward.function"] == no_env["reward.environment"] == "error"
    assert keys('logging.tensorboard="tb"')["logging.tensorboard"] == "warn"
    assert keys("resources.nodes=2")["resources.nodes"] == "error"
    assert keys("train.epochs_per_rollout=2")["train.epochs_per_rollout"] == "error"
    assert "train.zero_stage" in keys("train.zero_stage=3")
    # v0.3.0's fsdp_cpu_offload crashes (buffers left on the CPU; the seeds' device-mismatch error), fixed by 82a8241
    assert keys("train.offload=true").get("train.offload") == ("error" if version == "0.3.0" else None)
    assert "eval.every" in keys("eval.every=10")
    assert "checkpoint.final_dir" in keys('checkpoint.final_dir="final"')
    ent = keys('logging.wandb.entity="team"')
    assert ("logging.wandb.entity" in ent) is (version == "0.3.0")


# ---- cross-field validators, each at its source line -------------------------------------------------------------

def _extra_errors(version: str, extra: dict, sets: list[str] = ()) -> list[Any]:
    r = load(TWO_GPU, ["backend.prime_rl.extra={}", f'backend.version="{version}"', *sets]).recipe
    for k, v in extra.items():
        r.backend.extra()[k] = v
    return errors(PRIME.render(r))


def test_shared_offline_wandb_rejected_on_v080():
    """configs/rl.py:84-93 (SharedWandbConfig.validate_not_offline) at v0.8.0; allowed at v0.3.0 (rl.py:56-63)."""
    found = _extra_errors("0.8.0", {"wandb.offline": True})
    assert any("configs/rl.py:84-93" in f.message for f in found)
    assert _extra_errors("0.3.0", {"wandb.offline": True}) == []


def test_offload_conflict_on_v080():
    """configs/trainer.py:276-279 (cpu_offload_mutual_exclusion): rlctl turns optim_cpu_offload off with offload; a
    user extra turning it back on is caught."""
    assert _extra_errors("0.8.0", {}, ["train.offload=true"]) == []
    found = _extra_errors("0.8.0", {"trainer.model.optim_cpu_offload": True}, ["train.offload=true"])
    assert any("configs/trainer.py:276-279" in f.message for f in found)


def test_env_form_on_v080():
    """configs/orchestrator.py:182-204 (EnvConfig.validate_env): a classic env and a v1 taskset cannot combine; the
    seeds' verifiers environment (load_environment(**args)) is rendered as `legacy`, since a v1 taskset has no args."""
    _, _, cfg = render(TWO_GPU, "0.8.0")
    assert cfg["orchestrator"]["train"]["source"][0]["legacy"]["args"]["split"] == "train"
    assert "env" not in cfg["orchestrator"]["train"]["source"][0]
    found = _extra_errors("0.8.0", {"orchestrator.train.source": [{"legacy": {"id": "a/b"},
                                                                   "env": {"taskset": {"id": "c/d"}}}]})
    assert any("configs/orchestrator.py:182-204" in f.message for f in found)


@pytest.mark.parametrize("version,cite", [("0.3.0", "rl.py:381-393"), ("0.8.0", "utils/validation.py:286-294")])
def test_seq_len_rule(version, cite):
    found = _extra_errors(version, {"orchestrator.seq_len": 99999})
    assert any(cite in f.message for f in found)


@pytest.mark.parametrize("version,cite", [("0.3.0", "orchestrator/config.py:776-780"),
                                          ("0.8.0", "configs/orchestrator.py:664-683")])
def test_batch_must_hold_whole_groups(version, cite):
    found = _extra_errors(version, {}, ["train.train_batch_size=100", "rollout.group_size=8"])
    assert any(cite in f.message for f in found)
    assert _extra_errors(version, {}, ["train.train_batch_size=96", "rollout.group_size=8"]) == []


@pytest.mark.parametrize("version,cite", [("0.3.0", "inference/config.py:203-220"),
                                          ("0.8.0", "configs/inference.py:496-511")])
def test_lora_rank_within_vllm(version, cite):
    assert any(cite in f.message for f in _extra_errors(version, {}, ["lora.rank=1024"]))
    assert _extra_errors(version, {}, ["lora.rank=512"]) == []


def test_lora_needs_filesystem_broadcast():
    """v0.3.0 rl.py:417-420 (auto_setup_lora), v0.8.0 configs/rl.py:378-395 (auto_setup_weight_broadcast)."""
    assert any("rl.py:417-420" in f.message for f in _extra_errors("0.3.0", {"weight_broadcast.type": "nccl"}))
    assert any("configs/rl.py:378-395" in f.message for f in _extra_errors("0.8.0", {"weight_broadcast.type": "nccl"}))


def test_activation_checkpointing_off_means_off_on_v080():
    """configs/trainer.py:163 (ac on by default), :166 (ac_offloading on by default) and :262-267
    (ac_offloading_requires_ac turns ac back on) at v0.8.0: off needs both set to None."""
    _, plan, cfg = render(TWO_GPU, "0.8.0", ["train.gradient_checkpointing=false"])
    m = resolved(cfg, "0.8.0")["trainer"]["model"]
    assert m["ac"] is None and m["ac_offloading"] is None
    r = load(TWO_GPU, ["backend.prime_rl.extra={}", 'backend.version="0.8.0"', "train.gradient_checkpointing=false"
                       ]).recipe
    r.backend.extra()["trainer.model.ac_offloading"] = {"max_inflight_activations": 5}
    warned = [f for f in PRIME.validate(PRIME.render(r), None) if f.level == "warn"]
    assert any("configs/trainer.py:262-267" in f.message for f in warned)


def test_linear_scheduler_asserts():
    """trainer/scheduler.py:31-48 (setup_linear_scheduler asserts decay_start >= warmup) at both tags."""
    found = _extra_errors("0.8.0", {"trainer.scheduler": {"type": "linear", "warmup_steps": 900, "decay_steps": 500,
                                                          "min_lr": 0.0}})
    assert any("trainer/scheduler.py:31-48" in f.message for f in found)


def test_renderer_rule_follows_the_renderers_model_list():
    """configs/orchestrator.py:630-662 (validate_renderer_auto_resolves) at v0.8.0."""
    models = load_schema("0.8.0")["x-renderer-models"]
    assert "Qwen/Qwen3-8B" in models and "Qwen/Qwen2.5-7B-Instruct" not in models
    assert _extra_errors("0.8.0", {}, ['model.path="Qwen/Qwen2.5-7B-Instruct"'])
    assert _extra_errors("0.8.0", {"orchestrator.renderer.name": "default"},
                         ['model.path="Qwen/Qwen2.5-7B-Instruct"']) == []


# ---- 5. retention on prime-rl's real layout -------------------------------------------------------------------------

def make_step(root: Path, step: int, trainer: bool = True, orch: bool = True, weights: bool = True,
              broadcast: bool = False) -> None:
    t = root / "checkpoints" / f"step_{step}" / "trainer"
    t.mkdir(parents=True)
    (t / "__0_0.distcp").write_bytes(b"x" * 10)
    if trainer:
        (t / ".metadata").write_bytes(b"m")  # torch.distributed.checkpoint writes it when the save is done
    o = root / "run_default" / "checkpoints" / f"step_{step}" / "orchestrator"
    o.mkdir(parents=True)
    if orch:
        (o / "progress.pt").write_bytes(b"p")  # orchestrator/ckpt.py: progress.pt
    w = root / "weights" / f"step_{step}"
    w.mkdir(parents=True)
    if weights:
        (w / "STABLE").touch()  # trainer/ckpt.py: STABLE after the HF weights
    if broadcast:
        (root / "run_default" / "broadcasts" / f"step_{step}").mkdir(parents=True)


def test_checkpoint_layout_completeness_and_extras(tmp_path):
    root = tmp_path / "outputs"
    make_step(root, 5, broadcast=True)
    make_step(root, 10)
    make_step(root, 15, trainer=False)  # DCP save interrupted: no .metadata
    make_step(root, 20, orch=False)  # orchestrator's progress not written yet
    found = PRIME.checkpoints(root)
    assert [(c.step, c.complete) for c in found] == [(5, True), (10, True), (15, False), (20, False)]
    assert [c.step for c in found if c.complete][-1] == 10  # what --resume / ckpt.resume_step = latest picks
    five = found[0]
    assert five.path == root / "checkpoints" / "step_5"
    assert set(five.extra_paths) == {root / "weights" / "step_5", root / "run_default" / "checkpoints" / "step_5",
                                     root / "run_default" / "broadcasts" / "step_5"}
    assert pck.weights_complete(root, 5)
    (root / "checkpoints" / "step_99").symlink_to(root / "checkpoints" / "step_5")  # links are never checkpoints
    assert [c.step for c in PRIME.checkpoints(root)] == [5, 10, 15, 20]


def test_retention_prunes_what_prime_rl_never_does(tmp_path):
    """prime-rl's keep_last prunes checkpoints/ and weights/ (v0.8.0 trainer/ckpt.py:287-321, 485-517); the
    orchestrator's run_default/checkpoints/step_N and the broadcasts kept at checkpoint steps (trainer/utils.py:
    657-671) are never deleted by it, so rlctl prunes during the run and the disk check counts keep_last."""
    from rlctl.runs import checkpoints as ck

    r = load(TWO_GPU).recipe
    assert PRIME.prune_during_run(r) is True and PRIME.kept_checkpoints(r) == r.checkpoint.keep_last == 2
    r.checkpoint.keep_last = None
    assert PRIME.prune_during_run(r) is False
    root = tmp_path / "outputs"
    for s in (5, 10, 15):
        make_step(root, s, broadcast=True)
    # what prime-rl itself leaves after keep_last = 2 at step 15: step_5's trainer/weights dirs gone, the rest stays
    import shutil

    shutil.rmtree(root / "checkpoints" / "step_5")
    shutil.rmtree(root / "weights" / "step_5")
    # step 5's orchestrator checkpoint and kept broadcast are left behind: listed as an incomplete step
    assert [(c.step, c.complete) for c in PRIME.checkpoints(root)] == [(5, False), (10, True), (15, True)]
    deleted = ck.prune("prime_rl", tmp_path, 1, root=root)
    assert [c.step for c in deleted] == [5, 10]
    for s in (5, 10):
        assert not (root / "run_default" / "checkpoints" / f"step_{s}").exists()
        assert not (root / "run_default" / "broadcasts" / f"step_{s}").exists()
    assert not (root / "checkpoints" / "step_10").exists() and not (root / "weights" / "step_10").exists()
    assert [c.step for c in PRIME.checkpoints(root)] == [15]
    assert (root / "run_default" / "checkpoints" / "step_15" / "orchestrator" / "progress.pt").exists()


def test_disk_preflight_note_says_what_prime_rl_prunes(tmp_path):
    from rlctl.preflight import run
    from rlctl.recipe.planning import prepare

    res = [x for x in run(prepare(TWO_GPU, [f'checkpoint.dir="{tmp_path}"']), only=["disk"])
           if x.check == "disk.keep_last"]
    assert len(res) == 1 and res[0].verdict == "ok"
    assert "deletes old checkpoints/step_N and weights/step_N" in res[0].figure
    assert "never deletes run_default/checkpoints/step_N" in res[0].figure


# ---- 6. W&B key and the command ------------------------------------------------------------------------------------

def test_wandb_key_preflight_fails_without_a_key(tmp_path, monkeypatch):
    from rlctl.preflight import run
    from rlctl.recipe.planning import prepare

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    res = [x for x in run(prepare(TWO_GPU), only=["env.wandb"])]
    assert [x.verdict for x in res] == ["fail"]
    res = [x for x in run(prepare(TWO_GPU, ["logging.wandb.offline=true"]), only=["env.wandb"])]
    assert [x.verdict for x in res] == ["ok"]
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert [x.verdict for x in run(prepare(TWO_GPU), only=["env.wandb"])] == ["ok"]


def test_command_runs_from_any_directory(tmp_path, monkeypatch):
    """`uv run --project <checkout>`: prime-rl's own environment, the run directory as cwd (rl.toml, output_dir)."""
    _, plan, _ = render(TWO_GPU, "0.3.0")
    assert plan.argv == ["uv", "run", "--project", f"${{{CHECKOUT_ENV}}}", "rl", "@", "rl.toml"]
    monkeypatch.setenv(CHECKOUT_ENV, "/opt/prime-rl")
    assert PRIME.prepare_launch(plan, tmp_path).argv[3] == "/opt/prime-rl"
    r = load(TWO_GPU, ['backend.prime_rl.checkout="/src/prime-rl"']).recipe
    assert PRIME.render(r).argv[:4] == ["uv", "run", "--project", "/src/prime-rl"]
    # preflight's env family: the checkout must exist where the job runs (and uv)
    monkeypatch.setattr("shutil.which", lambda name, **kw: "/usr/bin/uv")
    res = [x for x in PRIME.preflight(type("C", (), {"recipe": r})(), "env") if x.check == "env.prime_rl_checkout"]
    assert [x.verdict for x in res] == ["fail"]
    (tmp_path / "pyproject.toml").write_text("[project]\nname='prime-rl'\n")
    r.backend.table().checkout = str(tmp_path)
    assert [x.verdict for x in PRIME.preflight(type("C", (), {"recipe": r})(), "env")
            if x.check == "env.prime_rl_checkout"] == ["warn"]  # not git


def test_checkout_must_be_at_the_rendered_tag(tmp_path, monkeypatch):
    import subprocess

    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "pyproject.toml").write_text("[project]\nname='prime-rl'\nversion='0.1.0'\n")
    git("add", "pyproject.toml")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    git("tag", "v0.3.0")
    r = load(TWO_GPU, [f'backend.prime_rl.checkout="{tmp_path}"']).recipe
    ctx = type("C", (), {"recipe": r})()
    monkeypatch.setattr("shutil.which", lambda name, **kw: "/usr/bin/uv")
    tag = [x for x in PRIME.preflight(ctx, "env") if x.check == "env.prime_rl_checkout"]
    assert [(x.verdict, x.figure.split(" at ")[-1]) for x in tag] == [("ok", "v0.3.0")]
    r.backend.version = "0.8.0"
    found = [x for x in PRIME.preflight(ctx, "env") if x.check == "env.prime_rl_checkout"]
    assert found[0].verdict == "fail" and "renders for v0.8.0" in found[0].figure


def test_uv_must_be_on_path(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name, **kw: None)
    r = load(TWO_GPU).recipe
    found = [x for x in PRIME.preflight(type("C", (), {"recipe": r})(), "env") if x.check == "env.uv"]
    assert [x.verdict for x in found] == ["fail"]


def test_installed_version_is_never_guessed(monkeypatch):
    """v0.2, v0.3.0 and v0.4.0 all say version = "0.1.0" in pyproject.toml."""
    import rlctl.backends._static as static

    monkeypatch.setattr(static, "installed_version", lambda name: "0.1.0")
    r = load(TWO_GPU).recipe
    r.backend.version = None
    with pytest.raises(UnknownVersion, match="cannot tell which"):
        PRIME.render(r)
    monkeypatch.setattr(static, "installed_version", lambda name: "0.8.0")
    assert PRIME.render(r).version == "0.8.0"


# ---- rlctl's reading of rl.toml against prime-rl's own resolution ---------------------------------------------------
# prime_rl_resolved_<tag>.json: for each variant, the rl.toml rlctl rendered and the concepts prime-rl's real RLConfig
# resolved from it, recorded by `scripts/prime_rl_schema.py --repo <clone> --tag v<tag> --record` (the variants a tag
# rejects are absent: v0.8.0's one-GPU placements).

def _reader_concepts(cfg: dict, version: str) -> dict[str, Any]:
    full = resolved(cfg, version)
    t, o = full["trainer"], full["orchestrator"]
    steps = effective(cfg, version, "max_steps")
    outs = effective(cfg, version, "output_dir")
    wb = effective(cfg, version, "wandb")
    lora = t["model"].get("lora")
    return {
        "trainer.max_steps": steps[0], "orchestrator.max_steps": steps[1],
        "trainer.loss.kl_tau": effective(cfg, version, "kl_tau"),
        "trainer.output_dir": outs[0], "orchestrator.output_dir": outs[1],
        "trainer.ckpt": effective(cfg, version, "ckpt"),
        "trainer.wandb.offline": wb and wb["offline_trainer"], "orchestrator.wandb.offline": wb and wb[
            "offline_orchestrator"], "trainer.wandb.project": wb and wb["project"],
        "trainer.model.ac_enabled": t["model"].get("ac") is not None or t["model"].get("ac_offloading") is not None,
        "trainer.scheduler": t["scheduler"], "trainer.optim.lr": t["optim"]["lr"],
        "trainer.optim.weight_decay": t["optim"]["weight_decay"],
        "trainer.model.fsdp_cpu_offload": t["model"]["fsdp_cpu_offload"],
        "trainer.model.optim_cpu_offload": t["model"].get("optim_cpu_offload"),
        "trainer.model.lora": None if lora is None else {k: lora[k] for k in ("rank", "alpha", "dropout")},
        "group_size": effective(cfg, version, "group_size"),
        "trainer.model.seq_len": t["model"]["seq_len"], "orchestrator.seq_len": o["seq_len"],
        "orchestrator.batch_size": o["batch_size"], "max_tokens": effective(cfg, version, "max_tokens"),
        "inference.model.max_model_len": full["inference"]["model"]["max_model_len"],
        "env": list(effective(cfg, version, "env")),
    }


def _resolved_cases():
    for version in VERSIONS:
        data = __import__("json").loads((Path(__file__).parent / f"prime_rl_resolved_{version}.json").read_text())
        for name in sorted(data):
            yield pytest.param(version, name, data[name], id=f"{version}-{name}")


@pytest.mark.parametrize("version,name,case", list(_resolved_cases()))
def test_rlctl_reads_rl_toml_as_prime_rl_resolves_it(version, name, case):
    cfg = tomllib.loads(case["rl.toml"])
    assert _reader_concepts(cfg, version) == case["resolved by prime-rl"]
    # and what rlctl renders today for that variant still means the same
    placements = {"one-gpu": (ONE_GPU, {}), "one-gpu-full": (ONE_GPU, {"lora": None}), "split-full": (SPLIT,
                                                                                                    {"lora": None})}
    sets, mutations = VARIANTS[name] if name in VARIANTS else placements[name]
    _, _, now = render(TWO_GPU, version, sets, mutations)
    assert _reader_concepts(now, version) == case["resolved by prime-rl"]
