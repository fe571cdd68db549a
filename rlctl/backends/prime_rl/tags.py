"""prime-rl's tags and their config layouts: the seeds' v0.3 layout and v0.8's."""

from __future__ import annotations

from rlctl.backends.base import version_key

NEW_LAYOUT_SINCE = "0.8.0"
CHECKOUT_ENV = "PRIME_RL_DIR"  # where a prime-rl checkout lives when the recipe names none


def layout(version: str | None) -> str:
    if version is None:
        return "v0.8"
    return "v0.8" if version_key(version) >= version_key(NEW_LAYOUT_SINCE) else "v0.3"
