#!/usr/bin/env python3
"""The GPU carry kit, one call on the GPU machine: keep this call's pieces, assemble a stack once all its pieces
(and its bases') are here, put rlctl's own wheel in front, run run.py (docs/gpu.md). Standard library only.

    python3 .gpu/kit/go.py trl-vllm                        # a call that only brings pieces: stored in /tmp/carry
    python3 .gpu/kit/go.py trl-vllm -- --part full         # ... and, once the stack is whole, run.py with these args

Pieces travel one per call (each call carries at most 64 MiB); the machine keeps /tmp between calls while it is
warm, so the calls of one stack go back to back. Every call re-reads rlctl's wheel (.gpu/rlctl/*.whl), the code
under test, which changes more often than the stacks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

KIT = Path(__file__).resolve().parent
GPU = KIT.parent
CARRY = Path(os.environ.get("RLCTL_GPU_CARRY", "/tmp/carry"))
SITES = Path(os.environ.get("RLCTL_GPU_SITES", "/tmp/site"))


def store() -> None:
    """This call's pieces (and every manifest) into /tmp/carry/<stack>/."""
    for m in sorted(GPU.glob("*/manifest.json")):
        dest = CARRY / m.parent.name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(m, dest / "manifest.json")
        for piece in sorted(m.parent.glob("site.tar.xz.*")):
            target = dest / piece.name
            if not target.is_file() or target.stat().st_size != piece.stat().st_size:
                shutil.copyfile(piece, target)
                print(f"go: stored {m.parent.name}/{piece.name} ({piece.stat().st_size / 2**20:.1f} MiB)")


def chain(stack: str) -> list[str]:
    """The stack's bases, deepest first, then the stack."""
    m = CARRY / stack / "manifest.json"
    if not m.is_file():
        raise SystemExit(f"go: no manifest for {stack} has come yet (.gpu/{stack}/manifest.json)")
    return list(reversed(json.loads(m.read_text()).get("bases") or [])) + [stack]


def missing(stack: str) -> list[str]:
    m = json.loads((CARRY / stack / "manifest.json").read_text())
    return [p["name"] for p in m["pieces"] if not (CARRY / stack / p["name"]).is_file()]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    stack, rest = argv[0], argv[1:]
    run_args = rest[rest.index("--") + 1:] if "--" in rest else []
    store()
    layers = chain(stack)
    wheels = sorted((GPU / "rlctl").glob("rlctl-*.whl"))
    own = SITES / "rlctl"
    if wheels:  # the code under test, in front of everything: assemble's import checks see it too (a standalone
        shutil.rmtree(own, ignore_errors=True)  # stack such as prime-rl carries no rlctl of its own)
        zipfile.ZipFile(wheels[-1]).extractall(own)
        os.environ["RLCTL_GPU_OWN"] = str(own)
    for i, s in enumerate(layers):
        if (SITES / s / "env.json").is_file():
            continue
        lack = missing(s)
        if lack:
            print(f"go: {s} waits for {len(lack)} more piece(s): {', '.join(lack)}")
            return 0
        bases = [str(SITES / b) for b in reversed(layers[:i])]
        cmd = [sys.executable, str(KIT / "assemble.py"), "--manifest", str(CARRY / s / "manifest.json"),
               "--pieces", str(CARRY / s), "--site", str(SITES / s), "--report", str(SITES / f"{s}.assemble.json")]
        for b in bases:
            cmd += ["--base", b]
        if subprocess.run(cmd).returncode:
            print(f"go: assembling {s} failed (report: {SITES / f'{s}.assemble.json'})")
            return 1
    env = json.loads((SITES / stack / "env.json").read_text())
    if wheels:
        env["PYTHONPATH"] = f"{own}:{env['PYTHONPATH']}"
        print(f"go: rlctl from {wheels[-1].name}")
    os.environ.update(env)
    if not run_args:
        return 0
    out = os.environ.get("OUT", "/tmp/out")
    cmd = [sys.executable, str(KIT / "run.py"), stack, "--out", out,
           "--assemble-report", str(SITES / f"{stack}.assemble.json"), *run_args]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
