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
  cluster, else the placement groups wait forever.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from rlctl.backends.openrlhf import OpenRLHFBackend
from rlctl.backends.openrlhf.releases import release
from tests.conformance._agreement import disagreement, peft_accepts, profile, rlctl_verdict, workdir
from tests.conformance._openrlhf_support import OpenRLHF, dest

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


@st.composite
def cases(draw) -> dict[str, Any]:
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    tp = draw(st.sampled_from([1, 2, 4]))
    assume(tp <= gpus)
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
    }
    return c


def sets_of(c: dict[str, Any]) -> list[str]:
    d = workdir()
    out = [f"{k}={json.dumps(v)}" for k, v in c.items()
           if k not in ("version", "lora", "data.eval") and v is not None]
    if c["lora"] is not None:
        out += ["lora.rank=8", f"lora.target_modules={json.dumps(c['lora'])}"]
    if c["data.eval"]:
        out += [f"data.eval={json.dumps(str(d / 'eval.jsonl'))}", "eval.every=5"]
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
    return True, ""



def check(c: dict[str, Any]) -> None:
    version = c["version"]
    ours = rlctl_verdict(base(version), sets_of(c))
    if ours.prep is None:  # refused at the recipe: the backend never sees it; only peft-invalid targets may be
        assert c["lora"] is not None and "all-linear" in str(c["lora"]), ours.reasons
        return
    argv = BACKEND.entrypoint(ours.prep.plan)[3:]
    theirs = openrlhf_verdict(version, argv, c["resources.nodes"] * c["resources.gpus_per_node"])
    assert ours.accepted == theirs[0], disagreement(c, ours, theirs)


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
def test_rlctl_and_openrlhf_agree(c):
    check(c)
