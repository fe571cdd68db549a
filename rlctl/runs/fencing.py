"""Fencing: which attempt of a pool run may write to its checkpoint.sync store and W&B, so that a run never has two
live attempts (docs/resilience.md).

Each attempt holds a *generation* claimed in the store before it starts: `generations/<n>.json`, {generation, token,
host, run_dir, from_step, from_manifest, claimed_at, by}. The current generation is the highest n; an attempt whose
token is not the current generation's is superseded. A claim writes n+1, waits SETTLE_S and reads it back: two
claimants of the same n both read the last write, so only one goes on (and should the loser's read come too late,
the attempt it starts holds a token the store does not name: it is fenced at its first check).

The attempt's side (its supervisor, on its host) asks `Fence.confirm()` right before every write to the store (a
checkpoint, its manifest, `latest`) and before every batch of W&B records, and `Fence.check()` periodically to stop
the trainer: a superseded attempt writes nothing more. When the store cannot be read, writes wait (the records stay
in metrics.jsonl) until the attempt is confirmed again within `lease_s`, which is shorter than the time a watcher
waits before it claims the next generation. Readers of `latest` trust it only when it was written by the current
generation (rlctl.runs.sync.read_latest); every attempt writes its files under a prefix of its own, so a write still
in flight when the attempt was superseded can never mix into another attempt's checkpoint.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any

from rlctl.errors import RlctlError

GENERATIONS = "generations"
SETTLE_S = float(os.environ.get("RLCTL_CLAIM_SETTLE_S", "2"))


class Superseded(Exception):
    """This attempt's generation is no longer the current one: it must write nothing more."""

    def __init__(self, by: dict[str, Any]):
        super().__init__(f"superseded by generation {by.get('generation')} on {by.get('host') or '?'}")
        self.by = by


class ClaimLost(RlctlError):
    """Another watcher claimed the same generation at the same time; its claim stands."""


def new_token() -> str:
    return uuid.uuid4().hex


def attempt_prefix(generation: int, token: str) -> str:
    """Where an attempt's files and manifests go in the store: its own, never another attempt's."""
    return f"attempts/{generation}-{token[:8]}"


def _path(root: str, n: int) -> str:
    return f"{root}/{GENERATIONS}/{n}.json"


def read_generation(fs: Any, root: str, n: int) -> dict[str, Any] | None:
    """Generation n's record, or None. A GET of one key, never a (cached) listing."""
    if n < 1:
        return None
    try:
        rec = json.loads(fs.cat_file(_path(root, n)))
    except (FileNotFoundError, OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def current(fs: Any, root: str, start: int = 1) -> dict[str, Any] | None:
    """The highest generation's record (claims go up one at a time, so walking up from `start` finds it), or None
    when the run was never fenced."""
    best = None
    n = max(start, 1)
    if start > 1:
        best = read_generation(fs, root, start - 1)
    while (rec := read_generation(fs, root, n)) is not None:
        best, n = rec, n + 1
    return best


def history(fs: Any, root: str) -> list[dict[str, Any]]:
    """Every generation's record, oldest first."""
    out = []
    n = 1
    while (rec := read_generation(fs, root, n)) is not None:
        out.append(rec)
        n += 1
    return out


def claim(url: str, record: dict[str, Any], settle: float = SETTLE_S) -> dict[str, Any]:
    """Claim the next generation for a new attempt: {generation, token, claimed_at, ...record}. ClaimLost when
    another claimant's write of the same generation stands."""
    from rlctl.runs.store import store

    fs, root = store(url)
    cur = current(fs, root)
    n = (int(cur["generation"]) if cur else 0) + 1
    rec = {**record, "generation": n, "token": record.get("token") or new_token(), "claimed_at": time.time(),
           "by": record.get("by") or f"{socket.gethostname()} pid {os.getpid()}"}
    fs.pipe_file(_path(root, n), json.dumps(rec, indent=1).encode())
    time.sleep(settle)
    got = read_generation(fs, root, n)
    newer = read_generation(fs, root, n + 1)
    if got is None or got.get("token") != rec["token"] or newer is not None:
        winner = newer or got or {}
        raise ClaimLost(f"generation {n} of {url} was claimed at the same time by {winner.get('by', '?')} "
                        f"(for {winner.get('host') or '?'}); that claim stands")
    return rec


def withdraw(url: str, generation: int, token: str) -> None:
    """Take back one's own claim whose attempt never started (a launch that failed): the store is as before."""
    from rlctl.runs.store import store

    fs, root = store(url)
    rec = read_generation(fs, root, generation)
    if rec is not None and rec.get("token") == token and read_generation(fs, root, generation + 1) is None:
        fs.rm(_path(root, generation))


def fence_spec(url: str, record: dict[str, Any], host: str, failover_after_s: float) -> dict[str, Any]:
    """What an attempt's supervisor gets (spec "fence"): it checks its generation every `every_s`, and writes only
    while confirmed within `lease_s`: half the time a watcher waits before it claims the next generation."""
    f = float(failover_after_s)
    return {"url": url, "generation": int(record["generation"]), "token": str(record["token"]), "host": host,
            "every_s": max(1.0, min(10.0, f / 4)), "lease_s": max(1.0, f / 2)}


def amend(url: str, generation: int, token: str, **fields: Any) -> None:
    """Add what is known after the launch (the run directory there) to one's own claim; another's is left alone."""
    from rlctl.runs.store import store

    fs, root = store(url)
    rec = read_generation(fs, root, generation)
    if rec is None or rec.get("token") != token:
        return
    fs.pipe_file(_path(root, generation), json.dumps({**rec, **fields}, indent=1).encode())


class Fence:
    """An attempt's view of its generation (the supervisor's spec "fence": url, generation, token, every_s,
    lease_s). check() is cheap to call every tick (it reads the store every `every_s`); confirm() reads now."""

    def __init__(self, spec: dict[str, Any]):
        self.url = str(spec["url"])
        self.generation = int(spec["generation"])
        self.token = str(spec["token"])
        self.host = spec.get("host")
        self.every_s = float(spec.get("every_s") or 10.0)
        self.lease_s = float(spec.get("lease_s") or 150.0)
        self.prefix = attempt_prefix(self.generation, self.token)
        self.state = "unknown"  # ok | superseded | unknown (the store did not answer)
        self.superseded_by: dict[str, Any] | None = None
        self.confirmed_at = 0.0
        self.checked_at = 0.0
        self.error: str | None = None
        self._fs: Any = None

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> Fence | None:
        return cls(spec) if isinstance(spec, dict) and spec.get("url") and spec.get("token") else None

    def _read(self) -> str:
        from rlctl.runs.store import store

        now = time.time()
        self.checked_at = now
        try:
            if self._fs is None:
                self._fs, self._root = store(self.url)
            mine = read_generation(self._fs, self._root, self.generation)
            newer = current(self._fs, self._root, self.generation + 1)
        except Exception as e:  # the store did not answer: nothing is known, writes wait out the lease
            self.error = f"{type(e).__name__}: {e}"
            return self.state
        if newer is not None and int(newer.get("generation", 0)) > self.generation:
            self.state, self.superseded_by = "superseded", newer
        elif mine is not None and mine.get("token") != self.token:
            self.state, self.superseded_by = "superseded", mine
        elif mine is None:
            self.error = f"generations/{self.generation}.json is not in {self.url}"
            self.state = "unknown"
        else:
            self.state, self.confirmed_at, self.error = "ok", now, None
        return self.state

    def check(self) -> str:
        """ok | superseded | unknown, read from the store at most every `every_s` (superseded is for good)."""
        if self.state != "superseded" and time.time() - self.checked_at >= self.every_s:
            self._read()
        return self.state

    def check_now(self) -> str:
        """The same, read from the store now."""
        if self.state != "superseded":
            self._read()
        return self.state

    def confirm(self) -> None:
        """Right before a write: Superseded when another attempt holds the run; RlctlError when the store cannot
        tell and the last confirmation is older than the lease."""
        if self.state != "superseded":
            self._read()
        if self.state == "superseded":
            raise Superseded(self.superseded_by or {})
        if not self.allows_writes():
            raise RlctlError(f"generation {self.generation} not confirmed for {time.time() - self.confirmed_at:.0f} s"
                             f" ({self.error or 'the store did not answer'}); writes wait")

    def allows_writes(self) -> bool:
        return self.state == "ok" and time.time() - self.confirmed_at <= self.lease_s
