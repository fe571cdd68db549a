"""Defects met beside issue 30's (its helpers' follow-ups), each played as a user types it: the README's commands
from a working directory with every default (relative ./runs, no RLCTL_* variables, only HOME isolated: the `user`
fixture). Each test failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_experiments import bandit_recipe


def project(work: Path, steps: int = 2, sleep: float = 0.0, extra: str = "") -> Path:
    """A bandit recipe (a real tiny learner through the command backend: seconds on a CPU) and its prompts."""
    (work / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=steps, sleep=sleep) + extra)
    return work / "b.toml"


# ---- env values are strings: a number typed for env.X is that string ---------------------------------------------

def test_env_numbers_given_with_set_grid_or_in_the_file_are_the_strings_typed(user):
    work, rlctl = user
    project(work, extra='[env]\nBANDIT_VERSION = 12.10\nBANDIT_FLAG = true\n')
    r = rlctl("recipe", "show", "b.toml", "--set", "env.BANDIT_SHIFT=0.250", "--set", "env.N=0", "--json")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["env"]
    assert env == {"BANDIT_SHIFT": "0.250", "N": "0", "BANDIT_VERSION": "12.10", "BANDIT_FLAG": "true"}, env
    assert rlctl("preflight", "b.toml", "--set", "env.BANDIT_SHIFT=0").returncode == 0
    # a sweep over an environment variable: each arm's run gets the value as typed
    r = rlctl("sweep", "b.toml", "--grid", "env.BANDIT_SHIFT=0,0.25", "--name", "shift", "--wait", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    shifts = sorted(_recipe_env(d)["BANDIT_SHIFT"] for d in (work / "runs").glob("shift-*"))
    assert shifts == ["0", "0.25"], shifts
    # another type mismatch names the option the value came from
    r = rlctl("sweep", "b.toml", "--grid", "train.steps=abc,2", "--name", "bad")
    assert r.returncode == 2 and "--grid: `train.steps`" in r.stderr and "--set" not in r.stderr, r.stderr
    (work / "s.toml").write_text(bandit_recipe(steps=2) + '[sweep]\ngrid = { "train.steps" = ["abc", 2] }\n')
    r = rlctl("sweep", "s.toml", "--name", "bad2")
    assert r.returncode == 2 and "[sweep] grid: `train.steps`" in r.stderr, r.stderr
    r = rlctl("preflight", "b.toml", "--set", "env.X=[1, 2]")
    assert r.returncode == 2 and "--set: `env.X`" in r.stderr and "Traceback" not in r.stderr, r.stderr


def _recipe_env(run: Path) -> dict[str, str]:
    import tomllib

    return tomllib.loads((run / "recipe.toml").read_text()).get("env", {})

