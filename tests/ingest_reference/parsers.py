"""Shared pieces for reading metrics out of logs; no backend is named here.

Each adapter's `parse(line)` (rlctl/backends/<name>/metrics.py) turns one log line of its backend into a record in
the unified names, using these helpers. A parser returns a record, None for a line that carries no metrics, raises
`Malformed` for a line that looks like metrics but cannot be read (counted and shown as "not understood"), or
`Incomplete` for the start of a record that continues on the next lines (a dict wrapped over several lines, a cut
line): the stream then retries with the following lines joined to it.

Steps in a record (see docs/metrics.md, "Steps"):
  - `"step": N`     the backend's own step;
  - no `step` key   a counted step: the stream gives it the step after the last one it saw (a backend that prints
                    no step, e.g. a console dict printed without one);
  - `"step": None`  the step in progress: the same step as the last record (e.g. an eval dict printed without one).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from tests.ingest_reference.unified import clean_value, unify

__all__ = ["ANSI", "Incomplete", "Malformed", "clean_value", "flat_dict", "key_values", "literal_dict", "number",
           "strip_ansi", "strip_prefixes", "unify"]


class Malformed(ValueError):
    """A metrics-looking line that could not be parsed."""


class Incomplete(Malformed):
    """The start of a metrics record that goes on in the next lines (or was cut)."""


ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(s: str) -> str:
    return ANSI.sub("", s)


# Ray's per-process prefix: `(PPOTrainer pid=4242)`, `(pid=4242, ip=10.0.0.1)`, `(TaskRunner pid=9, ip=..., node=..)`
RAY_PREFIX = re.compile(r"^\s*\((?:[\w.:\-]+ )?pid=\d+(?:, [\w]+=[^,)]*)*\)\s?")
# Ray's log deduplication suffix: `[repeated 3x across cluster]`
RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")


def strip_prefixes(line: str) -> str:
    """A line without ANSI colours, Ray's `(name pid=.., ip=..)` prefix and its `[repeated Nx ...]` suffix."""
    if "\x1b" in line:
        line = strip_ansi(line)
    if "pid=" in line:
        line = RAY_PREFIX.sub("", line, count=1)
    if "repeated" in line:
        line = RAY_REPEATED.sub("", line)
    return line


_NONFINITE = re.compile(r"(?<![\w'\"])(-?inf|nan|NaN|-?Infinity)(?![\w'\"])")
_VALUE = (r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+-]*|-?\.[0-9][0-9eE+-]*"""
          r"|nan|NaN|-?inf|-?Infinity|True|False|None")
_PAIR = re.compile(r"\s*'((?:[^'\\]|\\.)*)'\s*:\s*(" + _VALUE + r")\s*(?:,|$)")
_SCALARS = {"True": True, "False": False, "None": None}
# numpy/torch scalar reprs: np.float64(0.5), numpy.float32(1.0), tensor(0.5, device='cuda:0'), Decimal('1')
_WRAPPED = re.compile(r"\b(?:np|numpy|torch)?\.?(?:float|int|uint|bfloat)\d*\(\s*([^()]*?)\s*\)"
                      r"|\btensor\(([^()]*?)(?:,\s*[a-z_]+=[^()]*)*\)")


def _fast_dict(inner: str) -> dict[str, Any] | None:
    """A flat dict of scalars as print() writes it, read with one regex; None if it is anything more."""
    out: dict[str, Any] = {}
    pos = 0
    for m in _PAIR.finditer(inner):
        if m.start() != pos:
            return None
        pos = m.end()
        raw = m.group(2)
        if raw[0] in "'\"":
            out[m.group(1)] = raw[1:-1]
        else:
            out[m.group(1)] = _SCALARS.get(raw, raw)
    return out if pos == len(inner) else None


def literal_dict(text: str) -> dict[str, Any]:
    """A Python dict repr as print(dict) writes it: nan/inf, numpy and tensor scalars tolerated, elided values
    (`...`) and nested values dropped. An unclosed dict raises Incomplete, anything else unreadable Malformed."""
    text = text.strip()
    if not text.startswith("{"):
        raise Malformed("not a dict")
    if not text.endswith("}"):
        raise Incomplete("the dict does not close on this line")
    fast = _fast_dict(text[1:-1])
    if fast is not None:
        return fast
    t = _NONFINITE.sub(lambda m: f"'{m.group(1)}'", text)
    t = _WRAPPED.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), t)
    try:
        d = ast.literal_eval(t)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
        if text.count("{") > text.count("}"):
            raise Incomplete("the dict does not close on this line") from None
        raise Malformed(str(e)) from None
    if not isinstance(d, dict):
        raise Malformed("not a dict")
    return {str(k): v for k, v in d.items() if not isinstance(v, (list, dict, tuple, set)) and v is not Ellipsis}


def flat_dict(obj: Any) -> dict[str, Any]:
    """Scalars of a (possibly nested) JSON-like dict, nested keys joined with '/'."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            out.update({f"{k}/{kk}": vv for kk, vv in flat_dict(v).items()})
        elif not isinstance(v, (list, tuple)):
            out[str(k)] = v
    return out


_KV = re.compile(r"([A-Za-z_][\w/.@-]*)=\s*([^,\]\s]+)")


def key_values(text: str) -> dict[str, str]:
    """`a=1, b=2.5e-07, c=nan` (a tqdm postfix) as a dict of strings."""
    return {m.group(1): m.group(2) for m in _KV.finditer(text)}


def number(v: Any) -> Any:
    """A value as printed (`0.5`, `np.float64(0.5)`, `tensor(0.5)`, `1.2s`, `nan`) as a number where it is one."""
    out = clean_value(v)
    if type(out) is str and "(" in out:
        return clean_value(_WRAPPED.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), out))
    return out
