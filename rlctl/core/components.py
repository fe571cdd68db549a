"""A run's components and where each writes its own log: the trainer, the inference engine, an orchestrator, Ray, and
rlctl's supervisor. Adapters declare theirs (`Backend.log_components`); rlctl.runs.components adds rlctl's own and
reads them for `rlctl logs RUN --component`, the causes of death and the stall evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME = re.compile(r"[A-Za-z][\w-]{0,40}")  # a component's name

# Ray's driver prints each worker's line as `(Actor pid=N[, ip=A]) line`, the prefix wrapped in colour codes unless
# RAY_COLOR_PREFIX=0 (ray/_private/worker.py print_worker_logs); a task's line names the task, a raylet's has no pid
RAY_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)*\((?:(?P<actor>[A-Za-z_][\w.]*) )?pid=(?P<pid>[^,)]+)(?:, ip=[^)]*)?\)"
                        r"(?:\x1b\[[0-9;]*m)* ?")


@dataclass(frozen=True)
class Component:
    """One component of a run and its own log: files it writes, and/or the lines of the run's stdout.log that Ray's
    driver printed for some actors (or all the other lines: the driver and the training actors)."""

    name: str  # trainer | inference | orchestrator | ray | supervisor
    files: tuple[str, ...] = ()  # relative to the run directory, or absolute; `*` globs allowed
    ray_actors: tuple[str, ...] = ()  # stdout.log lines printed by these Ray actors
    main_log: bool = False  # the run's stdout.log itself, without the lines of `other_actors`
    other_actors: tuple[str, ...] = ()
    process: str | None = None  # a regex over its process's command line: rlctl sees when it is gone
    where: str = ""  # in words: where the backend writes it


def ray_actor(line: str) -> str | None:
    """The Ray actor (or task) whose output this stdout.log line is, or None (the driver's own line)."""
    m = RAY_PREFIX.match(line)
    if m is None:
        return None
    return m.group("actor") or ""
