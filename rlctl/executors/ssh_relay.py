"""Files from one SSH host to another (a run's checkpoints, an eval spec's data): straight from host to host when the
source reaches the destination, else through this machine; verified at the destination either way (every file's
size and sha256, as `ckpt push` checks them), and only what is missing there or differs travels.

The source reaches the destination with its OWN ssh (its ~/.ssh/config, keys and known_hosts, BatchMode: never a
prompt), by the name the destination has in hosts.toml (`ssh` and its `options`): seed 001's primary reaches the
spare as `rlu@10.202.0.3 -i ~/.ssh/google_compute_engine`, or by the same alias in the primary's ~/.ssh/config. rlctl
never forwards your agent (the primary's root could use your keys while it is forwarded); `ForwardAgent yes` for that
host in your own ssh config does it, if you want it. When the direct copy fails for any reason but a full disk, the
files go through this machine (pulled, then pushed: rsync --partial both ways), and the route taken is said.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError
from rlctl.executors.ssh_runner import Runner, call_remote


def missing_there(dst: Runner, dest: str, files: list[dict[str, Any]]) -> list[str]:
    """Which files (rel, size, sha256) are not intact under `dest` on the destination (relative to its workdir)."""
    answer = call_remote(dst, "verify", {"dest": dst.abs(dest), "files": _sums(files)}, timeout=600)
    return list(answer.get("bad") or [])


def relay(src: Runner, dst: Runner, files: list[dict[str, Any]], dest: str, out: Any = None,
          missing: list[str] | None = None, no_route: dict[tuple[str, str], str] | None = None) -> tuple[int, str]:
    """Copy `files` ({path: absolute on src, rel: where under dest, size, sha256}) from src to dst under `dest`
    (relative to dst's workdir), then check each one there. `missing`: which of them are not there intact, when the
    caller has asked already; `no_route`: {(source, destination): why} shared by the copies of one command, so that a
    pair whose direct copy failed is tried (and said) once. (files sent, route): route is "already there",
    "directly" or "through this machine"."""
    out = out or sys.stderr
    todo = set(missing_there(dst, dest, files) if missing is None else missing)
    if not todo:
        return 0, "already there"
    send = [f for f in files if f["rel"] in todo]
    dst.run(["mkdir", "-p", dest], timeout=60)
    pair = (src.host.name, dst.host.name)
    no_route = {} if no_route is None else no_route
    if pair not in no_route:
        try:
            answer = call_remote(src, "send", {"files": [{"path": f["path"], "rel": f["rel"]} for f in send],
                                               "ssh": dst.host.ssh, "options": list(dst.host.options),
                                               "dest": dst.abs(dest)}, timeout=3600 + 60)
        except RlctlError as e:  # e.g. an rlctl there from before host-to-host copies
            answer = {"sent": False, "why": e.message}
        if answer.get("disk_full"):
            raise RlctlError(f"{dst.host.name}: the disk is full where {src.host.name} writes ({dest}): "
                             f"{answer['why']}",
                             hint=f"free space on {dst.host.name} (rlctl hosts check {dst.host.name} shows it), then "
                                  "run the command again: finished files are not sent twice")
        if not answer.get("sent"):
            no_route[pair] = str(answer.get("why") or "no answer")
            print(f"rlctl: {src.host.name} cannot reach {dst.host.name} directly ({no_route[pair]}): copying "
                  "through this machine", file=out)
    route = "directly"
    if pair in no_route:  # asked once per command: the next files of the same pair go through here at once
        through_here(src, dst, send, dest)
        route = "through this machine"
    bad = missing_there(dst, dest, files)
    if bad:
        raise RlctlError(f"{len(bad)} file(s) copied to {dst.host.name} differ from {src.host.name}'s: "
                         f"{', '.join(bad[:3])}.", hint="run the command again: the copy resumes")
    return len(send), route


def through_here(src: Runner, dst: Runner, files: list[dict[str, Any]], dest: str) -> None:
    """Pull the files from src into a temporary directory here, then push them to dst under dest (both resumable)."""
    with tempfile.TemporaryDirectory(prefix="rlctl-relay-") as tmp:
        listing = Path(tmp) / "files"
        listing.write_text("".join(f["path"].lstrip("/") + "\n" for f in files))
        pulled = Path(tmp) / "pulled"
        pulled.mkdir()
        src.rsync(["/"], f"{pulled}/", up=False, extra=[f"--files-from={listing}", "--partial"])
        farm = Path(tmp) / "farm"
        for f in files:  # laid out as at the destination
            link = farm / f["rel"]
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(pulled / f["path"].lstrip("/"), link)
        dst.rsync([f"{farm}/"], dest.rstrip("/") + "/", up=True,
                  extra=["-L", "--partial", "--partial-dir=.rsync-partial"])


def _sums(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"rel": f["rel"], "size": f["size"], "sha256": f["sha256"]} for f in files]
