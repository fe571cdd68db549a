"""Held-out evals end to end on the CPU quickstart (issue 24): the baseline before training, two eval sets in
different modes at the right steps, `rlctl eval` by hand, a command evaluator, a crashing evaluator, a constructed
divergence that stops the run and keeps the best checkpoint, and a LoRA checkpoint evaluated on its base."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlctl.core.state import read_state
from tests.conftest import RECIPES
from tests.test_launch import env, metrics, model_cache, only_run, rlctl  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow
pytest.importorskip("trl")
QUICK = RECIPES / "quickstart.toml"
PROMPTS = RECIPES / "quickstart" / "prompts.jsonl"


def evals_at(run: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for m in metrics(run):
        keys = {k: v for k, v in m.items() if k.startswith("eval/")}
        if keys:
            out.setdefault(m["step"], {}).update(keys)
    return out


def test_two_sets_in_two_modes_with_a_baseline(env):  # noqa: F811
    recipe = env["cwd"] / "r.toml"
    recipe.write_text(f'''extends = "{QUICK}"
[rollout]
max_tokens = 8
[train]
steps = 4
[checkpoint]
every = 2
[eval]
primary = "id"
[eval.sets.id]
data = "{PROMPTS}"
grader = "reward"
threshold = 0.5
limit = 4
[eval.sets.ood]
data = "{PROMPTS}"
temperature = 1.0
n = 4
k = 2
grader = "reward"
threshold = 0.2
limit = 4
every = 4
''')
    r = rlctl(env, "launch", str(recipe), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(env["runs"])
    ev = evals_at(run)
    assert sorted(ev) == [0, 2, 4]
    both = {"eval/id/greedy_pass@1", "eval/ood/sampling_pass@2"}
    assert both <= set(ev[0]) and both <= set(ev[4])
    assert "eval/id/greedy_pass@1" in ev[2] and "eval/ood/sampling_pass@2" not in ev[2]  # ood: every 4 steps
    recs = metrics(run)
    first_train = min(m["time"] for m in recs if "reward/mean" in m)
    assert next(m["time"] for m in recs if m["step"] == 0) < first_train  # the baseline came before training
    ledger = json.loads((run / "evals" / "evals.json").read_text())
    assert {k: v["outcome"] for k, v in ledger["done"].items()} == {"0": "ok", "2": "ok", "4": "ok"}
    assert read_state(run)["best_checkpoint"]["key"] == "eval/id/greedy_pass@1"
    st = rlctl(env, "status", run.name)
    assert "eval/ood/sampling_pass@2" in st.stdout and "baseline" in st.stdout, st.stdout
    # by hand, on a finished run: one set at one checkpoint, into the stream at that step
    r = rlctl(env, "eval", run.name, "--step", "2", "--set", "ood", "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "eval/ood/sampling_pass@2" in json.loads(r.stdout)["results"][0]["metrics"]
    assert "eval/ood/sampling_pass@2" in evals_at(run)[2]


SCRIPT = '''import json, os, sys
step, name, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if name == "crashy" and step == 4:
    os.abort()  # the evaluator dies: the run must go on
values = {0: 0.5, 2: 0.6, 4: 0.45, 6: 0.4}
json.dump({"primary": values.get(step, 0.3), "extra": 1.0}, open(out, "w"))
'''


def test_command_evaluator_crash_and_a_divergence_that_stops_the_run(env):  # noqa: F811
    script = env["cwd"] / "eval_posthoc.py"
    script.write_text(SCRIPT)
    recipe = env["cwd"] / "r.toml"
    recipe.write_text(f'''extends = "{QUICK}"
[train]
steps = 60
[checkpoint]
every = 2
keep_last = 1
[eval]
evaluator = "command"
command = "{sys.executable} {script} {{step}} {{set}} {{output}}"
primary = "probe"
[eval.sets.probe]
data = "{PROMPTS}"
[eval.sets.crashy]
data = "{PROMPTS}"
[run]
stop_when = ["eval_divergence:2", "eval_below_baseline:2"]
''')
    r = rlctl(env, "launch", str(recipe), timeout=900)
    run = only_run(env["runs"])
    state = read_state(run)
    assert state["status"] == "stopped", (state, r.stderr[-2000:])
    assert state["stopped_by"]["rule"] in ("eval_divergence", "eval_below_baseline")
    assert "baseline" in state["stopped_by"]["message"]
    ev = evals_at(run)
    assert [ev[s]["eval/probe/greedy_pass@1"] for s in (0, 2, 4, 6)] == [0.5, 0.6, 0.45, 0.4]
    assert ev[2]["eval/probe/greedy_pass@1/extra"] == 1.0
    assert max(m["step"] for m in metrics(run)) < 60  # stopped well before the end
    # the crash at step 4 is recorded and reported; the other set of that job still counted
    assert any(f["step"] == 4 and "crashy" in f["error"] for f in state["eval_failures"])
    st = rlctl(env, "status", run.name).stdout
    assert "eval failed at step 4" in st and "stopped by stop_when" in st and "best checkpoint: step 2" in st
    # the best checkpoint is marked, kept by in-run pruning (keep_last = 1), by --keep-best, and by --resume
    assert state["best_checkpoint"]["step"] == 2
    assert (run / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    r = rlctl(env, "ckpt", "prune", run.name, "--keep-last", "1", "--keep-best", "--dry-run")
    assert "step       2" not in r.stdout and "would delete" in r.stdout
    from rlctl.backends import get_backend
    from rlctl.runs.launch import _parent_checkpoint

    assert _parent_checkpoint(get_backend("trl"), run).step == 2


def test_lora_checkpoint_eval_matches_the_merged_model(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlctl.evals.generate import Generator, generate_hf, load_hf
    from rlctl.recipe.tiny_model import resolve_model

    base = resolve_model("random:qwen2?hidden=64&layers=2", tmp_path / "models")
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    adapter = tmp_path / "checkpoint-2"
    model.save_pretrained(adapter)
    prompts = ["a sing sky tell:", "cats sea:", "of the:"]
    texts, _ = Generator(str(adapter), base).generate(prompts, 1, 0.0, 12)
    merged = model.merge_and_unload().eval()
    _, tok = load_hf(base, None)
    want, _ = generate_hf(merged, tok, prompts, 1, 0.0, 12, seed=0)
    plain, _ = Generator(base, None).generate(prompts, 1, 0.0, 12)
    assert texts == want
    assert texts != plain  # the adapter really changes the outputs (non-zero LoRA weights)


def test_trl_in_loop_eval_named_by_mode_and_best_kept_by_rlctl_rotation(env):  # noqa: F811
    """The single-set form on TRL (issue 24): GRPOTrainer's own eval (training temperature, num_generations) is named
    for what it ran, eval/default/sampling_pass@8/..., next to rlctl's greedy eval of the same set; keep_last = 1 with
    the set: no save_total_limit, rlctl rotates and the best-eval checkpoint stays."""
    recipe = env["cwd"] / "r.toml"
    recipe.write_text(f'''extends = "{QUICK}"
[data]
eval = "{PROMPTS}"
[rollout]
max_tokens = 8
[train]
steps = 6
[checkpoint]
every = 2
keep_last = 1
[eval]
every = 2
''')
    r = rlctl(env, "render", str(recipe))
    assert "rotation by rlctl, keeps the best-eval checkpoint" in r.stderr and "save_total_limit" not in r.stdout
    r = rlctl(env, "launch", str(recipe), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(env["runs"])
    assert json.loads((run / "in_loop_eval.json").read_text())["mode"] == "sampling_pass@8"
    keys = {k for e in evals_at(run).values() for k in e}
    assert "eval/default/sampling_pass@8/reward" in keys, keys  # TRL's eval_reward: the mean, no pass@k
    assert "eval/default/greedy_pass@1" in keys  # rlctl's checkpoint evaluator, the set's own mode
    assert not [k for k in keys if not k.startswith(("eval/default/sampling_pass@8/", "eval/default/greedy_pass@1"))]
    best = read_state(run)["best_checkpoint"]
    assert best["key"] == "eval/default/greedy_pass@1"
    from rlctl.evals.sets import primary_key_from_run

    assert primary_key_from_run(run) == "eval/default/greedy_pass@1"  # TRL's own eval never scores the set
    left = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("checkpoint-*"))
    assert left == sorted({6, best["step"]} - {0}), (left, best)
