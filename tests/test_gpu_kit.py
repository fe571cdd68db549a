"""The GPU carry kit on the CPU (scripts/gpu, docs/gpu.md): wheels packed into pieces with a sha256 manifest, the
pieces brought over several calls and assembled by go.py/assemble.py into a private site dir that imports; a damaged
piece refused; every stack's lock readable and its recipe rendered by rlctl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "scripts" / "gpu"
sys.path.insert(0, str(KIT))

import kit  # noqa: E402


def wheel(folder: Path, name: str, version: str, files: dict[str, bytes], purelib: bool = False) -> Path:
    """A wheel as a build backend writes it (files, dist-info; purelib under .data like OpenRLHF's)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    prefix = f"{name}-{version}.data/purelib/" if purelib else ""
    with zipfile.ZipFile(path, "w") as z:
        for rel, data in files.items():
            z.writestr(prefix + rel, data)
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n"
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


@pytest.fixture()
def packed(tmp_path):
    """A stack of two wheels packed into ~8 KiB pieces under tmp/.gpu/kit-test, the kit's scripts beside it."""
    w = tmp_path / "wheels"
    w.mkdir()
    noise = os.urandom(30_000)  # incompressible: several pieces
    wheels = [
        wheel(w, "alpha", "1.0", {"alpha/__init__.py": b"VALUE = 41\n", "alpha/blob.bin": noise,
                                  "alpha/big_kernel.so": b"x" * 50_000}),
        wheel(w, "beta", "2.0", {"beta/__init__.py": b"from alpha import VALUE\nVALUE = VALUE + 1\n"},
              purelib=True),
    ]
    gpu = tmp_path / ".gpu"
    out = kit.make_pack("kit-test", wheels, gpu / "kit-test", 8 * 1024, slim_globs=["alpha/big_kernel.so"],
                        env={"KIT_TEST_VAR": "1"})
    kit.copy_kit(gpu)
    return gpu, out


def go(gpu: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLCTL_GPU_CARRY": str(tmp_path / "carry"), "RLCTL_GPU_SITES": str(tmp_path / "site")}
    return subprocess.run([sys.executable, str(gpu / "kit" / "go.py"), *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_pack_then_assemble_over_two_calls(packed, tmp_path):
    gpu, out = packed
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["pieces"]) >= 3 and all(p["bytes"] <= 8 * 1024 for p in m["pieces"])
    assert m["packages"] == {"alpha": "1.0", "beta": "2.0"}
    assert m["slimmed"] == [{"path": "alpha/big_kernel.so", "bytes": 50_000}]
    assert kit.verify(out) == []
    # the first call brings half the pieces: stored, nothing assembled
    pieces = sorted(out.glob("site.tar.xz.*"))
    later = tmp_path / "later"
    later.mkdir()
    for p in pieces[len(pieces) // 2:]:
        p.rename(later / p.name)
    r = go(gpu, tmp_path, "kit-test")
    assert r.returncode == 0, r.stderr
    assert "waits for" in r.stdout and not (tmp_path / "site" / "kit-test").exists()
    # the second call brings the rest (the first half is gone from the checkout, as on a new call)
    for p in out.glob("site.tar.xz.*"):
        p.unlink()
    for p in later.iterdir():
        p.rename(out / p.name)
    r = go(gpu, tmp_path, "kit-test")
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site" / "kit-test"
    assert not (site / "alpha" / "big_kernel.so").exists() and (site / "alpha" / "blob.bin").is_file()
    env = json.loads((site / "env.json").read_text())
    assert env["KIT_TEST_VAR"] == "1" and env["PYTHONPATH"].split(":")[0] == str(site)
    p = subprocess.run([sys.executable, "-c", "import beta; print(beta.VALUE)"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": env["PYTHONPATH"]}, cwd=tmp_path)
    assert p.stdout.strip() == "42", p.stderr
    report = json.loads((tmp_path / "site" / "kit-test.assemble.json").read_text())
    assert report["packages"] == {"alpha": "1.0", "beta": "2.0"} and report["problems"] == []


def test_a_damaged_piece_is_refused_and_leaves_no_site(packed, tmp_path):
    gpu, out = packed
    piece = sorted(out.glob("site.tar.xz.*"))[1]
    data = bytearray(piece.read_bytes())
    data[100] ^= 0xFF
    piece.write_bytes(bytes(data))
    assert kit.verify(out) == [f"{piece.name}: size or sha256 differs from manifest.json"]
    r = go(gpu, tmp_path, "kit-test")
    assert r.returncode == 1
    report = json.loads((tmp_path / "site" / "kit-test.assemble.json").read_text())
    assert any("sha256" in p or "unpacking failed" in p for p in report["problems"]), report
    assert not (tmp_path / "site" / "kit-test").exists()


@pytest.mark.parametrize("stack", ["trl-vllm", "verl", "openrlhf", "prime-rl"])
def test_every_stack_has_a_lock_that_carries_its_backend(stack):
    pins = dict(kit.read_lock(stack))
    under = kit.bases(stack)
    carried = {n for s in [stack, *under] for n, _ in kit.read_lock(s)}
    assert "vllm" in carried
    own = {"trl-vllm": "trl", "verl": "verl", "openrlhf": "openrlhf", "prime-rl": "prime-rl"}[stack]
    assert own in pins
    allowed = {kit.norm(n) for n in kit.stack(stack).get("allow", [])}  # prime-rl's FA4 runs on the CuTe DSL
    assert not ({"torch", "flashinfer-python", "nvidia-cutlass-dsl"} - allowed) & carried  # the device's, or never


def test_a_source_built_package_is_pinned_to_its_commit_in_the_lock():
    """prime-rl is not on PyPI: the lock names where each source-built package came from (stacks.toml `source`), and
    a wheel built from a ref is checked against the lock's version before it is packed."""
    text = (KIT / "locks" / "prime-rl.txt").read_text()
    for name, spec in kit.stack("prime-rl")["source"].items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{kit.norm(name)}=="))
        assert f"# source {spec['repo']} {spec['ref']}" in line, line
    assert "prime-rl==0.8.0" in text and "vllm==0.26.0" in text and "transformers==5.6.2" in text


def test_resplit_keeps_the_whole(packed, tmp_path):
    gpu, out = packed
    whole = json.loads((out / "manifest.json").read_text())["whole"]
    pieces = kit.resplit(out, 5 * 1024)
    assert all(p["bytes"] <= 5 * 1024 for p in pieces) and kit.verify(out) == []
    assert json.loads((out / "manifest.json").read_text())["whole"] == whole
    r = go(gpu, tmp_path, "kit-test")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_site_runs_its_pth_files_and_names_itself_in_the_env(tmp_path):
    """A site dir on PYTHONPATH runs no .pth file, and nvidia-cutlass-dsl (prime-rl's FlashAttention-4) puts its
    `cutlass` package on sys.path from one: FA4 failed to import on the CPU check until the site got a sitecustomize
    running them. `{site}` in a stack's env is the site's path (prime-rl's PRIME_RL_DIR points into it)."""
    w = tmp_path / "wheels"
    w.mkdir()
    dsl = wheel(w, "dsl", "1.0", {"dsl/__init__.py": b"", "dsl/pkgs/cutlass_like.py": b"OK = 1\n",
                                  "dsl_pkgs.pth": b"import sys, os, dsl; sys.path.insert(0, os.path.join("
                                                  b"dsl.__path__[0], 'pkgs'))\n"})
    gpu = tmp_path / ".gpu"
    kit.make_pack("pth-test", [dsl], gpu / "pth-test", 1 << 20, slim_globs=[],
                  env={"WHERE": "{site}/checkouts/x"})
    kit.copy_kit(gpu)
    r = go(gpu, tmp_path, "pth-test")
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site" / "pth-test"
    env = json.loads((site / "env.json").read_text())
    assert env["WHERE"] == f"{site}/checkouts/x"
    p = subprocess.run([sys.executable, "-c", "import cutlass_like; print(cutlass_like.OK)"], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": env["PYTHONPATH"]}, cwd=tmp_path)
    assert p.stdout.strip() == "1", p.stderr
