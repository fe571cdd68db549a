"""`[executor.slurm]`: where and how a run's job is placed on a SLURM cluster (the executor's own recipe table,
validated like a backend's `[backend.<name>]`). `rlctl launch --partition/--account/--time` set the same keys."""

from __future__ import annotations

import re
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# SLURM's time formats (sbatch --time): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$")
_WORD = re.compile(r"^[A-Za-z0-9_.,:=+-]+$")  # partition, account, gres, qos: no shell or newline in them


def time_seconds(value: str) -> int | None:
    """sbatch's --time in seconds (None: unlimited)."""
    v = value.strip()
    if v.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days = 0
    if "-" in v:
        d, v = v.split("-", 1)
        days = int(d)
        parts = [int(x) for x in v.split(":")] + [0] * (3 - len(v.split(":")))  # D-H[:M[:S]]
        h, m, s = parts[:3]
    else:
        parts = [int(x) for x in v.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0  # M
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]  # M:S
        else:
            h, m, s = parts
    return ((days * 24 + h) * 60 + m) * 60 + s


class SlurmOptions(BaseModel):
    """What sbatch is asked for. Every key is optional: the cluster's defaults apply to what is not set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_mistyped_scalars(cls, v: Any, info: ValidationInfo) -> Any:
        from rlctl.recipe.schema import refuse_mistyped_scalar  # the recipe's one check (`ray_port = true` is no port)

        return refuse_mistyped_scalar(cls, v, info.field_name)

    partition: str | None = Field(default=None, description="sbatch --partition.")
    account: str | None = Field(default=None, description="sbatch --account.")
    qos: str | None = Field(default=None, description="sbatch --qos.")
    time: str | None = Field(default=None, description="sbatch --time (e.g. 4:00:00, 2-00:00:00): the job's limit. "
                             "Before it the job checkpoints and requeues itself (see signal_before).")
    gres: str | None = Field(default=None, description="sbatch --gres per node (default: gpu:<resources."
                             "gpus_per_node> when the recipe uses GPUs).")
    cpus_per_node: int | None = Field(default=None, ge=1, description="sbatch --cpus-per-task (one task per node).")
    mem: str | None = Field(default=None, description="sbatch --mem per node (e.g. 500G).")
    constraint: str | None = Field(default=None, description="sbatch --constraint (node features).")
    setup: str | None = Field(default=None, description="Shell line(s) run in the job before rlctl, e.g. `module load "
                              "cuda/12.4 && source ~/venvs/rl/bin/activate`, or a container's `enroot start ...`.")
    python: str | None = Field(default=None, description="The interpreter with rlctl in the job (default: the one "
                               "that runs rlctl here; after `setup`, e.g. `python3`).")
    requeue: bool = Field(default=True, description="sbatch --requeue: a preempted job or one that failed with its "
                          "node comes back and resumes from the last complete checkpoint.")
    signal_before: int = Field(default=300, ge=0, le=86400, description="Seconds before the time limit at which "
                               "SLURM signals the job (--signal=B:USR1@N): it checkpoints, stops and requeues itself. "
                               "0: no signal.")
    join_timeout: int = Field(default=300, ge=10, le=7200, description="Seconds every node has to join the job's "
                              "Ray cluster before the job fails naming the nodes that did not.")
    ray_port: int = Field(default=6379, ge=1024, le=65535, description="The Ray head's GCS port on the first node.")
    rdzv_port: int = Field(default=29500, ge=1024, le=65535, description="torchrun's rendezvous port on the first "
                           "node.")
    sbatch: list[str] = Field(default_factory=list, description="More sbatch options, verbatim "
                              "(e.g. [\"--exclusive\", \"--reservation=rl\"]).")

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not (_TIME.match(v.strip()) or v.strip().upper() in ("UNLIMITED", "INFINITE")):
            raise ValueError(f"{v!r} is not a SLURM time: use M, H:M:S, D-H or D-H:M:S (e.g. 4:00:00)")
        return v

    @field_validator("partition", "account", "qos", "gres", "mem", "constraint")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not _WORD.match(v):
            raise ValueError(f"{v!r}: letters, digits and _.,:=+- only")
        return v

    @field_validator("sbatch")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        for o in v:
            if not o.startswith("-") or "\n" in o:
                raise ValueError(f"{o!r}: each entry is one sbatch option, e.g. \"--exclusive\"")
        return v


def options_of(recipe: Any) -> SlurmOptions:
    """The recipe's `[executor.slurm]` (defaults when it has none)."""
    table = recipe.executor.table("slurm")
    return table if isinstance(table, SlurmOptions) else SlurmOptions()


def python_of(opts: SlurmOptions) -> str:
    """The interpreter in the job: the table's, else `python3` after a setup line (a module, venv or container
    brings its own), else the one running rlctl here (a venv on the shared filesystem)."""
    return opts.python or ("python3" if opts.setup else sys.executable)
