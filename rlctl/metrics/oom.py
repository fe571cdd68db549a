"""Out-of-memory evidence in a run's log: the messages torch, CUDA, NCCL and vLLM print when GPU memory runs out.

`rlctl status` puts this next to the memory plan: a run that died of an OOM has a measured peak capped at the GPU's
size, so "plan overestimated by N%" would be the wrong reading of it. Only the log's tail is read (bounded time on
a log of any size): an OOM ends the attempt, so its message is near the end of the attempt's output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TAIL_BYTES = 8 * 1024 * 1024

# (needle, what it is); the first needle found on a line wins. Texts as the libraries print them.
SIGNS: tuple[tuple[str, str], ...] = (
    ("OutOfMemoryError", "torch OutOfMemoryError"),  # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
    ("CUDA out of memory", "CUDA out of memory"),
    ("CUDA error: out of memory", "CUDA error: out of memory"),
    ("HIP out of memory", "HIP out of memory"),
    ("cudaErrorMemoryAllocation", "cudaErrorMemoryAllocation"),
    ("Cuda failure 2 'out of memory'", "NCCL: CUDA out of memory"),
    ("No available memory for the cache blocks", "vLLM: no memory left for the KV cache blocks"),
    ("is less than desired GPU memory utilization", "vLLM: the GPU's free memory is below gpu_memory_utilization"),
    ("larger than the available KV cache memory", "vLLM: max_model_len needs more KV cache than fits"),
)
_ALLOC = re.compile(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)\. GPU (\d+) has a total capacity of ([0-9.]+ GiB) of "
                    r"which ([0-9.]+ [KMGT]?i?B) is free")


@dataclass
class Oom:
    what: str  # which message
    line: str  # the log line, stripped and cut to 300 characters
    line_no: int | None  # 1-based line in the log, when the whole log was read
    detail: str | None = None  # "tried to allocate 8.00 GiB on GPU 0 (79.18 GiB, 6.66 GiB free)"

    def to_dict(self) -> dict[str, object]:
        return {"what": self.what, "line": self.line, "line_no": self.line_no, "detail": self.detail}


def find_oom(log: Path, tail_bytes: int = TAIL_BYTES) -> Oom | None:
    """The last out-of-memory message in the log's tail, or None (no log, unreadable, or no such message)."""
    if not log.is_file():  # missing, or a FIFO/device that would block or never end
        return None
    try:
        with log.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            start = max(size - tail_bytes, 0)
            fh.seek(start)
            data = fh.read(tail_bytes)
    except OSError:
        return None
    text = data.decode("utf-8", "replace")
    if not any(needle in text for needle, _ in SIGNS):  # the common case, in a few fast scans
        return None
    if start:
        text = text.split("\n", 1)[-1]  # the first line is cut
    found: Oom | None = None
    detail: str | None = None  # torch's figures, kept when a later line re-raises the error without them
    for n, line in enumerate(text.splitlines(), start=1):
        for needle, what in SIGNS:
            if needle in line:
                m = _ALLOC.search(line)
                if m:
                    detail = f"tried to allocate {m[1]} on GPU {m[2]} ({m[3]}, {m[4]} free)"
                found = Oom(what, line.strip()[:300], None if start else n, detail)
                break
    return found
