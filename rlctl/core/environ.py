"""Environment variables set for the length of a block and restored after it (unset ones unset again)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """os.environ with `values` set inside the block: what a child started there inherits."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
