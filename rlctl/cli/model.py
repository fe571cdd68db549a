"""Models for smoke tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlctl.cli._app import _echo, model_app
from rlctl.errors import RlctlError


@model_app.command("tiny")
def model_tiny(
    path: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    source: Annotated[str, typer.Option("--source", help="random:qwen2?hidden=64&layers=2")] = "random:qwen2",
) -> None:
    """A tiny randomly initialised model with a byte-level tokenizer (needs the [trl] extra)."""
    from rlctl.recipe.tiny_model import make_tiny, parse_random_source

    parse_random_source(source)
    if path.exists() and not path.is_dir():
        raise RlctlError(f"{path}: exists and is not a directory.", hint="name a new directory for the model.")
    if path.is_dir() and any(path.iterdir()) and not (path / "rlctl_tiny.json").is_file():
        raise RlctlError(f"{path}: a non-empty directory that is not an rlctl tiny model; writing there would "
                         "overwrite its config.json, weights and tokenizer. Nothing was written.",
                         hint="name a new or empty directory.")
    try:
        out = make_tiny(path, source)
    except ImportError as e:
        raise RlctlError(f"making a model needs torch and transformers ({e.name} is missing).",
                         hint="pip install torch transformers") from None
    _echo(str(out))
