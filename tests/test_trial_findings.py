"""What a new user met following only the README (own HOME, the default ./runs, the CPU quickstart): a typo taken
for a secret, a batch that never makes an optimizer step called OK, a model path that is not there given to
transformers, a fix naming another release, one recipe error of several, a nested fix without a did-you-mean, a
hang that TRL does not have, a recorded eval hidden behind a pruned checkpoint, a repeated paragraph under --watch,
an ssh fix without the -F caveat, a host named twice without a fix. Each as the user meets it: the command, what it
prints, its exit code."""

from __future__ import annotations

from tests.conftest import RECIPES

QUICKSTART = str(RECIPES / "quickstart.toml")


def test_a_typo_of_a_key_is_a_typo_not_a_secret(shell, cli):
    """`--set rollout.max_token=200` was refused as a secret (the word `token`) before its did-you-mean: a key the
    schema does not have holds nothing rlctl would write; the secret rule stays where a value could be written (a
    backend's extras, a known key) and for a credential-named key nothing known is close to."""
    r = cli("preflight", QUICKSTART, "--set", "rollout.max_token=200")
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.out, r.err)
    assert "secret" not in r.err and "Did you mean `rollout.max_tokens`?" in r.err, r.err
    r = cli("preflight", QUICKSTART, "--set", "backend.trl.extra.hub_token=hf_x")
    assert r.code == 2 and "`backend.trl.extra.hub_token` holds a secret" in r.err, r.err
    r = cli("preflight", QUICKSTART, "--set", "wandb.api_key=k")
    assert r.code == 2 and "`wandb.api_key` holds a secret" in r.err and "unknown key" in r.err, r.err


def test_every_recipe_error_is_reported_at_once(shell, cli):
    """A key in the wrong section and a number written as a word: only the first kind was reported (fix one, run
    again, meet the next). Both now, each with file:line and its fix, exit 2."""
    text = (f'extends = "{QUICKSTART}"\n'
            "[rollout]\nmax_model_len = 256\n"
            '[train]\nsteps = "eighty"\n')
    (shell / "mine.toml").write_text(text)
    r = cli("preflight", "mine.toml")
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.out, r.err)
    assert "mine.toml:3: unknown key `rollout.max_model_len`" in r.err and "`model.max_model_len`" in r.err, r.err
    assert "mine.toml:5: `train.steps`" in r.err and '"eighty"' in r.err, r.err
    assert r.err.count("fix: ") >= 1, r.err
    # a misspelt required key is one problem (its did-you-mean), not also "missing required key"
    (shell / "solo.toml").write_text('[backend]\nname = "trl"\n[model]\npath = "x"\n[data]\ntrian = "p.jsonl"\n')
    r = cli("preflight", "solo.toml")
    assert r.code == 2 and "Did you mean `data.train`?" in r.err and "missing required key" not in r.err, r.err


def test_a_host_named_twice_in_run_on_says_the_fix(shell, cli):
    """`run.on = ["box1", "box1"]` was refused with no fix line, unlike a GPU id or a LoRA module named twice."""
    (shell / "pool.toml").write_text(f'extends = "{QUICKSTART}"\n[run]\non = ["box1", "box2", "box1"]\n')
    r = cli("render", "pool.toml")
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.out, r.err)
    assert "pool.toml:3:" in r.err and "box1" in r.err and "twice" in r.err, r.err
    assert 'fix: name each host once: on = ["box1", "box2"]' in r.err, r.err
