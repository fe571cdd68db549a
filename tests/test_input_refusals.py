"""What a new user typed that rlctl took for something else (new-user trial 6): a host named twice in --on, an empty
element of a --gpu list, several hosts where a command runs on one, an empty host name to `hosts check`, a boolean
where the recipe means a number, a comma-joined host string in `run.on`. Each is refused (exit 2, naming the option
or key, with a fix) before anything runs; a pool's preflight line is not OK about a host rlctl does not know."""

from __future__ import annotations

from tests.test_experiments import bandit_recipe


def _refused(r, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "fix: " in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_a_host_named_twice_in_on_is_refused_as_in_the_recipe(user):
    """`launch q.toml --on box1,box1` was taken as `pool box1, box1` while `on = ["box1","box1"]` was refused."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "q.toml").write_text(bandit_recipe(steps=2))
    assert rlctl("hosts", "add", "box1", "me@127.0.0.1").returncode == 0
    for value in ("box1,box1", "box1, box1", "box1,box2,box1"):
        r = rlctl("launch", "q.toml", "--on", value)
        _refused(r, "--on", "named twice", "box1")
    assert not (work / "runs").exists() or not list((work / "runs").iterdir()), "no run started"


def test_an_empty_element_of_a_gpu_list_is_refused(user):
    """`eval RUN --gpu "0,,1"` was taken (CUDA stops reading CUDA_VISIBLE_DEVICES at the empty entry: GPU 1 is
    never seen); so was `eval.gpu = "0,,1"` in a recipe."""
    work, rlctl = user
    for value in ("0,,1", "0,", ",1", "0, ,1"):
        _refused(rlctl("eval", "some-run", "--gpu", value), "--gpu", "empty")
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "e.toml").write_text(bandit_recipe(steps=2) + '\n[eval]\ngpu = "0,,1"\n')
    r = rlctl("render", "e.toml")
    _refused(r, "eval.gpu", "empty")


def test_eval_on_a_pool_says_it_runs_on_one_host(user):
    """`eval RUN --on box1,box2` proposed `rlctl hosts add box1,box2 USER@HOST` (which hosts add refuses), and the
    empty --on fix offered eval a pool."""
    work, rlctl = user
    assert rlctl("hosts", "add", "box1", "me@127.0.0.1").returncode == 0
    r = rlctl("eval", "some-run", "--on", "box1,box2")
    _refused(r, "--on", "eval runs on one host")
    assert "hosts add box1,box2" not in r.stderr and "--on box1" in r.stderr, r.stderr
    r = rlctl("eval", "some-run", "--on", "")
    _refused(r, "--on ''")
    assert "pool" not in r.stderr and "HOST1,HOST2" not in r.stderr, r.stderr
    r = rlctl("launch", "q.toml", "--on", "")  # launch takes a pool: its fix says so
    _refused(r, "--on ''", "HOST1,HOST2")


def test_hosts_check_of_an_empty_name_is_refused(user):
    """`hosts check ""` (an unset $HOST) checked every host, exit 0."""
    work, rlctl = user
    assert rlctl("hosts", "add", "box1", "me@127.0.0.1").returncode == 0
    for value in ("", " "):
        r = rlctl("hosts", "check", value)
        _refused(r, "empty host name")
        assert "box1" not in r.stdout, r.stdout


def test_a_boolean_where_the_recipe_means_a_number_is_a_type_error(user):
    """`checkpoint.resume = true` was read as step 1 (pydantic takes a bool as an int); so were other numeric keys
    that lacked the bool check. Every numeric key of every section refuses a boolean, naming it and what it takes."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    base = bandit_recipe(steps=2)
    cases = {
        "checkpoint.resume": ("[checkpoint]\nresume = true\n", "off, latest or a step number"),
        "optim.lr": (None, "a number"),
        "rollout.top_p": ("[rollout]\ntop_p = true\n", "a number"),
        "run.stall.k": ("[run.stall]\nk = true\n", "a number"),
        "eval.timeout_s": ("[eval]\ntimeout_s = true\n", "a number"),
    }
    for key, (table, takes) in cases.items():
        text = base.replace("lr = 0.5", "lr = true") if table is None else _merge(base, table)
        (work / "b.toml").write_text(text)
        r = rlctl("render", "b.toml")
        _refused(r, key, "true", "boolean", takes)


def _merge(base: str, table: str) -> str:
    """Add `table` (a `[section]` and its keys) to the recipe, into the section it already has."""
    head, body = table.split("\n", 1)
    if head in base:
        return base.replace(head + "\n", table, 1)
    return base + "\n" + table


def test_preflight_pool_line_is_not_ok_about_an_unknown_host(user):
    """`on = ["box1", "nohost"]`: preflight printed `OK placement.pool pool of 2 host(s) (box1, nohost)` beside
    `FAIL placement.hosts`."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "p.toml").write_text(bandit_recipe(steps=2) + '\non = ["box1", "nohost"]\n'
                                 '[checkpoint]\nsync = "s3://bucket/prefix"\n')
    assert rlctl("hosts", "add", "box1", "me@127.0.0.1").returncode == 0
    r = rlctl("preflight", "p.toml")
    assert r.returncode == 1, r
    pool = [ln for ln in r.stdout.splitlines() if "placement.pool" in ln]
    assert not pool or not pool[0].lstrip().startswith("OK"), r.stdout
    assert any("FAIL" in ln and "placement.hosts" in ln for ln in r.stdout.splitlines()), r.stdout


def test_a_comma_joined_run_on_suggests_the_list_form(user):
    """`on = "box1,box2"` said `not a host name` with no fix line."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "p.toml").write_text(bandit_recipe(steps=2) + '\non = "box1,box2"\n')
    r = rlctl("render", "p.toml")
    _refused(r, "run.on", 'on = ["box1", "box2"]')


def test_every_numeric_key_of_the_schema_refuses_a_boolean():
    """The check is one mechanism (Section's validator), so every numeric key refuses `true` (a key added later too):
    each key of the schema's walk (tests/test_cli_properties.py) set to true on a bundled recipe is a RecipeError
    naming the key and the boolean, never read as 1."""
    import pytest

    from rlctl.errors import RecipeError
    from rlctl.recipe.loader import load
    from tests.conftest import RECIPES
    from tests.test_cli_properties import NUMERIC_KEYS

    assert "checkpoint.resume" in NUMERIC_KEYS and "optim.lr" in NUMERIC_KEYS, NUMERIC_KEYS
    wrong = {}
    for key in NUMERIC_KEYS:
        key = key.replace("eval.sets.", "eval.sets.s.")  # the walk passes through the dict of named sets
        with pytest.raises(RecipeError) as e:
            load(RECIPES / "quickstart.toml", sets=[f"{key}=true"])
        if "boolean" not in str(e.value) or key not in str(e.value):
            wrong[key] = str(e.value)
    assert not wrong, wrong


def test_colocate_beside_disjoint_gpu_lists_is_refused(cli, tmp_path):
    """`resources.colocate = true` (trainer and inference share GPUs) beside disjoint trainer_gpus / inference_gpus
    (they share none) got contradictory verdicts (placement counted shared GPUs, the GPU plan separate ones): the
    recipe contradicts itself, whichever backend, and is refused where it is read."""
    from tests.conftest import RECIPES

    base = RECIPES / "prime-rl-qwen3-8b-2xh100.toml"
    sets = ["resources.colocate=true", "resources.trainer_gpus=[0]", "resources.inference_gpus=[1]"]
    for cmd in ("render", "preflight"):
        r = cli(cmd, str(base), *[a for s in sets for a in ("--set", s)])
        assert r.code == 2, (r.code, r.out, r.err)
        assert "Traceback" not in r.err and "fix: " in r.err, r.err
        for w in ("resources.colocate", "resources.trainer_gpus", "resources.inference_gpus"):
            assert w in r.err, (w, r.err)
    path = tmp_path / "r.toml"
    path.write_text(f'extends = "{base}"\n[resources]\ncolocate = true\ntrainer_gpus = [0, 1]\n'
                    "inference_gpus = [2, 3]\ngpus_per_node = 4\n")
    r = cli("render", str(path))
    assert r.code == 2 and f"{path}:" in r.err, r.err
    # sharing one GPU, or colocate with one list only, is no contradiction
    assert cli("render", str(base), "--set", "resources.colocate=true", "--set", "resources.trainer_gpus=[0,1]",
               "--set", "resources.inference_gpus=[1]").code != 2


def _load_error(recipe: str, *sets: str) -> str:
    """The RecipeError (exit 2) a bundled recipe with these --set gives."""
    import pytest

    from rlctl.errors import RecipeError
    from rlctl.recipe.loader import load
    from tests.conftest import RECIPES

    with pytest.raises(RecipeError) as e:
        load(RECIPES / recipe, sets=list(sets))
    text = str(e.value) + "\n" + (e.value.hint or "")
    assert "fix" in text, text
    return text


PRIME = "prime-rl-qwen3-8b-2xh100.toml"


def test_a_gpu_id_named_twice_is_refused():
    """`resources.trainer_gpus=[0,0]` counted two trainer GPUs and rendered `trainer_gpu_ids = [0, 0]`."""
    for key in ("resources.trainer_gpus", "resources.inference_gpus"):
        err = _load_error(PRIME, f"{key}=[0,1,0]", "resources.colocate=true")
        assert err.startswith(f"--set {key}:") and "0" in err and "twice" in err, err


def test_an_error_from_set_names_the_set_not_a_file_line():
    """`--set resources.colocate=true` was blamed on the recipe's line of inference_gpus; `--set
    backend.verl.extra=5` on its [backend] line, with no fix."""
    err = _load_error(PRIME, "resources.colocate=true")
    assert err.startswith("--set resources.colocate:") and ".toml" not in err.split("\n")[0], err
    err = _load_error(PRIME, "backend.verl.extra=5")
    assert err.startswith("--set backend.verl.extra:") and "fix: " in err, err
    # the reverse contradiction: colocate = false beside lists that share a GPU is refused as colocate = true is
    err = _load_error("prime-rl-qwen2.5-7b-1xh100-shared.toml", "resources.colocate=false")
    assert err.startswith("--set resources.colocate:") and "[0]" in err and "fix: " in err, err


def test_a_type_error_says_the_fix():
    """`backend.version=1.16` said `expected input should be a valid string` with no fix and no known releases;
    `rollout.group_size="eight"` and `resources.trainer_gpus=[-1]` gave no fix either."""
    err = _load_error(PRIME, "backend.version=1.16")
    assert 'version = "1.16"' in err and "0.3.0" in err, err
    err = _load_error(PRIME, 'rollout.group_size="eight"')
    assert "fix: " in err and "whole number" in err and "group_size = " in err, err
    err = _load_error(PRIME, "resources.trainer_gpus=[-1]")
    assert "fix: " in err and "from 0 to 1023" in err, err


def test_a_quoted_number_in_a_recipe_is_a_type_error(shell, cli):
    """`train.steps = "100"` was taken as 100 (pydantic's lax mode turns text into a number), and `"true"` into a
    boolean: a recipe key typed wrong is refused, naming file:line, the key, what was given and the fix. On the
    command line values come as text: `--set train.steps=100` (and `"100"`, `True`) still parse."""
    (shell / "prompts.jsonl").write_text('{"input": "a"}\n')
    base = bandit_recipe(steps=2)
    cases = {  # key: (the recipe with it quoted, its line, what it says, the fix)
        "train.steps": (base.replace("steps = 2", 'steps = "100"'), '"100"', "steps = 100"),
        "optim.lr": (base.replace("lr = 0.5", 'lr = "5e-3"'), '"5e-3"', "lr = 0.005"),
        "train.gradient_checkpointing": (_merge(base, '[train]\ngradient_checkpointing = "true"\n'), '"true"',
                                         "gradient_checkpointing = true"),
    }
    for key, (text, given, fix) in cases.items():
        (shell / "q.toml").write_text(text)
        line = next(i for i, ln in enumerate(text.splitlines(), 1) if given in ln)
        r = cli("render", "q.toml")
        assert r.code == 2, (key, r.code, r.out, r.err)
        assert "Traceback" not in r.err and f"q.toml:{line}:" in r.err, (key, r.err)
        assert key in r.err and given in r.err and f"fix: write it without quotes: {fix}\n" in r.err, (key, r.err)
    # text that is no number: the fix names what the key takes, not a made-up value (it said `steps = 1`)
    (shell / "q.toml").write_text(base.replace("steps = 2", 'steps = "eighty"'))
    r = cli("render", "q.toml")
    assert r.code == 2 and "fix: write a whole number without quotes: steps = <a whole number>" in r.err, r.err
    (shell / "q.toml").write_text(base)
    for value in ("100", '"100"'):
        r = cli("render", "q.toml", "--set", f"train.steps={value}")
        assert r.code == 0 and "100" in r.out, (value, r.err)
    assert cli("render", "q.toml", "--set", "train.gradient_checkpointing=True").code == 0


def test_every_numeric_and_boolean_key_of_the_schema_refuses_text():
    """One mechanism (Section's validator): every number or boolean key of the schema given a quoted value in a
    recipe file is a RecipeError naming the key and what was given, never read as the number."""
    import tempfile
    from pathlib import Path

    import pytest

    from rlctl.errors import RecipeError
    from rlctl.recipe.loader import load
    from rlctl.recipe.schema import SECTIONS, scalar_kinds
    from tests.conftest import RECIPES

    keys = [f"{s}.{n}" if s else n for s, m in SECTIONS.items() for n in m.model_fields if scalar_kinds(m, n)]
    assert {"train.steps", "optim.lr", "train.gradient_checkpointing", "checkpoint.resume"} - set(keys) == {
        "checkpoint.resume"}, keys  # resume takes off/latest too: text is its own form there
    wrong = {}
    with tempfile.TemporaryDirectory() as d:
        for key in keys:
            *table, leaf = key.replace("eval.sets.", "eval.sets.s.").split(".")
            p = Path(d) / "r.toml"
            p.write_text(f'extends = "{RECIPES / "quickstart.toml"}"\n[{".".join(table)}]\n{leaf} = "1"\n'
                         if table else f'extends = "{RECIPES / "quickstart.toml"}"\n{leaf} = "1"\n')
            with pytest.raises(RecipeError) as e:
                load(p)
            if f"{p}:" not in str(e.value) or key.replace("eval.sets.", "eval.sets.s.") not in str(e.value) \
                    or '"1"' not in str(e.value):
                wrong[key] = str(e.value)
    assert not wrong, wrong


def test_a_lora_target_module_named_twice_is_refused(shell, cli):
    """`lora.target_modules = ["q_proj", "q_proj"]` passed silently (rendered as given); a GPU id or a host named
    twice is refused where the recipe is read, and so is a module: naming file:line (or the --set), the key, the
    module, and the list with each once."""
    (shell / "prompts.jsonl").write_text('{"input": "a"}\n')
    text = bandit_recipe(steps=2) + '[lora]\nrank = 8\ntarget_modules = ["q_proj", "v_proj", "q_proj"]\n'
    (shell / "q.toml").write_text(text)
    r = cli("render", "q.toml")
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.out, r.err)
    line = text.splitlines().index('target_modules = ["q_proj", "v_proj", "q_proj"]') + 1
    for w in (f"q.toml:{line}:", "lora.target_modules", "q_proj", "twice",
              'fix: list each module once: target_modules = ["q_proj", "v_proj"]'):
        assert w in r.err, (w, r.err)
    (shell / "q.toml").write_text(bandit_recipe(steps=2) + "[lora]\nrank = 8\n")
    r = cli("render", "q.toml", "--set", 'lora.target_modules=["k_proj","k_proj"]')
    assert r.code == 2 and r.err.startswith("rlctl: --set lora.target_modules:") and "k_proj" in r.err, r.err
