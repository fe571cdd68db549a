"""The recipe loader: extends, --set, unknown keys with did-you-mean, types, ranges, and bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlctl.errors import RecipeError
from rlctl.recipe.loader import load, locate, parse_set
from tests.conftest import MINIMAL, RECIPES


def test_minimal_recipe_gets_defaults(minimal_recipe):
    r = load(minimal_recipe).recipe
    assert r.backend.name == "trl"
    assert r.rollout.group_size == 8
    assert r.train.episodes == 1  # neither steps nor episodes given -> one pass
    assert r.lora is None


def test_set_overrides_are_typed(minimal_recipe):
    r = load(minimal_recipe, ["rollout.group_size=16", "optim.lr=2e-6", "train.gradient_checkpointing=false",
                              "model.path=my/model", "lora.rank=8"]).recipe
    assert r.rollout.group_size == 16 and isinstance(r.rollout.group_size, int)
    assert r.optim.lr == 2e-6
    assert r.train.gradient_checkpointing is False
    assert r.model.path == "my/model"
    assert r.lora is not None and r.lora.rank == 8


def test_parse_set_rejects_malformed():
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        parse_set("rollout.group_size")
    with pytest.raises(RecipeError):
        parse_set("=3")
    assert parse_set("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_set("a.b=hello world") == (["a", "b"], "hello world")


def test_extends_chain_and_relative_paths(write, tmp_path):
    write("data/p.jsonl", '{"input": "x"}\n')
    write("base/base.toml", MINIMAL.replace('train = "prompts.jsonl"', 'train = "../data/p.jsonl"')
          + "\n[rollout]\ngroup_size = 4\nmax_tokens = 100\n")
    write("mid.toml", 'extends = "base/base.toml"\n[rollout]\ngroup_size = 6\n')
    top = write("top.toml", 'extends = "mid.toml"\n[rollout]\nmax_tokens = 200\n')
    res = load(top)
    assert res.recipe.rollout.group_size == 6
    assert res.recipe.rollout.max_tokens == 200
    assert res.recipe.data.train == str((tmp_path / "data/p.jsonl").resolve())
    assert [p.name for p in res.chain] == ["base.toml", "mid.toml", "top.toml"]
    assert res.origins["rollout.group_size"].name == "mid.toml"


def test_extends_cycle_is_an_error(write):
    write("a.toml", 'extends = "b.toml"\n' + MINIMAL)
    b = write("b.toml", 'extends = "a.toml"\n')
    with pytest.raises(RecipeError, match="cycle"):
        load(b)


def test_extends_missing_file_names_the_line(write):
    p = write("a.toml", '# comment\nextends = "nope.toml"\n')
    with pytest.raises(RecipeError) as e:
        load(p)
    assert f"{p.resolve()}:2" in str(e.value) and "nope.toml" in str(e.value)


@pytest.mark.parametrize(
    "snippet, expected",
    [
        ("[rollout]\nn = 4\n", "did you mean `rollout.group_size`?"),
        ("seq_len = 2048\n", "`model.max_model_len`"),
        ("[rollout]\ngroup_szie = 4\n", "did you mean `rollout.group_size`?"),
        ("max_tokens = 10\n", "It belongs in the [rollout] section: did you mean `rollout.max_tokens`?"),
        ("[optim]\nlearning_rate = 1e-6\n", "`optim.lr`"),
    ],
)
def test_unknown_keys_get_did_you_mean_with_file_and_line(write, snippet, expected):
    p = write("r.toml", snippet + MINIMAL)
    with pytest.raises(RecipeError) as e:
        load(p)
    msg = str(e.value)
    assert expected.lower() in msg.lower()
    assert f"{p.resolve()}:" in msg  # the file and a line number


def test_unknown_key_line_number_is_exact(write):
    p = write("r.toml", MINIMAL + "\n[rollout]\ngroup_size = 4\nn = 4\n")
    with pytest.raises(RecipeError) as e:
        load(p)
    line = MINIMAL.count("\n") + 4
    assert f"{p.resolve()}:{line}:" in str(e.value)


@pytest.mark.parametrize(
    "snippet, expected",
    [
        ("[optim]\nlr = -1e-6\n", "`optim.lr` = -1e-06 is invalid: expected a value > 0"),
        ("[rollout]\ngpu_memory_utilization = 1.4\n", "`rollout.gpu_memory_utilization` = 1.4 is invalid"),
        ("[rollout]\ngroup_size = \"eight\"\n", "`rollout.group_size`: \"eight\" is text (in quotes)"),
        ("[algorithm]\nname = \"dpo\"\n", "expected one of"),
        ("[train]\nzero_stage = 4\n", "`train.zero_stage`"),
    ],
)
def test_wrong_types_and_ranges(write, snippet, expected):
    p = write("r.toml", MINIMAL + "\n" + snippet)
    with pytest.raises(RecipeError) as e:
        load(p)
    assert expected in str(e.value)
    assert str(p.resolve()) in str(e.value)


def test_missing_required_section(write):
    p = write("r.toml", '[backend]\nname = "trl"\n[data]\ntrain = "x.jsonl"\n')
    with pytest.raises(RecipeError, match=r"missing required key `model`"):
        load(p)


def test_set_error_names_set(minimal_recipe):
    with pytest.raises(RecipeError, match=r"^--set rollout.group_size: `rollout.group_size`"):
        load(minimal_recipe, ["rollout.group_size=0"])


def test_locate_handles_tables_and_dotted_keys():
    text = 'a = 1\n[rollout]\nn = 2\n[x.y]\nz.w = 3\n'
    assert locate(text, "a") == 1
    assert locate(text, "rollout.n") == 3
    assert locate(text, "x.y.z.w") == 5
    assert locate(text, "x.y") == 4
    assert locate(text, "nope") is None


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "empty"),
        (b"   \n\n", "empty"),
        (b"\x00\x01\x02binary\x00", "binary"),
        (b"\xff\xfe[backend]\n", "not valid UTF-8"),
        (b"[backend\nname = 1\n", "malformed TOML"),
        (b'[backend]\nname = trl\n', "malformed TOML"),
    ],
)
def test_bad_files_are_one_paragraph_errors_exit_2(cli, tmp_path, content, expected):
    p = tmp_path / "bad.toml"
    p.write_bytes(content)
    res = cli("recipe", "show", str(p))
    assert res.code == 2
    assert expected in res.err
    assert "Traceback" not in res.err + res.out
    assert str(p) in res.err


def test_missing_file_and_directory(cli, tmp_path):
    res = cli("recipe", "show", str(tmp_path / "nope.toml"))
    assert res.code == 2 and "no such file" in res.err
    res = cli("recipe", "show", str(tmp_path))
    assert res.code == 2 and "is a directory" in res.err


def test_recipe_show_toml_and_json(cli):
    res = cli("recipe", "show", str(RECIPES / "quickstart.toml"), "--set", "rollout.group_size=4")
    assert res.code == 0, res.err
    assert "group_size = 4" in res.out
    res = cli("recipe", "show", str(RECIPES / "quickstart.toml"), "--json")
    data = json.loads(res.out)
    assert data["backend"]["name"] == "trl"
    assert data["rollout"]["group_size"] == 8


def test_recipe_show_round_trips(cli, tmp_path):
    """What `recipe show` prints is itself a valid recipe that resolves to the same thing."""
    res = cli("recipe", "show", str(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml"))
    again = tmp_path / "again.toml"
    again.write_text(res.out)
    a = load(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml").recipe.model_dump()
    b = load(again).recipe.model_dump()
    assert a == b


def test_bundled_recipe_by_name(cli, tmp_path):
    res = cli("recipe", "show", "quickstart", cwd=tmp_path)
    assert res.code == 0, res.err
    assert 'name = "quickstart"' in res.out


def test_tiny_model_made_once_when_runs_start_together(tmp_path):
    """Two runs resolving the same `random:` model at once (a sweep's first two slots): each loads a whole model,
    one directory results, no temporary folder is left behind."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from rlctl.recipe.tiny_model import resolve_model; "
            "from transformers import AutoModelForCausalLM, AutoTokenizer; "
            "p = resolve_model('random:qwen2', Path(sys.argv[1])); AutoModelForCausalLM.from_pretrained(p); "
            "AutoTokenizer.from_pretrained(p); print(p)")
    import time

    procs = []
    for _ in range(6):  # started a little apart, as a queue launches: one may look while another writes
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        time.sleep(0.15)
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-1500:] for _, e in outs]
    assert len({o.strip() for o, _ in outs}) == 1
    assert [x.name for x in tmp_path.iterdir()] == [Path(outs[0][0].strip()).name]


def test_eval_command_scripts_resolved_against_the_recipe(tmp_path, monkeypatch):
    """`command = "python eval_posthoc.py {checkpoint} {output}"` (docs/eval.md): the script is the recipe's
    neighbour, wherever the command is typed; the eval job runs in <run>/evals, where a relative one is not found.
    Placeholders, options and names that are no file stay as written."""
    proj = tmp_path / "proj"
    (proj / "tools").mkdir(parents=True)
    (proj / "tools" / "eval_posthoc.py").write_text("")
    (proj / "r.toml").write_text(MINIMAL + '[eval]\nevaluator = "command"\n'
                                 'command = "python tools/eval_posthoc.py {checkpoint} --out {output} other.py"\n')
    monkeypatch.chdir(tmp_path)
    cmd = load(proj / "r.toml").recipe.eval.command
    assert cmd.split() == ["python", str(proj / "tools" / "eval_posthoc.py"), "'{checkpoint}'", "--out", "'{output}'",
                           "other.py"]
    monkeypatch.chdir(proj / "tools")  # --set: against the directory the command was typed in
    cmd = load(proj / "r.toml", ["eval.command=sh eval_posthoc.py {checkpoint}"]).recipe.eval.command
    assert str(proj / "tools" / "eval_posthoc.py") in cmd


def test_set_null_unsets_a_key_the_recipe_files_set(write, tmp_path, cli):
    """`--set k=null` (TOML has no null; Hydra spells it so): a key with no default, set by the recipe or a file it
    extends, is unset from the command line (quickstart's `warmup_steps = 0` blocked `--set optim.warmup_ratio=0.1`).
    A table goes whole (`lora=null` turns an extended LoRA recipe into a full fine-tune), and an [env] entry goes."""
    write("prompts.jsonl", '{"input": "x"}\n')
    write("base.toml", MINIMAL + '\n[optim]\nwarmup_steps = 0\n[lora]\nrank = 8\n[env]\nHF_HUB_OFFLINE = "1"\n')
    top = write("top.toml", 'extends = "base.toml"\n[rollout]\ngroup_size = 4\n')
    with pytest.raises(RecipeError, match="not both"):
        load(top, ["optim.warmup_ratio=0.1"])
    r = load(top, ["optim.warmup_steps=null", "optim.warmup_ratio=0.1", "lora=null", "env.HF_HUB_OFFLINE=null"])
    assert r.recipe.optim.warmup_steps is None and r.recipe.optim.warmup_ratio == 0.1
    assert r.recipe.lora is None and r.recipe.env == {} and r.recipe.rollout.group_size == 4
    assert load(top, ["optim.warmup_ratio=null"]).recipe.optim.warmup_ratio is None  # not set anywhere: nothing to do
    out = cli("recipe", "show", str(top), "--set", "optim.warmup_steps=null", "--set", "optim.warmup_ratio=0.1",
              cwd=tmp_path)
    assert out.code == 0, out.err
    assert "warmup_steps" not in out.out and "warmup_ratio = 0.1" in out.out


@pytest.mark.parametrize("expr,says", [
    ("rollout.group_size=null", "`rollout.group_size` cannot be unset: it always has a value (default 8)"),
    ("model.path=null", "`model.path` cannot be unset: the recipe must give it"),
    ("lora.rank=null", "`lora.rank` cannot be unset: [lora] must give it"),
])
def test_set_null_on_a_key_that_cannot_be_unset_says_so(minimal_recipe, tmp_path, cli, expr, says):
    with pytest.raises(RecipeError, match=re.escape(f"--set {expr}: {says}")) as e:
        load(minimal_recipe, ["lora.rank=8", expr])
    assert "give it a value" in (e.value.hint or "")
    out = cli("recipe", "show", str(minimal_recipe), "--set", "lora.rank=8", "--set", expr, cwd=tmp_path)
    assert out.code == 2 and says in out.err and "Traceback" not in out.err


def test_quoted_null_is_the_string(minimal_recipe):
    assert parse_set('a.b="null"') == (["a", "b"], "null")
    assert load(minimal_recipe, ['model.path="null"']).recipe.model.path == "null"


def test_grid_axis_can_unset_a_key(write):
    """`--grid` values are --set values: `null` is an arm without the key."""
    from rlctl.experiments.variants import grid_arms, parse_grid

    write("prompts.jsonl", '{"input": "x"}\n')
    p = write("r.toml", MINIMAL + '\n[optim]\nwarmup_steps = 0\n')
    arms = grid_arms(str(p), parse_grid(["optim.warmup_steps=null,5"]), [])
    assert [a.diff.get("optim.warmup_steps") for a in arms] == [[0, None], [0, 5]]


@pytest.mark.parametrize("value", ["-1", "0"])
def test_a_count_out_of_range_says_what_is_allowed(user, value):
    """`keep_last = -1` (or 0): the error names the file, the line and the key, and its fix says what the key takes
    and what leaving it out means (new-user trial: the message had no fix line)."""
    work, rlctl = user
    (work / "r.toml").write_text(MINIMAL + f"\n[checkpoint]\nevery = 10\nkeep_last = {value}\n")
    r = rlctl("preflight", "r.toml")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = (MINIMAL + "\n[checkpoint]\nevery = 10\n").count("\n") + 1
    assert f"{work / 'r.toml'}:{line}: `checkpoint.keep_last` = {value} is invalid: expected a value >= 1" in r.stderr
    fix = r.stderr.split("fix: ", 1)[-1] if "fix: " in r.stderr else ""
    assert "from 1 to" in fix and "remove the key" in fix and "every checkpoint" in fix, r.stderr


@pytest.mark.parametrize("key,table,value,says,fix", [
    ("run.on", "run", "5", "a host name or a list of host names", 'run.on = "box1"'),
    ("run.on", "run", "[5]", "a host name or a list of host names", 'run.on = ["box1", "box2"]'),
    ("lora.target_modules", "lora", "5", '"all-linear" or a list of module names', "lora.target_modules = "),
    ("checkpoint.resume", "checkpoint", "1.5", "off, latest or a step number", "checkpoint.resume = "),
])
def test_a_key_of_several_forms_says_which_with_its_line(user, key, table, value, says, fix):
    """`[run] on = 5` said "h2.toml: `run.on.str` = 5 is invalid ... `run.on.list[str]` = 5 is invalid": no line,
    pydantic's names of the union's members, no fix (new-user trial of pools). A key that takes several forms is one
    problem like any other key's: file:line, the key, the forms it takes and a fix."""
    work, rlctl = user
    extra = "rank = 4\n" if table == "lora" else ""
    (work / "r.toml").write_text(MINIMAL + f"\n[{table}]\n{extra}{key.split('.')[1]} = {value}\n")
    r = rlctl("preflight", "r.toml")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = (MINIMAL + f"\n[{table}]\n{extra}").count("\n") + 1
    assert f"{work / 'r.toml'}:{line}: `{key}` = {value} is invalid: expected {says}." in r.stderr, r.stderr
    assert r.stderr.count("is invalid") == 1 and "[str]" not in r.stderr and f"{key}." not in r.stderr, r.stderr
    assert "fix: " in r.stderr and fix in r.stderr.split("fix: ", 1)[1], r.stderr


def test_every_key_of_several_forms_declares_them():
    """The loader says what a union-typed key takes from its declared `form` and fixes it with its examples: a new
    such key without them would fall back to type names."""
    import types
    import typing

    from rlctl.recipe.schema import SECTIONS

    unions = []
    for section, model in SECTIONS.items():
        for name, info in model.model_fields.items():
            args = typing.get_args(info.annotation)
            if typing.get_origin(info.annotation) in (typing.Union, types.UnionType) and \
                    len([a for a in args if a is not type(None)]) > 1:
                unions.append(f"{section}.{name}")
                assert (info.json_schema_extra or {}).get("form") and info.examples, f"{section}.{name}"
    assert {"run.on", "lora.target_modules", "checkpoint.resume"} <= set(unions)
