"""Counting and reading prompt datasets (JSONL, JSON, Parquet) without a training framework."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlctl.errors import RecipeError

FORMATS = (".jsonl", ".json", ".parquet")


MAX_JSON_BYTES = 2 * 1024**3  # a .json dataset is read whole; past this, JSONL or Parquet is the format to use


def is_local(path: str) -> bool:
    """A local dataset: the loader made every local path absolute (rlctl.recipe.paths); a relative value is a dataset
    id, whatever the current directory holds."""
    try:
        return Path(path).is_absolute() and Path(path).exists()
    except (OSError, ValueError):  # a name too long, an embedded NUL: not a local file (preflight says why)
        return False


def _regular(p: Path) -> None:
    """A dataset file must be a readable regular file: a FIFO or device (/dev/zero) would hang the count."""
    from rlctl.recipe.loader import file_problem

    problem = file_problem(p)
    if problem:
        raise RecipeError(f"{p}: {problem}; expected a dataset file.",
                          hint="point data.train/data.eval at a JSONL, JSON or Parquet file.")


def count_records(path: str | Path) -> int:
    """Number of records in a local dataset file, as the backends' loaders would see it."""
    p = Path(path)
    if p.is_dir():
        try:
            files = sorted(f for f in p.iterdir() if f.suffix.lower() in FORMATS and f.is_file())
        except OSError as e:
            raise RecipeError(f"{p}: cannot list the directory ({e.strerror or e}).") from None
        if not files:
            raise RecipeError(f"{p}: a directory with no .jsonl/.json/.parquet files.")
        return sum(count_records(f) for f in files)
    _regular(p)
    suffix = p.suffix.lower()
    try:
        return _count(p, suffix)
    except OSError as e:
        raise RecipeError(f"{p}: cannot be read ({e.strerror or e}).",
                          hint="check the permissions of the file and its directory.") from None


def _count(p: Path, suffix: str) -> int:
    if suffix == ".jsonl":
        n = 0
        with p.open("rb") as fh:
            for line in fh:
                if line.strip():
                    n += 1
        return n
    if suffix == ".json":
        if p.stat().st_size > MAX_JSON_BYTES:
            raise RecipeError(f"{p}: a {p.stat().st_size / 1e9:.1f} GB JSON file is too large to read whole.",
                              hint="convert it to JSONL (one record per line) or Parquet.")
        try:
            data = json.loads(p.read_bytes())
        except (ValueError, RecursionError) as e:
            raise RecipeError(f"{p}: not valid JSON ({e}).",
                              hint="check the file; JSON lines want a .jsonl name.") from None
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
        try:
            return pq.ParquetFile(p).metadata.num_rows
        except OSError:
            raise
        except Exception as e:  # pyarrow's ArrowInvalid and friends: truncated or not Parquet at all
            raise RecipeError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0][:200]}).",
                              hint="the file may be truncated; re-download or re-export it.") from None
    raise RecipeError(f"{p}: unknown dataset format {suffix!r}; expected one of {', '.join(FORMATS)}.")


def iter_records(path: str | Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Records of a dataset file; one that cannot be read yields nothing (counting it already said why)."""
    p = Path(path)
    try:
        _regular(p)
        yield from _iter_records(p, limit)
    except (RecipeError, OSError, ValueError, RecursionError):
        return
    except Exception:  # pyarrow on a damaged Parquet file
        return


def _iter_records(p: Path, limit: int | None) -> Iterator[dict[str, Any]]:
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
        if p.stat().st_size > MAX_JSON_BYTES:
            return
        data = json.loads(p.read_bytes())
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


# ---- prompts wherever they can be read on this machine (preflight's context checks) ------------------------------
def hf_cache_dir(kind: str, repo_id: str) -> Path | None:
    """The local Hugging Face hub cache folder of a repo (`datasets--org--name`, `models--org--name`), if present."""
    import os

    if "/" not in repo_id or repo_id.startswith((".", "/")):
        return None
    home = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(Path.home(), ".cache", "huggingface"), "hub")
    p = Path(home) / f"{kind}--{repo_id.replace('/', '--')}"
    return p if p.is_dir() else None


def _offline() -> contextlib.AbstractContextManager[None]:
    """Hugging Face libraries offline for a while: a preflight never downloads."""
    from rlctl.core.environ import environ

    return environ(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def environment_module(env_id: str) -> str:
    """The Python module of a verifiers environment id (`org/my-env` -> `my_env`), as verifiers' loader names it."""
    return env_id.split("/")[-1].replace("-", "_")


def prompt_texts(recipe: Any, limit: int) -> tuple[list[str] | None, int, str]:
    """(prompt texts, records lacking the input key, where they were read) from wherever the training prompts can
    be read on this machine without downloading: a local file, an installed verifiers environment's dataset
    (reward.environment), a `datasets` id already in the local cache. (None, 0, why not) otherwise."""
    import importlib.util

    r = recipe
    key = r.data.input_key
    if is_local(r.data.train):
        return _texts(iter_records(r.data.train, limit=limit), key, limit) + (r.data.train,)
    env = getattr(r.reward, "environment", None)
    if env is not None:
        module = environment_module(env.id)
        try:  # a plain module name only: a dotted one would import its parent package to look
            found = module.isidentifier() and importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            try:
                with _offline():
                    loaded = importlib.import_module(module).load_environment(**dict(env.args or {}))
                    ds = getattr(loaded, "dataset", None)
                    if ds is None and hasattr(loaded, "get_dataset"):
                        ds = loaded.get_dataset()
                if ds is None:
                    return None, 0, f"the environment {env.id} ({module}) has no dataset"
                n = min(limit, len(ds))
                rows = ds.select(range(n)) if hasattr(ds, "select") else ds[:n]
                cols = _columns(ds)
                col = next((c for c in ("prompt", "question", key) if c in cols), key)
                texts, missing = _texts(iter(rows), col, limit)
                return texts, missing, f"the environment {env.id}'s dataset ({module}.load_environment)"
            except Exception as e:  # anything the user's environment raises: unknown, with the reason
                return None, 0, (f"the environment {env.id} ({module}) could not be loaded offline: "
                                 f"{type(e).__name__}: {str(e)[:160]}")
    if hf_cache_dir("datasets", r.data.train) is not None and importlib.util.find_spec("datasets") is not None:
        try:
            with _offline():
                import datasets

                ds = datasets.load_dataset(r.data.train, split="train")
            n = min(limit, len(ds))
            return _texts(iter(ds.select(range(n))), key, limit) + (f"{r.data.train} (local datasets cache)",)
        except Exception as e:
            return None, 0, f"{r.data.train} is in the datasets cache but could not be read offline: {str(e)[:160]}"
    why = "the dataset is not a local file"
    if env is not None:
        why += f", the environment {env.id} is not installed here (no module {environment_module(env.id)})"
    return None, 0, why + f", and {r.data.train!r} is no dataset in the local cache"


def _columns(ds: Any) -> list[str]:
    return list(getattr(ds, "column_names", None) or [])


def _texts(rows: Iterator[Any], key: str, limit: int) -> tuple[list[str], int]:
    texts, missing = [], 0
    for i, rec in enumerate(rows):
        if i >= limit:
            break
        t = prompt_text(rec, key) if isinstance(rec, dict) else None
        if t is None:
            missing += 1
        else:
            texts.append(t)
    return texts, missing
