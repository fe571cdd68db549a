"""The components of a run and their own logs (`rlctl logs RUN --component NAME`): what the backend's adapter declares
(trainer, inference, orchestrator: `Backend.log_components`) and rlctl's own — its supervisor (supervisor.log, and
the events it recorded) and Ray (the head rlctl started for the run: ray-head.log and the head's session logs).

Logs are read from their end in bounded pieces, so a component's tail costs the same on a log of any size.
"""

from __future__ import annotations

import contextlib
import glob
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlctl.core.components import Component, ray_actor
from rlctl.errors import RlctlError

LOG = "stdout.log"
SUPERVISOR_LOG = "supervisor.log"
COMPONENTS = "components.json"  # the adapter's declaration, written at launch: read without parsing the recipe
TRAINER = Component("trainer", main_log=True, where="the run's stdout.log")


def write_components(run_dir: Path, backend: Any, recipe: Any) -> None:
    """Record where each component of the run logs (at launch: the adapter and the recipe are at hand)."""
    comps = backend.log_components(recipe)
    with contextlib.suppress(OSError):
        (run_dir / COMPONENTS).write_text(json.dumps({n: asdict(c) for n, c in comps.items()}, indent=1) + "\n")


def _recorded(run_dir: Path) -> dict[str, Component] | None:
    try:
        data = json.loads((run_dir / COMPONENTS).read_text())
        return {str(n): Component(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})
                for n, c in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _declared(run_dir: Path, backend: str) -> dict[str, Component]:
    """The adapter's components for a run launched without a record of them (older, attached): from its recipe."""
    try:
        from rlctl.backends import get_backend
        from rlctl.recipe.loader import load

        return get_backend(backend).log_components(load(run_dir / "recipe.toml").recipe)
    except Exception:  # no recipe (an attached run), or one this rlctl cannot read: its output is all there is
        return {"trainer": TRAINER}


def run_components(run_dir: Path, state: dict[str, Any] | None = None, light: bool = False) -> dict[str, Component]:
    """The run's components by name: the adapter's (as recorded at launch, else from the run's recipe; `light`:
    never parse a recipe, the status table's fast path) and rlctl's own."""
    from rlctl.core.state import read_state

    state = read_state(run_dir) if state is None else state
    out: dict[str, Component] = {}
    recorded = _recorded(run_dir)
    backend = state.get("backend")
    if recorded is not None:
        out.update(recorded)
    elif backend and not light and (run_dir / "recipe.toml").is_file():
        out.update(_declared(run_dir, str(backend)))
    else:
        out["trainer"] = TRAINER
    if state.get("executor") == "ray" or any(c.ray_actors for c in out.values()):
        files = ["ray-head.log"]
        temp = state.get("ray_head_temp_dir")
        if isinstance(temp, str) and temp:
            files += [f"{temp}/session_latest/logs/raylet.out", f"{temp}/session_latest/logs/gcs_server.out"]
            where = f"ray-head.log and the run's Ray head's session logs ({temp}/session_latest/logs)"
        else:  # the backend started Ray itself (the local executor): Ray's own default place on this machine
            files += ["/tmp/ray/session_latest/logs/raylet.out", "/tmp/ray/session_latest/logs/gcs_server.out"]
            where = "Ray's latest session on this machine (/tmp/ray/session_latest/logs): the run started no head"
        out["ray"] = Component("ray", files=tuple(files), where=where)
    if (run_dir / ".launch.json").is_file() or (run_dir / SUPERVISOR_LOG).is_file() or state.get("supervisor_pid"):
        out["supervisor"] = Component("supervisor", files=(SUPERVISOR_LOG,),
                                      where="supervisor.log: rlctl's supervisor of the run (restarts, stalls, disk)")
    return out


def component(run_dir: Path, name: str, state: dict[str, Any] | None = None) -> Component:
    """One component, or the error (exit 2) naming those the run has."""
    comps = run_components(run_dir, state)
    if name in comps:
        return comps[name]
    from rlctl.core.state import read_state

    backend = (state if state is not None else read_state(run_dir)).get("backend") or "unknown"
    have = ", ".join(comps)
    raise RlctlError(f"{run_dir.name} ({backend}) has no component {name!r}; it has: {have}.",
                     hint=f"rlctl logs {run_dir.name} --component {next(iter(comps))}"
                     + (" (a command recipe names others in [backend.command] logs)" if backend == "command" else ""))


def files_of(run_dir: Path, comp: Component) -> list[Path]:
    """The component's files that exist, in the order declared (globs expanded, oldest first)."""
    out: list[Path] = []
    for f in comp.files:
        p = Path(f) if Path(f).is_absolute() else run_dir / f
        if any(ch in str(p) for ch in "*?["):
            out += sorted((Path(x) for x in glob.glob(str(p))), key=lambda q: q.stat().st_mtime)
        elif p.is_file():
            out.append(p)
    return out


def _tail_bytes(path: Path, max_bytes: int, since: int = 0) -> tuple[bytes, bool, int]:
    """The last `max_bytes` of a file (cut at a line start), whether that is the whole file, and how many lines
    before `since` (a byte offset: where an attempt began writing) were left out of it."""
    with path.open("rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        start = max(size - max_bytes, 0)
        fh.seek(start)
        data = fh.read(max_bytes)
    if start:
        head, _, data = data.partition(b"\n")
        start += len(head) + 1
    skipped = 0
    if since > start:
        cut = since - start
        skipped = len(data[:cut].decode("utf-8", "replace").splitlines())
        data = data[cut:]
    return data, start == 0, skipped


def _keep(comp: Component, line: str) -> bool:
    actor = ray_actor(line)
    if comp.ray_actors:
        return actor in comp.ray_actors
    return actor not in comp.other_actors if actor else True


def tail(run_dir: Path, comp: Component, max_bytes: int = 1 << 20, since: int = 0
         ) -> list[tuple[str, int | None, str]]:
    """The component's last lines as (source, 1-based line number when the whole file was read, text), oldest
    first: its files, then its lines of the run's stdout.log (`since`: only those written from that byte of it on,
    i.e. by the current attempt)."""
    out: list[tuple[str, int | None, str]] = []
    sources = files_of(run_dir, comp)
    if comp.ray_actors or comp.main_log:
        sources.append(run_dir / LOG)
    for p in sources:
        if not p.is_file():
            continue
        try:
            data, whole, skipped = _tail_bytes(p, max_bytes, since if p == run_dir / LOG else 0)
        except OSError:
            continue
        name = p.name if p.parent == run_dir else str(p.relative_to(run_dir)) if run_dir in p.parents else str(p)
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1 + skipped):
            if (comp.ray_actors or comp.other_actors) and p.name == LOG and p.parent == run_dir \
                    and not _keep(comp, line):
                continue
            out.append((name, n if whole else None, line))
    return out
