"""Counting and reading prompt datasets (JSONL, JSON, Parquet) without a training framework."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlctl.errors import RecipeError

FORMATS = (".jsonl", ".json", ".parquet")


def is_local(path: str) -> bool:
    return Path(path).exists()


def count_records(path: str | Path) -> int:
    """Number of records in a local dataset file, as the backends' loaders would see it."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in FORMATS)
        if not files:
            raise RecipeError(f"{p}: a directory with no .jsonl/.json/.parquet files.")
        return sum(count_records(f) for f in files)
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        n = 0
        with p.open("rb") as fh:
            for line in fh:
                if line.strip():
                    n += 1
        return n
    if suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RecipeError(f"{p}: not valid JSON ({e}).") from None
        if isinstance(data, list):
            return len(data)
        if isinstance(data, dict):  # {"train": [...]} or column-oriented {"input": [...], ...}
            lists = [v for v in data.values() if isinstance(v, list)]
            if lists:
                return len(lists[0])
        raise RecipeError(f"{p}: expected a JSON list of records.")
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise RecipeError(
                f"{p}: counting Parquet records needs pyarrow.", hint='pip install "rlctl[parquet]"'
            ) from None
        return pq.ParquetFile(p).metadata.num_rows
    raise RecipeError(f"{p}: unknown dataset format {suffix!r}; expected one of {', '.join(FORMATS)}.")


def iter_records(path: str | Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    p = Path(path)
    suffix = p.suffix.lower()
    n = 0
    if suffix == ".jsonl":
        with p.open("r", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    yield rec
                    n += 1
                    if limit and n >= limit:
                        return
    elif suffix == ".json":
        data = json.loads(p.read_text())
        for rec in data if isinstance(data, list) else []:
            if isinstance(rec, dict):
                yield rec
                n += 1
                if limit and n >= limit:
                    return
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(p).iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                yield rec
                n += 1
                if limit and n >= limit:
                    return


def prompt_text(record: dict[str, Any], key: str) -> str | None:
    value = record.get(key)
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # chat format: [{"role": ..., "content": ...}]
        return "\n".join(str(m.get("content", "")) for m in value if isinstance(m, dict))
    return None
