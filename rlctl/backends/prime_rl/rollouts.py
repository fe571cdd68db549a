"""prime-rl's orchestrator's lines for a rollout that failed. At v0.8.0 (src/prime_rl/orchestrator/dispatcher.py,
handle_completed_rollout) it logs each failed rollout as a warning and goes on: the failed rollouts become error
markers, the batch never fills, and no step completes while every rollout fails — nothing exits (the first start on
2 x H100, docs/gpu/prime-rl-1.json part 2gpu#3: renderers lacked RendererPool, ~7 minutes of these lines).

  `Rollout task failed in group {group_id} ({env_name}): {exc!r}`    the environment's task raised
  `Rollout failed in group {group_id} ({env_name}) — {type}: {message}`    it returned a rollout with an error

Lines come through its loguru logger: `HH:MM:SS WARNING message`, coloured, or with `json_logging` a JSON object whose
`message` is that text.
"""

from __future__ import annotations

import json
import re

from rlctl.metrics.parsers import strip_ansi

NEEDLE = "ollout "  # both lines have it: a cheap test before the regexes, every line of the log passes here
FAILED = re.compile(r"Rollout (?:task failed in group \S+ \([^)]*\): |failed in group \S+ \([^)]*\) — )(?P<error>.+)$")


def failure(line: str) -> str | None:
    """The error of the rollout this line says failed, verbatim; None for any other line."""
    if NEEDLE not in line:
        return None
    text = strip_ansi(line).strip() if "\x1b" in line else line.strip()
    if text.startswith("{"):
        try:
            text = str(json.loads(text).get("message") or "")
        except (ValueError, AttributeError):
            return None
    m = FAILED.search(text)
    return m["error"].strip() if m else None
