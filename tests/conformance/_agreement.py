"""Shared pieces of the agreement-by-generation tests (test_agreement_*.py): hypothesis profiles, rlctl's own verdict
on a generated recipe, and the files a generated recipe points at.

rlctl's verdict on a recipe: accepted when `render` finds no error (prepared.validate(): the backend's definitions and
what it cannot honour) AND preflight's configuration checks (placement.*, env.flags) have no FAIL. Checks that look
at this machine (disk, GPUs, installed packages, W&B keys, files) are not part of it: the backends' parsers do not
look at them either.

Sizes: CI runs a few hundred cases per backend (the `ci` profile, the default); `RLCTL_NIGHTLY=1` runs thousands
(`nightly`), with hypothesis' database off so each night explores new cases. A case hypothesis finds is printed
with its `--set` list: add it as an @example to the test (a named regression case) and fix rlctl.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

NIGHTLY = os.environ.get("RLCTL_NIGHTLY") == "1"


def examples(ci: int) -> int:
    """max_examples for one test: `ci` by default, 20x that at night."""
    return ci * 20 if NIGHTLY else ci


def profile(ci: int) -> settings:
    return settings(max_examples=examples(ci), deadline=None, derandomize=not NIGHTLY, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much], print_blob=True)


PROMPTS = 203
REWARD = '''
def reward_func(queries, prompts, labels):
    return [float(len(q) % 7) for q in queries]


def my_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(solution_str == ground_truth)
'''


@cache
def workdir() -> Path:
    """Local prompts, eval prompts and a reward file (generated recipes must not fail on missing files)."""
    d = Path(tempfile.mkdtemp(prefix="rlctl-agreement-"))
    (d / "prompts.jsonl").write_text("".join(json.dumps({"input": f"q{i}", "label": str(i)}) + "\n"
                                             for i in range(PROMPTS)))
    (d / "eval.jsonl").write_text("".join(json.dumps({"input": f"e{i}", "label": str(i)}) + "\n" for i in range(300)))
    (d / "reward.py").write_text(REWARD)
    (d / "ckpt").mkdir()
    return d


@dataclass
class Verdict:
    accepted: bool
    reasons: list[str] = field(default_factory=list)
    prep: Any = None

    def only_for_meaning(self, meaning: tuple[str, ...] = ()) -> bool:
        """Refused, each reason a declared change of meaning (MEANING, and the backend's own `meaning`): what rlctl
        refuses although the backend runs it, because it would silently run something else than the recipe says."""
        return not self.accepted and bool(self.reasons) and all(
            any(m in why for m in (*MEANING, *meaning)) for why in self.reasons)


# changes of meaning on every backend (docs/checks.md: an error is a crash, a hang or a silent change of meaning): a
# rollout smaller than one train batch makes no optimizer step, and where updates straddle rollouts each step learns
# from several rollouts' prompts, not rollout.prompts_per_step (placement.batch)
MEANING = ("is less than one train batch",)


@cache
def _tiny_model():
    from transformers import AutoModelForCausalLM

    from rlctl.recipe.tiny_model import make_tiny

    path = workdir() / "tiny"
    if not (path / "config.json").is_file():
        make_tiny(path)
    return AutoModelForCausalLM.from_pretrained(path)


def peft_accepts(target_modules: Any) -> str | None:
    """peft's own verdict on the parsed --target_modules (None: accepted)."""
    import copy

    from peft import LoraConfig, get_peft_model

    try:
        get_peft_model(copy.deepcopy(_tiny_model()), LoraConfig(r=8, target_modules=target_modules))
    except Exception as e:  # peft raises ValueError subclasses (NoMatchingPeftModuleError) for unknown modules
        return f"peft: {type(e).__name__}: {str(e)[:160]}"
    return None


CONFIG_CHECKS = ["placement", "lora", "env.flags"]


def rlctl_verdict(path: Path, sets: list[str]) -> Verdict:
    from rlctl import preflight as pf
    from rlctl.errors import RlctlError
    from rlctl.recipe.planning import prepare

    try:
        prep = prepare(path, sets)
    except RlctlError as e:
        return Verdict(False, [f"recipe: {e.message}"])
    reasons = [f"render: {f.key}: {f.message}" for f in prep.validate() if f.level == "error"]
    reasons += [f"preflight {r.check}: {r.figure}" for r in pf.run(prep, CONFIG_CHECKS) if r.verdict == pf.FAIL]
    return Verdict(not reasons, reasons, prep)


def disagreement(case: Any, ours: Verdict, theirs: tuple[bool, str]) -> str:
    ok, why = theirs
    return (f"rlctl {'accepts' if ours.accepted else 'refuses'} but the backend {'accepts' if ok else 'refuses'}"
            f"\n  case: {case}\n  rlctl: {ours.reasons or 'ok'}\n  backend: {why or 'ok'}")
