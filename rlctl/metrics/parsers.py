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
  - `"step": None`  the step in progress: the same step as the last record (e.g. an eval dict printed without one);
  - `"step": STAND_IN` / `STAND_IN_CURRENT`  a record that stands in for the backend's own record of a step (a
                    progress bar's summary, printed by another process than the step's own line): counted, or the
                    step in progress, while the log has given no record with a step of its own. Once it has, the two
                    reach the log in either order, so the stream pairs each stand-in with the step's own record: one
                    coming before it takes its step (the own record then overwrites the values both have), one coming
                    after it is not written (that record carries the step). A log with stand-ins only counts them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from itertools import accumulate, chain, compress, repeat
from math import isfinite
from operator import add, and_, contains, itemgetter
from typing import Any

from rlctl.metrics import clean_value, unify

__all__ = ["ANSI", "STAND_IN", "STAND_IN_CURRENT", "Header", "Incomplete", "KeyMap", "Malformed", "RowPlans",
           "clean_value", "flat_dict", "forget_lines", "json_numbers", "json_objects", "key_values", "lines_with",
           "literal_dict", "literal_rows", "number", "plain_lines", "plain_numbers", "plain_rows", "split_lines",
           "strip_ansi", "strip_prefixes", "template_rows", "unify"]


STAND_IN = "stand-in"  # a record's `step`: counted where the log gives no step of its own (module docstring)
STAND_IN_CURRENT = "stand-in, current"  # likewise, the step in progress


class Malformed(ValueError):
    """A metrics-looking line that could not be parsed."""


class Incomplete(Malformed):
    """The start of a metrics record that goes on in the next lines (or was cut)."""


class Header(Exception):  # noqa: N818 - a signal, like StopIteration, not an error
    """A line that gives meaning to the lines after it (a table's header): the stream keeps `text` and hands each
    next line to the parser as `text + "\n" + line` until the parser returns None for one (the table has ended).
    Raised again for such a joined text (a table's `|---|` rule), the table goes on with nothing to record."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


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
    (`...`) and nested values dropped. An unclosed dict raises Incomplete, anything else unreadable Malformed.
    Numbers come back as numbers or as their text (callers read every value with `number`)."""
    text = text.strip()
    if not text.startswith("{"):
        raise Malformed("not a dict")
    if text.endswith("...}") and len(text) > 5:
        return _cut_dict(text)
    if not text.endswith("}"):
        raise Incomplete("the dict does not close on this line")
    if '"' not in text and "\\" not in text:  # the common case, read by the JSON parser in C
        fast = json_numbers(_QUOTED_NUMBER.sub(r"\1", text).replace("'", '"'))
        if fast is not None:
            return fast
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


# ---- the fast path: a JSON object of plain numbers, read by orjson (in [dev]) or the standard library's C parser

try:
    from orjson import loads as _json_loads
except ImportError:  # orjson is optional: the standard library reads the same values
    from json import loads as _json_loads

# a JSON number that float()/int() read to the same value, and clean_value keeps as JSON wrote it: no integer part of
# 16 digits or more (clean_value reads integers through float), no exponent of 3 digits (inf)
_JSON_NUMBER = r"-?(?:0|[1-9][0-9]{0,14})(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,2})?"
_QUOTED_NUMBER = re.compile(r"'(" + _JSON_NUMBER + r")'(?=\s*[,}])")
_NUMERIC = frozenset((int, float))
_NUMERIC_STR = frozenset((int, float, str))


def json_numbers(text: str) -> dict[str, Any] | None:
    """`text` as a JSON object whose values are numbers (strings allowed too, as literal_dict gives them), each
    number exactly what `clean_value` makes of its text; None for anything else (the caller then takes its general
    path). The checks run in C: the types present, and the sum of magnitudes (it rules out inf/nan, and integers
    that clean_value would read through a float)."""
    try:
        d = _json_loads(text)
    except ValueError:
        return None
    return d if plain_numbers(d, strings=True) else None


def json_objects(text: str) -> list[Any] | None:
    """A JSON array (of objects, each checked by the caller with plain_numbers), or None."""
    try:
        out = _json_loads(text)
    except ValueError:
        return None
    return out if type(out) is list else None


def plain_numbers(d: Any, strings: bool = False) -> bool:
    """A dict whose values are numbers that clean_value keeps as they are (and strings, if allowed)."""
    if type(d) is not dict:
        return False
    values: Any = d.values()
    types = set(map(type, values))
    if not types <= _NUMERIC:
        if not strings or not types <= _NUMERIC_STR:
            return False
        values = [v for v in values if type(v) is not str]
    return sum(map(abs, values)) < 1e15


def plain_rows(rows: list[Any]) -> list[bool]:
    """plain_numbers(row) of every row (numbers only), checked for the whole list at once in C where all pass (the
    common case: a log repeats one kind of line), else row by row."""
    if all(type(r) is dict for r in rows):
        values = list(chain.from_iterable(map(dict.values, rows)))
        if set(map(type, values)) <= _NUMERIC and sum(map(abs, values)) < 1e15:
            return [True] * len(rows)
    return [plain_numbers(r) for r in rows]


def split_lines(text: str) -> tuple[list[str], list[int]]:
    """A chunk's lines and where each starts, worked out once per chunk (a bulk reader and the stream both need
    them): the last chunk's are kept until `forget_lines`."""
    global _SPLIT
    cached = _SPLIT  # one read: another thread may ingest another run meanwhile
    if cached[0] is not text:
        lines = text.split("\n")
        cached = _SPLIT = (text, lines, list(accumulate(map(add, map(len, lines), repeat(1)), initial=0)))
    return cached[1], cached[2]


def forget_lines() -> None:
    global _SPLIT
    _SPLIT = ("", [], [])


_SPLIT: tuple[str, list[str], list[int]] = ("", [], [])


def lines_with(text: str, needle: str) -> tuple[list[int], list[str]]:
    """The lines of `text` holding `needle` and where each starts, every line tested in a C loop (a bulk reader's
    first step over a chunk of mostly metrics lines)."""
    lines, starts = split_lines(text)
    mask = list(map(contains, lines, repeat(needle)))
    return list(compress(starts, mask)), list(compress(lines, mask))


def plain_lines(starts: list[int], lines: list[str], head: str, tail: str, ascii_only: bool = True
                ) -> tuple[list[int], list[str]]:
    """The lines (and their starts) that begin with `head`, end with `tail`, hold no tab or CR (split_segments'
    frames) and are ASCII unless not `ascii_only`, each test a C loop over all. For a caller that reads them as JSON,
    which allows no other control character (and checks what comes before `head` itself)."""
    mask = list(map(and_, map(str.startswith, lines, repeat(head)), map(str.endswith, lines, repeat(tail))))
    if not all(mask):
        starts, lines = list(compress(starts, mask)), list(compress(lines, mask))
    joined = "".join(lines)
    if "\t" in joined or "\r" in joined or (ascii_only and not joined.isascii()):
        mask = [(line.isascii() or not ascii_only) and "\t" not in line and "\r" not in line for line in lines]
        starts, lines = list(compress(starts, mask)), list(compress(lines, mask))
    return starts, lines


# A dict's repr with only its quotes, colons, commas and braces left: `{'':'','':}` (each key quoted, each value
# quoted or not), what literal_rows checks a line's quotes against (none in a key or value)
_SKELETON = re.compile(rb"\{'':(?:'')?(?:,'':(?:'')?)*\}")
_NOT_SKELETON = bytes(c for c in range(256) if c not in b"':,{}\n")


def literal_rows(texts: list[str]) -> list[dict[str, Any] | None]:
    """literal_dict of each text (`{...}` as Python prints a dict, from its `{` to its `}`), for many texts in one
    JSON parse: each a dict of plain numbers, or None where literal_dict's JSON path would not read it so (left to
    literal_dict). The texts are joined only when none holds another brace (or with quoted values, when each has a
    dict's skeleton), so each JSON value is exactly one text;
    a quoted value (transformers' `'0.1234'`) is read as the JSON number it holds: what _QUOTED_NUMBER gives, or
    the value `number` makes of the string (plain_rows rules out the rest)."""
    n = len(texts)
    if not n:
        return []
    joined = ",".join(texts)
    rows: Any = None
    if '"' not in joined and "\\" not in joined:
        text = "[" + joined.replace("'", '"') + "]"
        if '": "' not in text:  # no quoted value: the text is literal_dict's JSON
            rows = json_objects(text) if joined.count("{") == n and joined.count("}") == n else None
        elif all(map(_SKELETON.fullmatch, set("\n".join(texts).encode().translate(None, _NOT_SKELETON).split(b"\n")))):
            # quoted values (transformers' `'0.1234'`), each quote where a dict's repr puts it (the skeleton
            # says so): a string value is the one after `": ` and before `, "` or `}`, unquoted
            rows = json_objects(text.replace('": "', '": ').replace('", "', ', "').replace('"}', "}"))
    if rows is None or len(rows) != n:  # one text is no such JSON: each on its own
        rows = [_literal_json(t) for t in texts]
    return [r if ok else None for r, ok in zip(rows, plain_rows(rows), strict=True)]


def template_rows(lines: list[str], template: re.Pattern[str]) -> list[list[Any]] | None:
    """The numbers of lines that all match one line template (`^...$`, MULTILINE, a group per number, each group
    JSON's number grammar or narrower), a list per line in the groups' order, read by one findall and one JSON
    parse; None unless every line matches and the values pass plain_rows' check (the caller then takes its
    general path)."""
    rows = template.findall("\n".join(lines))
    if len(rows) != len(lines):  # a match never spans two lines: every line matched, whole
        return None
    joined = "],[".join(rows) if template.groups == 1 else "],[".join(map(",".join, rows))
    try:
        values = _json_loads("[[" + joined + "]]")
    except ValueError:
        return None
    if type(values) is not list or len(values) != len(lines):
        return None
    flat = list(chain.from_iterable(values))
    if not set(map(type, flat)) <= _NUMERIC or not sum(map(abs, flat)) < 1e15:
        return None
    return values


class LineTemplates:
    """One format's line templates, made once per line shape (the line with its digits as 0) by `build(line)` ->
    (regex for template_rows, record names, a reorder of each row's values or None) or None where lines of that
    shape are no template's; bounded, so a log of ever-new shapes cannot grow it."""

    _DIGITS = re.compile(r"[0-9]+")

    def __init__(self, build: Callable[[str], tuple[re.Pattern[str], Any, Any] | None]):
        self.build = build
        self.cache: dict[str, tuple[re.Pattern[str], Any, Any] | None] = {}

    def get(self, line: str) -> tuple[re.Pattern[str], Any, Any] | None:
        shape = self._DIGITS.sub("0", line)
        if shape in self.cache:
            return self.cache[shape]
        out = self.build(line)
        if len(self.cache) >= 256:
            self.cache.clear()
        self.cache[shape] = out
        return out

    def records(self, starts: list[int], lines: list[str]) -> dict[int, dict[str, Any]] | None:
        """The records of lines that all match the first one's template, by where each starts, or None."""
        template = self.get(lines[0])
        if template is None:
            return None
        regex, names, reorder = template
        values = template_rows(lines, regex)
        if values is None:
            return None
        rows = values if reorder is None else map(reorder, values)
        return dict(zip(starts, map(dict, map(zip, repeat(names), rows)), strict=True))


def _literal_json(text: str) -> Any:
    """literal_dict's JSON path for one text: what it reads, or None."""
    try:
        return _json_loads(_QUOTED_NUMBER.sub(r"\1", text).replace("'", '"'))
    except ValueError:
        return None


Plan = tuple[tuple[str, ...], Callable[[list[Any]], Any]]


class RowPlans:
    """How a row of plain numbers becomes its record, worked out once per set of keys (a log repeats them): the
    record's names and a getter of its values in that order (`make(keys)` gives the names and the values' positions,
    or None where the adapter's own parse must read such rows)."""

    MAX = 4096

    def __init__(self, make: Callable[[tuple[str, ...]], tuple[list[str], list[int]] | None]):
        self.make = make
        self._plans: dict[tuple[str, ...], Plan | None] = {}

    def get(self, keys: tuple[str, ...]) -> Plan | None:
        plan = self._plans.get(keys, ...)
        if plan is ...:
            made = self.make(keys)
            plan = None
            if made is not None and made[1]:
                names, order = made
                if order == list(range(len(keys))):
                    plan = (tuple(names), _identity)
                elif len(order) == 1:
                    plan = (tuple(names), _single(order[0]))
                else:
                    plan = (tuple(names), itemgetter(*order))
            if len(self._plans) >= self.MAX:
                self._plans.clear()
            self._plans[keys] = plan
        return plan


def _identity(values: list[Any]) -> list[Any]:
    return values


def _single(i: int) -> Callable[[list[Any]], tuple[Any]]:
    return lambda values: (values[i],)


class KeyMap:
    """A backend's key mapping (`unify`), the output names of each set of keys worked out once: a log repeats the
    same keys every step."""

    MAX = 4096

    def __init__(self, backend: str, mapping: dict[str, str]):
        self.backend, self.mapping = backend, dict(mapping)
        self._names: dict[tuple[str, ...], tuple[str, ...] | None] = {}

    def names(self, keys: tuple[str, ...]) -> tuple[str, ...] | None:
        """The unified names of `keys`, or None when a key is one unify leaves out (`step`, `time`)."""
        names = self._names.get(keys, ...)
        if names is ...:
            if "step" in keys or "time" in keys:
                names = None  # never for keys without them: apply's second call always has names
            else:
                get, prefix = self.mapping.get, self.backend + "/"
                names = tuple(get(k) or prefix + k for k in keys)
            if len(self._names) >= self.MAX:
                self._names.clear()
            self._names[keys] = names
        return names

    def apply(self, raw: dict[str, Any]) -> dict[str, Any]:
        """unify(backend, raw, mapping) on values read with `number`."""
        names = self.names(tuple(raw))
        if names is None:  # `step`/`time` are left out, as unify does
            raw = {k: v for k, v in raw.items() if k != "step" and k != "time"}
            names = self.names(tuple(raw))
        values = raw.values()
        if clean_numbers(values):
            return dict(zip(names, values, strict=True))
        return dict(zip(names, map(number, values), strict=True))


_CLEAN = frozenset((int, float, bool, type(None)))


def clean_numbers(values: Any) -> bool:
    """True when `number` would give every value back unchanged: ints, bools, None, finite floats (checked in C)."""
    if not set(map(type, values)) <= _CLEAN:
        return False
    try:
        return isfinite(sum(values))
    except (OverflowError, TypeError):
        return False


def _cut_dict(text: str) -> dict[str, Any]:
    """A dict printed cut short with `...}` (a log line truncated by the logger or the paste): the pairs before the
    cut; a pair the cut went through (`'kl': 0.00...}`) is left out, never read as a shorter number."""
    head = text[:-4].rstrip()
    if head.endswith(","):
        head = head[:-1]
    else:
        comma = head.rfind(",")
        head = head[:comma] if comma > 0 else "{"
    return literal_dict(head + "}")


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
