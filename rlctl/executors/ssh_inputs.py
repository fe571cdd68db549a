"""What a pool run's local record keeps to start the run on another host later with the same bytes: the launch
request (the inputs' sha256, never a secret's value: only its name) and copies of its inputs (rlctl.executors.ssh
writes them at launch, rlctl.executors.ssh_pool reads them at a failover)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from rlctl.core.state import write_state
from rlctl.errors import RlctlError

INPUTS = "inputs"  # copies of a pool run's inputs in its record, by sha256: a failover sends the same bytes
INPUT_COPY_MAX = 64 << 20  # bigger inputs are not copied: they must still be unchanged where they were


def keep_inputs(shas: dict[str, Path], root: Path, token: str) -> Path:
    """Copies of a pool run's inputs (up to INPUT_COPY_MAX each), named by sha256, in a directory that becomes the
    record's `inputs/`: a failover days later sends the bytes the run started with, whatever changed here since."""
    d = root / f".inputs-{token}"
    d.mkdir(parents=True, exist_ok=True)
    for sha, f in shas.items():
        with contextlib.suppress(OSError):
            if f.stat().st_size <= INPUT_COPY_MAX:
                shutil.copyfile(f, d / sha)
    return d


def record_pool(local: Path, pool: dict[str, Any], request: dict[str, Any], shas: dict[str, Path],
                env: dict[str, str], inputs: Path | None, host: str, answer: dict[str, Any],
                lineage: dict[str, Any]) -> None:
    """The pool, what starting the run elsewhere needs (never a secret's value: only its name), and attempt #1."""
    if inputs is not None and inputs.is_dir():
        os.replace(inputs, local / INPUTS)
    from rlctl.core.secrets import is_secret_name

    keep = {k: request[k] for k in ("manifest", "recipe", "paths", "git") if k in request}
    options = {k: v for k, v in request["options"].items() if k not in ("resume", "lineage", "name")}
    # a secret given as --set KEY=VALUE is never written: only its key, its value read from the environment again
    sets = [str(x) for x in options.get("sets") or []]
    options["sets"] = [x for x in sets if not is_secret_name(x.partition("=")[0])]
    options["secret_sets"] = [x.partition("=")[0] for x in sets if is_secret_name(x.partition("=")[0])]
    bundle = (request.get("git") or {}).get("bundle_sha256")  # a temporary file: only its copy stays
    sources = {sha: str(p) for sha, p in shas.items() if sha != bundle}
    entry = {"generation": int(lineage.get("generation") or 1), "token": lineage.get("token"), "host": host,
             "ref": {"host": host, "run_dir": answer["run_dir"]}, "from_step": None, "started_at": time.time()}
    write_state(local, pool={**pool, "request": {**keep, "options": options}, "env_names": sorted(env),
                             "sources": sources}, lineage=[entry])


def inputs_of(run_dir: Path, pool: dict[str, Any]) -> dict[str, Path]:
    """{sha256: a file with those bytes}: where it was when the run started, else the record's copy."""
    from rlctl.executors.ssh_remote import sha256_file

    req = pool.get("request") or {}
    wanted = set((req.get("manifest") or {}).values())
    if (req.get("git") or {}).get("bundle_sha256"):
        wanted.add(req["git"]["bundle_sha256"])
    sources = pool.get("sources") or {}
    out: dict[str, Path] = {}
    missing = []
    for sha in sorted(wanted):
        copy = run_dir / INPUTS / sha
        src = Path(sources[sha]) if sha in sources else None
        if copy.is_file():
            out[sha] = copy
        elif src is not None and src.is_file() and sha256_file(src) == sha:
            out[sha] = src
        else:
            missing.append(sources.get(sha) or sha[:12])
    if missing:
        raise RlctlError(f"{run_dir.name}: input(s) changed or gone since the run started, and too big to have been "
                         f"kept: {', '.join(missing[:3])}; the run cannot be started elsewhere with the same bytes.",
                         hint="put them back as they were, or launch a new run with --resume")
    return out
