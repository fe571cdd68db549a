"""Checkpoint sync to object storage (`checkpoint.sync = "s3://bucket/prefix"`, any fsspec URL): only complete
checkpoints, each made visible atomically, so a run can resume on another machine.

Layout under the URL: `checkpoints/<path relative to the checkpoint root>/...` (the files), then
`manifests/<step>.json` (every file with its size, written after the files) and `streams/<step>.jsonl` (the run's
metrics stream up to that step), then `latest` (written last, one PUT: {"step", "manifest"}). A reader trusts only
`latest`, and a manifest whose files are all there with their sizes: a sync cut off half-way is never mistaken for a
checkpoint. Credentials come from the environment (fsspec/s3fs read AWS_* and the like); rlctl never writes them
anywhere.

A pool run's attempts are fenced (rlctl.runs.fencing): each writes under a prefix of its own
(`attempts/<generation>-<token>/checkpoints/...`, `.../manifests/<step>.json`), checks its generation right before
every write, and stamps `latest` with it; `read_latest` trusts `latest` only when the current generation wrote it,
else the checkpoint the current generation started from.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError
from rlctl.runs.store import STORE_ENV, store, store_env_names  # noqa: F401 - re-exported for callers

SYNC_STATE = ".sync.json"
STREAM_WAIT_S = 30.0  # how long a complete checkpoint waits for the stream to reach its step before it is synced
_fs = store  # the older name


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _under(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def stream_upto(run_dir: Path, step: int) -> bytes:
    """The complete records of the run's metrics stream up to `step`: what a resumed attempt's stream starts with."""
    from rlctl.metrics.stream import METRICS

    try:
        data = (run_dir / METRICS).read_bytes()
    except OSError:
        return b""
    out = []
    for line in data[: data.rfind(b"\n") + 1].splitlines(keepends=True):
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            rec = json.loads(line)
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= step:
                out.append(line)
    return b"".join(out)


def upload_checkpoint(fs: Any, root: str, ckpt: Any, ckpt_root: Path, prefix: str = "",
                      stream: bytes | None = None, **about: Any) -> dict[str, Any]:
    """Upload one complete checkpoint (its files first, then the stream up to it and its manifest, under `prefix`);
    returns the manifest."""
    base = f"{root}/{prefix}" if prefix else root
    files: dict[str, int] = {}
    for top in [ckpt.path, *getattr(ckpt, "extra_paths", [])]:
        for f in _files(top):
            rel = f.relative_to(ckpt_root).as_posix()
            fs.put_file(str(f), f"{base}/checkpoints/{rel}")
            files[rel] = f.stat().st_size
    rel_manifest = _under(prefix, f"manifests/{ckpt.step}.json")
    manifest = {"step": ckpt.step, "path": ckpt.path.relative_to(ckpt_root).as_posix(), "files": files,
                "uploaded_at": time.time(), "prefix": prefix, "manifest": rel_manifest,
                **{k: v for k, v in about.items() if v}}  # the run it came from (wandb_run_id: resume continues it)
    if stream is not None:
        fs.pipe_file(f"{base}/streams/{ckpt.step}.jsonl", stream)
        manifest["stream"] = f"streams/{ckpt.step}.jsonl"
    fs.pipe_file(f"{root}/{rel_manifest}", json.dumps(manifest, indent=1).encode())
    return manifest


def write_latest(fs: Any, root: str, step: int, manifest: str | None = None, **stamp: Any) -> None:
    fs.pipe_file(f"{root}/latest", json.dumps({"step": step, "manifest": manifest or f"manifests/{step}.json",
                                               **stamp}).encode())


def _json(fs: Any, path: str) -> Any:
    try:
        return json.loads(fs.cat_file(path))
    except (FileNotFoundError, OSError, ValueError):
        return None


def manifest_at(fs: Any, root: str, rel: str) -> dict[str, Any] | None:
    """The manifest at `rel` when every file it lists is there with its size; else None."""
    manifest = _json(fs, f"{root}/{rel}")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return None
    prefix = str(manifest.get("prefix") or "")
    base = f"{root}/{prefix}" if prefix else root
    for f, size in manifest["files"].items():
        try:
            if fs.size(f"{base}/checkpoints/{f}") != size:
                return None
        except (FileNotFoundError, OSError):
            return None
    manifest.setdefault("manifest", rel)
    return manifest


def _manifest_steps(fs: Any, root: str, prefix: str) -> list[int]:
    path = f"{root}/{prefix}/manifests" if prefix else f"{root}/manifests"
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)
    try:
        names = fs.ls(path, detail=False)
    except (FileNotFoundError, OSError):
        return []
    steps = []
    for n in names:
        stem = str(n).rstrip("/").rsplit("/", 1)[-1].removesuffix(".json")
        if stem.isdigit():
            steps.append(int(stem))
    return sorted(steps)


def _resolve(fs: Any, root: str, latest: dict[str, Any] | None, cur: dict[str, Any]) -> dict[str, Any] | None:
    """The newest complete checkpoint of a fenced run: `latest` when the current generation wrote it, else the one
    the current generation started from (a superseded attempt may have written `latest` after the claim: never
    trusted), else the newest of the generations before it at or below the step it started from."""
    from rlctl.runs.fencing import attempt_prefix, read_generation

    own = latest and latest.get("generation") == cur.get("generation") and latest.get("token") == cur.get("token")
    if own and (m := manifest_at(fs, root, str(latest.get("manifest")))):
        return m
    if cur.get("from_manifest") and (m := manifest_at(fs, root, str(cur["from_manifest"]))):
        return m
    bound = cur.get("from_step")
    n = int(cur.get("generation") or 1) - 1
    while bound is not None and n >= 1:
        rec = read_generation(fs, root, n)
        if rec is None:
            break
        prefix = attempt_prefix(n, str(rec.get("token")))
        for step in reversed([s for s in _manifest_steps(fs, root, prefix) if s <= bound]):
            if m := manifest_at(fs, root, f"{prefix}/manifests/{step}.json"):
                return m
        bound = min(bound, rec["from_step"]) if rec.get("from_step") is not None else None
        n -= 1
    return None


def read_latest(url: str) -> dict[str, Any] | None:
    """The manifest `latest` points to, when every file it lists is there with its size (for a fenced run: as
    _resolve says); else None."""
    from rlctl.runs.fencing import current

    fs, root = store(url)
    latest = _json(fs, f"{root}/latest")
    latest = latest if isinstance(latest, dict) else None
    cur = current(fs, root)
    if cur is not None:
        return _resolve(fs, root, latest, cur)
    if latest is None or "manifest" not in latest:
        return None
    return manifest_at(fs, root, str(latest["manifest"]))


def fetch_manifest(url: str, manifest: dict[str, Any], dest_root: Path) -> dict[str, Any]:
    """Download the files of this (complete) manifest into dest_root, in the same relative layout."""
    fs, root = store(url)
    prefix = str(manifest.get("prefix") or "")
    base = f"{root}/{prefix}" if prefix else root
    for rel in manifest["files"]:
        dst = dest_root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".part")
        fs.get_file(f"{base}/checkpoints/{rel}", str(tmp))
        os.replace(tmp, dst)
    return manifest


def fetch_latest(url: str, dest_root: Path) -> dict[str, Any]:
    """Download the checkpoint `latest` points to into dest_root (same relative layout); returns its manifest."""
    manifest = read_latest(url)
    if manifest is None:
        raise RlctlError(f"{url}: no complete synced checkpoint (no `latest`, or its files are missing).")
    return fetch_manifest(url, manifest, dest_root)


def fetch_at(url: str, rel: str, dest_root: Path) -> dict[str, Any]:
    """Download the checkpoint of the manifest at `rel` (a failover names the one it chose)."""
    fs, root = store(url)
    manifest = manifest_at(fs, root, rel)
    if manifest is None:
        raise RlctlError(f"{url}/{rel}: not a complete synced checkpoint (its files are missing or differ).")
    return fetch_manifest(url, manifest, dest_root)


def read_stream(url: str, manifest: dict[str, Any]) -> bytes | None:
    """The metrics stream up to the manifest's step, as uploaded with it (None when it was not)."""
    if not manifest.get("stream"):
        return None
    fs, root = store(url)
    prefix = str(manifest.get("prefix") or "")
    try:
        return bytes(fs.cat_file(f"{root}/{_under(prefix, str(manifest['stream']))}"))
    except (FileNotFoundError, OSError):
        return None


def mark_synced(run_dir: Path, url: str, manifest: dict[str, Any]) -> None:
    """A checkpoint fetched from the store into a new run is synced already: its sync never uploads it again."""
    tmp = run_dir / (SYNC_STATE + ".tmp")
    tmp.write_text(json.dumps({"url": url, "steps": [manifest["step"]], "latest": manifest["step"],
                               "manifests": {str(manifest["step"]): manifest["manifest"]}}))
    os.replace(tmp, run_dir / SYNC_STATE)


def latest_synced(run_dir: Path) -> int | None:
    """The step `latest` points to as this run last wrote it (its local record of the sync), or None."""
    try:
        step = json.loads((run_dir / SYNC_STATE).read_text()).get("latest")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


class CheckpointSync:
    """Called by the supervisor every housekeeping tick: uploads new complete checkpoints in a background thread
    (the run is never held up by the network), then moves `latest`; final=True waits for it. With a `fence` (a pool
    run's attempt), every write is preceded by a fresh check of its generation: a superseded attempt writes nothing
    more (`superseded` says by whom)."""

    def __init__(self, run_dir: Path, backend: str, url: str, fence: Any = None):
        self.run_dir, self.backend, self.url, self.fence = run_dir, backend, url, fence
        self.fs, self.root = store(url)
        self.prefix = fence.prefix if fence is not None else ""
        try:
            saved = json.loads((run_dir / SYNC_STATE).read_text())
            self.done: set[int] = set(saved["steps"])
            self.manifests = {int(k): str(v) for k, v in (saved.get("manifests") or {}).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.done, self.manifests = set(), {}
        self.thread: threading.Thread | None = None
        self.error: str | None = None
        self.superseded: dict[str, Any] | None = None
        self.first_seen: dict[int, float] = {}  # step -> when its checkpoint was first seen complete

    def pending(self, final: bool = True) -> list[Any]:
        """Complete checkpoints not synced yet. While the run goes on (not `final`), one whose step the stream has
        not reached yet waits up to STREAM_WAIT_S: a trainer may finish saving before its log line for that step is
        read, and the stream uploaded with the checkpoint is what a resumed attempt starts from."""
        from rlctl.runs.checkpoints import find_checkpoints

        ckpts = [c for c in find_checkpoints(self.backend, self.run_dir) if c.complete and c.step not in self.done]
        if final or not ckpts:
            return ckpts
        reached = self._stream_step()
        now = time.time()
        out = []
        for c in ckpts:
            seen = self.first_seen.setdefault(c.step, now)
            if reached is None or reached >= c.step or now - seen >= STREAM_WAIT_S:
                out.append(c)
        return out

    def _stream_step(self) -> int | None:
        from rlctl.metrics.stream import METRICS, tail_records

        try:
            return max((r["step"] for r in tail_records(self.run_dir / METRICS, max_bytes=1 << 16)), default=None)
        except Exception:
            return None

    def tick(self, final: bool = False) -> None:
        if self.thread is not None and self.thread.is_alive():
            if final:
                self.thread.join()
            else:
                return
        if self.superseded is not None:
            return
        todo = self.pending(final)
        if not todo:
            return
        if final:
            self._upload(todo)
        else:
            self.thread = threading.Thread(target=self._upload, args=(todo,), daemon=True)
            self.thread.start()

    def _confirm(self) -> None:
        if self.fence is not None:
            self.fence.confirm()

    def _wandb_id(self) -> str | None:
        from rlctl.runs.state import read_state

        with contextlib.suppress(Exception):
            return read_state(self.run_dir).get("wandb_run_id")
        return None

    def _upload(self, todo: list[Any]) -> None:
        from rlctl.runs.checkpoints import checkpoint_dir
        from rlctl.runs.fencing import Superseded

        spec_dir = None
        with contextlib.suppress(OSError, ValueError, KeyError):
            spec_dir = json.loads((self.run_dir / ".launch.json").read_text()).get("checkpoint_dir")
        ckpt_root = checkpoint_dir(self.run_dir, spec_dir)
        try:
            for c in todo:
                if not c.path.exists():  # pruned meanwhile
                    continue
                self._confirm()
                m = upload_checkpoint(self.fs, self.root, c, ckpt_root, self.prefix, stream_upto(self.run_dir, c.step),
                                      wandb_run_id=self._wandb_id())
                self.done.add(c.step)
                self.manifests[c.step] = m["manifest"]
            newest = max(self.done, default=None)
            if newest is not None:
                stamp = {}
                if self.fence is not None:
                    stamp = {"generation": self.fence.generation, "token": self.fence.token, "host": self.fence.host}
                self._confirm()  # `latest` moves only while this attempt's generation is the current one
                write_latest(self.fs, self.root, newest, self.manifests.get(newest), **stamp)
            tmp = self.run_dir / (SYNC_STATE + ".tmp")
            tmp.write_text(json.dumps({"url": self.url, "steps": sorted(self.done), "latest": newest,
                                       "manifests": {str(k): v for k, v in self.manifests.items()}}))
            os.replace(tmp, self.run_dir / SYNC_STATE)
        except Superseded as e:
            self.superseded = e.by
            self._event("sync_superseded", str(e))
        except Exception as e:
            self.error = str(e)
            self._event("sync_error", str(e))

    def _event(self, event: str, error: str) -> None:
        with contextlib.suppress(OSError), (self.run_dir / "rlctl-events.jsonl").open("a") as fh:
            fh.write(json.dumps({"time": time.time(), "event": event, "error": error}) + "\n")


def sync_health(run_dir: Path, newest: int | None) -> dict[str, Any] | None:
    """What a user must see of the run's checkpoint sync (status, doctor): its errors (count, the last one), the last
    step synced, and whether the newest complete checkpoint (`newest`) is in the store; None without a sync."""
    import tomllib

    url = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        url = tomllib.loads((run_dir / "recipe.toml").read_text()).get("checkpoint", {}).get("sync")
    errors = []
    with contextlib.suppress(OSError):
        for line in (run_dir / "rlctl-events.jsonl").read_text(errors="replace").splitlines():
            if '"sync_error"' in line:
                with contextlib.suppress(ValueError):
                    errors.append(json.loads(line))
    if not url and not errors:
        return None
    synced = latest_synced(run_dir)
    behind = newest is not None and (synced is None or synced < newest)
    return {"url": url, "errors": len(errors), "last_error": (errors[-1].get("error") if errors else None),
            "last_synced_step": synced, "newest_checkpoint": newest, "behind": behind}


def sync_warning(h: dict[str, Any] | None) -> str | None:
    """One line for a sync that failed or is behind the run's newest checkpoint, else None."""
    if not h or not (h["errors"] or h["behind"]):
        return None
    where = f"last step synced {h['last_synced_step']}" if h["last_synced_step"] is not None else "nothing synced"
    out = f"checkpoint sync to {h['url']}: {where}"
    if h["behind"]:
        out += f", newest checkpoint step {h['newest_checkpoint']} is not in the store"
    if h["errors"]:
        out += f"; {h['errors']} sync error(s), the last: {h['last_error']}"
    return out
