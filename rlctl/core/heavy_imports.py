"""The cycle collector in a process that imports torch and transformers (the TRL runner, an eval job).

Such imports create millions of objects that live as long as the process, and Python's collector walks them again and
again: during the imports (each gen-2 pass over what was imported so far), during training, and once more at
shutdown. Measured on a 2-core machine, a 2-step CPU quickstart trainer: 8.6 s -> 5.3 s wall (imports frozen, and
the exit without the final collections). Only process entry points call these, never library code (a long-lived
process such as a test session would freeze what it holds).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import NoReturn


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Imports in the block run with the collector off; what exists after them is frozen (gc.freeze: left out of
    every later collection), then the collector is back on for what the process does next. Put only imports in the
    block: a frozen object is never collected, and modules live as long as the process anyway."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def exit_without_final_collection(code: int) -> NoReturn:
    """sys.exit(code), its objects frozen first: the interpreter's full collections at shutdown walk them all after
    the work is done (1.5 s of CPU for torch + transformers + TRL). atexit handlers, flushes and module teardown
    still run."""
    gc.freeze()
    sys.exit(code)
