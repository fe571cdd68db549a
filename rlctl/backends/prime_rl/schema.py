"""prime-rl's `RLConfig` as JSON Schema (schemas/<version>.json, generated from the tag's real sources by
scripts/prime_rl_schema.py): loading a rendered rl.toml the way prime-rl does (its TOML plus the schema's defaults),
and checking one against the schema (types, constraints, forbidden extra keys)."""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

from rlctl.backends.base import Finding

SCHEMAS = Path(__file__).resolve().parent / "schemas"


@cache
def load_schema(version: str) -> dict[str, Any]:
    p = SCHEMAS / f"{version}.json"
    if not p.is_file():
        from rlctl.backends.base import UnknownVersion

        known = sorted(x.stem for x in SCHEMAS.glob("*.json"))
        raise UnknownVersion(f"prime_rl {version} has no schema in rlctl; known: {', '.join(known)}")
    return json.loads(p.read_text())


def source(schema: dict[str, Any]) -> str:
    return schema.get("x-rlctl", {}).get("source", "prime-rl")


def deref(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def branches(schema: dict[str, Any], node: dict[str, Any], value: Any = None) -> list[dict[str, Any]]:
    """The object schemas a node may be: itself, or its anyOf/oneOf members (a discriminated union narrowed by the
    value's tag when there is one)."""
    node = deref(schema, node)
    alts = node.get("anyOf") or node.get("oneOf")
    if not alts:
        return [node]
    disc = node.get("discriminator")
    if disc and isinstance(value, dict) and value.get(disc["propertyName"]) in disc.get("mapping", {}):
        ref = disc["mapping"][value[disc["propertyName"]]]
        return [deref(schema, {"$ref": ref})]
    out = []
    for a in alts:
        out.extend(branches(schema, a, value))
    return out


def _objects(schema: dict[str, Any], node: dict[str, Any], value: Any = None) -> list[dict[str, Any]]:
    return [b for b in branches(schema, node, value) if b.get("type") == "object" or "properties" in b]


def subschema(schema: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    """The schema of a dotted key (arrays of tables are walked into their items), or None when no branch has it."""
    nodes = [schema]
    for part in dotted.split("."):
        nxt = []
        for n in nodes:
            for b in branches(schema, n):
                if b.get("type") == "array" and "items" in b:
                    b = deref(schema, b["items"])
                    for bb in branches(schema, b):
                        if part in bb.get("properties", {}):
                            nxt.append(bb["properties"][part])
                elif part in b.get("properties", {}):
                    nxt.append(b["properties"][part])
        if not nxt:
            return None
        nodes = nxt
    return nodes[0]


def has_key(schema: dict[str, Any], dotted: str) -> bool:
    return subschema(schema, dotted) is not None


def unknown_keys(schema: dict[str, Any], node: dict[str, Any], value: Any, path: str = "") -> list[tuple[str, list]]:
    """Keys of `value` that no branch of `node` declares where extras are forbidden: (dotted path, known keys)."""
    out: list[tuple[str, list]] = []
    if isinstance(value, list):
        for b in branches(schema, node):
            if b.get("type") == "array" and "items" in b:
                for item in value:
                    out += unknown_keys(schema, b["items"], item, path)
                return out
        return out
    if not isinstance(value, dict):
        return out
    objs = _objects(schema, node, value)
    if not objs:
        return out
    for k, v in value.items():
        p = f"{path}.{k}" if path else k
        holders = [o for o in objs if k in o.get("properties", {})]
        if holders:
            out += unknown_keys(schema, holders[0]["properties"][k], v, p)
        elif all(o.get("additionalProperties") is False for o in objs):
            known = sorted({x for o in objs for x in o.get("properties", {})})
            out.append((p, known))
    return out


def nulls(v: Any) -> Any:
    """TOML has no null: prime-rl's BaseConfig turns the string "None" into None before validating (v0.3.0
    utils/pydantic_config.py:18-28 `empty_str_to_none`; v0.8.0 prime-pydantic-config `_none_str_to_none`)."""
    if isinstance(v, dict):
        return {k: nulls(x) for k, x in v.items()}
    if isinstance(v, list):
        return [nulls(x) for x in v]
    return None if v == "None" else v


def check_config(cfg: dict[str, Any], schema: dict[str, Any], version: str) -> list[Finding]:
    """The rendered config against the tag's schema: unknown keys always; types and constraints with jsonschema
    (installed with rlctl's dev extra; CI always has it)."""
    cfg = nulls(cfg)
    findings = []
    where = f"prime-rl {version} ({source(schema)})"
    bad = unknown_keys(schema, schema, cfg)
    for path, known in bad:
        leaf = path.split(".")[-1]
        close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.6)
        findings.append(Finding("error", path, f"key `{path}` does not exist in {where}",
                                f"did you mean `{'.'.join(path.split('.')[:-1] + [close[0]])}`?" if close
                                else "remove it (backend.prime_rl.extra) or pin a prime-rl tag that has it"))
    import jsonschema  # a core dependency: never skipped silently
    unknown = {p for p, _ in bad}
    validator = jsonschema.Draft202012Validator(schema)
    for err in sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        leaves = [err]
        while leaves[-1].context:  # a union: what its deepest branch rejected
            leaves.append(max(leaves[-1].context, key=lambda e: len(list(e.absolute_path))))
        best = leaves[-1]
        if best.validator == "additionalProperties" and bad:
            continue  # already said, with a did-you-mean, by unknown_keys
        if path in unknown or any(path.startswith(u + ".") for u in unknown):
            continue
        msg = best.message
        path = ".".join(str(p) for p in best.absolute_path) or path
        findings.append(Finding("error", path, f"`{path}`: {msg} ({where})"))
    return findings


def with_defaults(schema: dict[str, Any], node: dict[str, Any], value: Any) -> Any:
    """`value` with every default the schema gives filled in below it, as pydantic would construct it (no validators
    run: what prime-rl's own model validators then change is asserted separately, in rules.py)."""
    if isinstance(value, list):
        for b in branches(schema, node):
            if b.get("type") == "array" and "items" in b:
                return [with_defaults(schema, b["items"], v) for v in value]
        return value
    if not isinstance(value, dict):
        return value
    objs = _objects(schema, node, value)
    if not objs:
        return value
    obj = objs[0]
    out = dict(value)
    for k, prop in obj.get("properties", {}).items():
        if k in out:
            out[k] = with_defaults(schema, prop, out[k])
        elif "default" in prop:
            out[k] = with_defaults(schema, prop, copy_json(prop["default"]))
        elif "default" in deref(schema, prop):
            out[k] = copy_json(deref(schema, prop)["default"])
    return out


def copy_json(v: Any) -> Any:
    return json.loads(json.dumps(v))


def resolved(cfg: dict[str, Any], version: str) -> dict[str, Any]:
    """The rendered config as prime-rl constructs it from TOML: the file plus every schema default."""
    schema = load_schema(version)
    return with_defaults(schema, schema, nulls(cfg))
