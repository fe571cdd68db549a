#!/usr/bin/env python3
"""The GPU carry kit, GPU side: put a packed stack's pieces back together, check them, unpack them into a private
site directory and say what is there (docs/gpu.md). Standard library only: it runs before anything is installed.

    python3 assemble.py --manifest .gpu/trl-vllm/manifest.json --pieces /tmp/carry --site /tmp/site/trl-vllm

Each piece is found in the --pieces folders (in order) or next to the manifest, checked against its sha256, and the
whole stream against the manifest's sha256 while it is unpacked; any mismatch removes the half-made site and exits 1.
The site gets `env.sh` (PYTHONPATH, PATH and the stack's variables) and `bin/rlctl`. Then every package's version is
read back and each of the stack's import checks runs in a fresh python3 with that environment; --report writes it
all as JSON (run.py puts it into the evidence).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import site as site_mod
import subprocess
import sys
import tarfile
import time
from pathlib import Path

MiB = 1024**2
# what each stack must import for its runs (checked right after unpacking: a missing module is named before any run)
IMPORTS = {
    "trl-vllm": ["rlctl.cli", "vllm:LLM", "trl:GRPOTrainer", "peft", "datasets", "pynvml"],
    "verl": ["rlctl.cli", "vllm:LLM", "verl.trainer.main_ppo", "ray", "hydra", "tensordict", "pynvml"],
    "openrlhf": ["rlctl.cli", "vllm:LLM", "openrlhf.cli.train_ppo_ray", "deepspeed", "ray", "flash_attn.bert_padding",
                 "pynvml"],
    # what `rl` starts: its launcher, the inference server (vLLM's API server with prime-rl's routes), the env
    # server, the orchestrator, the trainer (under torchrun)
    "prime-rl": ["rlctl.cli", "vllm:LLM", "prime_rl.entrypoints.rl", "prime_rl.inference.vllm.server",
                 "prime_rl.entrypoints.env_server", "prime_rl.orchestrator.orchestrator", "prime_rl.trainer.rl.train",
                 "flash_attn.cute:flash_attn_varlen_func", "pynvml",
                 # what the orchestrator's rollouts import when they run, not at load (verifiers' renderer client):
                 # renderers 0.1.12, PyPI's newest, lacks it (every rollout failed on the GPU, prime-rl-1.json)
                 "renderers:RendererPool"],
}


class Pieces:
    """The pieces read in order as one stream, each checked against its sha256 when it has been read whole, the
    whole stream hashed as it goes."""

    def __init__(self, files: list[tuple[Path, dict]]):
        self.files = files
        self.i = -1
        self.fh = None
        self.piece_hash = None
        self.whole = hashlib.sha256()
        self.bad: list[str] = []
        self._next()

    def _next(self) -> None:
        if self.fh is not None:
            self.fh.close()
            path, meta = self.files[self.i]
            if self.piece_hash.hexdigest() != meta["sha256"]:
                self.bad.append(f"{path}: sha256 differs from the manifest")
        self.i += 1
        self.fh = open(self.files[self.i][0], "rb") if self.i < len(self.files) else None  # noqa: SIM115
        self.piece_hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        out = b""
        while self.fh is not None and (n < 0 or len(out) < n):
            block = self.fh.read(n - len(out) if n >= 0 else -1)
            if not block:
                self._next()
                continue
            self.piece_hash.update(block)
            self.whole.update(block)
            out += block
        return out


def find_pieces(manifest: Path, folders: list[Path]) -> tuple[list[tuple[Path, dict]], list[str]]:
    m = json.loads(manifest.read_text())
    found, problems = [], []
    for p in m["pieces"]:
        hit = next((f / p["name"] for f in [*folders, manifest.parent] if (f / p["name"]).is_file()), None)
        if hit is None:
            problems.append(f"{p['name']}: not found in {', '.join(str(f) for f in folders + [manifest.parent])}")
        elif hit.stat().st_size != p["bytes"]:
            problems.append(f"{hit}: {hit.stat().st_size} bytes, the manifest says {p['bytes']}")
        else:
            found.append((hit, p))
    return found, problems


def dist_versions(site: Path) -> dict[str, str]:
    out = {}
    for d in site.glob("*.dist-info"):
        meta = d / "METADATA"
        if meta.is_file():
            head = meta.read_text(errors="replace").split("\n\n", 1)[0]
            n = re.search(r"^Name: (.+)$", head, re.M)
            v = re.search(r"^Version: (.+)$", head, re.M)
            if n and v:
                out[re.sub(r"[-_.]+", "-", n.group(1).strip()).lower()] = v.group(1).strip()
    return dict(sorted(out.items()))


# A site dir on PYTHONPATH is no site-packages: Python runs no .pth file there. nvidia-cutlass-dsl (prime-rl's
# FlashAttention-4) puts its `cutlass` package on sys.path from one (nvidia_cutlass_dsl_packages.pth). A site holding
# .pth files gets this sitecustomize: it runs them as site.addsitedir does for site-packages, then the sitecustomize it
# shadows (the image's own, if any), as Python would have.
PTH_HOOK = '''"""rlctl GPU kit (scripts/gpu/assemble.py): the .pth files of this site dir, run as in site-packages."""
import os
import site
import sys

_here = os.path.dirname(os.path.abspath(__file__))
site.addsitedir(_here)
_seen = False
for _d in list(sys.path):
    _d = os.path.abspath(_d or ".")
    if _d == _here:
        _seen = True
        continue
    _f = os.path.join(_d, "sitecustomize.py")
    if _seen and os.path.isfile(_f):
        exec(compile(open(_f).read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
'''


def pth_hook(site: Path) -> Path | None:
    """site/sitecustomize.py running the site's .pth files, when it has any (PTH_HOOK)."""
    if not any(site.glob("*.pth")):
        return None
    hook = site / "sitecustomize.py"
    hook.write_text(PTH_HOOK)
    return hook


def write_env(site: Path, env: dict[str, str], bases: list[Path]) -> dict[str, str]:
    """env.sh for a shell and env.json for go.py: the site in front of its bases on PYTHONPATH, its bin/ on PATH
    (with an `rlctl` shim), the stack's variables (`{site}` in one is the site's path)."""
    pth_hook(site)
    bin_dir = site / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "rlctl"
    shim.write_text('#!/bin/sh\nexec python3 -m rlctl.cli "$@"\n')
    shim.chmod(0o755)
    path = [str(site), *(str(b) for b in bases)]
    full = {"PYTHONPATH": ":".join(path + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
            "PATH": ":".join([str(bin_dir), *(str(b / "bin") for b in bases), os.environ.get("PATH", "")]),
            **{k: v.replace("{site}", str(site)) for k, v in env.items()}}
    lines = [f"export {k}={json.dumps(v)}" for k, v in full.items()]
    (site / "env.sh").write_text("\n".join(lines) + "\n")
    (site / "env.json").write_text(json.dumps(full, indent=1) + "\n")
    return full


def guard_launchers(bin_dir: Path) -> None:
    """Launchers packed before kit.py wrote pip's `__main__` guard: a spawned child re-imports its launcher, and an
    unguarded one starts the program again (prime-rl's vLLM server: RuntimeError in _check_not_importing_main)."""
    for f in bin_dir.glob("*") if bin_dir.is_dir() else []:
        try:
            lines = f.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        if lines[:2] == ["#!/usr/bin/env python3", "import sys"] and lines[-1].startswith("sys.exit("):
            f.write_text("\n".join([*lines[:-1], "if __name__ == '__main__':", f"    {lines[-1]}"]) + "\n")


def project_envs(site: Path, trees: list[str], system_site: bool = True) -> list[str]:
    """The project environment (`.venv`) of each checkout the stack carries, made from this machine's python3:
    what `uv sync` leaves there, with the image's packages (`--system-site-packages`: torch and the rest) and the
    stack's through PYTHONPATH (env.sh). `uv run --project <checkout>` runs in it (UV_NO_SYNC: nothing to sync, no
    network). Problems, none when every one was made."""
    problems = []
    for rel in trees:
        venv = site / rel / ".venv"
        cmd = [sys.executable, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site else []),
               str(venv)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            problems.append(f"{venv}: python3 -m venv failed: {p.stderr.strip()[-500:]}")
            continue
        if system_site and sys.prefix != sys.base_prefix:
            # python3 is itself a venv (the image's /opt/torch/.venv): --system-site-packages reaches the base
            # interpreter's packages, not the image's torch and pynvml (seen on the GPU: `import pynvml` failed)
            for sp in venv.glob("lib/python3*/site-packages"):
                (sp / "_rlctl_kit_image.pth").write_text("\n".join(site_mod.getsitepackages()) + "\n")
    return problems


def import_checks(stack: str, env: dict[str, str]) -> list[dict]:
    out = []
    own = os.environ.get("RLCTL_GPU_OWN")  # rlctl's wheel, extracted by go.py, in front as the run will have it
    if own:
        env = {**env, "PYTHONPATH": f"{own}:{env.get('PYTHONPATH', '')}"}
    # RLCTL_GPU_QUICK=1: rlctl's CLI alone (a stack whose imports an earlier call on the same release checked)
    for spec in ["rlctl.cli"] if os.environ.get("RLCTL_GPU_QUICK") else IMPORTS.get(stack, ["rlctl.cli"]):
        mod, _, attr = spec.partition(":")
        code = (f"import importlib, time; t = time.time(); m = importlib.import_module({mod!r}); "
                + (f"getattr(m, {attr!r}); " if attr else "")
                + "print(getattr(m, '__version__', ''), round(time.time() - t, 1))")
        t = time.time()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/tmp",
                           env={**os.environ, **env}, timeout=600)
        out.append({"import": spec, "ok": p.returncode == 0, "out": p.stdout.strip()[-200:],
                    "error": None if p.returncode == 0 else p.stderr.strip()[-1500:], "s": round(time.time() - t, 1)})
    return out


def assemble(manifest: Path, folders: list[Path], site: Path, bases: list[Path] | None = None) -> dict:
    m = json.loads(manifest.read_text())
    t0 = time.time()
    files, problems = find_pieces(manifest, folders)
    report: dict = {"stack": m["stack"], "manifest_built": m["built"], "site": str(site), "problems": problems}
    if problems:
        return report
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    stream = Pieces(files)
    try:
        with tarfile.open(fileobj=stream, mode="r|xz") as tar:
            tar.extractall(site, filter="tar") if hasattr(tarfile, "data_filter") else tar.extractall(site)
        stream.read()  # the rest (tar padding), so every piece is hashed whole
    except (tarfile.TarError, EOFError, OSError) as e:
        problems.append(f"unpacking failed: {type(e).__name__}: {e}")
    problems += stream.bad
    if stream.whole.hexdigest() != m["whole"]["sha256"]:
        problems.append("the pieces together differ from the manifest's whole sha256")
    if problems:
        shutil.rmtree(site, ignore_errors=True)
        return report
    report["unpack_s"] = round(time.time() - t0, 1)
    report["bytes"] = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    report["packages"] = dist_versions(site)
    missing = sorted(set(m["packages"]) - set(report["packages"]))
    if missing:
        problems.append(f"packages in the manifest but not unpacked: {', '.join(missing)}")
    problems += project_envs(site, list(m.get("trees") or {}))
    guard_launchers(site / "bin")
    report["env"] = write_env(site, m.get("env", {}), bases or [])
    report["imports"] = import_checks(m["stack"], report["env"])
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", type=Path, required=True)
    ap.add_argument("--pieces", type=Path, action="append", default=[], help="folder holding pieces (repeatable)")
    ap.add_argument("--site", type=Path, required=True)
    ap.add_argument("--base", type=Path, action="append", default=[],
                    help="the site of a stack this one lies on, nearest first (repeatable)")
    ap.add_argument("--report", type=Path, help="write the report as JSON here")
    args = ap.parse_args(argv)
    report = assemble(args.manifest, args.pieces, args.site, args.base)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report, indent=1) + "\n")
    for p in report["problems"]:
        print(f"assemble: {p}", file=sys.stderr)
    if report["problems"]:
        return 1
    print(f"assemble: {report['stack']} in {report['site']}: {len(report['packages'])} packages, "
          f"{report['bytes'] / MiB:.0f} MiB, unpacked in {report['unpack_s']} s")
    for name in ("rlctl", "vllm", "trl", "verl", "openrlhf", "deepspeed", "ray", "prime-rl", "verifiers", "uv",
                 "transformers", "peft"):
        if name in report["packages"]:
            print(f"  {name} {report['packages'][name]}")
    for c in report["imports"]:
        print(f"  import {c['import']}: {'ok' if c['ok'] else 'FAILED'} ({c['s']} s) "
              + (c["out"] if c["ok"] else (c["error"] or "").splitlines()[-1] if c["error"] else ""))
    return 0 if all(c["ok"] for c in report["imports"]) else 1


if __name__ == "__main__":
    sys.exit(main())
