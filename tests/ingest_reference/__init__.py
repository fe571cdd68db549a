"""rlctl's log ingestion as it was before the fast path (main af8ba80), frozen: the oracle the fast path must match.

Copies of rlctl/metrics/{__init__,parsers,stream}.py and rlctl/backends/<name>/metrics.py at that commit (imports
pointed here), used by tests/test_ingest_speed.py only. Formats added later (docs/metrics.md) are not in it: the
equivalence is asserted on the formats this copy reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.ingest_reference import openrlhf, prime_rl, trl, verl
from tests.ingest_reference.parsers import Malformed
from tests.ingest_reference.stream import IngestState, _Reader
from tests.ingest_reference.unified import clean_value

RECORD_KEY = "rlctl_command"


def command(line: str | dict[str, Any]) -> dict[str, Any] | None:
    """The command backend's parse at af8ba80."""
    if isinstance(line, dict):
        inner = line.get(RECORD_KEY)
    else:
        s = line.strip()
        if not s.startswith('{"' + RECORD_KEY + '"'):
            return None
        try:
            inner = json.loads(s)[RECORD_KEY]
        except (ValueError, KeyError, TypeError) as e:
            raise Malformed(str(e)) from None
    if not isinstance(inner, dict):
        return None
    rec = {k: clean_value(v) for k, v in inner.items() if k != "step"}
    if "step" in inner:
        rec["step"] = inner["step"] if type(inner["step"]) is int else None
    return rec


PARSERS = {"openrlhf": (openrlhf.parse, openrlhf.NEEDLES), "prime_rl": (prime_rl.parse, prime_rl.NEEDLES),
           "trl": (trl.parse, trl.NEEDLES), "verl": (verl.parse, verl.NEEDLES),
           "command": (command, ('{"' + RECORD_KEY + '"',))}


def ingest_file(log: Path, backend: str, out: Path, final: bool = True) -> IngestState:
    """The old reader over one log file, appending its records to `out` (a metrics.jsonl)."""
    parse, needles = PARSERS[backend]
    return _Reader(parse, needles, out).file(log, IngestState(), final)
