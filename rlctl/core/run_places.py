"""Where this user's runs live: the runs directories rlctl has made a run record in, so a run is found by name from
any directory (find_run's fallback after ./runs).

One absolute path per line in `$XDG_STATE_HOME/rlctl/runs-dirs` (default `~/.local/state/rlctl/runs-dirs`): the
parent directory of each run directory, never anything of a run's content (no names, no recipes, no secrets).
Written when a run directory gets its first state.json (launch, attach, sweep variants, a remote run's local
record); a directory that was moved or deleted is skipped when read and dropped at the next write. The record is a
convenience: any failure to read or write it is silent and changes nothing else.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

RECORD = "runs-dirs"
MAX_DIRS = 1000  # far above any user's projects; keeps a runaway script from growing the file without end


def record_file() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or ""
    state = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "state"
    return state / "rlctl" / RECORD


def _read() -> list[str]:
    try:
        f = record_file()
        if not f.is_file():  # missing, or a FIFO that would block
            return []
        return [ln for ln in f.read_text(errors="replace").splitlines() if ln.startswith("/")]
    except OSError:
        return []


def known_roots() -> list[Path]:
    """The recorded runs directories that still exist, most recently recorded last."""
    out: dict[Path, None] = {}
    for line in _read():
        p = Path(line)
        with contextlib.suppress(OSError):
            if p.is_dir():
                out.pop(p, None)
                out[p] = None
    return list(out)


def remember(root: Path) -> None:
    """Add a runs directory to the record (absolute; once): the ones that are gone are dropped on the way."""
    root = root.absolute()
    lines = _read()
    if str(root) in lines:
        return
    keep = [ln for ln in lines if _is_dir(ln)][-(MAX_DIRS - 1):] + [str(root)]
    with contextlib.suppress(OSError):
        f = record_file()
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{RECORD}.{os.getpid()}.tmp")
        tmp.write_text("".join(f"{x}\n" for x in keep))
        os.replace(tmp, f)


def _is_dir(line: str) -> bool:
    try:
        return Path(line).is_dir()
    except OSError:
        return False
