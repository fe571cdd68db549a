"""Keys that cannot act as the backend runs the recipe (Backend.inert): preflight's algorithm.inert warns, render says
it, and `rlctl ab`/`rlctl sweep` refuse arms that would train identically, before anything runs.

The trial that found it (seed 001's A28 question, eps_clip 0.2 vs 0.1, played on the quickstart): `rlctl ab A.toml
B.toml --seeds 2` launched 4 runs and `compare` said "B - A = +0, identical in every seed". TRL rendered
num_iterations = 1 and one optimizer step per generation batch, so GRPOTrainer's ratio pi/pi_old is exactly 1 at the
only update of each rollout and the clip never binds. Where that holds, per backend, is checked against each
backend's own code in tests/conformance (test_agreement_trl.py: GRPOConfig; test_verl.py: verl's composed config;
test_openrlhf.py: OpenRLHF's parsed arguments)."""

from __future__ import annotations

import json

from rlctl.experiments.variants import ab_arms, inert_only
from tests.conftest import RECIPES, run_cli

QUICKSTART = RECIPES / "quickstart.toml"


def _pair(work, a: str = "", b: str = "") -> tuple[str, str]:
    """Seed 001's A28 question on the quickstart: A eps_clip 0.2, B 0.1, 6 steps each."""
    for name, clip, more in (("A.toml", 0.2, a), ("B.toml", 0.1, b)):
        (work / name).write_text(f'extends = "{QUICKSTART}"\n[train]\nsteps = 6\n{more}\n[algorithm]\n'
                                 f"eps_clip = {clip}\n")
    return "A.toml", "B.toml"


def _inert(args: list[str]) -> list[dict]:
    r = run_cli("preflight", str(QUICKSTART), "--only", "algorithm", "--json", *args)
    assert r.code == 0, r.err
    return [x for x in json.loads(r.out)["results"] if x["check"] == "algorithm.inert"]


def test_eps_clip_on_the_quickstart_cannot_act_and_preflight_says_why_and_the_fix(shell):
    (warn,) = _inert(["--set", "algorithm.eps_clip=0.1"])
    assert warn["verdict"] == "warn" and warn["data"] == {"key": "algorithm.eps_clip"}
    fig = warn["figure"]
    assert fig.startswith("algorithm.eps_clip = 0.1 cannot act:")
    # in TRL's own terms: its config values and where the trainer takes the old log-probs from
    for said in ("num_iterations = 1", "steps_per_generation = 1", "gradient_accumulation_steps = 1",
                 "one optimizer step per generation batch of 32", "per_token_logps.detach()", "exactly 1"):
        assert said in fig, fig
    assert warn["set"] == {"train.epochs_per_rollout": 2} and "num_iterations = 2" in warn["fix"]
    # the other way names both batch keys (hostile trial 11: the train batch alone left TRL's steps as they were)
    assert "train.train_batch_size = 16 and train.micro_batch_size = 16" in warn["fix"], warn["fix"]
    # applying the fix closes it (vetted: nothing else newly fails or warns)
    assert _inert(["--set", "algorithm.eps_clip=0.1", "--set", "train.epochs_per_rollout=2"]) == []
    # several optimizer steps per rollout (32 samples, 16 per step): the second one trains on moved weights
    assert _inert(["--set", "algorithm.eps_clip=0.1", "--set", "train.train_batch_size=16",
                   "--set", "train.micro_batch_size=16"]) == []
    # the quickstart as shipped does not set eps_clip: nothing to say
    r = run_cli("preflight", str(QUICKSTART), "--only", "algorithm")
    assert r.code == 0 and "0 checks ran" in r.out, r.out


def test_an_extra_clip_key_is_said_too_and_render_says_it_where_the_command_is_shown(shell):
    (warn,) = _inert(["--set", "backend.trl.extra={epsilon_high=0.28}"])
    assert warn["data"] == {"key": "backend.trl.extra.epsilon_high"}
    r = run_cli("render", str(QUICKSTART), "--set", "algorithm.eps_clip=0.1")
    assert r.code == 0, r.err
    assert "warn: algorithm.inert: algorithm.eps_clip = 0.1 cannot act" in r.err, r.err
    assert "train.epochs_per_rollout = 2" in r.err


def test_ab_refuses_the_a28_pair_before_anything_runs(shell):
    a, b = _pair(shell)
    r = run_cli("ab", a, b, "--seeds", "2")
    assert r.code == 2, (r.code, r.out, r.err)
    assert "A and B differ only in algorithm.eps_clip (0.2 vs 0.1)" in r.err, r.err
    assert "num_iterations = 1" in r.err and "would train identically" in r.err
    assert "--set train.epochs_per_rollout=2" in r.err and "--force" in r.err
    assert "Traceback" not in r.err
    assert not (shell / "runs").exists()  # no experiment, no run directory, nothing preflighted or queued
    # a grid over the key alone, on the same recipe: the same refusal
    r = run_cli("sweep", a, "--grid", "algorithm.eps_clip=0.1,0.3", "--seeds", "2")
    assert r.code == 2 and "the 2 arms of the grid differ only in algorithm.eps_clip" in r.err, r.err
    assert not (shell / "runs").exists()
    # --force goes past the refusal to preflight and placement (here: a host that does not exist, so nothing runs)
    r = run_cli("ab", a, b, "--seeds", "1", "--force", "--on", "nohost")
    assert r.code == 2 and "preflight of 2 variants" in r.err and "no host 'nohost'" in r.err, r.err
    assert "nothing was launched" not in r.err  # not refused: said, as what --force launches (identical arms)
    assert "warning: --force: the arms differ only in algorithm.eps_clip, which cannot act" in r.err, r.err


def test_ab_refuses_a_key_the_backend_does_not_render(shell):
    """prime-rl's loss has no PPO clip (unhonoured: render and env.flags say it): two arms that differ in eps_clip
    alone run the same command."""
    base = RECIPES / "prime-rl-qwen3-8b-2xh100.toml"
    (shell / "P.toml").write_text(f'extends = "{base}"\n[algorithm]\neps_clip = 0.1\n')
    r = run_cli("ab", str(base), "P.toml", "--seeds", "2")
    assert r.code == 2 and "differ only in algorithm.eps_clip (0.2 vs 0.1)" in r.err, r.err
    assert "not rendered: prime-rl's loss has no PPO clip range" in r.err and "dppo_mask_high" in r.err
    assert not (shell / "runs").exists()


def test_arms_where_the_clip_acts_or_that_really_differ_are_not_refused(shell):
    # with two passes over each rollout the clip acts: a real question
    a, b = _pair(shell, "epochs_per_rollout = 2", "epochs_per_rollout = 2")
    assert inert_only(ab_arms(a, b, [])) is None
    # eps_clip and the learning rate: the arms differ in what they train
    a, b = _pair(shell)
    assert inert_only(ab_arms(a, b, ["optim.lr=1e-3"])) is not None  # --set is both arms': eps_clip alone differs
    (shell / "C.toml").write_text(f'extends = "{QUICKSTART}"\n[train]\nsteps = 6\n[optim]\nlr = 1e-3\n'
                                  "[algorithm]\neps_clip = 0.1\n")
    assert inert_only(ab_arms(a, "C.toml", [])) is None
    # differing only in seeds: a noise check, on purpose
    (shell / "D.toml").write_text(f'extends = "{QUICKSTART}"\n[train]\nsteps = 6\nseed = 7\n[algorithm]\n'
                                  "eps_clip = 0.2\n")
    assert inert_only(ab_arms(a, "D.toml", [])) is None


def test_verl_clip_extras_one_bound_or_both(shell):
    """verl's vanilla loss clips at clip_ratio_low / clip_ratio_high (rendered from eps_clip): an extra for one bound
    is said as that bound; extras for both leave eps_clip nothing to do, whatever the updates per rollout."""
    from rlctl.recipe.planning import prepare

    seed = RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"
    high = 'backend.verl.extra={"actor_rollout_ref.actor.clip_ratio_high"=0.28}'
    prep = prepare(seed, ["train.epochs_per_rollout=2", high])  # two passes: the clip acts
    (said,) = [f for f in prep.validate() if f.key.endswith("clip_ratio_high")]
    assert "for that bound of the clip range; algorithm.eps_clip sets the other" in said.message
    assert prep.backend.inert(prep.recipe) == []
    both = ('backend.verl.extra={"actor_rollout_ref.actor.clip_ratio_high"=0.28, '
            '"actor_rollout_ref.actor.clip_ratio_low"=0.2}')
    prep = prepare(seed, ["train.epochs_per_rollout=2", both])
    (eps,) = prep.backend.inert(prep.recipe)
    assert eps.key == "algorithm.eps_clip"
    assert "sets actor_rollout_ref.actor.clip_ratio_low and clip_ratio_high" in eps.why
    # one step per iteration: the extras themselves cannot act either (a nested table is the same key)
    r = run_cli("preflight", str(seed), "--only", "algorithm", "--json", "--set",
                'backend.verl.extra={actor_rollout_ref={actor={clip_ratio_c=2.0}}}')
    (warn,) = json.loads(r.out)["results"]
    assert warn["data"] == {"key": "backend.verl.extra.actor_rollout_ref.actor.clip_ratio_c"}, warn


def test_a_grid_axis_that_cannot_act_in_any_arm_is_refused_though_another_axis_acts(shell):
    """The hostile trial: eps_clip 0.1,0.2,0.3 x lr 1e-3,5e-3 queued 6 runs that were 2 trainings (compare gave
    identical values per lr). The eps_clip axis is refused by name, with why, the fix and --force."""
    a, _ = _pair(shell)
    r = run_cli("sweep", a, "--grid", "algorithm.eps_clip=0.1,0.2,0.3", "--grid", "optim.lr=1e-3,5e-3",
                "--seeds", "1")
    assert r.code == 2, (r.code, r.out, r.err)
    assert "grid axis algorithm.eps_clip (0.1, 0.2, 0.3) cannot act in any of the 6 arms" in r.err, r.err
    assert "only 2 distinct trainings" in r.err and "num_iterations = 1" in r.err, r.err
    assert "drop --grid algorithm.eps_clip" in r.err and "--set train.epochs_per_rollout=2" in r.err, r.err
    assert "--force" in r.err and "Traceback" not in r.err
    assert not (shell / "runs").exists()
    # with the fix the axis acts: past the refusal to preflight (a host that does not exist: nothing runs)
    r = run_cli("sweep", a, "--grid", "algorithm.eps_clip=0.1,0.3", "--grid", "optim.lr=1e-3,5e-3", "--seeds", "1",
                "--set", "train.epochs_per_rollout=2", "--on", "nohost")
    assert r.code == 2 and "preflight of 4 variants" in r.err and "cannot act" not in r.err, r.err


def test_sweep_help_example_is_a_grid_whose_axes_act(shell):
    r = run_cli("sweep", "--help")
    assert r.code == 0
    example = " ".join(r.out.split()).split("Example:", 1)[1]
    assert "algorithm.eps_clip" not in example or "train.epochs_per_rollout=2" in example, example


def test_ab_warns_where_part_of_the_diff_cannot_act_and_launches(shell):
    """A vs C: eps_clip and lr differ; it launches, and says the eps_clip part cannot act (the result is lr's)."""
    a, _ = _pair(shell)
    (shell / "C.toml").write_text(f'extends = "{QUICKSTART}"\n[train]\nsteps = 6\n[optim]\nlr = 1e-3\n'
                                  "[algorithm]\neps_clip = 0.1\n")
    r = run_cli("ab", a, "C.toml", "--seeds", "1", "--on", "nohost")
    assert r.code == 2 and "preflight of 2 variants" in r.err and "no host 'nohost'" in r.err, r.err
    assert "warning: algorithm.eps_clip (0.2 vs 0.1) cannot act" in r.err, r.err
    assert "the result is optim.lr's alone" in r.err, r.err


def test_forced_identical_arms_are_recorded_and_compare_says_so(shell):
    from rlctl.experiments import manifest as mf
    from rlctl.experiments.report import inert_notes
    from rlctl.experiments.variants import inert_record

    a, b = _pair(shell)
    arms = ab_arms(a, b, [])
    rec = inert_record(arms, forced=True)
    assert rec["algorithm.eps_clip"]["values"] == [0.2, 0.1] and rec["algorithm.eps_clip"]["forced"] is True
    m = mf.new_manifest("x", "ab", arms, 1, [], {}, inert=rec)
    assert m["inert"] == rec
    (note,) = inert_notes(m)
    assert note.startswith("launched with --force although the arms differ only in algorithm.eps_clip (0.2 vs 0.1)")
    assert "they trained identically" in note
    assert inert_notes({"arms": []}) == []
