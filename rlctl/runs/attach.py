"""`rlctl attach`: make a run directory for a run rlctl did not start, so status, logs, doctor, metrics and ckpt work
on it like on a launched run.

PATH is a log file, a directory (of logs, or a backend's output: checkpoints, trainer_state.json, TensorBoard event
files, W&B offline runs), or a Ray job id (with --address). The run directory links to the logs (stdout.log and
logs/<name>, symlinks: a growing log is followed with --follow) and to the checkpoint directory (recipe.toml's
checkpoint.dir); what the second sources hold (TensorBoard scalars, W&B history rows, trainer_state.json's
log_history) is read once, exactly, and written to metrics.jsonl after the console's records. Which backend wrote
it is asked of each installed adapter (`--backend auto`): the one whose parser finds most metric names rlctl knows
wins, and attach says it guessed; when none recognises anything, an adapter that reads any trainer's JSON lines
(`reads_any_log`) reads them, and attach says so. `--recipe R.toml` / `--metrics-map k=name,...` give such an adapter
the recipe's metrics map. This module names no backend.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.errors import EXIT_CHECK_FAILED, RlctlError
from rlctl.metrics import UNIFIED
from rlctl.metrics.stream import (
    LOG,
    METRICS,
    SOURCES,
    IngestState,
    adapter,
    assign_steps,
    ingest,
    unparsed_report,
    write_records,
)
from rlctl.runs.rundir import RUN_NAME_MAX, check_run_name, create_run_dir
from rlctl.runs.state import ACTIVE, read_state, runs_root, write_state

LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".stdout", ".stderr", ".jsonl")  # JSON lines: read like a log
TB_PREFIX = "events.out.tfevents."
TRAINER_STATE = "trainer_state.json"  # transformers' Trainer state: log_history with steps
MAX_DEPTH = 6
SAMPLE_BYTES = 2 * 1024 * 1024
FIRST_SAMPLE = 256 * 1024  # detection looks at this much of each end first, and further only when it is not clear
CLEAR = 100  # known metric names (about ten records) a first look needs, at twice the runner-up's, to decide
RAY_JOB = re.compile(r"^(raysubmit_[A-Za-z0-9]+|[0-9a-f]{8,}(?:-[0-9a-f]{4,})*)$")


class AttachFailed(RlctlError):
    exit_code = EXIT_CHECK_FAILED


@dataclass
class Sources:
    """What was found under PATH."""

    logs: list[Path] = field(default_factory=list)
    tensorboard: list[Path] = field(default_factory=list)
    wandb: list[Path] = field(default_factory=list)
    trainer_state: Path | None = None
    dirs: list[Path] = field(default_factory=list)  # candidate checkpoint roots

    def empty(self) -> bool:
        return not (self.logs or self.tensorboard or self.wandb or self.trainer_state)


def find_sources(path: Path) -> Sources:
    src = Sources()
    if path.is_file():
        _classify(path, src)
        if not (src.logs or src.tensorboard or src.wandb or src.trainer_state):  # a log of any name
            src.logs.append(path)
        return src
    states: list[Path] = []
    src.dirs.append(path)
    for p, depth in _walk(path):
        if p.is_dir():
            if depth <= 2:
                src.dirs.append(p)
            continue
        if not p.is_file():  # a FIFO, socket or device named like a log would block the read
            continue
        if p.name == TRAINER_STATE:
            states.append(p)
        else:
            _classify(p, src)
    if states:  # the newest checkpoint's state holds the whole log_history
        src.trainer_state = max(states, key=lambda p: (len(_read_json(p).get("log_history", [])), p.stat().st_mtime))
    return src


def _classify(p: Path, src: Sources) -> None:
    if p.name.startswith(TB_PREFIX):
        src.tensorboard.append(p)
    elif p.suffix == ".wandb":
        src.wandb.append(p)
    elif p.name == TRAINER_STATE:
        src.trainer_state = p
    elif p.suffix in LOG_SUFFIXES and "debug" not in p.name:  # W&B's own debug logs are not the run's
        src.logs.append(p)


def _walk(root: Path, depth: int = 0) -> Iterator[tuple[Path, int]]:
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return
    for p in entries:
        if p.is_symlink() and p.is_dir():
            continue
        yield p, depth
        if p.is_dir() and depth < MAX_DEPTH and not p.name.startswith("."):
            yield from _walk(p, depth + 1)


def _read_json(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


# ---- second sources -------------------------------------------------------------------------------------------


def tensorboard_rows(path: Path) -> list[dict[str, Any]]:
    """Scalars of one TensorBoard event file, one row per step: {tag: value, ..., "_step": step}, read with
    tensorboard's own event reader (no TensorFlow needed)."""
    try:
        import numpy as np
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError as e:
        raise RlctlError(f"reading {path} needs tensorboard ({e.name} is missing).",
                         hint='pip install "rlctl[tensorboard]"') from None
    rows: dict[int, dict[str, Any]] = {}
    for event in EventFileLoader(str(path)).Load():
        if not event.HasField("summary"):
            continue
        for v in event.summary.value:
            kind = v.WhichOneof("value")
            if kind == "simple_value":
                value: Any = float(str(np.float32(v.simple_value)))  # the float32 TensorBoard holds, shortest form
            elif kind == "tensor":
                arr = tensor_util.make_ndarray(v.tensor)
                if arr.size != 1 or arr.dtype.kind not in "fiub":
                    continue
                item = arr.reshape(()).item()
                value = float(str(np.float32(item))) if arr.dtype == np.float32 else item
            else:
                continue
            rows.setdefault(int(event.step), {})[v.tag] = value
    return [{**row, "_step": step} for step, row in sorted(rows.items())]


_WB_BLOCK = 32768
_WB_HEADER = b":W&B"


def wandb_rows(path: Path) -> list[dict[str, Any]]:
    """History rows of a W&B offline run file (run-<id>.wandb): {key: value, ..., "_step": n}. The records are
    wandb's own protobuf (`wandb.proto.wandb_internal_pb2.Record`); the file's framing (LevelDB-log blocks of 32 KiB
    after a 7-byte `:W&B` header) is read here, as wandb has no Python reader of it."""
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError as e:
        raise RlctlError(f"reading {path} needs wandb ({e.name} is missing).",
                         hint='pip install "rlctl[wandb]"') from None
    data = path.read_bytes()
    if not data.startswith(_WB_HEADER):
        raise RlctlError(f"{path} is not a W&B run file (no :W&B header).")
    rows = []
    for payload in _wandb_records(data):
        rec = pb.Record()
        try:
            rec.ParseFromString(payload)
        except Exception:
            continue
        if rec.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in rec.history.item:
            key = item.key or "/".join(item.nested_key)
            try:
                row[key] = json.loads(item.value_json)
            except ValueError:
                continue
        if rec.history.HasField("step"):
            row.setdefault("_step", rec.history.step.num)
        rows.append({k: v for k, v in row.items() if not isinstance(v, (dict, list))})
    return rows


def _wandb_records(data: bytes) -> Iterator[bytes]:
    import struct

    pos, buf = 7, b""
    while pos + 7 <= len(data):
        room = _WB_BLOCK - pos % _WB_BLOCK
        if room < 7:
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # padding to the end of the block
            pos += room
            continue
        payload = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield payload
        elif kind == 2:
            buf = payload
        elif kind == 3:
            buf += payload
        elif kind == 4:
            yield buf + payload
            buf = b""


def structured_rows(src: Sources) -> dict[str, list[dict[str, Any]]]:
    """Rows of every second source, by source path."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in src.tensorboard:
        out[str(p)] = tensorboard_rows(p)
    for p in src.wandb:
        out[str(p)] = wandb_rows(p)
    if src.trainer_state is not None:
        out[str(src.trainer_state)] = [e for e in _read_json(src.trainer_state).get("log_history", [])
                                       if isinstance(e, dict)]
    return out


def rows_to_records(parse: Callable[[Any], dict[str, Any] | None], rows: list[dict[str, Any]]) -> tuple[list, int]:
    """(records, rows not understood) of one source's rows."""
    records, bad = [], 0
    for row in rows:
        try:
            rec = parse(row)
        except Exception:
            bad += 1
            continue
        if rec is None and row:
            bad += 1
        elif rec is not None:
            records.append(rec)
    return assign_steps(records, IngestState()), bad


# ---- backend detection ------------------------------------------------------------------------------------------


def _sample_lines(p: Path, window: int = SAMPLE_BYTES) -> list[str]:
    """The whole lines in the first and the last `window` bytes of a log (metrics may start after a long startup): a
    line cut by a window's edge is left out (it would be scored as garbage, and keeps a bulk reader off the rest)."""
    try:
        with p.open("rb") as fh:
            data = fh.read(window)
            size = p.stat().st_size
            if size > window and b"\n" in data:
                data = data[: data.rfind(b"\n") + 1]
            if size > 2 * window:
                fh.seek(size - window)
                tail = fh.read(window)
                data += tail[tail.find(b"\n") + 1:]
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()


def _score(parse: Any, needles: tuple[str, ...], lines: list[str], rows: dict[str, list[dict[str, Any]]],
           known: bool = True, bulk: Any = None) -> int:
    """How much of the sources a parser understands: metric names rlctl knows (known=True), else records read. Lines
    under a table's header (parsers.Header, e.g. a notebook progress table) are read with that header. `bulk`: the
    parser's bulk reader, whose records of the lines it reads are what `parse` makes of them (as the stream uses it):
    a sample of a log's own lines costs one bulk read, not a parse per line."""
    from rlctl.metrics.parsers import Header, forget_lines
    from rlctl.metrics.stream import split_segments

    done: dict[int, dict[str, Any]] = {}
    if bulk is not None and lines:
        try:
            done = bulk("\n".join(lines))
        except Exception:  # a reader's bug costs the speed, never the guess
            done = {}
        finally:
            forget_lines()
    score, context, pos = 0, "", 0
    for line in lines:
        start, pos = pos, pos + len(line) + 1
        if not context and start in done:
            rec = done[start]
            score += _understood(rec) if known else 1
            continue
        if context:
            try:
                rec = parse(context + "\n" + line)
            except Header as h:
                context = h.text
                continue
            except Exception:
                continue
            if rec:
                score += _understood(rec) if known else 1
                continue
            context = ""
        if needles and not any(n in line for n in needles):
            continue
        for seg in split_segments(line):
            try:
                rec = parse(seg)
            except Header as h:
                context = h.text
                continue
            except Exception:
                continue
            if rec:
                score += _understood(rec) if known else 1
    for rs in rows.values():
        for row in rs[:200]:
            try:
                rec = parse(row)
            except Exception:
                continue
            if rec:
                score += _understood(rec) if known else 1
    return score


def detect_backend(src: Sources, rows: dict[str, list[dict[str, Any]]], options: dict[str, Any] | None = None
                   ) -> tuple[str | None, dict[str, int], tuple[str | None, int]]:
    """(the adapter that understands the sources best or None, every adapter's score, and when none understands
    anything: an adapter that reads any log and how many records it reads). The score: metric names rlctl knows (a
    record of keys it only prefixed counts nothing) and checkpoints recognised; an adapter that reads any log
    (`reads_any_log`) is not scored. The logs' ends are looked at FIRST_SAMPLE deep first, and SAMPLE_BYTES deep
    unless that settles it: a clear winner (CLEAR names, twice the runner-up's), or none and CLEAR records of a
    custom trainer's JSON lines."""
    from rlctl.backends import available

    names = [n for n in sorted(available()) if adapter(n) is not None]
    takers = [n for n in names if getattr(adapter(n), "reads_any_log", False)]
    names = [n for n in names if n not in takers]
    ckpts = {n: _checkpoint_score(adapter(n), src) for n in names}
    whole = all(_size(p) <= FIRST_SAMPLE for p in src.logs)
    generic: tuple[str | None, int] = (None, 0)
    for window in ((FIRST_SAMPLE,) if whole else (FIRST_SAMPLE, SAMPLE_BYTES)):
        lines = [line for p in src.logs for line in _sample_lines(p, window)]
        scores: dict[str, int] = {}
        for name in names:
            ad = adapter(name)
            scores[name] = ckpts[name] + _score(ad.parse, tuple(getattr(ad, "metric_needles", ()) or ()), lines,
                                                rows, bulk=getattr(ad, "metric_bulk", None))
        ranked = sorted(scores.values(), reverse=True) + [0]
        if ranked[0] >= CLEAR and ranked[0] >= 2 * ranked[1]:
            break
        if ranked[0] == 0 and takers:
            parse = adapter(takers[0]).options_parser(options)
            generic = takers[0], _score(parse, tuple(getattr(parse, "metric_needles", ()) or ()), lines, rows,
                                        known=False, bulk=getattr(parse, "metric_bulk", None))
            if generic[1] >= CLEAR:
                break
    best = max(scores, key=lambda n: scores[n], default=None)
    if best is None or scores[best] == 0:
        return None, scores, generic
    return best, scores, (None, 0)


def _checkpoint_score(ad: Any, src: Sources) -> int:
    score = 0
    for d in src.dirs:
        try:
            score += 5 * len(ad.checkpoints(d))
        except Exception:
            continue
    return score


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def choose_backend(where: str, src: Sources, rows: dict[str, list[dict[str, Any]]], backend: str,
                   options: dict[str, Any] | None) -> tuple[str, str | None]:
    """(the backend, what to tell the user about how it was chosen). `auto` is a guess and says so; when no adapter
    recognises anything, an adapter that reads any log takes it, saying what that means."""
    if backend != "auto":
        return backend, None
    found, scores, (generic, n) = detect_backend(src, rows, options)
    if found is not None:
        others = sorted(((v, n) for n, v in scores.items() if n != found and v), reverse=True)
        rest = "; next: " + ", ".join(f"{n} {v}" for v, n in others[:2]) if others else "; no other adapter matched"
        return found, (f"backend guessed from the logs: {found} ({scores[found]} known metric names/checkpoints "
                       f"matched{rest}); give --backend NAME if that is wrong")
    if generic is not None and n:
        return generic, (f"no backend adapter recognises these logs (tried {', '.join(sorted(scores)) or 'none'}): "
                         f"read as a custom trainer's JSON lines by the `{generic}` backend; keys not in a metrics "
                         f"map are kept as {generic}/<key> (name them with --metrics-map key=name,... or "
                         "--recipe R.toml)")
    tried = ", ".join(sorted(scores)) or "none installed"
    raise AttachFailed(f"{where}: no installed backend adapter understands it (tried {tried}).",
                       hint="give --backend NAME if you know which backend wrote it")


def _understood(rec: dict[str, Any]) -> int:
    return sum(1 for k in rec if k in _KNOWN or k.startswith("eval/"))


_KNOWN = frozenset(UNIFIED)


def checkpoint_root(backend: str, src: Sources) -> Path | None:
    ad = adapter(backend)
    best, found = None, 0
    for d in src.dirs:
        try:
            n = len(ad.checkpoints(d))
        except Exception:
            continue
        if n > found:
            best, found = d, n
    return best


# ---- the command ----------------------------------------------------------------------------------------------


@dataclass
class Attached:
    run_dir: Path
    backend: str
    state: IngestState
    structured: int  # records from second sources
    structured_bad: int
    lines: int  # log lines read
    note: str | None = None  # how the backend was chosen (a guess, or the generic reader), said first

    @property
    def records(self) -> int:
        return self.state.records + self.structured


def parser_options(backend: str, recipe: str | None, metrics_map: dict[str, str] | None
                   ) -> tuple[str, dict[str, Any] | None]:
    """(the backend, its parser options) from `--recipe R.toml` (its backend, unless one is given, and its metrics
    declarations) and `--metrics-map`."""
    if recipe is None and not metrics_map:
        return backend, None
    from rlctl.backends import available

    rec = None
    if recipe is not None:
        from rlctl.recipe.loader import load

        rec = load(Path(recipe)).recipe
        if backend == "auto":
            backend = rec.backend.name
    takers = sorted(n for n in available() if getattr(adapter(n), "reads_any_log", False))
    if backend == "auto":
        if len(takers) != 1:
            raise RlctlError("--metrics-map needs --backend NAME (or --recipe).")
        backend = takers[0]
    ad = adapter(backend)
    if ad is None:
        raise RlctlError(f"unknown backend {backend!r}; installed backends: {', '.join(sorted(available()))}.")
    options = ad.parser_options(rec, metrics_map)
    if options is None and metrics_map:
        raise RlctlError(f"--metrics-map: the {backend} backend reads its own log format and takes no metrics map.",
                         hint=f"a metrics map is for a custom trainer's logs: --backend {' / '.join(takers)}")
    return backend, options


def parse_metrics_map(text: str | None) -> dict[str, str] | None:
    """`key=unified,key2=unified2` -> a dict; a malformed item is a usage error naming it."""
    if not text:
        return None
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise RlctlError(f"--metrics-map {text!r}: {item!r} is not key=name.",
                             hint="e.g. --metrics-map loss=policy_loss,avg_reward=reward/mean")
        out[key.strip()] = value.strip()
    return out


def attach(path: str, backend: str = "auto", name: str | None = None, address: str | None = None,
           root: Path | None = None, recipe: str | None = None, metrics_map: dict[str, str] | None = None
           ) -> Attached:
    backend, options = parser_options(backend, recipe, metrics_map)
    if name is not None:
        check_run_name(name)
    p = Path(path).expanduser()
    if not p.exists():
        if address or RAY_JOB.match(path):
            return _attach_ray_job(path, backend, name, address, root, options)
        raise RlctlError(f"{path}: no such file or directory.",
                         hint="give a log file, a directory of logs or a backend's output, or a Ray job id "
                              "with --address")
    p = p.resolve()
    src = find_sources(p)
    if src.empty() and not src.dirs:
        raise RlctlError(f"{p}: no logs, TensorBoard event files, W&B runs or trainer_state.json found.")
    rows = structured_rows(src)
    backend, note = choose_backend(str(p), src, rows, backend, options)
    ad = adapter(backend)
    if ad is None:
        from rlctl.backends import available

        raise RlctlError(f"unknown backend {backend!r}; installed backends: {', '.join(sorted(available()))}.")
    run_dir = create_run_dir(root or runs_root(), name or _default_name(p))
    _write_parser_options(run_dir, ad, options)
    _write_in_loop_eval(run_dir, ad, recipe)
    ckpt = _recipe_checkpoints(ad, recipe, p) or checkpoint_root(backend, src)
    _write_recipe(run_dir, backend, ckpt)
    _link_logs(run_dir, src.logs)
    mtimes = [q.stat().st_mtime for q in [*src.logs, *src.tensorboard, *src.wandb] if q.exists()]
    write_state(run_dir, backend=backend, status="attached", executor="attached", attached_from=str(p),
                started_at=min(mtimes) if mtimes else time.time(), ended_at=max(mtimes) if mtimes else None,
                sources={"logs": [str(q) for q in src.logs], "tensorboard": [str(q) for q in src.tensorboard],
                         "wandb": [str(q) for q in src.wandb],
                         "trainer_state": str(src.trainer_state) if src.trainer_state else None,
                         "checkpoints": str(ckpt) if ckpt else None},
                **_recipe_total(ad, recipe))
    st = ingest(run_dir, backend, final=True) or IngestState()
    structured, bad = 0, 0
    from rlctl.evals import in_loop

    rename = in_loop.renamer(ad, run_dir)
    for rs in rows.values():
        recs, nbad = rows_to_records(ad.log_parser(run_dir), rs)
        if rename is not None:
            recs = [rename(r) for r in recs]
        write_records(run_dir / METRICS, recs)
        structured += len(recs)
        bad += nbad
    return Attached(run_dir, backend, st, structured, bad, st.lines, note)


def _recipe_total(ad: Any, recipe: str | None) -> dict[str, int]:
    """With --recipe: its step count in the steps the backend logs, as a launch records it (status: step N/total,
    ETA); {} when the recipe does not say it without its data."""
    if recipe is None:
        return {}
    from rlctl.recipe.loader import load

    try:
        rec = load(Path(recipe)).recipe
        total = ad.total_steps(rec, None)
        per = max(int(ad.optimizer_steps_per_logged_step(rec)), 1)
    except Exception:  # a count that needs the dataset, a recipe this release cannot plan: no total, as before
        return {}
    return {"total_steps": -(-total // per), "optimizer_steps": total} if total else {}


def _recipe_checkpoints(ad: Any, recipe: str | None, p: Path) -> Path | None:
    """With --recipe: its checkpoint.dir (relative: inside the attached directory, where the trainer ran), its
    layout told to the adapter as a launch would; None when it holds no checkpoint."""
    if recipe is None:
        return None
    from rlctl.recipe.loader import load

    rec = load(Path(recipe)).recipe
    d = Path(rec.checkpoint.dir).expanduser()
    if not d.is_absolute():
        if not p.is_dir():
            return None
        d = p / d
    if not d.is_dir():
        return None
    ad.describe_checkpoints(rec, d)
    return d if ad.checkpoints(d) else None


def _write_in_loop_eval(run_dir: Path, ad: Any, recipe: str | None) -> None:
    """With --recipe: what the backend's in-loop eval ran, as the recipe renders it, so that its metrics are named
    eval/<set>/<mode> (rlctl.evals.in_loop); without one, the backend's own names stay."""
    if recipe is None or not hasattr(ad, "in_loop_eval_run"):
        return
    from rlctl.evals.in_loop import write_context
    from rlctl.recipe.loader import load

    try:
        ctx = ad.in_loop_eval_run(load(Path(recipe)).recipe)
    except Exception:  # a recipe this machine cannot render (another release, paths elsewhere): names stay raw
        return
    write_context(run_dir, ctx)


def _write_parser_options(run_dir: Path, ad: Any, options: dict[str, Any] | None) -> None:
    """The parser options of an adapter that reads any log (its defaults when none were given), for every later
    ingest of the run (--follow, status)."""
    from rlctl.backends.base import PARSER_OPTIONS

    if options is None and getattr(ad, "reads_any_log", False):
        options = ad.parser_options(None, None)
    if options is not None:
        (run_dir / PARSER_OPTIONS).write_text(json.dumps(options, indent=2) + "\n")


def _attach_ray_job(job_id: str, backend: str, name: str | None, address: str | None, root: Path | None,
                    options: dict[str, Any] | None = None) -> Attached:
    from rlctl.executors.ray import catch_up_logs, job_status, normalize_address

    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,200}", job_id):
        raise RlctlError(f"{job_id!r}: neither an existing path nor a Ray job id (letters, digits, '_', '-', '.').",
                         hint="give a log file, a directory of logs or a backend's output, or a Ray job id "
                              "with --address")
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise RlctlError(f"{job_id}: not a file; as a Ray job id it needs the cluster's dashboard address.",
                         hint="rlctl attach JOB_ID --address http://HEAD:8265 (or set RAY_ADDRESS)")
    address = normalize_address(address)
    js = job_status(address, job_id)
    if js is None:
        raise RlctlError(f"Ray job {job_id} not found at {address} (or the cluster is not reachable).")
    run_dir = create_run_dir(root or runs_root(), name or job_id)
    state = {"executor": "ray", "ray_address": address, "ray_job_id": job_id, "status": "running",
             "started_at": time.time(), "attached_from": f"ray:{job_id}"}
    write_state(run_dir, **state)
    catch_up_logs(run_dir, state)
    backend, note = choose_backend(f"Ray job {job_id}", find_sources(run_dir / LOG), {}, backend, options)
    if adapter(backend) is None:
        raise RlctlError(f"unknown backend {backend!r}.")
    _write_parser_options(run_dir, adapter(backend), options)
    _write_recipe(run_dir, backend, None)
    from rlctl.executors.ray import TERMINAL as terminal

    write_state(run_dir, backend=backend, ray_job_status=js,
                **({"status": terminal[js], "ended_at": time.time()} if js in terminal else {}))
    st = ingest(run_dir, backend, final=js in terminal) or IngestState()
    return Attached(run_dir, backend, st, 0, 0, st.lines, note)


def _default_name(p: Path) -> str:
    stem = p.stem if p.is_file() else p.name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:RUN_NAME_MAX].rstrip("-._") or "attached"


def _write_recipe(run_dir: Path, backend: str, ckpt: Path | None) -> None:
    lines = ["# attached by `rlctl attach`: a record of where the run lives, not a launchable recipe",
             "[backend]", f"name = {json.dumps(backend)}"]
    if ckpt is not None:
        lines += ["", "[checkpoint]", f"dir = {json.dumps(str(ckpt))}"]
    (run_dir / "recipe.toml").write_text("\n".join(lines) + "\n")


def _link_logs(run_dir: Path, logs: list[Path]) -> None:
    """stdout.log -> the biggest log; every other log under logs/ (symlinks: they keep growing)."""
    if not logs:
        return
    main = max(logs, key=lambda q: q.stat().st_size if q.exists() else 0)
    (run_dir / LOG).symlink_to(main)
    rest = [q for q in logs if q != main]
    if rest:
        (run_dir / SOURCES).mkdir()
        for i, q in enumerate(rest):
            (run_dir / SOURCES / f"{i:02d}-{q.name}").symlink_to(q)


def follow(run_dir: Path, backend: str, idle_exit: float = 0.0, interval: float = 1.0,
           echo: Callable[[str], None] = print) -> IngestState:
    """Keep ingesting the attached logs while they grow (a Ray job's through the job API, until it ends); stop on
    Ctrl-C, or after `idle_exit` seconds without growth (0 = never). The run shows as running meanwhile."""
    import contextlib

    state = read_state(run_dir)
    ray_job = state.get("executor") == "ray"
    if ray_job and state.get("status") not in ACTIVE:
        return ingest(run_dir, backend, final=True) or IngestState()
    write_state(run_dir, status="running", supervisor_pid=os.getpid(), supervisor_create_time=_create_time(),
                ended_at=None)
    st = IngestState()
    last_size, last_change = -1, time.time()
    try:
        while True:
            if ray_job and _ray_job_ended(run_dir, state):
                break
            st = ingest(run_dir, backend) or st
            size = sum(q.stat().st_size for q in _followed(run_dir))
            if size != last_size:
                if last_size >= 0:
                    echo(f"{run_dir.name}: {st.records} records, step {_last_step(run_dir)}")
                last_size, last_change = size, time.time()
            elif idle_exit and time.time() - last_change >= idle_exit:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        with contextlib.suppress(Exception):
            st = ingest(run_dir, backend, final=True) or st
        if read_state(run_dir).get("status") in ACTIVE:
            # a Ray job goes on without us: status asks the job API from now on
            write_state(run_dir, supervisor_pid=None, **({} if ray_job else {"status": "attached",
                                                                              "ended_at": time.time()}))
    return st


def _ray_job_ended(run_dir: Path, state: dict[str, Any]) -> bool:
    """Copy the job's new log into stdout.log; True (and the state recorded) once the job has ended."""
    from rlctl.executors.ray import TERMINAL, catch_up_logs, job_status

    catch_up_logs(run_dir, state)
    js = job_status(state["ray_address"], state["ray_job_id"])
    if js in TERMINAL:
        catch_up_logs(run_dir, state)
        write_state(run_dir, status=TERMINAL[js], ended_at=time.time(), ray_job_status=js, supervisor_pid=None)
        return True
    return False


def _followed(run_dir: Path) -> list[Path]:
    from rlctl.metrics.stream import log_files

    out = []
    for n in log_files(run_dir):
        try:
            (run_dir / n).stat()
            out.append(run_dir / n)
        except OSError:
            continue
    return out


def _create_time() -> float | None:
    from rlctl.runs.state import process_create_time

    return process_create_time(os.getpid())


def _last_step(run_dir: Path) -> int | None:
    from rlctl.metrics.stream import tail_records

    recs = tail_records(run_dir / METRICS, 64 * 1024)
    return recs[-1]["step"] if recs else None


def report(a: Attached) -> tuple[str, int]:
    """The summary printed by `rlctl attach` and its exit code: non-zero when a non-empty log gave no record."""
    parts = [f"attached {a.run_dir} ({a.backend}): {a.records} records"
             f" ({a.state.records} from {a.state.lines} log lines" + (f", {a.structured} from TensorBoard/W&B/trainer "
                                                                 f"state" if a.structured else "") + ")"]
    if a.note:
        parts.insert(0, a.note)
    msg = unparsed_report(a.state)
    if msg:
        parts.append(msg)
    if a.structured_bad:
        parts.append(f"{a.structured_bad} TensorBoard/W&B/trainer-state rows were not understood")
    code = 0
    if a.records == 0 and (a.state.lines or a.structured_bad):
        parts.append(f"no metrics record could be read: is it a {a.backend} log? (see docs/metrics.md)")
        code = EXIT_CHECK_FAILED
    return "\n".join(parts), code
