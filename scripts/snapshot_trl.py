#!/usr/bin/env python3
"""Regenerate rlctl/backends/snapshots/trl-<version>.json (GRPOConfig's fields) from TRL's released wheel.

    python scripts/snapshot_trl.py 1.16.0 --transformers 5.23.0

The other backends have their own generators: scripts/snapshot_openrlhf.py, scripts/snapshot_verl.py and
scripts/prime_rl_schema.py (prime-rl is not on PyPI: JSON Schemas from its tags).

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

from rlctl.backends._static import dataclass_fields  # noqa: E402

OUT = ROOT / "rlctl" / "backends" / "snapshots"


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("versions", nargs="+")
    ap.add_argument("--transformers", default="5.23.0")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for v in a.versions:
        snap = trl(v, a.transformers)
        path = OUT / f"trl-{snap['version']}.json"
        path.write_text(json.dumps(snap, indent=1, sort_keys=True, default=str) + "\n")
        print(f"wrote {path.relative_to(ROOT)} ({len(snap['keys'])} entries)")


if __name__ == "__main__":
    main()
