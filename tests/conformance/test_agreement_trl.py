"""Agreement by generation, TRL: generated CPU recipes (the backend rlctl runs on the CPU: one process, so the GPU
dimensions do not apply), rlctl's verdict (tests/conformance/_agreement.py) against TRL's own: the installed trl's
GRPOConfig built from the rendered trl_config.json exactly as rlctl's runner builds it (its __post_init__ checks the
batch arithmetic), and peft's get_peft_model with the rendered LoRA config on a tiny Qwen2.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rlctl.backends.trl import CONFIG_FILE
from tests.conformance._agreement import disagreement, peft_accepts, profile, rlctl_verdict, workdir

pytest.importorskip("trl")

BASE = """
name = "agree"
[backend]
name = "trl"
[model]
path = "random:qwen2?hidden=64&layers=2"
dtype = "float32"
max_model_len = 128
[data]
train = "{dir}/prompts.jsonl"
max_prompt_tokens = 32
[rollout]
max_tokens = 16
[algorithm]
kl_coef = 0.0
[train]
steps = 10
gradient_checkpointing = false
[resources]
gpus_per_node = 0
gpu = "cpu"
[reward]
function = "{dir}/reward.py"
[checkpoint]
dir = "{dir}/ckpt"
"""


@cache
def base():
    d = workdir()
    p = d / "trl.toml"
    p.write_text(BASE.format(dir=d))
    return p


@st.composite
def cases(draw) -> dict[str, Any]:
    return {
        "rollout.group_size": draw(st.sampled_from([1, 2, 3, 4, 8])),
        "rollout.prompts_per_step": draw(st.sampled_from([1, 2, 3, 4, 8])),
        "train.train_batch_size": draw(st.sampled_from([1, 2, 4, 6, 8, 16, 32])),
        "train.micro_batch_size": draw(st.sampled_from([1, 2, 3, 4, 8])),
        "train.epochs_per_rollout": draw(st.sampled_from([1, 2])),
        "algorithm.name": draw(st.sampled_from(["grpo", "dr_grpo"])),
        "optim.schedule": draw(st.sampled_from(["constant", "cosine", "linear", "cosine_with_min_lr"])),
        "lora": draw(st.sampled_from([None, "all-linear", ["all-linear"], ["q_proj", "v_proj"], ["nope_proj"]])),
        "extra": draw(st.sampled_from([None, {"num_generations": 3}, {"generation_batch_size": 12},
                                       {"max_completion_length": 8}])),
        "data.eval": draw(st.booleans()),
    }


def sets_of(c: dict[str, Any]) -> list[str]:
    out = [f"{k}={json.dumps(v)}" for k, v in c.items() if k not in ("lora", "extra", "data.eval")]
    if c["lora"] is not None:
        out += ["lora.rank=8", f"lora.target_modules={json.dumps(c['lora'])}"]
    if c["extra"]:
        k, v = next(iter(c["extra"].items()))
        out.append(f"backend.trl.extra={{{k}={v}}}")
    if c["data.eval"]:
        out += [f"data.eval={json.dumps(str(workdir() / 'eval.jsonl'))}", "eval.every=5"]
    return out


def trl_verdict(config: dict[str, Any]) -> tuple[bool, str]:
    from trl import GRPOConfig

    grpo = dict(config["grpo"])
    grpo.pop("resume_from_checkpoint", None)  # as rlctl.backends.trl.runner does
    try:
        built = GRPOConfig(**grpo)
    except Exception as e:
        return False, f"GRPOConfig: {type(e).__name__}: {str(e)[:300]}"
    if config.get("lora"):
        problem = peft_accepts(config["lora"]["target_modules"])
        if problem:
            return False, problem
    config["built"] = built
    return True, ""


def ratio_moves(built: Any) -> bool:
    """GRPOTrainer's own condition for old log-probs that differ from the current ones (trl 1.16.0
    trainer/grpo_trainer.py _generate_and_score_completions: `generate_every = steps_per_generation * num_iterations`,
    old_per_token_logps computed only if `gradient_accumulation_steps % generate_every != 0`; else _compute_loss uses
    per_token_logps.detach() and the ratio is exactly 1), on the GRPOConfig its __post_init__ resolved."""
    return built.gradient_accumulation_steps % (built.steps_per_generation * built.num_iterations) != 0


def check(c: dict[str, Any]) -> None:
    ours = rlctl_verdict(base(), sets_of(c))
    if ours.prep is None and c["lora"] is not None and "lora.target_modules" in str(ours.reasons):
        # refused when read (planning.prepare: LoRA on no module of the model): peft on the list as written must too
        problem = peft_accepts(c["lora"])
        assert problem, disagreement(c, ours, (True, ""))
        return
    if ours.prep is None:
        raise AssertionError(f"rlctl refused the recipe itself: {ours.reasons}")
    config = json.loads(ours.prep.plan.files[CONFIG_FILE])
    theirs = trl_verdict(config)
    if theirs[0] and ours.only_for_meaning():  # a declared change of meaning (_agreement.MEANING)
        return
    assert ours.accepted == theirs[0], disagreement(c, ours, theirs)
    if theirs[0]:  # where the clip can act (Backend.inert): rlctl's reading of the rendered config, TRL's own
        r = ours.prep.recipe
        inert = {i.key for i in ours.prep.backend.inert(ours.prep.backend.effective(r).recipe)}
        assert ("algorithm.eps_clip" not in inert) == ratio_moves(config["built"]), (c, inert)


SEED = {"rollout.group_size": 8, "rollout.prompts_per_step": 4, "train.train_batch_size": 32,
        "train.micro_batch_size": 8, "train.epochs_per_rollout": 1, "algorithm.name": "grpo",
        "optim.schedule": "constant", "lora": None, "extra": None, "data.eval": False}


@profile(ci=200)
@given(cases())
@example(SEED)
@example({**SEED, "lora": ["all-linear"]})
@example({**SEED, "lora": ["nope_proj"]})
@example({**SEED, "train.micro_batch_size": 32})  # the quickstart's one step per generation batch: no clip
@example({**SEED, "train.micro_batch_size": 32, "train.epochs_per_rollout": 2})  # a second pass: the clip acts
@example({**SEED, "train.train_batch_size": 16})  # two optimizer steps per rollout: the clip acts
@example({**SEED, "rollout.prompts_per_step": 2})  # updates straddle two rollouts of 16: no clip, 2 epochs neither
@example({**SEED, "rollout.prompts_per_step": 2, "train.epochs_per_rollout": 2})
def test_rlctl_and_trl_agree(c):
    check(c)
