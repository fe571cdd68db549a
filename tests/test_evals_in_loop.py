"""Issue 24, the in-loop half: a backend's own eval metrics named `eval/<set>/<mode>` like rlctl's checkpoint
evaluator's (the set from the recipe, the mode from what the adapter rendered), the fallback without a recipe, and
keep_last with eval sets: the backend's own rotation off, rlctl's pruning keeping the best-eval checkpoint."""

from __future__ import annotations

import json
import tomllib
import types
from pathlib import Path

from rlctl.backends import get_backend
from rlctl.evals.in_loop import IN_LOOP_EVAL, context, write_context
from rlctl.evals.sets import resolve_key
from rlctl.metrics.stream import LOG, METRICS, ingest
from rlctl.recipe.loader import load
from tests.conftest import RECIPES

FIXTURES = Path(__file__).parent / "fixtures"
OPENRLHF = RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml"
VERL = RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"
PRIME = RECIPES / "prime-rl-qwen2.5-7b-1xh100-shared.toml"
QUICK = RECIPES / "quickstart.toml"
PROMPTS = RECIPES / "quickstart" / "prompts.jsonl"


def ingested(tmp_path: Path, backend: str, log: str, ctx: dict | None) -> dict[int, dict]:
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / LOG).write_text(log)
    write_context(run, ctx)
    ingest(run, backend, final=True)
    out: dict[int, dict] = {}
    for line in (run / METRICS).read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["step"], {}).update(rec)
    return out


def evals(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k.startswith("eval/")}


# ---- what each adapter says its in-loop eval runs, from its render -----------------------------------------------

def test_openrlhf_mode_comes_from_the_rendered_flags():
    ob = get_backend("openrlhf")
    assert ob.in_loop_eval_run(load(OPENRLHF).recipe)["mode"] == "greedy_pass@1"  # the seed's OOD probe
    r = load(OPENRLHF, ["eval.temperature=0.6", "eval.n_samples=8"]).recipe
    assert ob.in_loop_eval_run(r) == context("default", 0.6, 8) and context("default", 0.6, 8)["mode"] == \
        "sampling_pass@8"
    # an extra given after rlctl's flag wins in argparse, and so here: what OpenRLHF really runs
    for version, extra in (("0.9.3", "{eval_temperature = 1.0, eval_n_samples_per_prompt = 4}"),
                           ("0.11.2", '{"eval.temperature" = 1.0, "eval.n_samples_per_prompt" = 4}')):
        r = load(OPENRLHF, [f"backend.version={json.dumps(version)}", f"backend.openrlhf.extra={extra}"]).recipe
        assert ob.in_loop_eval_run(r)["mode"] == "sampling_pass@4", version
    assert ob.in_loop_eval_run(load(OPENRLHF, ['data.eval=""']).recipe) is None


def test_verl_mode_comes_from_val_kwargs():
    vb = get_backend("verl")
    assert vb.in_loop_eval_run(load(VERL).recipe)["mode"] == "greedy_pass@1"
    r = load(VERL, ["eval.temperature=0.6", "eval.n_samples=4"]).recipe
    assert vb.in_loop_eval_run(r)["mode"] == "sampling_pass@4"
    # do_sample = false is greedy whatever the temperature: n > 1 greedy samples are the nondeterminism proxy
    r = load(VERL, ["eval.temperature=0.6", "eval.n_samples=4",
                    'backend.verl.extra={"actor_rollout_ref.rollout.val_kwargs.do_sample" = false}']).recipe
    assert vb.in_loop_eval_run(r)["mode"] == "nondet_proxy_pass@4"


def test_trl_in_loop_eval_samples_like_training():
    r = load(QUICK, [f"data.eval={json.dumps(str(PROMPTS))}", "eval.every=2"]).recipe
    ctx = get_backend("trl").in_loop_eval_run(r)
    assert ctx["mode"] == f"sampling_pass@{r.rollout.group_size}" and ctx["temperature"] == r.rollout.temperature
    assert ctx["scores_set"] is False  # rlctl evaluates the set in its own mode: TRL's eval is never its score
    assert get_backend("trl").in_loop_eval_run(load(QUICK).recipe) is None


# ---- the stream names them eval/<set>/<mode> ----------------------------------------------------------------------

def test_openrlhf_in_loop_metrics_in_the_stream(tmp_path):
    log = (FIXTURES / "openrlhf" / "console-0.9.3.log").read_text()  # printed by OpenRLHF's own code: n = 8
    ctx = get_backend("openrlhf").in_loop_eval_run(load(OPENRLHF, ["eval.temperature=0.6", "eval.n_samples=8"])
                                                   .recipe)
    m = ingested(tmp_path, "openrlhf", log, ctx)
    assert evals(m[4]) == {"eval/default/sampling_pass@8": 0.5,  # eval_aime_pass8: max over the 8 samples
                           "eval/default/sampling_pass@8/mean_correct": 0.3}  # eval_aime_pass1: their mean
    assert json.loads((tmp_path / "run" / IN_LOOP_EVAL).read_text())["set"] == "default"
    # without the run's context (attach without a recipe): the backend's own names, never a mode label
    m = ingested(tmp_path / "attached", "openrlhf", log, None)
    assert evals(m[4]) == {"eval/aime/pass1": 0.3, "eval/aime/pass8": 0.5}


def test_openrlhf_several_sources_and_whole_eval_lengths():
    from rlctl.backends.openrlhf.metrics import eval_record

    ob = get_backend("openrlhf")
    rec = eval_record(6, {"eval_aime_pass1": 0.2, "eval_math_pass1": 0.7, "eval_aime_truncated_rate": 0.1,
                          "eval_response_length_mean": 900.0})  # 0.11.2's keys
    assert ob.name_in_loop_evals(rec, context("default", 0.0, 1)) == {
        "step": 6, "eval/default/greedy_pass@1/aime": 0.2, "eval/default/greedy_pass@1/math": 0.7,
        "eval/default/greedy_pass@1/aime/truncated_rate": 0.1,
        "eval/default/greedy_pass@1/response_length_mean": 900.0}
    # the primary set's score when the data holds several sources: the first source's, not a length
    keys = ob.name_in_loop_evals(rec, context("default", 0.0, 1))
    assert resolve_key("eval/default/greedy_pass@1", keys) == "eval/default/greedy_pass@1/aime"


def test_verl_in_loop_metrics_in_the_stream(tmp_path):
    log = (FIXTURES / "verl" / "console-0.9.1.log").read_text()  # printed by verl's own code
    m = ingested(tmp_path, "verl", log, get_backend("verl").in_loop_eval_run(load(VERL).recipe))
    with_evals = {s: evals(r) for s, r in m.items() if evals(r)}
    assert with_evals and all("eval/default/greedy_pass@1" in e for e in with_evals.values()), with_evals
    assert not [k for e in with_evals.values() for k in e if not k.startswith("eval/default/greedy_pass@1")]
    # the bulk reader and the line parser name the same (bulk reads plain step lines)
    raw = ingested(tmp_path / "raw", "verl", log, None)
    for s, e in with_evals.items():
        assert len(e) == len(evals(raw[s]))


def test_verl_sampling_mode_names():
    from rlctl.backends.verl.metrics import parse

    vb = get_backend("verl")
    rec = parse("step:10 - val-core/gsm8k/reward/mean@4:0.5 - val-core/gsm8k/reward/best@4/mean:0.7 - "
                "val-aux/gsm8k/reward/best@2/mean:0.6 - val-aux/gsm8k/reward/std@4:0.1 - val-aux/num_turns/min:1")
    assert vb.name_in_loop_evals(rec, context("default", 0.6, 4)) == {
        "step": 10, "eval/default/sampling_pass@4/mean_correct": 0.5, "eval/default/sampling_pass@4": 0.7,
        "eval/default/sampling_pass@4/reward/best@2/mean": 0.6, "eval/default/sampling_pass@4/reward/std@4": 0.1,
        "eval/default/sampling_pass@4/num_turns/min": 1}


def test_trl_in_loop_metrics_named_for_what_it_ran():
    from rlctl.backends.trl.metrics import parse

    rec = parse("{'eval_loss': 0.1, 'eval_reward': 0.4, 'eval_completions/mean_length': 12.0, 'epoch': 1.0}")
    named = get_backend("trl").name_in_loop_evals(rec, context("default", 1.0, 4))
    assert evals(named) == {"eval/default/sampling_pass@4/loss": 0.1, "eval/default/sampling_pass@4/reward": 0.4,
                            "eval/default/sampling_pass@4/completions/mean_length": 12.0}


# ---- keep_last with eval sets: the backend's rotation off, rlctl keeps the best ------------------------------------

def test_verl_rotation_off_with_eval_sets(cli):
    vb = get_backend("verl")
    for version in vb.known_versions:
        on = dict(vb.overrides(load(VERL, ["checkpoint.keep_last=2", f'backend.version="{version}"']).recipe, None))
        assert "trainer.max_actor_ckpt_to_keep" not in on  # verl's null: keep all (checkpoint_manager.py)
        off = dict(vb.overrides(load(VERL, ["checkpoint.keep_last=2", 'data.eval=""', f'backend.version="{version}"'])
                                .recipe, None))
        assert off["trainer.max_actor_ckpt_to_keep"] == 2  # no eval set: verl rotates as before
    res = cli("render", str(VERL), "--set", "checkpoint.keep_last=2")
    assert res.code == 0 and "rotation by rlctl, keeps the best-eval checkpoint" in res.err
    assert "max_actor_ckpt_to_keep (and max_critic_ckpt_to_keep) stays at null" in res.err


def test_prime_rl_and_trl_rotation_off_with_eval_sets(cli):
    pb = get_backend("prime_rl")
    sets = [f'eval.sets.probe.data={json.dumps(str(PROMPTS))}']
    for version in pb.known_versions:
        r = load(PRIME, [f'backend.version="{version}"', *sets]).recipe
        cfg = tomllib.loads(next(v for k, v in pb.render(r).files.items() if k.endswith(".toml")))
        assert "keep_last" not in cfg.get("ckpt", {}) and pb.prune_during_run(r)
        r = load(PRIME, [f'backend.version="{version}"']).recipe
        cfg = tomllib.loads(next(v for k, v in pb.render(r).files.items() if k.endswith(".toml")))
        assert cfg["ckpt"]["keep_last"] == 3
    res = cli("render", str(PRIME), "--set", sets[0])
    assert "rotation by rlctl, keeps the best-eval checkpoint" in res.err and "so up to 4 stay on disk" in res.err
    tb = get_backend("trl")
    r = load(QUICK, ["checkpoint.keep_last=1", *sets]).recipe
    assert "save_total_limit" not in tb.grpo_config(r, None) and tb.kept_checkpoints(r) == 2
    assert tb.grpo_config(load(QUICK, ["checkpoint.keep_last=1"]).recipe, None)["save_total_limit"] == 1


def test_best_mark_from_the_stream_when_evals_run_in_loop_only(tmp_path):
    """No rlctl checkpoint evals (the one set runs in-loop): the supervisor marks the best checkpoint from the
    backend's own evals in the stream, and its pruning keeps it."""
    from rlctl.core.state import read_state, write_state
    from rlctl.runs.checkpoints import prune_during_run
    from rlctl.runs.supervisor import Supervisor

    run = tmp_path / "run-20261125-000000"
    for step in (2, 4, 6, 8):
        d = run / "checkpoints" / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text("{}")
    (run / "recipe.toml").write_text(f'[data]\neval = "{PROMPTS}"\n[eval]\nevery = 2\n')
    key = "eval/default/greedy_pass@1"
    (run / METRICS).write_text("".join(json.dumps({"step": s, key: v, "eval/other/x": 1 - v}) + "\n"
                                       for s, v in ((2, 0.3), (4, 0.8), (6, 0.5), (8, 0.4))))
    write_state(run, backend="trl")
    spec = {"backend": "trl", "keep_last": 1, "prune_during_run": True, "evals": None}
    sup = types.SimpleNamespace(run_dir=run, spec=spec, _best_marked=None,
                                state=lambda **kw: write_state(run, **kw))
    Supervisor._mark_best_from_stream(sup)  # type: ignore[arg-type]
    assert read_state(run)["best_checkpoint"]["step"] == 4 and read_state(run)["best_checkpoint"]["key"] == key
    prune_during_run(run, spec, 1)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-4", "checkpoint-8"]


def test_primary_is_the_mode_the_backend_really_ran(cli, tmp_path):
    from rlctl.evals.sets import primary_key, primary_key_from_run

    ob = get_backend("openrlhf")
    extra = "backend.openrlhf.extra={eval_temperature = 1.0, eval_n_samples_per_prompt = 4}"
    assert primary_key(load(OPENRLHF).recipe, ob) == "eval/default/greedy_pass@1"
    r = load(OPENRLHF, [extra]).recipe
    assert primary_key(r, ob) == "eval/default/sampling_pass@4"  # the extra changed what OpenRLHF runs
    res = cli("render", str(OPENRLHF), "--set", extra)
    assert res.code == 0 and "eval set 'default' runs in-loop as sampling_pass@4" in res.err
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.toml").write_text(f'[data]\neval = "{PROMPTS}"\n[eval]\nevery = 2\n')
    assert primary_key_from_run(run) == "eval/default/greedy_pass@1"
    write_context(run, ob.in_loop_eval_run(r))
    assert primary_key_from_run(run) == "eval/default/sampling_pass@4"
