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


def _line(out: str, check: str) -> tuple[str, str]:
    """(the first line of `check`, the fix line under it) in preflight's text."""
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.split()[1:2] == [check] and ln.split()[0] in ("FAIL", "WARN"))
    fix = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].strip().startswith("fix:") else ""
    return lines[i], fix


def test_a_rollout_smaller_than_the_train_batch_fails_with_a_fix_that_makes_it_whole(shell, cli):
    """quickstart with group_size 4: `OK placement.batch 16 samples per rollout = 0 optimizer step(s) of 32`, and
    env.flags' GRPOConfig refusal fixed by train.micro_batch_size alone (train.train_batch_size is 32 too). Both
    FAIL with a fix naming the keys and values that make a rollout whole optimizer steps; applied, preflight passes."""
    (shell / "mine.toml").write_text(f'extends = "{QUICKSTART}"\n')
    r = cli("preflight", "mine.toml", "--set", "rollout.group_size=4")
    assert r.code == 1 and "Traceback" not in r.err, (r.code, r.out, r.err)
    assert "= 0 optimizer step(s)" not in r.out, r.out  # said OK before
    batch, batch_fix = _line(r.out, "placement.batch")
    assert batch.startswith("FAIL") and "16 samples" in batch and "32" in batch, r.out
    assert batch_fix == "fix: set train.train_batch_size = 16, train.micro_batch_size = 16", r.out
    flags, flags_fix = _line(r.out, "env.flags")
    assert flags.startswith("FAIL") and "generation_batch_size 16" in flags, r.out
    assert flags_fix.startswith("fix: set train.micro_batch_size = 16, train.train_batch_size = 16"), r.out
    r = cli("preflight", "mine.toml", "--set", "rollout.group_size=4", "--set", "train.train_batch_size=16",
            "--set", "train.micro_batch_size=16", "--only", "placement", "--only", "env.flags")
    assert r.code == 0, r.out


def _eval_recipe(work) -> None:
    (work / "mine.toml").write_text(f'extends = "{QUICKSTART}"\n[eval.sets.held]\n'
                                    f'data = "{RECIPES / "quickstart" / "prompts.jsonl"}"\n')


def test_eval_of_a_model_path_that_is_not_there_says_so(shell, cli):
    """`rlctl eval ./nonexistent --recipe mine.toml` printed transformers' traceback ("Repo id must use alphanumeric
    chars") and exit 1: a local-looking path (./ ../ / ~) that is not there is exit 2, saying so, with a fix."""
    _eval_recipe(shell)
    r = cli("eval", "./nonexistent", "--recipe", "mine.toml")
    assert r.code == 2 and "Traceback" not in r.out + r.err, (r.code, r.out, r.err)
    assert "./nonexistent does not exist" in r.err and "fix: " in r.err, r.err
    assert not (shell / "rlctl-evals").exists(), "no eval job was started"


def test_the_prime_rl_install_fix_names_the_release_the_recipe_renders_for(shell, cli):
    """The 0.3.0 recipe's header says `(prime_rl 0.3.0)` but its fix said `check out the tag (e.g. v0.8.0)`."""
    r = cli("preflight", str(RECIPES / "prime-rl-qwen2.5-7b-1xh100-shared.toml"), "--only", "env")
    assert "(prime_rl 0.3.0)" in r.out and "Traceback" not in r.err, (r.code, r.out, r.err)
    fixes = [ln for ln in r.out.splitlines() if "check out" in ln]
    assert fixes and all("v0.3.0" in ln and "v0.8.0" not in ln for ln in fixes), r.out


def test_the_context_budget_says_what_happens_with_the_recipes_engine(shell, cli):
    """On the CPU quickstart (TRL generating with its own model, no vLLM) the fix of a too-long max_tokens said "vLLM
    rejects such requests: rollouts hang": it names what the recipe's generation really does."""
    r = cli("preflight", QUICKSTART, "--set", "rollout.max_tokens=200", "--only", "context.budget")
    assert r.code == 1 and "Traceback" not in r.err, (r.code, r.out, r.err)
    line, fix = _line(r.out, "context.budget")
    assert line.startswith("FAIL") and "> max_model_len 128" in line, r.out
    assert "vLLM" not in fix and "hang" not in fix, fix
    assert "trainer's own model" in fix and "nothing enforces model.max_model_len" in fix, fix


def test_status_watch_with_no_runs_says_so_once(shell, cli, monkeypatch):
    """`rlctl status --watch` where there are no runs printed the whole "no runs in ..." paragraph every interval:
    a text that did not change is not printed again. (Three intervals, then the user's Ctrl-C.)"""
    import rlctl.runs.status as status

    ticks = []

    def sleep(_s: float) -> None:
        ticks.append(_s)
        if len(ticks) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", sleep)
    r = cli("status", "--watch", "--interval", "0.01")
    assert r.code == 0 and len(ticks) == 3, (r.code, r.out, r.err)
    assert r.out.count("no runs in") == 1, r.out


def test_hosts_check_of_an_unreachable_host_gives_the_ssh_config_caveat(shell, cli):
    """`hosts check` of an unreachable host said "`ssh gpubox true` works" only: with HOME set elsewhere than the
    account's home (this user's case), OpenSSH does not read $HOME/.ssh/config, so `ssh gpubox true` working in the
    user's shell says nothing; the fix gives the -F option docs/remote.md gives, and the ssh rlctl really runs."""
    assert cli("hosts", "add", "gpubox", "me@127.0.0.1", "--ssh-option=-p", "--ssh-option=1").code == 0
    r = cli("hosts", "check", "gpubox")  # nothing listens on port 1: refused at once
    assert r.code == 1 and "unreachable" in r.out + r.err and "Traceback" not in r.err, (r.code, r.out, r.err)
    said = r.out + r.err
    assert "`ssh -p 1 me@127.0.0.1 true`" in said, said
    assert "rlctl hosts add gpubox me@127.0.0.1 --replace --ssh-option=-p --ssh-option=1 --ssh-option=-F " \
           "--ssh-option=$HOME/.ssh/config" in said, said
