"""Agreement by generation, OpenRLHF: recipes generated across the dimensions that interact, for every release rlctl
knows, and rlctl's verdict (tests/conformance/_agreement.py) compared with OpenRLHF's own.

OpenRLHF's verdict is its code run on what rlctl renders (tests/conformance/_openrlhf_support.py): train_ppo_ray's
argparse, its post-parse checks and train() up to its first Ray work (the colocation assert is there), then what the
job meets before its first step, each from the code that decides it:
- DeepSpeed's batch assertion (deepspeed/runtime/config.py `_batch_assertion`): train_batch_size = micro batch x
  gradient accumulation x actor processes, the accumulation being train_batch_size // (micro x processes);
- vLLM's tensor parallel rule (vllm/config ModelConfig.verify_with_parallel_config): TP divides the attention heads;
- peft on the parsed --target_modules (peft's real get_peft_model on a tiny Qwen2): a name no module has is
  NoMatchingPeftModuleError / ValueError at start;
- Ray's placement: the GPUs the parsed counts ask for (actor, + critic and vLLM engines unless colocated) exist in the
  cluster, else the placement groups wait forever;
- the first weight sync, at the end of step 1 (trainer/ray/ppo_actor.py broadcast_to_vllm, the release's own, run on
  a LoRA of rlctl's tiny Qwen2: _openrlhf_sync.py): a LoRA actor's weights go to vLLM under names its model must have,
  else vLLM's load_weights refuses the first (seen on 2 x H100: no parameter named 'base_model'), on every restart.

`extra` entries that collide with what rlctl renders (EXTRAS): the same flag with the same or another value, the
other dialect's spelling (`--max_ckpt_num` / `--ckpt.max_num`), a store_true flag given a value or `false`, a valued
flag given none, a list, a wrong type or choice, an abbreviation, an unknown flag. train_ppo_ray's argparse decides
(last wins, or an error). rlctl checks what would run (rlctl/backends/openrlhf/argv.py): an override's value
goes back into its recipe key (the effective recipe) and rlctl's checks read it; its verdict must equal OpenRLHF's on
the case itself. One class of case is treated apart, by name: an override whose value no recipe key can hold (a
concept in argv.NO_RECIPE_KEY, e.g. the actor's GPUs per node; an advantage estimator rlctl has no algorithm for,
or any other on a ppo recipe;
a LoRA flag on a recipe without [lora]): rlctl refuses it on purpose ("rlctl cannot check what would run"), whatever
OpenRLHF would do; `unmapped()` asserts that refusal, that it names the extra, and that rlctl refuses so for nothing
else; the case is not compared with OpenRLHF.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from rlctl.backends.openrlhf import OpenRLHFBackend
from rlctl.backends.openrlhf.argv import ESTIMATOR_NAME, NO_RECIPE_KEY
from rlctl.backends.openrlhf.releases import FLAGS, release
from rlctl.recipe.planning import prepare
from tests.conformance._agreement import disagreement, peft_accepts, profile, rlctl_verdict, workdir
from tests.conformance._openrlhf_support import OpenRLHF, dest
from tests.conformance._openrlhf_sync import refused_by_vllm

BACKEND = OpenRLHFBackend()
VERSIONS = BACKEND.known_versions
HEADS = 14  # Qwen/Qwen2.5-0.5B: 14 attention heads, 2 KV heads (rlctl's architecture table; vLLM reads config.json)
BASE = """
name = "agree"
[backend]
name = "openrlhf"
version = "{version}"
[model]
path = "Qwen/Qwen2.5-0.5B"
max_model_len = 1536
[data]
train = "{dir}/prompts.jsonl"
max_prompt_tokens = 512
[rollout]
max_tokens = 1024
gpu_memory_utilization = 0.6
[algorithm]
kl_coef = 0.01
[train]
episodes = 1
[resources]
executor = "ray"
[reward]
function = "{dir}/reward.py"
[checkpoint]
dir = "{dir}/ckpt"
save_optimizer = false
"""


@cache
def base(version: str):
    d = workdir()
    p = d / f"openrlhf-{version}.toml"
    p.write_text(BASE.format(version=version, dir=d))
    return p


# (how, concept or flag, value): "concept" spells the concept as the case's release does, "alias" as the other
# dialect does, "prefix" as an abbreviation of the release's flag, "raw" as written; "same" is the rendered value
EXTRAS: list[tuple[str, str, Any] | None] = [
    None,
    ("concept", "seed", "same"), ("concept", "train_batch_size", "same"),  # said again: nothing changes
    ("concept", "seed", 7), ("concept", "temperature", 0.7), ("concept", "max_ckpt_num", 5),  # free: the extra wins
    ("concept", "train_batch_size", 8), ("concept", "micro_train_batch_size", 2),  # checked values overridden
    ("concept", "vllm_tp", 2), ("concept", "vllm_num_engines", 1), ("concept", "n_samples_per_prompt", 2),
    ("concept", "colocate_all", True),
    ("alias", "max_ckpt_num", 3), ("alias", "seed", 7),  # the other release line's spelling
    ("concept", "gradient_checkpointing", "true"), ("concept", "colocate_all", 1),  # store_true given a value
    ("concept", "gradient_checkpointing", False), ("concept", "colocate_all", False),  # store_true given false
    ("concept", "train_batch_size", True), ("concept", "seed", [1, 2]),  # no value, two values
    ("concept", "seed", "abc"), ("concept", "train_batch_size", 2.5), ("concept", "kl_estimator", "k9"),
    ("prefix", "max_ckpt_num", 4), ("prefix", "eps_clip", 0.3),  # abbreviations (unique or ambiguous)
    ("raw", "nope_flag", 1),
    ("concept", "actor_num_gpus_per_node", 1),  # no recipe key: refused on purpose (unmapped())
    ("concept", "advantage_estimator", "dr_grpo"), ("concept", "advantage_estimator", "rloo"),  # rloo: no algorithm
    ("concept", "lora_rank", 16),  # lora.rank where the case has [lora]; LoRA turned on by one flag otherwise
    ("concept", "rollout_batch_size", 1), ("concept", "micro_rollout_batch_size", 4), ("concept", "vllm_tp", 4),
    ("concept", "target_modules", ["nope_proj"]), ("concept", "target_modules", ["q_proj"]),  # peft decides
]


def extra_entry(c: dict[str, Any]) -> tuple[str, Any] | None:
    """The case's extra as (key, value) for its release."""
    if c.get("extra") is None:
        return None
    how, name, value = c["extra"]
    rel = release(c["version"])
    if how == "raw":
        return name, value
    flat, dotted = FLAGS[name]
    flag = (flat if rel.dotted else dotted) if how == "alias" else (dotted if rel.dotted else flat)
    if how == "prefix":
        flag = flag[:-2]
    if value == "same":
        value = {"seed": 42, "train_batch_size": c["train.train_batch_size"]}[name]
    return flag.lstrip("-"), value


@st.composite
def cases(draw) -> dict[str, Any]:
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    tp = draw(st.sampled_from([1, 2, 4]))
    assume(tp <= gpus * 2)  # a TP group may span two nodes (Backend.tp_spans_nodes)
    c = {
        "version": draw(st.sampled_from(VERSIONS)),
        "resources.nodes": draw(st.sampled_from([1, 1, 2])),
        "resources.gpus_per_node": gpus,
        "resources.colocate": draw(st.booleans()),
        "rollout.engines": draw(st.integers(1, 4)),
        "rollout.tensor_parallel": tp,
        "rollout.prompts_per_step": draw(st.sampled_from([1, 2, 4, 8, 16])),
        "rollout.group_size": draw(st.sampled_from([1, 2, 4, 8])),
        "train.train_batch_size": draw(st.sampled_from([2, 4, 8, 16, 32, 64])),
        "train.micro_batch_size": draw(st.sampled_from([1, 2, 4])),
        "algorithm.name": draw(st.sampled_from(["grpo", "dr_grpo", "reinforce_baseline", "ppo"])),
        "lora": draw(st.sampled_from([None, "all-linear", ["all-linear"], ["q_proj", "v_proj"], ["nope_proj"]])),
        "train.steps": draw(st.sampled_from([None, None, 7])),
        "data.eval": draw(st.booleans()),
        "extra": draw(st.none() | st.sampled_from(EXTRAS[1:])),  # half the cases keep the plain recipe
    }
    return c


def sets_of(c: dict[str, Any]) -> list[str]:
    d = workdir()
    out = [f"{k}={json.dumps(v)}" for k, v in c.items()
           if k not in ("version", "lora", "data.eval", "extra") and v is not None]
    if c["lora"] is not None:
        out += ["lora.rank=8", f"lora.target_modules={json.dumps(c['lora'])}"]
    if c["data.eval"]:
        out += [f"data.eval={json.dumps(str(d / 'eval.jsonl'))}", "eval.every=5"]
    entry = extra_entry(c)
    if entry is not None:
        out.append(f'backend.openrlhf.extra={{"{entry[0]}"={json.dumps(entry[1])}}}')
    return out


def openrlhf_verdict(version: str, argv: list[str], have: int) -> tuple[bool, str]:
    """(accepted, why not); `have`: the cluster's GPUs."""
    with OpenRLHF(version) as o:
        try:
            args, _, _ = o.parse(argv)
        except SystemExit as e:
            return False, str(e)[-400:]
        except AssertionError as e:
            return False, f"post-parse/train() assert: {e}"
    rel = release(version)

    def v(concept: str) -> Any:
        return dest(args, rel.flag(concept))

    procs = v("actor_num_nodes") * v("actor_num_gpus_per_node")
    tbs, micro = v("train_batch_size"), v("micro_train_batch_size")
    if tbs % (micro * procs):  # DeepSpeed _batch_assertion
        return False, f"deepspeed: train_batch_size {tbs} != {micro} x {tbs // (micro * procs)} x {procs}"
    tp = v("vllm_tp")
    if HEADS % tp:
        return False, f"vllm: {HEADS} attention heads not divisible by TP {tp}"
    if v("lora_rank"):
        problem = peft_accepts(v("target_modules"))
        if problem:
            return False, problem
    colocate_all = bool(v("colocate_all"))
    critic = procs if dest(args, "--critic.model_name_or_path" if rel.dotted else "--critic_pretrain") else 0
    engines = v("vllm_num_engines") * tp
    need = max(procs, engines) if colocate_all else procs + critic + engines
    if need > have:
        return False, f"ray: placement groups ask for {need} GPUs, the cluster has {have}"
    if v("lora_rank") and v("vllm_num_engines"):
        refused = refused_by_vllm(version, args)
        if refused:
            return False, f"vllm at the first weight sync: there is no module or parameter named {refused!r}"
    return True, ""



def check(c: dict[str, Any]) -> None:
    version = c["version"]
    ours = rlctl_verdict(base(version), sets_of(c))
    if ours.prep is None:  # refused at the recipe: the backend never sees it; only peft-invalid targets may be
        assert c["lora"] is not None and ("all-linear" in str(c["lora"]) or peft_accepts(c["lora"])), ours.reasons
        return
    if unmapped(c, ours.reasons):
        return
    argv = BACKEND.entrypoint(ours.prep.plan)[3:]
    theirs = openrlhf_verdict(version, argv, c["resources.nodes"] * c["resources.gpus_per_node"])
    if theirs[0] and ours.only_for_meaning():  # a declared change of meaning (_agreement.MEANING)
        return
    assert ours.accepted == theirs[0], disagreement(c, ours, theirs)


UNCHECKABLE = "rlctl cannot check what would run"


def unmapped(c: dict[str, Any], reasons: list[str]) -> bool:
    """Whether rlctl refused the case's extra as an override it cannot check (module docstring): then the case is not
    compared with OpenRLHF. Allowed only where no recipe key can hold the value (`no_key`: a concept in
    argv.NO_RECIPE_KEY, an advantage estimator with no rlctl algorithm, a LoRA flag on a recipe without [lora]); any
    other such refusal (a value the recipe cannot hold, a derived flag that moves) fails the test as a disagreement."""
    entry = extra_entry(c)
    said = any(UNCHECKABLE in r for r in reasons)
    if entry is None:
        assert not said, reasons
        return False
    how, name, value = c["extra"]
    no_key = how != "raw" and (
        name in NO_RECIPE_KEY  # argv.NO_RECIPE_KEY: rendered from several keys, or rlctl's own plumbing
        # an estimator rlctl has no algorithm for, or any other on a ppo recipe (which renders the critic too)
        or (name == "advantage_estimator" and (value not in ESTIMATOR_NAME or c["algorithm.name"] == "ppo"))
        or (name.startswith("lora_") or name == "target_modules") and c["lora"] is None)  # LoRA on takes 3 keys
    if said:  # refused for that and nothing else may be: named, and only a concept with no recipe key
        assert no_key and any(f"backend.openrlhf.extra.{entry[0]}" in r for r in reasons), (
            f"an override rlctl cannot check, not listed in NO_RECIPE_KEY\n  case: {c}\n  {reasons}")
    # not said for a no-key concept: the extra repeats the value rlctl renders, so what runs is what was checked
    return said


# named regression cases: each a disagreement found by generation (issue 22), fixed in rlctl
ALL_LINEAR_LIST = {"version": "0.9.3", "resources.nodes": 1, "resources.gpus_per_node": 4, "resources.colocate": False,
                   "rollout.engines": 2, "rollout.tensor_parallel": 1, "rollout.prompts_per_step": 8,
                   "rollout.group_size": 4, "train.train_batch_size": 16, "train.micro_batch_size": 2,
                   "algorithm.name": "grpo", "lora": ["all-linear"], "train.steps": None, "data.eval": False}
COLOCATED_UNEQUAL = {**ALL_LINEAR_LIST, "lora": None, "resources.colocate": True, "rollout.engines": 2}
MAX_SAMPLES_EVAL = {**ALL_LINEAR_LIST, "lora": None, "train.steps": 7, "data.eval": True}
# render gives each node max(2 - 3 // 2, 1) = 1 actor GPU: actor 2 + vLLM 3 = 5 GPUs asked of 4 (found by generation)
ROUNDED_PER_NODE = {**ALL_LINEAR_LIST, "lora": None, "resources.nodes": 2, "resources.gpus_per_node": 2,
                    "rollout.engines": 3, "rollout.prompts_per_step": 1, "rollout.group_size": 2,
                    "train.train_batch_size": 2, "train.micro_batch_size": 1}
# train_ppo_ray < 0.11.0 does not assert n_samples_per_prompt > 1 for dr_grpo (found by generation)
DR_GRPO_SINGLE = {**ALL_LINEAR_LIST, "lora": None, "resources.gpus_per_node": 1, "resources.colocate": True,
                  "rollout.engines": 1, "rollout.prompts_per_step": 1, "rollout.group_size": 1,
                  "train.train_batch_size": 2, "train.micro_batch_size": 1, "algorithm.name": "dr_grpo"}
PPO_CRITIC = {**ALL_LINEAR_LIST, "lora": None, "algorithm.name": "ppo"}  # actor 2 + critic 2 + vLLM 2 > 4


# extras that collide with what rlctl renders (issue 22), each a disagreement found by generation before
# rlctl/backends/openrlhf/argv.py, in every release: the extra was passed on unread
EXTRA_BASE = {**ALL_LINEAR_LIST, "lora": None}
TP_OVERRIDE = {**EXTRA_BASE, "extra": ("concept", "vllm_tp", 2)}  # silently TP 2: Ray asks 2 + 2 x 2 GPUs of 4
STORE_TRUE_VALUE = {**EXTRA_BASE, "extra": ("concept", "gradient_checkpointing", "true")}  # "true" unrecognised
STORE_TRUE_ONE = {**EXTRA_BASE, "extra": ("concept", "colocate_all", 1)}
VALUED_FLAG_BARE = {**EXTRA_BASE, "extra": ("concept", "train_batch_size", True)}  # expected one argument
ONE_VALUE_LIST = {**EXTRA_BASE, "extra": ("concept", "seed", [1, 2])}  # the second value unrecognised
WRONG_TYPE = {**EXTRA_BASE, "extra": ("concept", "seed", "abc")}  # invalid int value
FLOAT_FOR_INT = {**EXTRA_BASE, "extra": ("concept", "train_batch_size", 2.5)}
NOT_A_CHOICE = {**EXTRA_BASE, "extra": ("concept", "kl_estimator", "k9")}
ABBREVIATION = {**EXTRA_BASE, "extra": ("prefix", "max_ckpt_num", 4)}  # argparse reads --max_ckpt_n: rlctl refused it
# overrides of checked values: checked as the effective recipe (the extra's value in its recipe key)
BATCH_OVERRIDE = {**EXTRA_BASE, "extra": ("concept", "train_batch_size", 8)}
COLOCATE_OVERRIDE = {**EXTRA_BASE, "extra": ("concept", "colocate_all", True)}
STORE_TRUE_FALSE = {**EXTRA_BASE, "extra": ("concept", "gradient_checkpointing", False)}  # a warning: stays on
# found by generation checking the effective recipe: render derives other flags from the overridden key, so the
# effective recipe must pin them to what the command keeps, or leave out one no check reads
MICRO_PINS_ROLLOUT = {**EXTRA_BASE, "extra": ("concept", "micro_train_batch_size", 1)}  # --micro_rollout_batch_size
KEEP_LAST_FROM_EXTRA = {**EXTRA_BASE, "data.eval": True, "extra": ("concept", "max_ckpt_num", 5)}  # best_metric_key
# rendered from TP 2: the actor gets max(4 - 2 x 2, 1) = 1 GPU, 1 + 4 > 4; the extra's TP 1 keeps that actor: 1 + 2
EXTRA_FIXES_PLACEMENT = {**EXTRA_BASE, "rollout.tensor_parallel": 2, "extra": ("concept", "vllm_tp", 1)}
# TP 2 on 2 nodes of 1 GPU: OpenRLHF's vLLM engine spreads its TP group over the nodes (Ray, PACK); rlctl refused
# TP > gpus_per_node for every backend (found by generation: the recipe path never generated it)
TP_SPANS_NODES = {**EXTRA_BASE, "resources.nodes": 2, "resources.gpus_per_node": 1, "resources.colocate": True,
                  "rollout.engines": 1, "rollout.prompts_per_step": 1, "rollout.group_size": 2,
                  "train.train_batch_size": 2, "train.micro_batch_size": 1, "extra": ("concept", "vllm_tp", 2)}
ACTOR_GPUS = {**EXTRA_BASE, "extra": ("concept", "actor_num_gpus_per_node", 1)}  # no recipe key: refused (unmapped)


@pytest.mark.slow
@profile(ci=150)
@given(cases())
@example(ALL_LINEAR_LIST)
@example(COLOCATED_UNEQUAL)
@example(MAX_SAMPLES_EVAL)
@example(ROUNDED_PER_NODE)
@example(PPO_CRITIC)
@example(DR_GRPO_SINGLE)
@example({**DR_GRPO_SINGLE, "version": "0.10.2"})
@example({**DR_GRPO_SINGLE, "version": "0.11.0"})
@example(TP_OVERRIDE)
@example({**TP_OVERRIDE, "version": "0.11.2"})
@example(STORE_TRUE_VALUE)
@example({**STORE_TRUE_VALUE, "version": "0.10.2"})
@example(STORE_TRUE_ONE)
@example(VALUED_FLAG_BARE)
@example(ONE_VALUE_LIST)
@example(WRONG_TYPE)
@example(FLOAT_FOR_INT)
@example(NOT_A_CHOICE)
@example({**NOT_A_CHOICE, "version": "0.11.2"})
@example(ABBREVIATION)
@example({**ABBREVIATION, "version": "0.11.2"})
@example(BATCH_OVERRIDE)
@example(COLOCATE_OVERRIDE)
@example(STORE_TRUE_FALSE)
@example(MICRO_PINS_ROLLOUT)
@example({**MICRO_PINS_ROLLOUT, "version": "0.11.2"})
@example(KEEP_LAST_FROM_EXTRA)
@example({**KEEP_LAST_FROM_EXTRA, "version": "0.11.2"})
@example(EXTRA_FIXES_PLACEMENT)
@example({**COLOCATE_OVERRIDE, "rollout.engines": 4})
@example(ACTOR_GPUS)
@example(TP_SPANS_NODES)
@example({**TP_SPANS_NODES, "version": "0.11.2"})
@example({**EXTRA_BASE, "algorithm.name": "ppo", "extra": ("concept", "advantage_estimator", "dr_grpo")})
@example({**ACTOR_GPUS, "resources.gpus_per_node": 1, "rollout.engines": 1})  # renders 1 too: not an override
@example({**EXTRA_BASE, "extra": ("alias", "max_ckpt_num", 3)})
@example({**EXTRA_BASE, "version": "0.11.2", "extra": ("alias", "max_ckpt_num", 3)})
def test_rlctl_and_openrlhf_agree(c):
    check(c)


def test_extra_collisions_are_said():
    """Nothing silent: an extra that changes what rlctl renders is a finding (a warning: the extra wins, the checks
    used its value; an error where no recipe key can hold it); the same value said again is none."""
    def said(c: dict[str, Any]) -> list[tuple[str, str]]:
        prep = rlctl_verdict(base(c["version"]), sets_of(c)).prep
        return [(f.level, f.message) for f in prep.validate() if f.key.startswith("backend.openrlhf.extra")]

    for version in ("0.9.3", "0.11.2"):
        seed = said({**EXTRA_BASE, "version": version, "extra": ("concept", "seed", 7)})
        assert [lv for lv, _ in seed] == ["warn"] and "the extra wins" in seed[0][1], seed
        batch = said({**BATCH_OVERRIDE, "version": version})
        assert [lv for lv, _ in batch] == ["warn"] and "16" in batch[0][1] and "8" in batch[0][1], batch
        assert "the checks used the extra's value" in batch[0][1] and "train.train_batch_size" in batch[0][1], batch
        actor = said({**EXTRA_BASE, "version": version, "extra": ("concept", "actor_num_gpus_per_node", 1)})
        assert [lv for lv, _ in actor] == ["error"] and UNCHECKABLE in actor[0][1], actor
        off = said({**STORE_TRUE_FALSE, "version": version})
        assert [lv for lv, _ in off] == ["warn"] and "stays on" in off[0][1], off
        assert said({**EXTRA_BASE, "version": version, "extra": ("concept", "seed", "same")}) == []
        # what the checks find on the extra's values names the extra: TP 2 asks Ray for 2 + 2 x 2 GPUs of 4
        tp = rlctl_verdict(base(version), sets_of({**TP_OVERRIDE, "version": version}))
        assert not tp.accepted and all("extra" in r for r in tp.reasons), tp.reasons
        # a computed fix never sets a key an extra overrides (the extra would still win): micro 3 does not divide 16
        from rlctl import preflight as pf

        micro = rlctl_verdict(base(version), sets_of({**EXTRA_BASE, "version": version,
                                                      "extra": ("concept", "micro_train_batch_size", 3)}))
        batch_check = [r for r in pf.run(micro.prep, ["placement"]) if r.check == "placement.batch"]
        assert batch_check[0].verdict == pf.FAIL and "extra" in batch_check[0].figure, batch_check
        assert all("train.micro_batch_size" not in (r.set or {}) for r in batch_check), batch_check
        # an extra that makes the run fit is checked as such (EXTRA_FIXES_PLACEMENT)
        assert rlctl_verdict(base(version), sets_of({**EXTRA_FIXES_PLACEMENT, "version": version})).accepted


# ---- the context budget, both ways (issue 30 point 2.15) -------------------------------------------------------------
# OpenRLHF gives vLLM max_model_len = train()'s `max_len` (0.9.3-0.9.7: prompt_max_len + generate_max_len; later
# --max_len / --data.max_len) and cuts prompts to fit (prompt_max_len, or max_len - max_new_tokens): a request never
# overflows, whatever model.max_model_len says. What breaks is a context longer than the model: vLLM refuses to start
# (_get_and_verify_max_len), Qwen2.5-0.5B's config.json having max_position_embeddings 32768 and no rope scaling.
MODEL_POSITIONS = 32768


@st.composite
def context_cases(draw) -> dict[str, Any]:
    return {"version": draw(st.sampled_from(VERSIONS)),
            "data.max_prompt_tokens": draw(st.sampled_from([256, 1024, 4096])),
            "rollout.max_tokens": draw(st.sampled_from([512, 4096, 30000])),
            "model.max_model_len": draw(st.sampled_from([1024, 5120, 40000]))}


def openrlhf_context(version: str, argv: list[str]) -> tuple[bool, str]:
    """OpenRLHF's own numbers: the max_len train() hands create_vllm_engines, the prompt cut, the generate length."""
    rel = release(version)
    with OpenRLHF(version) as o:
        args, train_locals, _ = o.parse(argv)
    context = train_locals["max_len"]
    if rel.flag("prompt_max_len"):
        prompt, gen = dest(args, rel.flag("prompt_max_len")), dest(args, rel.flag("generate_max_len"))
    else:
        gen = dest(args, rel.flag("max_new_tokens"))
        prompt = context - gen
    if prompt + gen > context:
        return False, f"requests of {prompt} + {gen} tokens > vLLM's max_model_len {context}"
    if context > MODEL_POSITIONS:
        return False, f"vLLM's max_model_len {context} > the model's {MODEL_POSITIONS}: vLLM refuses to start"
    return True, ""


@pytest.mark.slow
@profile(ci=30)
@given(context_cases())
@example({"version": "0.9.3", "data.max_prompt_tokens": 1024, "rollout.max_tokens": 4096,
          "model.max_model_len": 1024})  # max_model_len below the sum: OpenRLHF runs it (budget failed it before)
@example({"version": "0.11.2", "data.max_prompt_tokens": 4096, "rollout.max_tokens": 30000,
          "model.max_model_len": 40000})  # the sum exceeds the model: vLLM refuses
def test_context_budget_follows_openrlhfs_vllm_context(c):
    from rlctl import preflight as pf

    sets = [f"{k}={v}" for k, v in c.items() if k != "version"]
    prep = prepare(base(c["version"]), sets)
    ours = [r for r in pf.run(prep, ["context"]) if r.verdict == pf.FAIL]
    theirs = openrlhf_context(c["version"], BACKEND.entrypoint(prep.plan)[3:])
    assert (not ours) == theirs[0], (c, [(r.check, r.figure) for r in ours], theirs[1])
