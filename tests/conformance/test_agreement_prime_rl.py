"""Agreement by generation, prime-rl: generated recipes for each tag rlctl knows, rlctl's verdict
(tests/conformance/_agreement.py) against prime-rl's own as far as it can run without its checkout (prime-rl is not
on PyPI): the rendered rl.toml validated with `jsonschema` against the tag's RLConfig JSON Schema (made from its real
config classes by scripts/prime_rl_schema.py, committed), then its cross-field validators re-encoded in
rlctl/backends/prime_rl/rules.py, each citing the file:line of the validator at the tag (including the loader's
shared-field propagation, utils/validation.py propagate_shared_fields), and vLLM's tensor parallel rule.

rlctl's verdict adds what it decides on its own (preflight placement, what prime-rl cannot honour): where the two
differ, either rlctl refuses what prime-rl would run (rlctl is wrong) or prime-rl refuses what rlctl accepts (a
validator is missing from rules.py: add it with its file:line).
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from typing import Any

import jsonschema
from hypothesis import example, given
from hypothesis import strategies as st

from rlctl.backends import get_backend
from rlctl.backends.prime_rl import CONFIG_FILE, rules
from rlctl.backends.prime_rl.schema import load_schema, nulls
from tests.conformance._agreement import disagreement, profile, rlctl_verdict, workdir

PRIME = get_backend("prime_rl")
VERSIONS = PRIME.known_versions
HEADS = 32  # Qwen/Qwen3-8B
BASE = """
name = "agree"
[backend]
name = "prime_rl"
version = "{version}"
[model]
path = "Qwen/Qwen3-8B"
max_model_len = 8192
[data]
train = "{dir}/prompts.jsonl"
max_prompt_tokens = 2048
[rollout]
max_tokens = 2048
gpu_memory_utilization = 0.8
[train]
steps = 50
seq_len = 4096
[resources]
gpu = "H100-80GB"
[reward.environment]
id = "reverse-text"
[checkpoint]
dir = "{dir}/ckpt"
every = 10
keep_last = 2
"""


@cache
def base(version: str):
    d = workdir()
    p = d / f"prime-rl-{version}.toml"
    p.write_text(BASE.format(version=version, dir=d))
    return p


EXTRAS = [None, {"seq_len": 4096}, {"seq_len": 1000}, {"max_steps": 50}, {"max_steps": 7},
          {"orchestrator.seq_len": 8192}, {"trainer.model.seq_len": 2048}, {"ckpt.interval": 3}]


@st.composite
def cases(draw) -> dict[str, Any]:
    gpus = draw(st.sampled_from([1, 2, 3, 4]))
    inference = draw(st.integers(1, gpus))
    return {
        "version": draw(st.sampled_from(VERSIONS)),
        "resources.gpus_per_node": gpus,
        "resources.colocate": draw(st.booleans()),
        "inference": inference,
        "rollout.tensor_parallel": draw(st.sampled_from([1, 2, 4])),
        "rollout.group_size": draw(st.sampled_from([1, 2, 4, 8])),
        "train.train_batch_size": draw(st.sampled_from([8, 12, 16, 32, 64])),
        "rollout.prompts_per_step": draw(st.sampled_from([None, 8, 16])),
        "train.seq_len": draw(st.sampled_from([2048, 4096, 8192])),
        "lora": draw(st.sampled_from([None, "all-linear", ["all-linear"], ["q_proj", "v_proj"]])),
        "extra": draw(st.sampled_from(EXTRAS)),
    }


def sets_of(c: dict[str, Any]) -> list[str]:
    out = [f"{k}={json.dumps(v)}" for k, v in c.items()
           if k not in ("version", "lora", "extra", "inference", "resources.colocate") and v is not None]
    n = c["inference"]
    # no GPU left for the trainer: it shares the engine's (colocate = false beside shared lists is refused at load)
    colocate = c["resources.colocate"] or n >= c["resources.gpus_per_node"]
    out.append(f"resources.colocate={json.dumps(colocate)}")
    out.append(f"resources.inference_gpus={json.dumps(list(range(n)))}")
    if not colocate:
        out.append(f"resources.trainer_gpus={json.dumps(list(range(n, c['resources.gpus_per_node'])))}")
    else:
        out.append(f"resources.trainer_gpus={json.dumps(list(range(n)))}")
    if c["lora"] is not None:
        out += ["lora.rank=8", f"lora.target_modules={json.dumps(c['lora'])}"]
    if c["extra"]:
        k, v = next(iter(c["extra"].items()))
        out.append(f'backend.prime_rl.extra={{"{k}"={json.dumps(v)}}}')
    return out


def prime_verdict(version: str, cfg: dict[str, Any]) -> tuple[bool, str]:
    schema = load_schema(version)
    errs = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft202012Validator(schema).iter_errors(nulls(cfg))]
    if errs:
        return False, f"schema: {errs[:3]}"
    found = [f.message for f in rules.check(cfg, version, schema) if f.level == "error"]
    if found:
        return False, f"validators: {found[:3]}"
    tp = (cfg.get("inference") or {}).get("parallel", {}).get("tp", 1)
    if HEADS % tp:
        return False, f"vllm: {HEADS} heads not divisible by TP {tp}"
    return True, ""


def check(c: dict[str, Any]) -> None:
    ours = rlctl_verdict(base(c["version"]), sets_of(c))
    if ours.prep is None:
        raise AssertionError(f"rlctl refused the recipe itself: {ours.reasons}")
    theirs = prime_verdict(c["version"], tomllib.loads(ours.prep.plan.files[CONFIG_FILE]))
    if theirs[0] and ours.only_for_meaning():  # a declared change of meaning (_agreement.MEANING)
        return
    assert ours.accepted == theirs[0], disagreement(c, ours, theirs)


SEED = {"version": "0.8.0", "resources.gpus_per_node": 2, "resources.colocate": False, "inference": 1,
        "rollout.tensor_parallel": 1, "rollout.group_size": 8, "train.train_batch_size": 64,
        "rollout.prompts_per_step": None, "train.seq_len": 4096, "lora": None, "extra": None}


@profile(ci=200)
@given(cases())
@example(SEED)
@example({**SEED, "extra": {"seq_len": 1000}})  # issue 22: "Shared config conflicts", refused by render now
@example({**SEED, "extra": {"seq_len": 4096}})  # the same value twice is accepted by prime-rl (and rlctl)
@example({**SEED, "version": "0.3.0", "rollout.tensor_parallel": 2})  # issue 22: TP 2 on one inference GPU
@example({**SEED, "train.train_batch_size": 8, "rollout.group_size": 2})  # prompts_per_step default: no finding
def test_rlctl_and_prime_rl_agree(c):
    check(c)
