"""Machine facts: what a machine has that decides whether a run fits there (GPUs, free disk, installed backend
runtimes and their patch state, rlctl's version), gathered in one go so a remote host answers in one round trip
(`rlctl facts --json`, run there by `rlctl hosts check`). This is the type; rlctl/facts.py gathers them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class MachineFacts:
    machine: str  # the host name as the machine calls itself (what checks name when they say where they looked)
    rlctl_version: str
    python: str
    gpus: list[dict[str, Any]] | None  # None: no NVML/nvidia-smi there; [] : none found
    gpu_note: str | None = None
    disk_path: str | None = None
    disk_free: int | None = None
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {package, installed, patches}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MachineFacts:
        known = {k: d.get(k) for k in cls.__dataclass_fields__ if k in d}
        known.setdefault("machine", "?")
        known.setdefault("rlctl_version", "?")
        known.setdefault("python", "?")
        known.setdefault("gpus", None)
        return cls(**known)
