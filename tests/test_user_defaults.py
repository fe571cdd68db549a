"""What a new user meets with the README's defaults (runs in ./runs of the directory the command is typed in, no
RLCTL_* variable, only HOME isolated): `rlctl --version`, finding a run from another directory, no "GPU memory: not
measured" line for a CPU recipe, no "None" where a backend's version is unknown (issue 30 §2.16)."""

from __future__ import annotations

import re
import shutil
import tomllib
from importlib.metadata import version
from pathlib import Path

from tests.conftest import RECIPES, ROOT
from tests.test_experiments import bandit_recipe


def test_version_is_the_installed_one(user):
    _, rlctl = user
    r = rlctl("--version")
    assert r.returncode == 0 and r.stdout == f"rlctl {version('rlctl')}\n", r.stdout + r.stderr
    assert version("rlctl") == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_gpu_memory_is_measured_where_dev_is_installed():
    """[dev] brings NVML's bindings (the `gpu` extra), so a GPU machine set up as the README says measures GPU
    memory; on this CPU machine the sampler then says NVML found no GPU, not that a package is missing."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("nvidia-ml-py") for d in extras["gpu"])
    assert "gpu" in re.search(r"rlctl\[([^\]]*)\]", " ".join(extras["dev"])).group(1).split(",")
    import pynvml  # noqa: F401 - installed by [dev]


def test_a_cpu_run_says_nothing_of_gpu_memory_and_is_found_from_another_directory(user, tmp_path):
    """A run lives in ./runs of the directory it was launched from; from any other directory it is found by its
    name all the same (the runs directories of this user are recorded under ~/.local/state/rlctl), and `status
    --all` lists them. Before, `status NAME` from another directory said "no run" (exit 2)."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=3))  # resources.gpus_per_node = 0
    r = rlctl("launch", "b.toml")
    assert r.returncode == 0, r.stderr
    assert "GPU memory" not in r.stdout + r.stderr
    run = next((work / "runs").iterdir())
    st = rlctl("status", run.name)
    assert st.returncode == 0 and "GPU memory" not in st.stdout, st.stdout
    other = tmp_path / "elsewhere"
    other.mkdir()
    for ref in (run.name, "bandit"):  # its name, or a unique prefix of it, from another directory
        r = rlctl("status", ref, cwd=other)
        assert r.returncode == 0 and run.name in r.stdout and "finished" in r.stdout, r.stdout + r.stderr
    assert rlctl("logs", run.name, cwd=other).returncode == 0
    assert not (other / "runs").exists()
    # what is recorded: the runs directory, nothing of the run (no names, no recipe, no secret)
    record = Path(rlctl.env["HOME"]) / ".local" / "state" / "rlctl" / "runs-dirs"
    assert record.read_text().splitlines() == [str(work / "runs")]
    listing = rlctl("status", cwd=other)
    assert listing.returncode == 0 and "status --all" in listing.stdout, listing.stdout
    every = rlctl("status", "--all", cwd=other)
    assert every.returncode == 0 and f"runs in {work / 'runs'}" in every.stdout and run.name in every.stdout, every
    # a second project with a run of the same name: from a third directory the name is ambiguous, both are said
    work2 = tmp_path / "project2"
    work2.mkdir()
    shutil.copytree(work / "runs", work2 / "runs")
    r = rlctl("status", run.name, cwd=work2)  # in a directory that holds it, ./runs decides
    assert r.returncode == 0 and str(work2 / "runs" / run.name) not in r.stderr, r.stderr
    assert record.read_text().splitlines() == [str(work / "runs")]  # a copy made by hand is not recorded
    (work2 / "b.toml").write_text(bandit_recipe(steps=1))
    (work2 / "prompts.jsonl").write_text('{"input": "a"}\n')
    assert rlctl("launch", "b.toml", "--name", "other", cwd=work2).returncode == 0
    r = rlctl("status", run.name, cwd=other)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(work / "runs" / run.name) in r.stderr and str(work2 / "runs" / run.name) in r.stderr, r.stderr
    assert "give the run's directory" in r.stderr
    # a project moved away: its runs directory is skipped, the other one answers again
    shutil.move(str(work2), str(tmp_path / "moved"))
    r = rlctl("status", run.name, cwd=other)
    assert r.returncode == 0 and "finished" in r.stdout, r.stdout + r.stderr
    r = rlctl("status", "nope", cwd=other)
    assert r.returncode == 2 and "no run 'nope'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    by_path = rlctl("status", str(run), cwd=other)
    assert by_path.returncode == 0 and run.name in by_path.stdout and "finished" in by_path.stdout


def test_no_none_in_what_a_user_reads(user):
    """A backend whose version is not pinned (the command backend: any version) is said as such, never `None`:
    preflight, render, recipe show, launch and status of the bundled torchrun recipe and of the quickstart."""
    work, rlctl = user
    shutil.copytree(RECIPES, work / "recipes")
    outs = []
    for recipe in ("recipes/command-torchrun-dr-grpo.toml", "recipes/quickstart.toml"):
        for cmd in (("preflight", recipe), ("render", recipe), ("recipe", "show", recipe)):
            r = rlctl(*cmd)
            outs.append((cmd, r.stdout + r.stderr))
    # the torchrun recipe launched here: its trainer is not on this machine, so it fails at once, as a user sees it
    r = rlctl("launch", "recipes/command-torchrun-dr-grpo.toml")
    outs.append((("launch",), r.stdout + r.stderr))
    run = next((work / "runs").iterdir()).name
    for cmd in (("status",), ("status", run), ("logs", run)):
        r = rlctl(*cmd)
        outs.append((cmd, r.stdout + r.stderr))
    assert "(command (any version))" in outs[0][1], outs[0][1][:300]
    for cmd, text in outs:
        bad = [line for line in text.splitlines() if re.search(r"\b(command|trl) None\b", line)]
        assert not bad, (cmd, bad)


def test_a_given_name_wins_from_another_directory_too(user, tmp_path):
    """`--name sr` and `--name sr2` in one project: from the project `status sr` is sr's run, from another directory
    it said "'sr' names 2 runs in other runs directories" (exit 2) although both are in one directory."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=1))
    for name in ("sr", "sr2"):
        assert rlctl("launch", "b.toml", "--name", name).returncode == 0
    sr = next((work / "runs").glob("sr-*"))
    other = tmp_path / "elsewhere"
    other.mkdir()
    for cwd in (work, other):
        r = rlctl("status", "sr", cwd=cwd)
        assert r.returncode == 0 and sr.name in r.stdout and "sr2-" not in r.stdout, r.stdout + r.stderr


def test_hosts_install_knows_an_rlctl_installed_from_a_clone():
    """`rlctl hosts install box1` after the README's install (`pip install -e .` of a clone) asked the host's pip for
    rlctl==<version>, which no index has, and gave no fix: the failure names the source tree and how to send it."""
    from importlib.metadata import distribution

    from rlctl.cli.hosts import _source_tree

    if distribution("rlctl").read_text("direct_url.json"):  # installed as the README says
        assert _source_tree() == str(ROOT)
    else:  # an rlctl found through an older egg-info beside the sources: nothing to name
        assert _source_tree() is None


def test_an_empty_run_name_is_an_error_not_a_prefix_of_every_run(user):
    """`rlctl status ''` (an unset shell variable: `rlctl status "$RUN"`) named every run by the empty prefix and showed
    the only one, or said it matched all; stop would have acted on it. Each command that takes a run says instead
    that the name is empty, exit 2 (new-user trial)."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=2))
    assert rlctl("launch", "b.toml").returncode == 0
    for args in (["status", ""], ["logs", ""], ["metrics", ""], ["eval", ""], ["stop", ""], ["doctor", ""],
                 ["ckpt", "list", ""], ["status", " "], ["metrics", next((work / "runs").iterdir()).name, ""]):
        r = rlctl(*args)
        assert r.returncode == 2 and "an empty run name" in r.stderr and "fix: " in r.stderr, (args, r)
        assert "Traceback" not in r.stderr and "bandit" not in r.stdout, (args, r)
    r = rlctl("launch", "b.toml", "--resume", "")  # was a fresh run: `--resume ""` read as no --resume
    assert r.returncode == 2 and "an empty run name" in r.stderr, r
    assert len(list((work / "runs").iterdir())) == 1


def _commands_with(option: str) -> list[list[str]]:
    from tests.test_cli_properties import COMMANDS

    return [path for path, params in COMMANDS if any(option in getattr(p, "opts", ()) for p in params)]


def test_an_empty_on_is_an_error_not_this_machine(user):
    """`rlctl launch R --on ""` (an unset `$HOST`) trained here: an 80-step local run started; `--on " "` said "no
    host ''" and `eval RUN --on ""` proposed `rlctl hosts add  USER@HOST`. An empty or blank --on, or an empty
    element of a pool (`--on a,,b`), is an error naming --on, exit 2, with a fix, in every command that takes --on;
    so is an empty `eval --gpu` (it read as no GPU given). New-user trial of host pools (issue 32)."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=2))
    for value in ("", " ", "box1,,box2", "box1, ,box2", ","):
        r = rlctl("launch", "b.toml", "--on", value)
        assert r.returncode == 2 and "--on" in r.stderr and "empty" in r.stderr and "fix: " in r.stderr, (value, r)
        assert "Traceback" not in r.stderr and "hosts add  " not in r.stderr, (value, r)
    assert not (work / "runs").exists() or not list((work / "runs").iterdir()), "no run started"
    paths = _commands_with("--on")
    assert {"launch", "eval", "sweep"} <= {p[0] for p in paths}, paths
    for path in paths:  # each command's --on, before any argument it lacks
        r = rlctl(*path, "--on", "")
        assert r.returncode == 2 and "--on ''" in r.stderr and "fix: " in r.stderr, (path, r)
    assert rlctl("launch", "b.toml").returncode == 0
    run = next((work / "runs").iterdir()).name
    for args in (["eval", run, "--on", ""], ["eval", run, "--gpu", ""], ["eval", run, "--gpu", " "]):
        r = rlctl(*args)
        assert r.returncode == 2 and "empty" in r.stderr and "fix: " in r.stderr, (args, r)
        assert "hosts add  " not in r.stderr and "Traceback" not in r.stderr, (args, r)


def test_an_unknown_host_in_run_on_fails_preflight_where_it_is_written(user):
    """`[run] on = ["box1", "nohost"]`: preflight passed (exit 0) and launch then said only "no host 'nohost' in
    .../hosts.toml", not where the recipe names it. Preflight fails a check naming the recipe's file:line, run.on,
    the host and the fix; launch's error names file:line too (new-user trial of pools, issue 32)."""
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    text = bandit_recipe(steps=2) + '\non = ["box1", "nohost"]\n'
    (work / "p.toml").write_text(text)
    line = text.rstrip("\n").count("\n") + 1
    assert rlctl("hosts", "add", "box1", "me@127.0.0.1").returncode == 0
    r = rlctl("preflight", "p.toml")
    assert r.returncode == 1, r
    failed = [ln for ln in r.stdout.splitlines() if "nohost" in ln]
    assert failed and "FAIL" in failed[0] and f"p.toml:{line}" in failed[0] and "run.on" in failed[0], r.stdout
    assert "rlctl hosts add nohost USER@HOST" in r.stdout, r.stdout
    assert "box1" not in " ".join(failed).replace("box1, nohost", ""), r.stdout  # box1 is known: not named unknown
    r = rlctl("launch", "p.toml")
    assert r.returncode == 2 and f"p.toml:{line}" in r.stderr and "run.on" in r.stderr and "nohost" in r.stderr, r
    assert "fix: rlctl hosts add nohost USER@HOST" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (work / "runs").exists() or not list((work / "runs").iterdir())
