"""Where the bundled recipes and patch sets are: rlctl/_data/ in a checkout (symlinks) and in a wheel (copies)."""

from __future__ import annotations

from pathlib import Path

_DATA = Path(__file__).resolve().parent / "_data"


def recipes_dir() -> Path:
    return (_DATA / "recipes").resolve()


def patches_dir() -> Path:
    return (_DATA / "patches").resolve()


def bundled_recipe(name: str) -> Path | None:
    """`quickstart` or `quickstart.toml` -> the bundled recipe file, if there is one."""
    stem = name[:-5] if name.endswith(".toml") else name
    candidate = recipes_dir() / f"{stem}.toml"
    return candidate if candidate.is_file() else None
