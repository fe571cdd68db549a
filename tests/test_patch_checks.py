"""A recipe's patch set as render and preflight see it: one that does not exist, or is for another release, fails
both (exit 2, naming patches.set and where it is set) and never credits its `fixes`; a user's directory wins over
a bundled set of the same name; a relative set path is relative to the current directory; a manifest's `fixes`
names only known checks."""

from __future__ import annotations

import json
import shutil

import pytest

from rlctl import patching
from rlctl.errors import PatchError
from rlctl.resources import patches_dir
from tests.test_lora_vllm_sync import lora_recipe  # noqa: F401 - the fixture
from tests.test_patching import site  # noqa: F401 - the fixture
from tests.test_slurm import cluster, sl  # noqa: F401 - the fixtures (a user on a real SLURM login node)

BUNDLED = patches_dir() / "openrlhf"


def _user_set(root, version="0.9.3", extra_fixes=None):
    """A user's copy of a bundled set under root/openrlhf/<version>, with one more (harmless) patch."""
    d = root / "openrlhf" / version
    shutil.copytree(BUNDLED / version, d)
    (d / "0005-user.patch").write_text(
        "--- /dev/null\n+++ b/openrlhf/user_marker.py\n@@ -0,0 +1 @@\n+MARK = 1\n")
    text = (d / "manifest.toml").read_text()
    if extra_fixes is not None:
        text = text.replace('fixes = ["disk.lora_zero3", "lora.vllm_sync"]', f"fixes = {json.dumps(extra_fixes)}")
    (d / "manifest.toml").write_text(text + '\n[[patch]]\nfile = "0005-user.patch"\npurpose = "the user\'s own"\n')
    return d


def test_an_unknown_set_fails_render_and_preflight_naming_where(lora_recipe, cli):  # noqa: F811
    r = lora_recipe("0.10.4", "nope/1.0")
    for cmd in (("preflight", str(r)), ("render", str(r))):
        res = cli(*cmd)
        assert res.code == 2 and "Traceback" not in res.err, (cmd, res.code, res.err)
        assert "patches.set" in res.err and "nope/1.0" in res.err and f"{r}:" in res.err, res.err
        assert "openrlhf/0.10.4" in res.err and "openrlhf/0.9.3" in res.err, res.err  # the known sets
    res = cli("preflight", str(lora_recipe("0.10.4", name="s.toml")), "--set", 'patches.set="nope/1.0"')
    assert res.code == 2 and "--set patches.set" in res.err and "nope/1.0" in res.err, res.err


@pytest.mark.parametrize("recipe_version, set_name", [("0.9.3", "openrlhf/0.10.4"), ("0.10.4", "openrlhf/0.9.3")])
def test_a_set_for_another_release_is_refused_and_never_credited(lora_recipe, cli, recipe_version,  # noqa: F811
                                                                  set_name):
    r = lora_recipe(recipe_version, set_name)
    for cmd in (("preflight", str(r)), ("render", str(r))):
        res = cli(*cmd)
        assert res.code == 2, (cmd, res.code, res.out, res.err)
        assert set_name in res.err and recipe_version in res.err and "patches.set" in res.err, res.err
        assert "declares it fixes" not in res.out
    from rlctl.backends.openrlhf.honour import patch_set_fixes
    from rlctl.recipe.loader import load

    assert patch_set_fixes(load(r).recipe) == []


def test_a_users_set_wins_over_the_bundled_one_of_the_same_name(tmp_path, cli):
    _user_set(tmp_path / "mypatches", extra_fixes=["disk.lora_zero3"])
    ps = patching.find_set("openrlhf/0.9.3", tmp_path / "mypatches")
    assert ps.source == "user" and len(ps.patches) == 5 and ps.fixes == ["disk.lora_zero3"]
    # a listing (here: the known sets of an error) says which is which
    res = cli("patch", "status", "team/0.9.3", "--dir", "mypatches", cwd=tmp_path)
    assert res.code == 2 and "no patch set" in res.err
    assert "openrlhf/0.9.3 (bundled, shadowed" in res.err and "openrlhf/0.9.3 (--dir mypatches)" in res.err, res.err
    listed = cli("patch", "list", "--dir", "mypatches", cwd=tmp_path).out
    assert "(bundled: " in listed and "shadowed" in listed and "(user: " in listed, listed


def test_a_relative_set_path_is_relative_to_the_current_directory(tmp_path, monkeypatch):
    d = _user_set(tmp_path / "mypatches")
    monkeypatch.chdir(tmp_path)
    ps = patching.find_set("mypatches/openrlhf/0.9.3")
    assert ps.root == d and all(e.file.is_absolute() for e in ps.patches)
    ps = patching.find_set("openrlhf/0.9.3", patching.Path("mypatches"))
    assert ps.root == d and all(e.file.is_absolute() for e in ps.patches)


def test_a_fix_naming_no_check_is_refused(tmp_path):
    d = _user_set(tmp_path / "mp", extra_fixes=["no.such.check"])
    with pytest.raises(PatchError) as e:
        patching.load_set(d, "user")
    msg = f"{e.value.message} {e.value.hint}"
    assert "no.such.check" in msg and f"{d / 'manifest.toml'}:" in msg, msg
    assert "lora.vllm_sync" in msg and "disk.lora_zero3" in msg, msg


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch not installed")
def test_the_users_set_and_a_relative_path_against_the_real_package(site, tmp_path, cli):  # noqa: F811
    """As the trial ran it: the user's 5-patch set shadowing the bundled one applies all 5; status by a relative
    path reports the real states, not every patch conflicting."""
    sp, py = site
    _user_set(tmp_path / "mypatches")
    res = cli("patch", "status", "mypatches/openrlhf/0.9.3", "--python", py, "--json", cwd=tmp_path)
    assert res.code == 0 and {p["state"] for p in json.loads(res.out)["patches"]} == {"not applied"}, res.out
    res = cli("patch", "apply", "openrlhf/0.9.3", "--dir", "mypatches", "--python", py, cwd=tmp_path)
    assert res.code == 0 and "applied 5" in res.out, (res.out, res.err)
    assert (sp / "openrlhf" / "user_marker.py").read_text() == "MARK = 1\n"
    res = cli("patch", "status", "mypatches/openrlhf/0.9.3", "--python", py, "--json", cwd=tmp_path)
    assert {p["state"] for p in json.loads(res.out)["patches"]} == {"applied"}, res.out


def test_status_of_an_uninstalled_backend_names_the_release_to_install(user):
    """`rlctl patch status openrlhf/0.9.3` where openrlhf is not installed said `pip install openrlhf`, which installs
    whatever is newest, for which the set is not: the hint pins the set's release (exit 2, no traceback). With
    --backend alone it names the releases that have a set."""
    if _installed("openrlhf"):
        pytest.skip("openrlhf is installed here")
    _, rlctl = user
    r = rlctl("patch", "status", "openrlhf/0.9.3")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "pip install openrlhf==0.9.3" in r.stderr, r.stderr
    r = rlctl("patch", "status", "--backend", "openrlhf")
    assert r.returncode == 2 and "pip install openrlhf==" in r.stderr and "0.10.4" in r.stderr, r.stderr


def _installed(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
    except PackageNotFoundError:
        return False
    return True


def test_launch_onto_a_cluster_from_a_machine_without_the_backend(sl, lora_recipe):  # noqa: F811
    """A user on a SLURM login node without openrlhf (the packages are the compute nodes'): `rlctl launch` of a
    recipe with a patch set cannot patch this machine's site-packages; it says where the set must be applied and
    submits the job (patching.apply_for_launch), instead of failing on the missing package."""
    if _installed("openrlhf"):
        pytest.skip("openrlhf is installed here")
    work, rlctl, _ = sl
    recipe = lora_recipe("0.10.4", "openrlhf/0.10.4")
    r = rlctl("launch", str(recipe), "--executor", "slurm", "--partition", "debug", "--force", "--detach",
              timeout=300)
    assert "openrlhf is not installed here; patch set openrlhf/0.10.4 must be applied on the cluster's nodes" \
        in r.stderr, r.stderr
    # and the launch goes on to submit the job: to SLURM, whose test nodes have no GPUs, so sbatch refuses the gres
    # the recipe's GPUs ask for (a cluster with GPUs runs it); never a refusal for the package missing here
    assert "could not be applied" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "submitted as SLURM job" in r.stderr or "sbatch refused the job" in r.stderr, r.stderr
    assert list((work / "runs").glob("*/slurm.sbatch")), "the job script was written and submitted"


@pytest.mark.parametrize("body", ["", "this is not a diff\n", "--- a/verl/x.py\n+++ b/verl/x.py\n"])
def test_a_patch_that_changes_nothing_is_refused_naming_the_manifest_line(tmp_path, cli, body):
    """New-user trial: an empty (or not-a-diff) 0001.patch with explicit `targets` passed `patch list`; a patch that
    changes nothing is an error naming manifest.toml:LINE (docs/checks.md), exit 2."""
    d = tmp_path / "mp" / "verl" / "0.9.1"
    d.mkdir(parents=True)
    (d / "0001.patch").write_text(body)
    (d / "manifest.toml").write_text('backend = "verl"\npackage = "verl"\nversion = "0.9.1"\n\n[[patch]]\n'
                                     'file = "0001.patch"\ntargets = ["verl/x.py"]\npurpose = "p"\n')
    res = cli("patch", "list", "--dir", "mp", cwd=tmp_path)
    assert res.code == 2 and "Traceback" not in res.err, res.out + res.err
    assert f"{d / 'manifest.toml'}:6" in res.err and "0001.patch" in res.err and "changes nothing" in res.err, res.err
