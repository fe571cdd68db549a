"""`backend.verl.extra` by every route a user has (a TOML quoted dotted key, a bare dotted key or sub-table, `--set
backend.verl.extra.a.b=v`, `--set backend.verl.extra={...}`): one recipe, overrides verl 0.9.1's own Hydra composer
takes, and the LoRA + FSDP1 refusal sees the key whatever route it came by."""

from __future__ import annotations

import pytest

from rlctl.backends import get_backend
from rlctl.recipe.loader import load
from tests.conformance import _verl_support as vs

pytest.importorskip("hydra")

VERL = get_backend("verl")
A = "actor_rollout_ref"


def _recipe_file(tmp_path, body: str):
    from tests.conftest import RECIPES

    p = tmp_path / "r.toml"
    p.write_text(f'extends = "{RECIPES / "verl-qwen2.5-math-1.5b-1xh100.toml"}"\n' + body)
    return p


def test_set_under_extra_is_the_toml_quoted_key(tmp_path):
    toml = load(_recipe_file(tmp_path, '[backend.verl.extra]\n"a.b.c" = "x"\n"+d.e" = 1\n')).recipe
    sets = load(_recipe_file(tmp_path, ""), ['backend.verl.extra.a.b.c="x"', "backend.verl.extra.+d.e=1"]).recipe
    assert sets.backend.extra() == toml.backend.extra()
    assert {k: toml.backend.extra()[k] for k in ("a.b.c", "+d.e")} == {"a.b.c": "x", "+d.e": 1}
    # and `null` unsets that one key
    unset = load(_recipe_file(tmp_path, '[backend.verl.extra]\n"a.b.c" = "x"\n'), ["backend.verl.extra.a.b.c=null"])
    assert "a.b.c" not in unset.recipe.backend.extra()


STRATEGY_ROUTES = {
    "set-dotted": ("", [f"backend.verl.extra.{A}.actor.strategy=fsdp"]),
    "set-table": ("", [f'backend.verl.extra={{"{A}.actor" = {{strategy = "fsdp"}}}}']),
    "toml-bare-dotted": (f'[backend.verl.extra]\n{A}.actor.strategy = "fsdp"\n', []),
    "toml-subtable": (f'[backend.verl.extra.{A}.actor]\nstrategy = "fsdp"\n', []),
    "toml-plus": (f'[backend.verl.extra]\n"+{A}.actor.strategy" = "fsdp"\n', []),
}


@pytest.mark.parametrize("route", STRATEGY_ROUTES)
def test_lora_under_fsdp1_is_refused_whatever_route(cli, tmp_path, route):
    body, sets = STRATEGY_ROUTES[route]
    path = _recipe_file(tmp_path, "[lora]\nrank = 8\n" + body)
    res = cli("render", str(path), *[a for s in sets for a in ("--set", s)])
    assert res.code == 1, (res.out, res.err)  # render's exit for an error finding
    assert f'backend.verl.extra."{A}.actor.strategy"' in res.err and "LoRA under FSDP1" in res.err
    assert VERL.memory_engine(load(path, sets).recipe) == "fsdp1"  # the memory estimate reads the same key


def test_nested_extra_composes_in_verls_own_hydra(tmp_path):
    """What render makes of each route is an override verl 0.9.1's composer takes, and means what it says."""
    try:
        vs.verl_root("0.9.1")
    except RuntimeError as e:
        pytest.skip(str(e))
    path = _recipe_file(tmp_path, f'[backend.verl.extra.{A}.rollout]\nfree_cache_engine = false\n')
    r = load(path, [f"backend.verl.extra.{A}.actor.optim.betas=[0.8,0.9]",
                    f'backend.verl.extra.+{A}.model.override_config.attn_implementation="sdpa"',
                    f"backend.verl.extra.{A}.ref={{log_prob_micro_batch_size_per_gpu = 3}}"]).recipe
    argv = VERL.render(r, 128).argv[3:]
    keys = [f"{A}.actor.optim.betas", f"{A}.model.override_config.attn_implementation", f"{A}.ref",
            f"{A}.rollout.free_cache_engine", f"{A}.model.path"]
    res = vs.run_jobs("0.9.1", [{"id": "x", "overrides": argv, "select": keys}])[0]
    assert "error" not in res, (res["error"], argv)
    v = res["values"]
    assert v[keys[0]] == [0.8, 0.9] and v[keys[1]] == "sdpa" and v[keys[3]] is False
    assert v[keys[2]]["log_prob_micro_batch_size_per_gpu"] == 3 and v[keys[4]] == r.model.path
