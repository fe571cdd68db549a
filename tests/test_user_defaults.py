"""What a new user meets with the README's defaults (runs in ./runs of the directory the command is typed in, no
RLCTL_* variable, only HOME isolated): `rlctl --version`, finding a run from another directory, no "GPU memory: not
measured" line for a CPU recipe, no "None" where a backend's version is unknown (issue 30 §2.16)."""

from __future__ import annotations

import re
import shutil
import tomllib
from importlib.metadata import version

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
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "b.toml").write_text(bandit_recipe(steps=3))  # resources.gpus_per_node = 0
    r = rlctl("launch", "b.toml")
    assert r.returncode == 0, r.stderr
    assert "GPU memory" not in r.stdout + r.stderr
    run = next((work / "runs").iterdir())
    st = rlctl("status", run.name)
    assert st.returncode == 0 and "GPU memory" not in st.stdout, st.stdout
    # from another directory: the run is not there, and the message says where runs live and how to reach it
    other = tmp_path / "elsewhere"
    other.mkdir()
    r = rlctl("status", run.name, cwd=other)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"in {other / 'runs'}" in r.stderr and "runs live in ./runs of the directory" in r.stderr, r.stderr
    assert "PATH/runs/RUN" in r.stderr and "RLCTL_RUNS_DIR" in r.stderr
    listing = rlctl("status", cwd=other)
    assert listing.returncode == 0 and "runs live in ./runs" in listing.stdout, listing.stdout
    by_path = rlctl("status", str(run), cwd=other)  # what the message says works
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
