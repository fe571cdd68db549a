"""A built wheel carries the bundled recipes, patch sets and backend snapshots, found the same way as in a checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_wheel_contents_and_lookup(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path / "whl"), str(ROOT)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {r.stderr[-300:]}")
    wheel = next((tmp_path / "whl").glob("rlctl-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("rlctl/_data/recipes/quickstart.toml", "rlctl/_data/recipes/quickstart/reward.py",
                 "rlctl/_data/patches/openrlhf/0.9.3/manifest.toml", "rlctl/backends/snapshots/openrlhf-0.9.3.json",
                 "rlctl/backends/prime_rl/schemas/0.3.0.json", "rlctl/backends/verl/snapshots/0.9.1.json",
                 "rlctl/backends/trl/runner.py", "rlctl/backends/command/runner.py"):
        assert must in names, must
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    code = ("import rlctl, rlctl.backends.base as b; from rlctl.resources import recipes_dir, patches_dir;"
            "from rlctl.recipe.planning import prepare; p = prepare('quickstart');"
            "print(rlctl.__file__); print(recipes_dir()); print(patches_dir());"
            "print(b.load_snapshot('openrlhf','0.9.3') is not None);"
            "print(p.plan.total_steps)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.splitlines()
    assert out[0].startswith(str(target)) and out[1].startswith(str(target)) and out[2].startswith(str(target))
    assert out[3] == "True" and out[4] == "80"
