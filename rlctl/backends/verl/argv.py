"""Values as verl's Hydra command line takes them (`key=value` overrides): shared by the render and by the
pass-through's comparison of an extra with what rlctl renders (its own module: the package imports both)."""

from __future__ import annotations

import re
from typing import Any


def _val(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, list):
        return "[" + ",".join(_val(x) for x in v) + "]"
    if v is None:
        return "null"
    if isinstance(v, float):
        return repr(v) if abs(v) >= 1e-3 or v == 0 else f"{v:g}"
    if isinstance(v, dict):
        # Hydra's override grammar: {key:value,...} with bare keys (JSON's quoted keys are a parse error); Hydra
        # merges it into the node the key names, as the dotted leaves would
        return "{" + ",".join(f"{k}:{_element(x)}" for k, x in v.items()) + "}"
    return str(v)


def _element(v: Any) -> str:
    """A value inside a Hydra dict: a string Hydra would not read back as that string is quoted."""
    if isinstance(v, str) and (not re.fullmatch(r"[A-Za-z_/][A-Za-z0-9_./\-]*", v)
                               or v.lower() in ("true", "false", "null", "nan", "inf")):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return _val(v)
