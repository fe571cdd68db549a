"""Checkpoint sync to object storage (`checkpoint.sync = "s3://bucket/prefix"`, any fsspec URL): only complete
checkpoints, each made visible atomically, so a run can resume on another machine.

Layout under the URL: `checkpoints/<path relative to the checkpoint root>/...` (the files), then
`manifests/<step>.json` (every file with its size, written after the files), then `latest` (written last, one PUT:
{"step", "manifest"}). A reader trusts only `latest`, and a manifest whose files are all there with their sizes: a
sync cut off half-way is never mistaken for a checkpoint. Credentials come from the environment (fsspec/s3fs read
AWS_* and the like); rlctl never writes them anywhere.
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

SYNC_STATE = ".sync.json"


def _fs(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise RlctlError("checkpoint.sync needs fsspec (and s3fs for s3://).", hint='pip install fsspec s3fs') from None
    try:
        fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True)  # credentials/endpoint as of now
    except (ImportError, ValueError) as e:
        raise RlctlError(f"checkpoint.sync = {url!r}: {e}", hint="e.g. pip install s3fs for s3:// URLs") from None
    return fs, root.rstrip("/")


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def upload_checkpoint(fs: Any, root: str, ckpt: Any, ckpt_root: Path) -> dict[str, Any]:
    """Upload one complete checkpoint (its files first, then its manifest); returns the manifest."""
    files: dict[str, int] = {}
    for top in [ckpt.path, *getattr(ckpt, "extra_paths", [])]:
        for f in _files(top):
            rel = f.relative_to(ckpt_root).as_posix()
            fs.put_file(str(f), f"{root}/checkpoints/{rel}")
            files[rel] = f.stat().st_size
    manifest = {"step": ckpt.step, "path": ckpt.path.relative_to(ckpt_root).as_posix(), "files": files,
                "uploaded_at": time.time()}
    fs.pipe_file(f"{root}/manifests/{ckpt.step}.json", json.dumps(manifest, indent=1).encode())
    return manifest


def write_latest(fs: Any, root: str, step: int) -> None:
    fs.pipe_file(f"{root}/latest", json.dumps({"step": step, "manifest": f"manifests/{step}.json"}).encode())


def read_latest(url: str) -> dict[str, Any] | None:
    """The manifest `latest` points to, when every file it lists is there with its size; else None."""
    fs, root = _fs(url)
    try:
        latest = json.loads(fs.cat_file(f"{root}/latest"))
        manifest = json.loads(fs.cat_file(f"{root}/{latest['manifest']}"))
    except (FileNotFoundError, OSError, ValueError, KeyError):
        return None
    for rel, size in manifest["files"].items():
        try:
            if fs.size(f"{root}/checkpoints/{rel}") != size:
                return None
        except (FileNotFoundError, OSError):
            return None
    return manifest


def fetch_latest(url: str, dest_root: Path) -> dict[str, Any]:
    """Download the checkpoint `latest` points to into dest_root (same relative layout); returns its manifest."""
    manifest = read_latest(url)
    if manifest is None:
        raise RlctlError(f"{url}: no complete synced checkpoint (no `latest`, or its files are missing).")
    fs, root = _fs(url)
    for rel in manifest["files"]:
        dst = dest_root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".part")
        fs.get_file(f"{root}/checkpoints/{rel}", str(tmp))
        os.replace(tmp, dst)
    return manifest


def latest_synced(run_dir: Path) -> int | None:
    """The step `latest` points to as this run last wrote it (its local record of the sync), or None."""
    try:
        step = json.loads((run_dir / SYNC_STATE).read_text()).get("latest")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


class CheckpointSync:
    """Called by the supervisor every housekeeping tick: uploads new complete checkpoints in a background thread
    (the run is never held up by the network), then moves `latest`; final=True waits for it."""

    def __init__(self, run_dir: Path, backend: str, url: str):
        self.run_dir, self.backend, self.url = run_dir, backend, url
        self.fs, self.root = _fs(url)
        try:
            self.done: set[int] = set(json.loads((run_dir / SYNC_STATE).read_text())["steps"])
        except (OSError, ValueError, KeyError, TypeError):
            self.done = set()
        self.thread: threading.Thread | None = None
        self.error: str | None = None

    def pending(self) -> list[Any]:
        from rlctl.runs.checkpoints import find_checkpoints

        ckpts = find_checkpoints(self.backend, self.run_dir)
        return [c for c in ckpts if c.complete and c.step not in self.done]

    def tick(self, final: bool = False) -> None:
        if self.thread is not None and self.thread.is_alive():
            if final:
                self.thread.join()
            else:
                return
        todo = self.pending()
        if not todo:
            return
        if final:
            self._upload(todo)
        else:
            self.thread = threading.Thread(target=self._upload, args=(todo,), daemon=True)
            self.thread.start()

    def _upload(self, todo: list[Any]) -> None:
        from rlctl.runs.checkpoints import checkpoint_dir

        spec_dir = None
        with contextlib.suppress(OSError, ValueError, KeyError):
            spec_dir = json.loads((self.run_dir / ".launch.json").read_text()).get("checkpoint_dir")
        ckpt_root = checkpoint_dir(self.run_dir, spec_dir)
        try:
            for c in todo:
                if not c.path.exists():  # pruned meanwhile
                    continue
                upload_checkpoint(self.fs, self.root, c, ckpt_root)
                self.done.add(c.step)
            newest = max(self.done, default=None)
            if newest is not None:
                write_latest(self.fs, self.root, newest)
            tmp = self.run_dir / (SYNC_STATE + ".tmp")
            tmp.write_text(json.dumps({"url": self.url, "steps": sorted(self.done), "latest": newest}))
            os.replace(tmp, self.run_dir / SYNC_STATE)
        except Exception as e:
            self.error = str(e)
            with contextlib.suppress(OSError), (self.run_dir / "rlctl-events.jsonl").open("a") as fh:
                fh.write(json.dumps({"time": time.time(), "event": "sync_error", "error": str(e)}) + "\n")
