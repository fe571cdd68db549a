"""A new user's slips around secrets and recipe errors (a hostile trial): each as the user meets it, at the CLI."""

from pathlib import Path

import pytest

QUICKSTART = str(Path(__file__).resolve().parents[1] / "recipes" / "quickstart.toml")


@pytest.mark.parametrize("name", ["HF_TOKN", "WANDB_API_KY", "MY_SECRET_TOKN", "DB_PASWORD"])
def test_a_misspelt_secret_env_name_is_refused_not_written(cli, tmp_path, name):
    r = cli("render", QUICKSTART, "--set", f"env.{name}=hf_PLAINTEXT", "--out", str(tmp_path / "o"))
    assert r.code == 2, r.out
    assert "hf_PLAINTEXT" not in r.out + r.err
    fixed = {"HF_TOKN": "HF_TOKEN", "WANDB_API_KY": "WANDB_API_KEY", "MY_SECRET_TOKN": "MY_SECRET_TOKEN",
             "DB_PASWORD": "DB_PASSWORD"}[name]
    assert f"--set env.{name}:" in r.err and f'{fixed} = "${{{fixed}}}"' in r.err
    assert not any(p.is_file() and "hf_PLAINTEXT" in p.read_text() for p in tmp_path.rglob("*"))


def test_a_misspelt_secret_env_name_in_a_file_names_the_line_and_a_reference_passes(cli, tmp_path):
    r = tmp_path / "r.toml"
    r.write_text(f'extends = "{QUICKSTART}"\n\n[env]\nMY_SECRET_TOKN = "abc123"\n')
    res = cli("render", str(r))
    assert res.code == 2 and f"{r}:4: `env.MY_SECRET_TOKN`" in res.err and "abc123" not in res.err
    r.write_text(f'extends = "{QUICKSTART}"\n\n[env]\nMY_SECRET_TOKN = "${{MY_SECRET_TOKN}}"\n')
    assert cli("render", str(r)).code == 0  # a ${...} reference writes no value


@pytest.mark.parametrize("key,var", [("logging.wandb.api_key", "WANDB_API_KEY"),
                                     ("backend.trl.extra.hub_token", "HF_TOKEN"),
                                     ("reward.environment.args.api_key", "API_KEY")])
def test_the_secret_fix_names_the_variable_the_library_reads_and_says_one_error(cli, key, var):
    r = cli("render", QUICKSTART, "--set", f"{key}=abc")
    assert r.code == 2 and f'[env] {var} = "${{{var}}}"' in r.err, r.err
    assert "unknown key" not in r.err and "Did you mean" not in r.err


@pytest.mark.parametrize("key", ["logging.wandb.api_kye", "logging.wandb.tokn", "logging.wandb.secrt"])
def test_a_credential_looking_key_gets_the_secret_advice_not_a_did_you_mean(cli, key):
    r = cli("render", QUICKSTART, "--set", f"{key}=abc")
    assert r.code == 2 and "WANDB_API_KEY" in r.err and "Did you mean" not in r.err, r.err


def test_a_section_is_never_suggested_for_a_key(cli):
    r = cli("render", QUICKSTART, "--set", "logging.wandbx=1")
    assert r.code == 2 and "Did you mean `logging.wandb`" not in r.err, r.err


@pytest.mark.parametrize("text", ['[backend.trl]\nextra = { hub_token = "hf_x" }\n',
                                  '[backend]\ntrl = { extra = { hub_token = "hf_x" } }\n'])
def test_a_secret_in_an_inline_extra_table_names_its_line(cli, tmp_path, text):
    r = tmp_path / "bad2.toml"
    r.write_text(f'extends = "{QUICKSTART}"\n\n{text}')
    res = cli("render", str(r))
    assert res.code == 2 and f"{r}:4: `backend.trl.extra.hub_token` holds a secret" in res.err, res.err


@pytest.mark.parametrize("text,line,key", [('[optim]\nlr = 1e-6\nlr = 2e-6\n', 5, "optim.lr"),
                                           ('[optim]\nlr = 1e-6\n\n[optim]\nlr = 2e-6\n', 6, "optim")])
def test_a_duplicate_key_names_the_line_of_the_second_and_the_fix(cli, tmp_path, text, line, key):
    r = tmp_path / "bad4.toml"
    r.write_text(f'extends = "{QUICKSTART}"\n\n{text}')
    res = cli("render", str(r))
    assert res.code == 2 and f"{r}:{line}: " in res.err and f"`{key}`" in res.err, res.err
    assert "fix: " in res.err and "delete" in res.err and ".." not in res.err


def test_a_key_missing_because_of_a_set_blames_the_set_not_the_file(cli):
    r = cli("render", QUICKSTART, "--set", 'lora.target_modules=["q_proj"]')
    assert r.code == 2 and "--set lora.target_modules: " in r.err and "`lora.rank`" in r.err, r.err
    assert "quickstart.toml: missing" not in r.err and "--set lora.rank=" in r.err
