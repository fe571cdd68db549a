"""Finding runs and knowing their true state (running, finished, failed, stopped, stalled, lost).

state.json is written by whoever owns the run (the supervisor); if that owner dies, the state is recovered from
the processes themselves: a run whose recorded processes are gone but whose state still says running is `lost`
unless its log shows how it ended.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError

STATE = "state.json"
ACTIVE = ("queued", "starting", "running", "stopping", "restarting")  # queued: a batch job waits for its allocation


ATTEMPTS = "attempts"
# a run launched on another machine keeps the recipe as this machine resolved it (its paths, not the other machine's
# copies of the same files): its settings when it is compared with this machine's runs
HERE_RECIPE = "recipe.laptop.toml"
EXIT_RECORD = "exit.json"


@dataclass(frozen=True)
class RunHandle:
    """Lives in state.json under "handle": enough for a new process to find the attempt again."""

    executor: str  # registry key
    ref: dict[str, Any] = field(default_factory=dict)  # {pid, pgid, create_time} or {address, job_id}
    attempt: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RunHandle | None:
        h = state.get("handle")
        if not isinstance(h, dict) or not isinstance(h.get("executor"), str):
            return None
        return cls(h["executor"], dict(h.get("ref") or {}), int(h.get("attempt") or 1))


def attempt_dir(run_dir: Path, attempt: int) -> Path:
    return run_dir / ATTEMPTS / str(attempt)


def read_exit_record(run_dir: Path, attempt: int) -> dict[str, Any] | None:
    """What the wrapper around the child wrote when the child ended: {"exit_code", "ended_at"}, or None."""
    try:
        rec = json.loads((attempt_dir(run_dir, attempt) / EXIT_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and "exit_code" in rec else None


def runs_root() -> Path:
    """Where run directories live: $RLCTL_RUNS_DIR, else ./runs — made absolute here, once, against the directory
    the command was typed in: a run directory is handed to processes that run elsewhere (the supervisor and eval
    jobs start in the run directory), so a relative one would name another place there."""
    return Path(os.environ.get("RLCTL_RUNS_DIR", "runs")).absolute()


# said wherever a run is looked for and not found: a run lives where it was launched, not in one place per user
WHERE_RUNS_LIVE = "runs live in ./runs of the directory rlctl was run from (or $RLCTL_RUNS_DIR)"
FIND_A_RUN = ("cd to the directory you launched from, or give the run's directory (rlctl status PATH/runs/RUN), "
              "or set RLCTL_RUNS_DIR to that runs directory")


# The type each well-known field must have; a damaged state.json (hand-edited, half-written, another tool's)
# loses the fields that do not fit instead of breaking every command that reads it.
_NUMBER = (int, float)
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "started_at": _NUMBER, "ended_at": _NUMBER, "pid_create_time": _NUMBER, "supervisor_create_time": _NUMBER,
    "pid": (int,), "pgid": (int,), "supervisor_pid": (int,), "ray_head_pid": (int,), "total_steps": (int,),
    "optimizer_steps": (int,),
    "exit_code": (int,), "status": (str,), "backend": (str,), "executor": (str,), "name": (str,),
    "version": (str,), "ray_job_id": (str,), "ray_address": (str,), "wandb_run_id": (str,),
    "attempt": (int,), "attempts": (list,), "handle": (dict,), "restart": (dict,),
}


_PIDS = ("pid", "pgid", "supervisor_pid", "ray_head_pid")


def _sane(data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        want = FIELD_TYPES.get(k)
        if want is not None and v is not None and (isinstance(v, bool) or not isinstance(v, want)):
            continue
        if isinstance(v, float) and v != v:  # NaN
            continue
        if k in _PIDS and v is not None and not 0 < v < 2**22:  # beyond any pid_max: not a process
            continue
        if isinstance(v, list) and k == "attempts":  # a list of records: anything else in it is damage
            v = [a for a in v if isinstance(a, dict)]
        out[k] = v
    return out


def read_state(run_dir: Path) -> dict[str, Any]:
    try:
        path = run_dir / STATE
        if not path.is_file():  # a FIFO or device named state.json would block or never end
            return {}
        with path.open("rb") as fh:
            data = json.loads(fh.read(8 * 1024 * 1024))
        return _sane(data) if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


STATE_LOCK = ".state.lock"  # beside state.json: one writer at a time, across processes and nodes
LOCK_WAIT = 10.0  # seconds a writer waits for the lock, then writes anyway: a holder stopped (SIGSTOP, a hung
# network filesystem) must not hang every other writer; a holder holds it for one read and one rename

_thread_lock = threading.RLock()
# run directories whose state lock this process holds (the thread in write_state), each with the updates that a
# signal handler wrote while it did: that thread merges them again after its own rename
_held: dict[str, list[dict[str, Any]]] = {}
_tmp_seq = itertools.count()


@contextlib.contextmanager
def _state_lock(run_dir: Path) -> Iterator[None]:
    try:
        fh = open(run_dir / STATE_LOCK, "a")  # noqa: SIM115 - closed below; closing releases the lock
    except OSError:  # no lock file (a read-only or full disk): the write is tried as it comes
        yield
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT
        delay = 0.002
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    break  # no locks on this filesystem (ENOLCK), or a stuck holder: write anyway
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        yield
    finally:
        fh.close()


def _merge_write(run_dir: Path, change: Callable[[dict[str, Any]], dict[str, Any] | None]
                 ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    state = read_state(run_dir)
    updates = change(dict(state))
    if updates is None:
        return state, None
    state.update(updates)
    tmp = run_dir / f".{STATE}.{os.getpid()}.{next(_tmp_seq)}.tmp"  # a handler's write never renames ours
    try:
        tmp.write_text(json.dumps(state, indent=2, default=str) + "\n")
        os.replace(tmp, run_dir / STATE)
    except OSError:  # a full disk: state.json stays as it was, no half-written temp file is left behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return state, updates


def _merged(late: list[dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The updates a signal handler made (oldest first, the newest wins), taken off the list."""
    again: dict[str, Any] = {}
    for u in late:
        again.update(u)
    late.clear()
    return lambda now: again


def update_state(run_dir: Path, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
    """Read, decide and write state.json under the run's state lock: `change` is given the state as it is now and
    returns the updates to merge into it (None: nothing to write). state.json has more than one writer (the
    run's supervisor; `rlctl status` where the executor learns what only it can tell, e.g. a SLURM job's queue state
    from the login node while the job's own rlctl writes the same file): no writer loses what another wrote, and a
    writer that decides from the state decides on the state as it is. Returns the state as written (or read)."""
    first = not (run_dir / STATE).exists()
    key = str(run_dir.absolute())
    with _thread_lock:
        late = _held.get(key)
        if late is not None:  # a signal handler, in the middle of this process's own write of this file
            state, updates = _merge_write(run_dir, change)
            if updates:
                late.append(updates)
            return state
        # registered before the lock is taken and after it is released: a handler never waits on our own lock
        _held[key] = late = []
        try:
            with _state_lock(run_dir):
                state, _ = _merge_write(run_dir, change)
                while late:  # written before our rename replaced the file: merged again
                    state, _ = _merge_write(run_dir, _merged(late))
        finally:
            del _held[key]
        if late:  # written between the lock's release and now, without it: once more under it
            state = update_state(run_dir, _merged(late))
    if first:
        from rlctl.core.run_places import remember

        remember(run_dir.parent)
    return state


def write_state(run_dir: Path, **updates: Any) -> dict[str, Any]:
    """Merge updates into state.json atomically (write a temp file, then rename) under the run's state lock
    (update_state). A run directory's first state.json records its runs directory as one of this user's
    (rlctl.core.run_places: found by name from anywhere)."""
    return update_state(run_dir, lambda now: updates)


def process_alive(pid: int | None, create_time: float | None = None) -> bool:
    """True if `pid` runs and (when known) is the same process as recorded, not a reused pid."""
    if not pid:
        return False
    try:
        import psutil

        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(p.create_time() - create_time) < 1.0
    except Exception:
        return False


def process_create_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def list_runs(root: Path | None = None) -> list[Path]:
    root = root or runs_root()
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if p.is_dir() and (p / STATE).is_file()]

    def started(p: Path) -> float:  # a damaged state.json in one run must not break the listing of all
        t = read_state(p).get("started_at")
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0

    return sorted(runs, key=started)


def check_run_ref(ref: str) -> str:
    """A run reference that can name a run: an empty one (`rlctl stop "$RUN"` with RUN unset) is a prefix of every
    run's name and, as a path, the working directory: an error, never a match."""
    if not ref.strip():
        raise RlctlError(f"{ref!r} is an empty run name: it would match every run.",
                         hint="give a run's name, a unique prefix of it or its directory (rlctl status lists the "
                              "runs; in a script, check that the variable holding the name is set)")
    return ref


def find_run(ref: str, root: Path | None = None) -> Path:
    """A run by directory path, full name, or unique prefix of its name: in ./runs (or `root`), else — with no
    `root` given — in the other runs directories this user's runs were made in (rlctl.core.run_places)."""
    p = Path(check_run_ref(ref))
    if p.is_dir() and (p / STATE).is_file():
        return p.absolute()  # as runs_root: the run's directory must mean the same in a process started elsewhere
    explicit = root is not None
    root = (root or runs_root()).absolute()
    runs = list_runs(root)
    exact = [r for r in runs if r.name == ref]
    if exact:
        return exact[0]
    matches = [r for r in runs if r.name.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    named = _given_name(ref, matches)
    if len(named) == 1:
        return named[0]
    if len(matches) > 1:
        raise RlctlError(f"{ref!r} matches {len(matches)} runs: {', '.join(r.name for r in matches[:5])}.",
                         hint="give more of the name")
    elsewhere = [] if explicit or "/" in ref else _elsewhere(ref, root)
    named = _given_name(ref, elsewhere) if len(elsewhere) > 1 else elsewhere
    if len(named) == 1:
        return named[0]
    if elsewhere:
        raise RlctlError(f"{ref!r} names {len(elsewhere)} runs elsewhere (in runs directories other than {root}): "
                         + ", ".join(str(r) for r in elsewhere[:5]) + ".",
                         hint="give the run's directory (rlctl status PATH), or cd to the directory it was launched "
                              "from")
    if runs:
        meant = _meant(ref, runs)
        raise NoSuchRun(f"no run {ref!r} in {root}, nor in another runs directory of yours."
                        + (f" Did you mean `{meant}`?" if meant else ""),
                        hint=f"recent runs: {', '.join(r.name for r in runs[-5:])} (see rlctl status --all)",
                        meant=meant)
    raise NoSuchRun(f"no run {ref!r} in {root}, nor in another runs directory of yours: {WHERE_RUNS_LIVE}.",
                    hint=FIND_A_RUN)


class NoSuchRun(RlctlError):
    """No run answers to a reference; `meant`: the run's name (as given to --name, else the directory's) it is a slip
    of, when one is close."""

    def __init__(self, message: str, *, hint: str | None = None, meant: str | None = None):
        super().__init__(message, hint=hint)
        self.meant = meant


def _meant(ref: str, runs: list[Path]) -> str | None:
    """The run a mistyped reference meant (`bs5` for bs4-<date>-<time>): its given name where that names one run,
    else its directory's name."""
    import difflib

    given: dict[str, list[str]] = {}
    for r in runs:
        m = re.fullmatch(r"(.+?)-\d{8}-\d{6}(-\d+)?", r.name)
        given.setdefault(m.group(1) if m else r.name, []).append(r.name)
    close = difflib.get_close_matches(ref, list(given), n=1, cutoff=0.6)
    if close:
        names = given[close[0]]
        return close[0] if len(names) == 1 or close[0] in names else names[-1]
    close = difflib.get_close_matches(ref, [r.name for r in runs], n=1, cutoff=0.6)
    return close[0] if close else None


def _given_name(ref: str, runs: list[Path]) -> list[Path]:
    """The runs `ref` is the given name of (`--name a27`: a27-<date>-<time>): that name wins over the names it is a
    prefix of (`--name a27r`)."""
    return [r for r in runs if re.fullmatch(re.escape(ref) + r"-\d{8}-\d{6}(-\d+)?", r.name)]


def _elsewhere(ref: str, here: Path) -> list[Path]:
    """Runs named `ref` (exactly, else by a prefix) in the other recorded runs directories; names only, no state
    read but the file's presence: cheap with many runs."""
    from rlctl.core.run_places import known_roots

    exact: list[Path] = []
    prefix: list[Path] = []
    for other in known_roots():
        if other == here:
            continue
        try:
            names = [n for n in os.listdir(other) if n.startswith(ref)]
        except OSError:
            continue
        for n in sorted(names):
            if (other / n / STATE).is_file():
                (exact if n == ref else prefix).append(other / n)
    return exact or prefix
