"""checkpoint.sync: the store's URL is one rlctl can write to, checked before launch (a sync error during the run is
only an event: the run goes on, its checkpoints never reach the store)."""

from __future__ import annotations

import os
from pathlib import Path

from rlctl.preflight import FAIL, OK, SKIP, Context, Result, check, existing_parent

FIX = 'set checkpoint.sync = "s3://bucket/prefix" or "file:///mnt/nfs/dir" (any fsspec URL; pip install "rlctl[sync]")'


@check("checkpoint.sync", silent="no checkpoint.sync store")
def sync(ctx: Context) -> Result | None:
    url = ctx.recipe.checkpoint.sync
    if not url:
        return None
    try:
        import fsspec
    except ImportError:
        return Result("checkpoint.sync", FAIL, f"{url}: fsspec is not installed here", 'pip install "rlctl[sync]"')
    proto = url.split("://", 1)[0] if "://" in url else "file"
    if proto not in fsspec.available_protocols():
        return Result("checkpoint.sync", FAIL, f"{url}: fsspec knows no protocol {proto!r}", FIX)
    try:
        cls = fsspec.get_filesystem_class(proto)
    except (ImportError, ValueError) as e:  # known, its package not installed (s3fs, gcsfs, ...)
        return Result("checkpoint.sync", FAIL, f"{url}: {e}", f"install the package for {proto}:// (e.g. pip install "
                      "s3fs), or set another checkpoint.sync")
    if getattr(cls, "protocol", None) in ("file", ("file", "local")) or proto in ("file", "local"):
        path = Path(url.split("://", 1)[1] if "://" in url else url)
        base = existing_parent(path)
        if not os.access(base, os.W_OK | os.X_OK):
            return Result("checkpoint.sync", FAIL, f"{url}: {base} is not writable here",
                          "make it writable, or set another checkpoint.sync")
        made = "" if base == path else f" ({path} will be created under {base})"
        return Result("checkpoint.sync", OK, f"{url}: a directory writable here{made}")
    # a remote store: reaching it would be a network call (and maybe a write); nothing is sent from preflight
    return Result("checkpoint.sync", SKIP, f"{url}: {cls.__name__} importable; the store itself is not reached from "
                  "preflight (credentials and bucket are checked by the first sync: rlctl status RUN shows its errors)",
                  None)
