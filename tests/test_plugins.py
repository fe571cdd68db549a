"""Third-party backends: a throw-away plugin distribution, pip-installed, used end to end through the rlctl CLI;
name clashes and broken plugins are reported and never break rlctl (docs/plugins.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import rlctl.backends as registry
from rlctl.backends import BackendLoadError, UnknownBackend, get_backend
from tests.conftest import ROOT

TOY = '''
"""A toy RL backend: prints a few steps; rlctl knows it only through this adapter."""
import re
import sys

from pydantic import Field

from rlctl.backends.base import Backend, Finding, LaunchPlan
from rlctl.recipe.schema import BackendExtra

LINE = re.compile(r"^toy-step (\\d+) reward (\\S+)$")


class ToyOptions(BackendExtra):
    greeting: str = "hello"
    repeat: int = Field(default=1, ge=1, le=10)


class ToyBackend(Backend):
    name = "toy"
    packages = ("rlctl-toy",)
    known_versions = ("0.1.0",)
    runs_on_cpu = True
    table_model = ToyOptions
    metric_needles = ("toy-step",)

    def uses_vllm(self, recipe):
        return False

    def render(self, recipe, dataset_size=None):
        opts = recipe.backend.table(self.name)
        steps = recipe.train.steps or 3
        code = ("import time\\n"
                f"for i in range(1, {steps} + 1):\\n"
                f"    print(f'toy-step {{i}} reward {{i / {steps}}}', flush=True)\\n"
                "    time.sleep(0.05)\\n")
        return LaunchPlan(backend=self.name, version=self.target_version(recipe), argv=[sys.executable, "toy.py"],
                          files={"toy.py": code, "greeting.txt": " ".join([opts.greeting] * opts.repeat) + "\\n"},
                          total_steps=steps, keys=["greeting", "repeat"])

    def validate(self, plan, installed_version):
        return [] if installed_version == "0.1.0" else [Finding("warn", "toy", "rlctl-toy is not installed")]

    def parse(self, line):
        m = LINE.match(line.strip())
        return {"step": int(m.group(1)), "reward/mean": float(m.group(2))} if m else None


class NotABackend:
    name = "notabackend"
'''

TOY_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "rlctl-toy"
version = "0.1.0"

[project.entry-points."rlctl.backends"]
toy = "rlctl_toy:ToyBackend"
trl = "rlctl_toy:ToyBackend"            # takes a bundled name: reported, the bundled adapter is kept
notabackend = "rlctl_toy:NotABackend"   # not a Backend subclass

[tool.setuptools]
py-modules = ["rlctl_toy"]
"""

BROKEN_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "rlctl-broken"
version = "0.0.1"

[project.entry-points."rlctl.backends"]
broken = "rlctl_broken:BrokenBackend"

[tool.setuptools]
py-modules = ["rlctl_broken"]
"""

TOY_RECIPE = """
name = "toy-run"
[backend]
name = "toy"
[backend.toy]
greeting = "hi"
repeat = 3
[model]
path = "random:qwen2?hidden=64&layers=2"
dtype = "float32"
max_model_len = 128
[data]
train = "prompts.jsonl"
max_prompt_tokens = 32
[rollout]
group_size = 4
prompts_per_step = 2
max_tokens = 16
[train]
steps = 4
train_batch_size = 8
micro_batch_size = 4
[resources]
gpus_per_node = 0
gpu = "cpu"
"""


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """rlctl-toy and rlctl-broken, built from source and pip-installed into a --target directory."""
    src = tmp_path_factory.mktemp("plugin-src")
    (src / "toy").mkdir()
    (src / "toy" / "pyproject.toml").write_text(TOY_PYPROJECT)
    (src / "toy" / "rlctl_toy.py").write_text(TOY)
    (src / "broken").mkdir()
    (src / "broken" / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (src / "broken" / "rlctl_broken.py").write_text("raise RuntimeError('boom: this plugin is broken')\n")
    site = tmp_path_factory.mktemp("plugin-site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(site), str(src / "toy"), str(src / "broken")],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"cannot build the plugin packages: {r.stderr[-500:]}")
    assert any(site.glob("rlctl_toy-0.1.0.dist-info/entry_points.txt"))
    return site


@pytest.fixture
def w(tmp_path, plugin_site):
    (tmp_path / "prompts.jsonl").write_text('{"input": "a"}\n{"input": "b"}\n')
    (tmp_path / "toy.toml").write_text(TOY_RECIPE)
    env = dict(os.environ)
    env.pop("RLCTL_NO_PLUGINS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_site), str(ROOT), env.get("PYTHONPATH", "")])
    env["RLCTL_RUNS_DIR"] = str(tmp_path / "runs")
    return SimpleNamespace(dir=tmp_path, env=env, runs=tmp_path / "runs")


def rlctl(w, *args):
    return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], cwd=w.dir, env=w.env, capture_output=True,
                          text=True, timeout=120)


def test_plugin_render_preflight_launch(w):
    listing = rlctl(w, "backends", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = {r["name"]: r for r in json.loads(listing.stdout)}
    assert rows["toy"]["dist"] == "rlctl-toy" and rows["toy"]["dist_version"] == "0.1.0"
    assert rows["toy"]["status"] == "ok" and rows["toy"]["known_versions"] == ["0.1.0"] and not rows["toy"]["builtin"]
    assert rows["toy"]["installed"] == "0.1.0"
    assert rows["trl"]["dist"] == "rlctl" and rows["trl"]["target"] == "rlctl.backends.trl:TRLBackend"

    r = rlctl(w, "render", "toy.toml")
    assert r.returncode == 0, r.stderr
    assert "## greeting.txt\nhi hi hi" in r.stdout and "toy.py" in r.stdout and "# backend: toy 0.1.0" in r.stdout
    # [backend.toy] is validated by the plugin's own model, with the file and line
    bad = rlctl(w, "render", "toy.toml", "--set", "backend.toy.repeat=0")
    assert bad.returncode == 2 and "backend.toy.repeat" in bad.stderr and "Traceback" not in bad.stderr
    (w.dir / "typo.toml").write_text(TOY_RECIPE.replace("greeting =", "greting ="))
    bad = rlctl(w, "render", "typo.toml")
    assert bad.returncode == 2 and "typo.toml:" in bad.stderr and "backend.toy.greting" in bad.stderr

    pf = rlctl(w, "preflight", "toy.toml", "--json")
    assert pf.returncode == 0, pf.stdout + pf.stderr
    assert json.loads(pf.stdout)["backend"] == "toy"

    run = rlctl(w, "launch", "toy.toml")
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    (run_dir,) = list(w.runs.iterdir())
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["reward/mean"]) for m in recs] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    assert (run_dir / "greeting.txt").read_text() == "hi hi hi\n"
    st = json.loads(rlctl(w, "status", run_dir.name, "--json").stdout)
    assert st["backend"] == "toy" and st["status"] == "finished" and st["step"] == 4 and st["total_steps"] == 4


def test_name_clash_keeps_the_builtin_and_says_so(w):
    r = subprocess.run([sys.executable, "-c", "from rlctl.backends import get_backend; "
                        "print(type(get_backend('trl')).__module__)"], env=w.env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "rlctl.backends.trl"
    assert "backend 'trl' from rlctl-toy (rlctl_toy:ToyBackend) ignored" in r.stderr
    assert "bundled adapter is kept" in r.stderr
    text = rlctl(w, "backends").stdout
    assert "ignored: backend 'trl' from rlctl-toy" in text


def test_broken_plugin_does_not_break_rlctl(w):
    assert rlctl(w, "--help").returncode == 0
    text = rlctl(w, "backends")
    assert text.returncode == 0
    broken = next(line for line in text.stdout.splitlines() if line.startswith("broken "))
    assert "rlctl-broken 0.0.1 (plugin)" in broken and "BROKEN" in broken and "boom" in broken
    notab = next(line for line in text.stdout.splitlines() if line.startswith("notabackend "))
    assert "not a subclass of rlctl.backends.base.Backend" in notab
    # other backends work as before
    r = rlctl(w, "render", "toy.toml")
    assert r.returncode == 0, r.stderr
    # a recipe naming the broken backend gets an error, never a traceback
    (w.dir / "b.toml").write_text(TOY_RECIPE.replace('name = "toy"', 'name = "broken"').replace("[backend.toy]\n"
                                  'greeting = "hi"\nrepeat = 3\n', ""))
    r = rlctl(w, "render", "b.toml")
    assert r.returncode == 2 and "boom" in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---- the registry in-process, with faked entry points ------------------------------------------------------------
@pytest.fixture
def fake_eps(monkeypatch):
    """Replace the installed entry points by the given (name, value, dist) triples."""

    def install(*triples, error: Exception | None = None):
        def eps():
            if error is not None:
                raise error
            dist = SimpleNamespace
            return [SimpleNamespace(name=n, value=v, dist=dist(name=d, version="9.9")) for n, v, d in triples]

        monkeypatch.setattr(registry, "_entry_points", eps)
        registry.reset()

    monkeypatch.delenv("RLCTL_NO_PLUGINS", raising=False)
    yield install
    monkeypatch.undo()
    registry.reset()


def test_registry_clash_unknown_and_bad_entries(fake_eps, capsys):
    fake_eps(("verl", "elsewhere:Verl", "evil"), ("mine", "tests.test_plugins:_Mine", "mine-dist"),
             ("mine", "other:Mine", "second"), ("bad name", "x:Y", "odd"), ("novalue", "nocolon", "odd"),
             ("verl", "rlctl.backends.verl:VerlBackend", "rlctl"))
    found = registry.available()
    assert found["verl"] == "rlctl.backends.verl:VerlBackend" and found["mine"] == "tests.test_plugins:_Mine"
    assert "bad name" not in found and "novalue" not in found
    err = capsys.readouterr().err
    assert "backend 'verl' from evil (elsewhere:Verl) ignored" in err
    assert "backend 'mine' from second (other:Mine) ignored: the name is taken; tests.test_plugins:_Mine" in err
    assert err.count("rlctl: warning:") == 4
    registry.available()
    assert capsys.readouterr().err == ""  # reported once per process
    assert get_backend("mine").name == "mine"
    with pytest.raises(UnknownBackend, match="installed backends: command, mine, openrlhf"):
        get_backend("nope")


def test_registry_survives_broken_metadata(fake_eps, capsys):
    fake_eps(error=RuntimeError("corrupt METADATA"))
    assert set(registry.available()) == set(registry.BUILTIN)
    assert "corrupt METADATA" in capsys.readouterr().err
    assert "trl" in registry.cpu_backends()


def test_registry_load_errors(fake_eps):
    fake_eps(("gone", "no_such_module_xyz:Backend", "gone-dist"), ("wrongname", "tests.test_plugins:_Mine", "d"))
    with pytest.raises(BackendLoadError, match="No module named 'no_such_module_xyz'"):
        get_backend("gone")
    with pytest.raises(BackendLoadError, match="calls itself 'mine'"):
        get_backend("wrongname")
    rows = {r["name"]: r for r in registry.listing()}
    assert rows["gone"]["status"] == "broken" and rows["command"]["status"] == "ok"
    assert "gone" not in registry.cpu_backends()


def test_no_plugins_switch(fake_eps, monkeypatch):
    fake_eps(("mine", "tests.test_plugins:_Mine", "mine-dist"))
    monkeypatch.setenv("RLCTL_NO_PLUGINS", "1")
    registry.reset()
    assert set(registry.available()) == set(registry.BUILTIN)


def _mine_class():
    from rlctl.backends.base import Backend

    class _Mine(Backend):
        name = "mine"

    return _Mine


_Mine = _mine_class()


def test_docs_show_the_entry_point_table():
    doc = (ROOT / "docs" / "plugins.md").read_text()
    assert '[project.entry-points."rlctl.backends"]' in doc and "rlctl backends" in doc


def test_backends_lists_the_bundled_adapters(monkeypatch):
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_NO_PLUGINS", "1")
    registry.reset()
    try:
        text = run_cli("backends").out
        rows = {r["name"]: r for r in json.loads(run_cli("backends", "--json").out)}
    finally:
        registry.reset()
    assert text.splitlines()[0].split() == ["backend", "from", "known", "versions", "runtime"]
    assert set(rows) == set(registry.BUILTIN) and all(r["builtin"] and r["status"] == "ok" for r in rows.values())
    assert rows["trl"]["known_versions"] and rows["command"]["known_versions"] == []
    assert any(line.startswith("command ") and " any " in line for line in text.splitlines())
