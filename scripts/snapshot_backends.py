#!/usr/bin/env python3
"""Regenerate backends/snapshots/*.json from the backends' released sources.

    (OpenRLHF: scripts/snapshot_openrlhf.py, which also records per-release behaviours)
    python scripts/snapshot_backends.py verl 0.9.1
    python scripts/snapshot_backends.py trl 1.16.0 --transformers 5.23.0
    python scripts/snapshot_backends.py prime_rl v0.3.0 --repo /path/to/prime-rl   # a git clone (not on PyPI)

The snapshots hold only names and types of flags/keys (facts about the interface), never the backends' code.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlctl.backends._static import dataclass_fields, pydantic_key_paths, yaml_key_paths  # noqa: E402

OUT = ROOT / "backends" / "snapshots"


def _wheel_member(dist: str, version: str, member_suffix: str, tmp: Path) -> str:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp), f"{dist}=={version}"],
        check=True,
    )
    wheel = next(tmp.glob(f"{dist.replace('-', '_')}-{version}*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(member_suffix):
                return zf.read(name).decode()
    raise SystemExit(f"{member_suffix} not found in {wheel.name}")


def verl(version: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        text = _wheel_member("verl", version, "verl/trainer/config/_generated_ppo_trainer.yaml", Path(d))
    return {"backend": "verl", "version": version,
            "source": f"verl=={version} verl/trainer/config/_generated_ppo_trainer.yaml", "keys": yaml_key_paths(text)}


def trl(version: str, transformers_version: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        sources = {
            "trl.trainer.grpo_config": _wheel_member("trl", version, "trl/trainer/grpo_config.py", Path(d)),
            "trl.trainer.base_config": _wheel_member("trl", version, "trl/trainer/base_config.py", Path(d)),
            "transformers.training_args": _wheel_member(
                "transformers", transformers_version, "transformers/training_args.py", Path(d)
            ),
        }
    # base_config imports TrainingArguments from the package root; point it at the module that defines it
    sources["transformers"] = "from transformers.training_args import TrainingArguments\n"
    return {"backend": "trl", "version": version,
            "source": f"trl=={version} GRPOConfig + transformers=={transformers_version} TrainingArguments",
            "keys": dataclass_fields(sources, "GRPOConfig")}


def prime_rl(tag: str, repo: Path) -> dict:
    """Every config module of the tag (its layout moved over time), keyed by module name."""
    listing = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "-r", "--name-only", tag],
                             capture_output=True, text=True, check=True).stdout.split()
    sources = {}
    for f in listing:
        if "/src/prime_rl/" not in f"/{f}" or not f.endswith(".py"):
            continue
        if not (f.endswith("config.py") or f.endswith("/rl.py") or "/configs/" in f):
            continue
        module = f.split("src/", 1)[1][:-3].replace("/", ".").removesuffix(".__init__")
        r = subprocess.run(["git", "--git-dir", str(repo), "show", f"{tag}:{f}"], capture_output=True, text=True)
        if r.returncode == 0:
            sources[module] = r.stdout
    keys = pydantic_key_paths(sources, "RLConfig")
    return {"backend": "prime_rl", "version": tag.lstrip("v"),
            "source": f"prime-rl {tag} RLConfig (src/prime_rl/rl.py and the config modules)", "keys": keys}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("backend", choices=["verl", "trl", "prime_rl"])
    ap.add_argument("versions", nargs="+")
    ap.add_argument("--repo", type=Path, help="prime-rl git directory")
    ap.add_argument("--transformers", default="5.23.0")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for v in a.versions:
        if a.backend == "verl":
            snap = verl(v)
        elif a.backend == "trl":
            snap = trl(v, a.transformers)
        else:
            snap = prime_rl(v, a.repo)
        path = OUT / f"{a.backend}-{snap['version']}.json"
        path.write_text(json.dumps(snap, indent=1, sort_keys=True, default=str) + "\n")
        n = len(snap.get("flags") or snap.get("keys"))
        print(f"wrote {path.relative_to(ROOT)} ({n} entries)")


if __name__ == "__main__":
    main()
