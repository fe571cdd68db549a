"""rlctl's declared dependency ranges hold at their floors: a fresh venv with every core dependency pinned to the
lowest version pyproject.toml allows (and the newest of everything else) runs the light commands and reports usage
errors without a traceback. The newest releases are what `pip install -e ".[dev]"` (CI) already gets.

Slow: it creates a venv and installs from the package index."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def floors() -> list[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = []
    for dep in deps:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][^,;\s]*)\s*(?:,.*)?", dep)
        assert m, f"dependency {dep!r} has no >= floor: declare one so it can be tested"
        pins.append(f"{m.group(1)}=={m.group(2)}")
    return pins


@pytest.mark.slow
def test_light_commands_work_at_dependency_floors(tmp_path):
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the floors first, then rlctl itself without letting pip move them
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", *floors()], env=env, capture_output=True,
                             text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                              str(ROOT)], env=env, capture_output=True, text=True, timeout=600)
    if install.returncode != 0:  # no setuptools in the venv: build isolation needs the index, allowed here
        install = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], env=env,
                                 capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    check = subprocess.run([str(py), "-m", "pip", "check"], env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    rlctl = venv / "bin" / "rlctl"
    quick = ROOT / "recipes" / "quickstart.toml"
    for args, codes in ((["--help"], {0}), (["render", str(quick)], {0}), (["preflight", str(quick)], {0, 1}),
                        (["recipe", "show", str(quick)], {0}), (["status"], {0}), ([], {2}), (["frobnicate"], {2}),
                        (["status", "--bogus"], {2}), (["render", "/nonexistent.toml"], {2}),
                        (["logs"], {2}), (["render"], {2}), (["ckpt", "prune"], {2})):
        r = subprocess.run([str(rlctl), *args], env={**env, "RLCTL_RUNS_DIR": str(tmp_path / "runs")}, cwd=tmp_path,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert "Traceback" not in r.stdout + r.stderr, (args, r.stderr[-2000:])
        assert r.returncode in codes, (args, r.returncode, r.stdout[-1000:], r.stderr[-1000:])
