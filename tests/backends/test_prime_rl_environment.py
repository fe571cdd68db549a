"""prime-rl v0.8.0's processes need packages `uv sync` leaves out (schemas/0.8.0.json x-environment, from the tag's
sources): the trainer's flash-attention (env.flash_attn) and the inference router's binary (env.vllm_router), looked
up in the environment `uv run --project <checkout>` runs: a fake checkout whose .venv is a real venv (pyvenv.cfg) over
this machine's base Python, with module files that raise when imported (the check must never import them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlctl.backends import get_backend
from rlctl.recipe.loader import load

ROOT = Path(__file__).resolve().parents[2]
TWO_GPU = ROOT / "recipes" / "prime-rl-qwen3-8b-2xh100.toml"
PRIME = get_backend("prime_rl")
BOOM = "raise ImportError('imported: preflight must only look')\n"


def checkout(tmp_path: Path, *files: str, router: bool = False) -> Path:
    co = tmp_path / "prime-rl"
    venv = co / ".venv"
    (venv / "bin").mkdir(parents=True)
    (co / "pyproject.toml").write_text("[project]\nname='prime-rl'\n")
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "bin" / "python").symlink_to(base)
    (venv / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n")
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for f in files:
        p = site / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(BOOM * (1200 if f.endswith("cute/interface.py") else 1))
    if router:
        (venv / "bin" / "vllm-router").write_text("#!/bin/sh\n")
        (venv / "bin" / "vllm-router").chmod(0o755)
    return co


def results(tmp_path, co: Path, *extra: str, name: str = "env.flash_attn", **env):
    r = load(TWO_GPU, [f'backend.prime_rl.checkout="{co}"', 'backend.version="0.8.0"', "backend.prime_rl.extra={}",
                       *extra]).recipe
    return [x for x in PRIME.preflight(type("C", (), {"recipe": r})(), "env") if x.check == name]


FA2 = ("flash_attn/__init__.py", "flash_attn/flash_attn_interface.py")
FA4 = ("flash_attn/cute/__init__.py", "flash_attn/cute/interface.py")


@pytest.fixture(autouse=True)
def no_router_on_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("UV_PROJECT_ENVIRONMENT", raising=False)


def test_fa4_missing_fails_naming_the_key_and_the_extra(tmp_path):
    co = checkout(tmp_path, *FA2)
    [res] = results(tmp_path, co, 'backend.prime_rl.extra={"trainer.model.attn"="flash_attention_4"}')
    assert res.verdict == "fail", res
    assert "trainer.model.attn = flash_attention_4" in res.figure and "flash_attn.cute" in res.figure
    assert "--extra flash-attn-cute" in res.fix and str(co / ".venv") in res.figure


def test_fa4_installed_beside_flash_attn_is_ok_and_nothing_is_imported(tmp_path):
    co = checkout(tmp_path, *FA2, *FA4)
    [res] = results(tmp_path, co, 'backend.prime_rl.extra={"trainer.model.attn"="flash_attention_4"}')
    assert res.verdict == "ok", res


def test_fa4_shadowed_by_flash_attn_stub_fails_with_prime_rls_fix(tmp_path):
    co = checkout(tmp_path, *FA2, "flash_attn/cute/__init__.py")
    stub = co / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / \
        "flash_attn" / "cute" / "interface.py"
    stub.write_text("x = 1\n")
    [res] = results(tmp_path, co, 'backend.prime_rl.extra={"trainer.model.attn"="flash_attention_4"}')
    assert res.verdict == "fail" and "fix-flash-attn-cute.sh" in res.fix


def test_trainer_needs_flash_attn_at_load_whatever_the_attention(tmp_path):
    """trainer/rl/train.py imports ring_flash_attn, which imports flash_attn.flash_attn_interface unguarded."""
    co = checkout(tmp_path, *FA4)
    [res] = results(tmp_path, co, 'backend.prime_rl.extra={"trainer.model.attn"="flash_attention_4"}')
    assert res.verdict == "fail" and "flash_attn.flash_attn_interface" in res.figure
    assert "ring-flash-attn" in res.figure and "--extra flash-attn" in res.fix


def test_auto_attention_without_a_visible_gpu_is_not_silent(tmp_path, monkeypatch):
    monkeypatch.setattr("rlctl.backends.prime_rl.environment.compute_capabilities", lambda: None)
    [res] = results(tmp_path, checkout(tmp_path, *FA2))
    assert res.verdict == "warn" and "could not check" in res.figure and "trainer.model.attn" in res.fix
    monkeypatch.setattr("rlctl.backends.prime_rl.environment.compute_capabilities", lambda: {(9, 0)})
    [res] = results(tmp_path, checkout(tmp_path / "h", *FA2))
    assert res.verdict == "fail" and "flash_attention_3" in res.figure and "flash_attn_interface" in res.figure


def test_an_environment_that_cannot_be_probed_says_so(tmp_path):
    co = checkout(tmp_path, *FA2)
    (co / ".venv" / "bin" / "python").unlink()
    (co / ".venv" / "bin" / "python").symlink_to(tmp_path / "gone")
    [res] = results(tmp_path, co, 'backend.prime_rl.extra={"trainer.model.attn"="flash_attention_2"}')
    assert res.verdict == "warn" and "could not check" in res.figure


def test_router_binary_or_router_off(tmp_path):
    co = checkout(tmp_path, *FA2)
    [res] = results(tmp_path, co, name="env.vllm_router")
    assert res.verdict == "fail" and "inference.router" in res.figure and "vllm-router" in res.figure
    assert "--extra disagg" in res.fix and '"inference.router" = "None"' in res.fix
    [res] = results(tmp_path, co, 'backend.prime_rl.extra={"inference.router"="None"}', name="env.vllm_router")
    assert res.verdict == "ok"
    [res] = results(tmp_path, checkout(tmp_path / "r", *FA2, router=True), name="env.vllm_router")
    assert res.verdict == "ok"


def test_remote_executor_is_not_checked_from_here(tmp_path):
    co = checkout(tmp_path, *FA2)
    [res] = results(tmp_path, co, 'resources.executor="slurm"', name="env.vllm_router")
    assert res.verdict == "warn" and "not checked from here" in res.figure


def test_an_attention_that_is_installed_is_given_as_set_and_closes_the_check(tmp_path, monkeypatch):
    """The fixes were text only ("set backend.prime_rl.extra "trainer.model.attn" = ..."): where an installed
    attention would do, it is the check's `set`, and applying it (as `--set`) closes the check. A fix no recipe
    value gives (a package to install) stays text."""
    import json

    def applied(co, res, *extra):
        return results(tmp_path, co, *extra, *[f"{k}={json.dumps(v)}" for k, v in res.set.items()])

    key = "backend.prime_rl.extra.trainer.model.attn"
    monkeypatch.setattr("rlctl.backends.prime_rl.environment.compute_capabilities", lambda: None)
    co = checkout(tmp_path, *FA2)
    [res] = results(tmp_path, co)  # auto, no GPU visible: which one it picks is unknown
    assert res.verdict == "warn" and res.set == {key: "flash_attention_2"}, res
    assert [r.verdict for r in applied(co, res)] == ["ok"]
    fa3 = 'backend.prime_rl.extra={"trainer.model.attn"="flash_attention_3"}'
    [res] = results(tmp_path, co, fa3)
    assert res.verdict == "fail" and res.set == {key: "flash_attention_2"}, res
    assert [r.verdict for r in applied(co, res, fa3)] == ["ok"]
    [res] = results(tmp_path, checkout(tmp_path / "4", *FA4), 'backend.prime_rl.extra={"trainer.model.attn"='
                    '"flash_attention_4"}')  # flash_attn itself missing: only installing it helps
    assert res.verdict == "fail" and not res.set, res
