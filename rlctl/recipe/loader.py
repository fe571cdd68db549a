"""Loading recipes: TOML (tomlkit), `extends` chains, `--set a.b=c` overrides, and errors a person can act on.

Every error names the file and line of the offending key, says what was expected, and where it can, what was
meant ("did you mean `rollout.group_size`?").
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import tomlkit
import tomlkit.exceptions
from pydantic import BaseModel, ValidationError

from rlctl.backends import available as available_backends
from rlctl.errors import RecipeError
from rlctl.executors import available as available_executors
from rlctl.recipe import paths
from rlctl.recipe.schema import (
    ALIASES,
    SECTIONS,
    BackendExtra,
    BackendSection,
    Recipe,
    TableErrors,
    all_key_paths,
    backend_table_model,
    executor_table_model,
    from_text,
    scalar_kinds,
    submodel,
)
from rlctl.resources import bundled_recipe


@dataclass
class ResolvedRecipe:
    recipe: Recipe
    data: dict[str, Any]  # the merged raw mapping, as validated
    path: Path  # the top recipe file
    origins: dict[str, Path] = field(default_factory=dict)  # dotted key -> the file that set it ("--set" for CLI)
    chain: list[Path] = field(default_factory=list)  # the extends chain, base first

    def to_toml(self) -> str:
        return dump_toml(self.recipe.model_dump(mode="json", exclude_none=True))

    def to_json(self) -> str:
        return json.dumps(self.recipe.model_dump(mode="json"), indent=2, sort_keys=False)


def dump_toml(data: dict[str, Any]) -> str:
    doc = tomlkit.document()
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for k, v in scalars.items():
        doc[k] = v
    for k, v in tables.items():
        doc[k] = _table(v)
    return tomlkit.dumps(doc)


def _table(d: dict[str, Any]) -> Any:
    t = tomlkit.table()
    for k, v in d.items():
        if not isinstance(v, dict):
            t[k] = v
    for k, v in d.items():
        if isinstance(v, dict):
            t[k] = _table(v) if v else tomlkit.table()
    return t


# --------------------------------------------------------------------------------------------------------------
# reading one file


MAX_RECIPE_BYTES = 4 * 1024 * 1024


def file_problem(p: Path) -> str | None:
    """Why `p` cannot be read as a regular file ("does not exist", "is not a regular file (a FIFO, ...)"), or None.
    One rule for recipes, datasets, model configs and reward files: a FIFO or device would hang a read."""
    import errno
    import os
    import stat

    try:
        st = p.stat()
    except ValueError:
        return "is not a valid path (it contains a NUL character)"
    except RuntimeError:  # older Pythons report symlink loops this way
        return "is a symlink loop"
    except OSError as e:
        return {errno.ENOENT: "does not exist", errno.ELOOP: "is a symlink loop",
                errno.ENAMETOOLONG: "has a name too long for the file system",
                errno.ENOTDIR: "has a file where a directory should be"}.get(e.errno or 0,
                                                                              f"cannot be read ({e.strerror})")
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, socket or device)"
    if not os.access(p, os.R_OK):
        return "is not readable (permission denied)"
    return None


def read_regular_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. A FIFO, a device (/dev/zero), a symlink loop, an
    unreadable or huge file is a RecipeError naming the path — never a hang or a traceback."""
    problem = file_problem(path)
    if problem:
        raise RecipeError(f"{path}: {problem}; expected {what} file.",
                          hint="point rlctl at the file itself; check the path, its symlinks and permissions.")
    size = path.stat().st_size
    if size > limit:
        raise RecipeError(f"{path}: {size} bytes is far too large for {what} file (limit {limit}).",
                          hint="check that this is the right file.")
    try:
        with path.open("rb") as fh:
            return fh.read(limit + 1)
    except OSError as e:
        raise RecipeError(f"{path}: cannot be read ({e.strerror or e}).",
                          hint="check the permissions of the file and its directory.") from None


def read_toml(path: Path) -> tuple[dict[str, Any], str]:
    """Read and parse one TOML file; every way it can fail becomes a RecipeError naming the file."""
    if not path.exists():
        hint = None
        bundled = bundled_recipe(path.name)
        if bundled is not None:
            hint = f"a bundled recipe of that name exists: {bundled}"
        raise RecipeError(f"{path}: no such file.", hint=hint or "check the path (relative to the current directory).")
    if path.is_dir():
        bundled = bundled_recipe(path.name) or bundled_recipe(path.name + ".toml")
        raise RecipeError(f"{path}: is a directory, expected a recipe .toml file.",
                          hint="name the .toml file inside it"
                               + (f" (or the bundled recipe: {bundled})." if bundled else "."))
    raw = read_regular_file(path, MAX_RECIPE_BYTES, "a recipe")
    if not raw.strip():
        raise RecipeError(f"{path}: the file is empty; a recipe needs at least [backend], [model] and [data].")
    if b"\x00" in raw[:8192]:
        raise RecipeError(f"{path}: looks like a binary file, not TOML text.", hint="point rlctl at the recipe .toml.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise RecipeError(f"{path}:{line}: not valid UTF-8 text (byte {e.start}).") from None
    try:
        doc = tomlkit.parse(text)
    except Exception as e:
        if "already exists" in str(e) and (dup := duplicate_key(text)):  # tomlkit says which key, not where
            line, dotted, first = dup
            raise RecipeError(f"{path}:{line}: `{dotted}` is set a second time (first at line {first}); TOML allows "
                              "a key or table once.", hint=f"delete one of the two (line {first} or {line}), keeping "
                                                           "the value you mean.") from None
        _malformed(path, e)
    data = _plain(doc.unwrap())
    env = doc.get("env")
    if isinstance(data.get("env"), dict) and hasattr(env, "items"):
        for k, v in env.items():
            data["env"][str(k)] = env_value(data["env"][str(k)], v.as_string() if hasattr(v, "as_string") else "")
    return data, text


def _malformed(path: Path, e: Exception) -> NoReturn:
    if isinstance(e, tomlkit.exceptions.ParseError):
        line = getattr(e, "line", None)
        col = getattr(e, "col", None)
        where = f"{path}:{line}:{col}" if line else str(path)
        msg = str(e).split(" at line")[0].rstrip(".")
        raise RecipeError(
            f"{where}: malformed TOML: {msg}.", hint="fix the syntax at that line (strings need quotes)."
        ) from None
    # tomlkit raises assorted errors on odd input; none must escape as a traceback
    raise RecipeError(f"{path}: malformed TOML: {str(e).rstrip('.')}.") from None


def duplicate_key(text: str) -> tuple[int, str, int] | None:
    """(line, dotted key, line of its first setting) of the first key or [table]
    a TOML text sets a second time, or None.
    Keys in [[array]] tables are each element's own, and are not compared."""
    seen: dict[str, int] = {}
    table: list[str] = []
    in_array = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _HEADER.match(line)
        if m:
            table = [p.strip().strip("\"'") for p in m.group(1).split(".")]
            in_array = line.lstrip().startswith("[[")
            dotted = ".".join(table)
            if not in_array:
                if f"[{dotted}]" in seen:
                    return lineno, dotted, seen[f"[{dotted}]"]
                seen[f"[{dotted}]"] = lineno
            continue
        k = _KEY.match(line)
        if k and not in_array:
            dotted = ".".join(table + [p.strip().strip("\"'") for p in k.group(1).split(".")])
            if dotted in seen:
                return lineno, dotted, seen[dotted]
            seen[dotted] = lineno
    return None


def env_value(value: Any, typed: str) -> Any:
    """An environment variable's value is a string: a number (or true/false) given for one is the string as it was
    typed (`0.250` stays `0.250`, `12.10` is not the float 12.1); anything else is left for validation to name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return typed.strip() or str(value)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.\"' -]+?)\s*=")


def locate(text: str, dotted: str) -> int | None:
    """The line (1-based) where `dotted` is set in a TOML text, or None. Handles tables and dotted keys."""
    target = dotted.split(".")
    table: list[str] = []
    best = inline = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _HEADER.match(line)
        if m:
            table = [p.strip().strip("\"'") for p in m.group(1).split(".")]
            if table == target and best is None:
                best = lineno
            continue
        k = _KEY.match(line)
        if k:
            key = table + [p.strip().strip("\"'") for p in k.group(1).split(".")]
            if key == target:
                return lineno
            if best is None and key[: len(target)] == target:
                best = lineno
            # an inline table (`extra = { hub_token = "..." }`) sets the keys under it on its own line
            if inline is None and len(key) < len(target) and target[: len(key)] == key \
                    and re.search(rf"[{{,]\s*[\"']?{re.escape(target[-1])}[\"']?\s*=", line):
                inline = lineno
    return best or inline


# --------------------------------------------------------------------------------------------------------------
# extends and --set

SET = "--set"
OPTIONS = ("--grid", "[sweep] grid")  # the other options whose values reach a recipe as sets (a sweep's)


def _load_chain(path: Path, seen: list[Path]) -> tuple[dict[str, Any], dict[str, Path], list[Path], dict[Path, str]]:
    try:
        path = path.resolve()
    except (OSError, RuntimeError) as e:
        raise RecipeError(f"{path}: cannot be resolved ({getattr(e, 'strerror', None) or e}).",
                          hint="fix the symlink or shorten the path.") from None
    if path in seen:
        cycle = " -> ".join(str(p) for p in [*seen, path])
        raise RecipeError(f"{seen[-1]}: `extends` forms a cycle: {cycle}.", hint="remove one of the extends.")
    data, text = read_toml(path)
    texts = {path: text}
    paths.resolve(data, path.parent)  # this file's paths against its own directory (rlctl.recipe.paths)
    parent = data.pop("extends", None)
    if parent is None:
        origins = {k: path for k in _leaf_paths(data)}
        return data, origins, [path], texts
    if not isinstance(parent, str):
        line = locate(text, "extends")
        raise RecipeError(f"{path}:{line}: `extends` must be a file path string, got {type(parent).__name__}.")
    base_path = (path.parent / parent) if not Path(parent).is_absolute() else Path(parent)
    if not base_path.exists() and bundled_recipe(parent) is not None:
        base_path = bundled_recipe(parent)  # type: ignore[assignment]
    try:
        base, origins, chain, base_texts = _load_chain(base_path, [*seen, path])
    except RecipeError as e:
        if not base_path.exists():
            line = locate(text, "extends")
            raise RecipeError(f"{path}:{line}: extends {parent!r}, but {base_path} does not exist.") from None
        raise e from None
    texts.update(base_texts)
    merged = deep_merge(base, data)
    for k in _leaf_paths(data):
        origins[k] = path
    return merged, origins, [*chain, path], texts


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _leaf_paths(data: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in data.items():
        p = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            out.extend(_leaf_paths(v, p))
        else:
            out.append(p)
    return out


class _Null:
    """`--set k=null`: TOML has no null, so the bare word `null` (as in Hydra) unsets a key; `"null"` is the string."""

    def __repr__(self) -> str:
        return "null"


NULL = _Null()


_EXTRA_KEY = re.compile(r"(backend\.[A-Za-z0-9_]+\.extra)\.(\S+)")


def split_key(dotted: str) -> list[str]:
    """A dotted recipe key's parts. A backend's passthrough table takes the backend's own keys as they are, dots and
    `+` included: everything after `extra.` is one key, as the TOML form `[backend.verl.extra] "a.b.c" = v` writes
    it (`--set` and a computed fix's `set` name such keys so)."""
    extra = _EXTRA_KEY.fullmatch(dotted)
    return [*extra.group(1).split("."), extra.group(2)] if extra else dotted.split(".")


def parse_set(expr: str) -> tuple[list[str], Any]:
    """`rollout.group_size=16` -> (["rollout", "group_size"], 16). Values are TOML values; bare words are strings;
    the bare word `null` is NULL (unset the key)."""
    key, sep, raw = expr.partition("=")
    key = key.strip()
    extra = _EXTRA_KEY.fullmatch(key)
    if not sep or not key or not (extra or re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", key)):
        raise RecipeError(
            f"--set {expr!r}: expected KEY=VALUE with a dotted key.", hint="e.g. --set rollout.group_size=16"
        )
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    keys = split_key(key)
    if raw == "null":
        return keys, NULL
    if keys[0] == "env" and len(keys) == 2:
        value = env_value(value, raw)
    return keys, value


def apply_sets(data: dict[str, Any], sets: list[str], origins: dict[str, Path],
               options: dict[str, str] | None = None) -> None:
    """Each `--set k=v` over the loaded recipe; a path it gives is relative to where the command was typed.
    `options` names the option a key came from when it was not --set (a sweep's `--grid`, `[sweep] grid`): an error
    about it names that option. `k=null` unsets a key (unset_problem says which keys can be)."""
    for expr in sets:
        keys, value = parse_set(expr)
        dotted = ".".join(keys)
        if value is NULL:
            problem = unset_problem(keys)
            if isinstance(problem, tuple):
                raise RecipeError(f"--set {expr}: `{dotted}` cannot be unset: {problem[0]}.", hint=problem[1])
            if problem is None:
                _unset(data, keys)
                for k in [k for k in origins if k == dotted or k.startswith(dotted + ".")]:
                    del origins[k]
                continue
            value = None  # not a key of the schema: validation names it, with a did-you-mean
        else:
            fragment: Any = value
            for k in reversed(keys):
                fragment = {k: fragment}
            paths.resolve(fragment, Path.cwd())
            for k in keys:
                fragment = fragment[k]
            value = _typed(keys, fragment)
        node = data
        for k in keys[:-1]:
            nxt = node.get(k)
            if not isinstance(nxt, dict):
                nxt = {}
                node[k] = nxt
            node = nxt
        node[keys[-1]] = value
        origins[dotted] = Path((options or {}).get(dotted, SET))


def _typed(keys: list[str], value: Any) -> Any:
    """A command line's value comes as text: for a number or boolean key (`--set train.steps="100"`, `--set
    train.gradient_checkpointing=True`) it is read as that key reads it (schema.from_text). A recipe file writes the
    value itself: text there is refused (schema.refuse_mistyped_scalar). Text that means no such value is left for
    validation to name."""
    if not isinstance(value, str):
        return value
    *table, name = keys
    model: Any = SECTIONS.get(".".join(table))
    if model is None and len(table) == 3 and table[:2] == ["eval", "sets"]:  # [eval.sets.<name>]
        model = SECTIONS.get("eval.sets")
    elif model is None and len(table) == 2 and table[0] == "backend" and table[1] in available_backends():
        model = backend_table_model(table[1])
    elif model is None and len(table) == 2 and table[0] == "executor" and table[1] in available_executors():
        model = executor_table_model(table[1])
    kinds = scalar_kinds(model, name) if model is not None else None
    meant = from_text(kinds, value) if kinds else None
    return value if meant is None else meant


def resolved_sets(sets: list[str], base: Path) -> list[str]:
    """`--set` expressions as they must be kept to mean the same elsewhere (an experiment's arms, replayed by its
    queue in whatever directory it was started from): a path key's value made absolute against `base`
    (rlctl.recipe.paths), every other expression as typed."""
    out = []
    for expr in sets:
        keys, value = parse_set(expr)
        fragment: Any = value
        for k in reversed(keys):
            fragment = {k: fragment}
        paths.resolve(fragment, base)
        for k in keys:
            fragment = fragment[k]
        out.append(f"{'.'.join(keys)}={json.dumps(fragment)}" if fragment != value else expr)
    return out


def _unset(data: dict[str, Any], keys: list[str]) -> None:
    node: Any = data
    for k in keys[:-1]:
        node = node.get(k) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(keys[-1], None)


UNKNOWN = "unknown"


def unset_problem(keys: list[str]) -> None | str | tuple[str, str]:
    """Whether `--set KEY=null` may unset a key: None when it may (its schema default is None: the key is optional; or
    it is an entry of a free-form table: [env], `extra`, an eval set), UNKNOWN when the schema has no such key, else
    (why not, the fix)."""
    dotted = ".".join(keys)
    if len(keys) == 4 and keys[2] == "extra" and keys[3].lstrip("+").startswith("~"):
        # `~key` is a deletion in Hydra's grammar, not a key: `=null` would only drop it from the table, silently
        return (f"`{keys[3]}` (a deletion in Hydra's override grammar) is not passed through: rlctl renders its own "
                "value for the keys it sets and refuses to delete them",
                "set the recipe key rlctl renders it from, or give the key a value")
    model: Any = Recipe
    parent: Any = None  # the field holding `model`
    entry_of: Any = None  # inside a mapping: the type of its values
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if entry_of is not None:  # `k` names an entry
            sub = submodel(entry_of)
            if last or sub is None:
                return None
            model, entry_of = sub, None
            continue
        field = model.model_fields.get(k)
        if field is None:
            if issubclass(model, BackendSection) and k in available_backends():  # [backend.<name>]
                if last:
                    return None
                model, parent = backend_table_model(k), None
                continue
            if model.model_config.get("extra") == "allow" and not issubclass(model, BackendSection):
                return None  # a section of free keys ([doctor])
            return UNKNOWN
        if last:
            break
        entry_of = _mapping_values(field.annotation)
        if entry_of is None:
            sub = submodel(field.annotation)
            if sub is None:
                return UNKNOWN  # a value has no keys under it
            model, parent = sub, field
    value_fix = f"give it a value instead: --set {dotted}=<VALUE>"
    if field.is_required():
        section = ".".join(keys[:-1])
        if parent is not None and not parent.is_required() and parent.get_default() is None:
            return (f"[{section}] must give it", f"{value_fix}, or remove the whole table: --set {section}=null")
        return "the recipe must give it", value_fix
    default = field.get_default(call_default_factory=True)
    if default is None:
        return None
    if isinstance(default, BaseModel):
        return "the section always exists", "unset the keys under it that have no default, one by one"
    shown = json.dumps(default, default=str)
    return (f"it always has a value (default {shown})",
            f"{value_fix}, e.g. its default: --set {dotted}={shown}. Only keys without a default can be unset.")


def _mapping_values(annotation: Any) -> Any:
    """The value type of a dict annotation (or of the dict in an Optional one), else None."""
    if typing.get_origin(annotation) is dict:
        return typing.get_args(annotation)[1]
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is dict:
            return typing.get_args(arg)[1]
    return None


# --------------------------------------------------------------------------------------------------------------
# validation with useful messages


def suggest(dotted: str, table: bool = False) -> str | None:
    """A did-you-mean for an unknown dotted key: an alias, the same name in another section, or a close spelling.
    A section is suggested only for a table (`tokn = ...` is no misspelt [logging.wandb]); a key that looks like a
    credential gets none: the secret refusal advises it (a did-you-mean would put the key into, say, a run name)."""
    from rlctl.core.secrets import credential_slip

    if credential_slip(dotted):
        return None
    leaf = dotted.split(".")[-1]
    section = dotted.rsplit(".", 1)[0] if "." in dotted else ""
    if leaf in ALIASES:
        return ALIASES[leaf]
    if dotted in ALIASES:
        return ALIASES[dotted]
    known = [p for p in all_key_paths() if table or p not in SECTIONS]
    if section.startswith("executor.") and (table := executor_table_model(section.split(".")[1])) is not None:
        known = [f"{section}.{k}" for k in table.model_fields]  # an executor's own table: its keys
    same_leaf = [p for p in known if p.split(".")[-1] == leaf and p != dotted]
    if same_leaf:
        return same_leaf[0]
    siblings = [p.split(".")[-1] for p in known if (p.rsplit(".", 1)[0] if "." in p else "") == section]
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if close:
        return f"{section}.{close[0]}" if section else close[0]
    close = difflib.get_close_matches(dotted, known, n=1, cutoff=0.7)
    return close[0] if close else None


def _unknown_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    model = SECTIONS.get(prefix)
    if model is None:
        return []
    out = []
    for k, v in data.items():
        p = f"{prefix}.{k}" if prefix else k
        if prefix == "backend" and k not in model.model_fields and k in available_backends():
            # [backend.<name>] holds `extra` and the adapter's own options
            allowed = backend_table_model(k).model_fields
            out.extend(f"{p}.{inner}" for inner in (v if isinstance(v, dict) else {}) if inner not in allowed)
        elif prefix == "executor" and k in available_executors():
            # [executor.<name>] holds the executor's own options (its table_model)
            table = executor_table_model(k)
            allowed = table.model_fields if table is not None else {}
            out.extend(f"{p}.{inner}" for inner in (v if isinstance(v, dict) else {}) if inner not in allowed)
        elif k not in model.model_fields:
            out.append(p)
        elif p == "eval.sets" and isinstance(v, dict):  # [eval.sets.<name>]: each table is one eval set
            for name, table in v.items():
                if isinstance(table, dict):
                    out.extend(f"{p}.{name}.{inner[len(p) + 1:]}" for inner in _unknown_keys(table, p))
        elif isinstance(v, dict) and p in SECTIONS and not p.endswith(".extra") and p != "doctor":
            out.extend(_unknown_keys(v, p))
    return out


def _where(dotted: str, origins: dict[str, Path], texts: dict[Path, str], top: Path) -> str:
    src = origins.get(dotted)
    if src is None:
        # a section-level error: use the file that set any key under it
        for k, v in origins.items():
            if k.startswith(dotted + ".") or dotted.startswith(k + "."):
                src = v
                break
    if src is None:
        src = top
    if str(src) == SET or str(src) in OPTIONS:
        return f"{src} {dotted}"
    line = locate(texts.get(src, ""), dotted)
    return f"{src}:{line}" if line else str(src)


_KEY_IN_TEXT = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+")


def _blamed(dotted: str, msg: str, origins: dict[str, Path]) -> str:
    """The key a check's error points at. A check of several keys (colocate beside the GPU lists, a backend's table)
    fails on its section or on one of them; the keys its message names under it say which: the one an option gave
    (--set is the last word, so it made the contradiction), else the first named."""
    named = [k for k in _KEY_IN_TEXT.findall(msg) if k == dotted or k.startswith(dotted + ".")]
    for k in named:
        src = origins.get(k) or next((v for o, v in origins.items() if o.startswith(k + ".")), None)
        if src is not None and (str(src) == SET or str(src) in OPTIONS):
            return k
    return named[0] if named else dotted


def _expected(err: dict[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    t = err["type"]
    if t == "finite_number":
        return "a finite number (inf and nan are not settings; write the value itself, e.g. 1.0)"
    if t == "literal_error":
        return f"one of {ctx.get('expected')}"
    if t in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[t]
        bound = next(iter(ctx.values()), "")
        limit = (" (rlctl's upper limit for this key, far above any real run: see docs/checks.md, Limits)"
                 if t == "less_than_equal" and isinstance(bound, int) and bound >= 1000 else "")
        return f"a value {op} {bound}{limit}"
    return err["msg"].lower()


_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _range_fix(dotted: str) -> str | None:
    """The fix of a value out of its key's range: the whole range the key takes (both bounds, from the schema), what
    the key means, and, for an optional key, that it can be left out (its description says what unset means)."""
    section, _, name = dotted.rpartition(".")
    model = SECTIONS.get(section)
    info = model.model_fields.get(name) if model is not None else None
    if info is None:
        return None
    bounds: dict[str, Any] = {}
    whole = False
    anns = [info.annotation, *typing.get_args(info.annotation)]  # `Steps | None`: the bounds sit in the union
    listed = [typing.get_args(a)[0] for a in anns if typing.get_origin(a) is list and typing.get_args(a)]
    for ann in [*anns, *listed]:  # `list[GpuId]`: each element's bounds
        base, *meta = typing.get_args(ann) if typing.get_origin(ann) is typing.Annotated else (ann,)
        for m in [*meta, *info.metadata]:
            for f in getattr(m, "metadata", [m]):  # a nested FieldInfo holds its constraints in .metadata
                for op in ("ge", "gt", "le", "lt"):
                    if getattr(f, op, None) is not None:
                        bounds[op] = getattr(f, op)
        whole = whole or base is int
    lo = (">=", bounds["ge"]) if "ge" in bounds else (">", bounds["gt"]) if "gt" in bounds else None
    hi = ("<=", bounds["le"]) if "le" in bounds else ("<", bounds["lt"]) if "lt" in bounds else None
    kind = "a whole number" if whole else "a number"
    if lo and hi and lo[0] == ">=" and hi[0] == "<=":
        allowed = f"{kind} from {lo[1]} to {hi[1]}"
    else:
        allowed = " and ".join(f"{kind if i == 0 else ''} {op} {v}".strip() for i, (op, v) in
                               enumerate(b for b in (lo, hi) if b))
    if not allowed:
        return None
    fix = f"set {allowed}"
    if not info.is_required() and info.default is None:
        fix += ", or remove the key"
    if listed:
        fix = fix.replace("set a", "give each element a", 1)
    if info.description:
        d = info.description
        fix += f" ({dotted}: {d[0].lower() if d[1:2].islower() else d[0]}{d[1:].rstrip('.')})"  # GPU stays GPU
    default = info.get_default(call_default_factory=True)
    example = default if isinstance(default, (int, float)) and not isinstance(default, bool) else (lo or hi)[1]
    return fix + f"; e.g. {name} = {json.dumps([example] if listed else example)}."


def _type_fix(err: dict[str, Any], dotted: str, data: dict[str, Any]) -> str:
    """The fix of a value of the wrong type: what the key takes, written as the recipe writes it, with an example."""
    t, got, leaf = err["type"], err.get("input"), dotted.rsplit(".", 1)[-1]
    if t == "string_type" and isinstance(got, (int, float)) and not isinstance(got, bool):
        fix = f'quote it (TOML reads {got} unquoted as a number): {leaf} = "{got}"'
        if dotted == "backend.version":
            from rlctl.backends import get_backend

            try:
                known = get_backend(str((data.get("backend") or {}).get("name"))).known_versions
            except Exception:  # an unknown backend is its own error
                known = ()
            fix += f"; known releases: {', '.join(known)}" if known else ""
        return fix
    if t.startswith(("int_", "float_")):
        whole = t.startswith("int_")
        return _range_fix(dotted) or f"set {'a whole number' if whole else 'a number'} (no quotes), e.g. " \
                                     f"{leaf} = {1 if whole else 1.0}"
    if t.startswith("bool_"):
        return f"write true or false (no quotes), e.g. {leaf} = true"
    if t in ("dict_type", "model_type", "model_attributes_type"):
        return f"write a table: [{dotted}] with one `key = value` a line, or {leaf} = {{ key = \"value\" }}"
    form, fix = _forms(dotted)
    if fix:
        return fix
    if t == "list_type":
        return f"write a list in brackets, e.g. {leaf} = [\"a\", \"b\"]"
    return f"give {dotted} {_expected(err)} instead of {_shown(got)}"


def literal_secrets(data: dict[str, Any]) -> list[str]:
    """Dotted keys whose value rlctl would write although their name says a secret: outside [env], a secret name
    (is_secret_name) or a slip of one (credential_slip) that holds a value; in [env], a slip of a secret name that
    holds a literal (a real secret name is masked as ${NAME}; a slip would be written in plain text).
    rlctl passes secrets to a run only through its environment, never through argv or config files it writes."""
    from rlctl.core.secrets import credential_slip, looks_secret

    found: list[str] = []
    env = data.get("env")
    if isinstance(env, dict):
        found.extend(f"env.{k}" for k, v in env.items() if credential_slip(str(k)) and isinstance(v, str)
                     and v and not re.fullmatch(r"\$\{[^}]+\}", v.strip()))

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                dotted = f"{prefix}.{k}" if prefix else str(k)
                if dotted == "env":
                    continue
                if looks_secret(str(k)) and v not in (None, "", True, False) and not isinstance(v, dict):
                    found.append(dotted)
                else:
                    walk(v, dotted)
        elif isinstance(node, list):
            for v in node:
                walk(v, prefix)

    walk(data, "")
    return found


def _key_of(loc: tuple[Any, ...], data: dict[str, Any]) -> tuple[str, bool]:
    """(the recipe key an error is about, whether pydantic went into a union to find it). A union's member tags
    (`run.on.str`, `run.on.list[str]`) are no keys: the key is the longest part of the path the recipe has."""
    node: Any = data
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            if isinstance(node, list) and 0 <= p < len(node):
                node = node[p]
            continue
        if not isinstance(node, dict) or p not in node:
            return ".".join(parts), True
        parts.append(str(p))
        node = node[p]
    return ".".join(parts), False


def _shown(value: Any) -> str:
    """A value as the recipe wrote it (TOML's scalars and arrays as JSON writes them), else its type's name."""
    try:
        return json.dumps(value) if isinstance(value, (int, float, str, bool, list)) else type(value).__name__
    except (TypeError, ValueError):
        return type(value).__name__


def _forms(dotted: str) -> tuple[str, str | None]:
    """What a key of several forms takes (its declared `form`, else its type's members) and a fix from its examples."""
    section, _, name = dotted.rpartition(".")
    model = SECTIONS.get(section)
    info = model.model_fields.get(name) if model is not None else None
    if info is None:
        return "another value", None
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    form = str(extra.get("form") or " or ".join(
        getattr(a, "__name__", str(a)) for a in typing.get_args(info.annotation) if a is not type(None)))
    examples = [f"{dotted} = {json.dumps(v)}" for v in info.examples or []]
    return form, (f"write {' or '.join(examples)}" if examples else None)


def validate(
    data: dict[str, Any], origins: dict[str, Path], texts: dict[Path, str], top: Path
) -> Recipe:
    problems: list[str] = []
    unknown = _unknown_keys(data)
    hints = {dotted: suggest(dotted, isinstance(_at(data, dotted), dict)) for dotted in unknown}
    misplaced = {dotted: table for dotted in unknown if (table := _backend_table_key(dotted, data))}
    secrets: set[str] = set()
    held: dict[str, list[str]] = {}  # a misplaced backend key -> the secrets under it (said in its one error)
    for dotted in literal_secrets(data):
        if (at := next((m for m in misplaced if dotted.startswith(m + ".")), None)) is not None:
            held.setdefault(at, []).append(dotted)
            continue
        if _typo(dotted, hints.get(dotted)):  # a key the schema lacks, a slip of one it has, is a typo first: it
            continue  # holds nothing rlctl would write (refused below as unknown); elsewhere the rule holds as ever
        secrets.add(dotted)  # one error per key: a key refused as a secret is not also an unknown key
        problems.append(_secret_problem(dotted, _where(dotted, origins, texts, top)))
    for dotted in unknown:
        if dotted in secrets:
            continue
        where = _where(dotted, origins, texts, top)
        if dotted in misplaced:
            problems.append(_misplaced_problem(dotted, misplaced[dotted], where, held.get(dotted, [])))
            continue
        hint = hints[dotted]
        msg = f"{where}: unknown key `{dotted}`."
        if hint:
            section = hint.rsplit(".", 1)[0] if "." in hint else ""
            if hint.split(".")[-1] == dotted.split(".")[-1] and section:
                msg += f" It belongs in the [{section}] section: did you mean `{hint}`?"
            else:
                msg += f" Did you mean `{hint}`?"
        problems.append(msg)
    # every problem at once: the keys the schema has are validated too, without the unknown ones (each said above)
    known = _without(data, unknown)
    try:
        recipe = Recipe.model_validate(known)
    except ValidationError as e:
        unions: set[str] = set()
        errors: list[Any] = []
        for err in e.errors():  # a table's own model's errors (TableErrors) are worded as its keys' errors
            nested = (err.get("ctx") or {}).get("error")
            errors.extend(nested.errors if isinstance(nested, TableErrors) else [err])
        for err in errors:
            dotted = ".".join(str(p) for p in err["loc"] if not isinstance(p, int))
            if err["type"] != "missing":
                dotted, in_union = _key_of(tuple(err["loc"]), data)
                if in_union and err["type"] != "value_error":  # one problem for the key, not one per member
                    if dotted not in unions:
                        unions.add(dotted)
                        form, fix = _forms(dotted)
                        got = err.get("input")
                        problems.append(f"{_where(dotted, origins, texts, top)}: `{dotted}` = {_shown(got)} is "
                                        f"invalid: expected {form}." + (f"\n  fix: {fix}" if fix else ""))
                    continue
            if err["type"] == "value_error":
                dotted = _blamed(dotted, err["msg"], origins)
            where = _where(dotted, origins, texts, top)
            if err["type"] == "missing" and dotted in hints.values():
                continue  # a misspelling of it is said above, with its did-you-mean
            if err["type"] == "missing" and (by := _made_by_option(dotted, origins)):
                option, key = by  # the section exists only because an option set a key of it: that option is why
                section = dotted.rsplit(".", 1)[0]
                problems.append(f"{option} {key}: sets [{section}], which then needs `{dotted}` (missing)."
                                f"\n  fix: also {option} {dotted}=..., or drop {option} {key}.")
            elif err["type"] == "missing":
                section = dotted.rsplit(".", 1)[0] if "." in dotted else dotted
                problems.append(f"{where}: missing required key `{dotted}`." + (
                    f" Add it under [{section}]." if "." in dotted else f" Add a [{dotted}] table."
                ))
            elif err["type"] == "value_error":
                msg, has_fix, fix = err["msg"].removeprefix("Value error, ").partition("\n  fix: ")
                key = f"`{dotted}`: " if "." in dotted and dotted not in msg else ""
                problems.append(f"{where}: {key}{msg}." + (f"\n  fix: {fix}" if has_fix else ""))
            else:
                got = err.get("input")
                got_s = _shown(got)
                fix = _range_fix(dotted) if err["type"] in _BOUNDS else _type_fix(err, dotted, data)
                problems.append(f"{where}: `{dotted}` = {got_s} is invalid: expected {_expected(err)}."
                                + (f"\n  fix: {fix}" if fix else ""))
    if problems:
        raise RecipeError("\n".join(problems)) from None
    return recipe


def _made_by_option(dotted: str, origins: dict[str, Path]) -> tuple[str, str] | None:
    """(option, key) when every key set under `dotted`'s section came from an option (--set, --grid): the section, and
    so its missing key, is that option's doing, not the file's."""
    section = dotted.rsplit(".", 1)[0] if "." in dotted else ""
    under = [(k, str(src)) for k, src in origins.items() if section and k.startswith(section + ".")]
    if under and all(src == SET or src in OPTIONS for _, src in under):
        return under[0][1], under[0][0]
    return None


def _secret_problem(dotted: str, where: str) -> str:
    """The refusal of a secret written into a recipe, with its fix: the environment variable its library reads."""
    from rlctl.core.secrets import corrected, credential_slip, env_name_for

    slip = credential_slip(dotted)
    if dotted.startswith("env."):
        name = corrected(dotted[4:])
        return (f"{where}: `{dotted}` is spelt like a secret ({slip[0] if slip else ''} for {slip[1] if slip else ''})"
                f" but is not a secret name, so its value would be written in plain text into the run's files."
                f"\n  fix: spell it {name} and give it from your environment: [env] {name} = \"${{{name}}}\" and "
                f"`export {name}=...`.")
    name = env_name_for(dotted)
    said = "holds a secret" if not slip else f"looks like a credential ({slip[0]} for {slip[1].lower()})"
    return (f"{where}: `{dotted}` {said}; rlctl never writes secrets into a run's argv or files. Remove it and put "
            f"the credential in the environment under the name the backend reads (e.g. [env] {name} = \"${{{name}}}\""
            f" and `export {name}=...`): environment secrets reach the run without being written anywhere.")


def _backend_table_key(dotted: str, data: dict[str, Any]) -> str | None:
    """`backend.extra` (or another key of a `[backend.<name>]` table) written directly under [backend]: the table it
    belongs in, `backend.<the recipe's backend>.extra`, or `backend.<name>.extra` where the recipe names none."""
    section, _, leaf = dotted.rpartition(".")
    if section != "backend":
        return None
    backend = data.get("backend") if isinstance(data.get("backend"), dict) else {}
    name = backend.get("name") if isinstance(backend.get("name"), str) else None
    known = name in available_backends()
    if leaf not in (backend_table_model(name) if known else BackendExtra).model_fields:
        return None
    return f"backend.{name if known else '<name>'}.{leaf}"


def _misplaced_problem(dotted: str, meant: str, where: str, secrets: list[str]) -> str:
    """One error for a backend table's key put directly under [backend], with the secret advice for any key under it
    (moved to where it belongs, a secret would still be refused)."""
    section = meant.rsplit(".", 1)[0]
    msg = (f"{where}: `{dotted}` is no key of [backend]: it belongs in a backend's own table, "
           f"[backend.<name>.{meant.rsplit('.', 1)[1]}]" + (f" ([{meant}] for this recipe's backend)" if
                                                            "<name>" not in meant else "") + ".")
    fix = f"move it: [{meant}]" if "<name>" not in meant else f"move it under [{section}] of the backend that runs it"
    if secrets:
        fix += " (without the secret below)"
    msg += f"\n  fix: {fix}."
    for s in secrets:  # the secret's own advice, without a second location
        msg += "\n  " + _secret_problem(s, "").removeprefix(": ")
    return msg


def _typo(dotted: str, hint: str | None) -> bool:
    """Whether an unknown key is a slip of the known key `hint` (`max_token` of `max_tokens`), not merely near it
    (`hf_token` is near `max_tokens` too, and means a credential)."""
    if not hint:
        return False
    leaf, meant = dotted.rsplit(".", 1)[-1], hint.rsplit(".", 1)[-1]
    return leaf == meant or difflib.SequenceMatcher(None, leaf, meant).ratio() >= 0.8


def _at(data: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted key (a table's name may hold dots, as in _without), else None."""
    node: Any = data
    rest = dotted
    while isinstance(node, dict) and rest not in node:
        head = next((k for k in node if rest.startswith(f"{k}.")), None)
        if head is None:
            return None
        node, rest = node[head], rest[len(head) + 1:]
    return node.get(rest) if isinstance(node, dict) else None


def _without(data: dict[str, Any], dotted_keys: list[str]) -> dict[str, Any]:
    """A copy of `data` without the keys named (dotted, as _unknown_keys names them; a table's name may hold dots)."""
    if not dotted_keys:
        return data
    out = copy.deepcopy(data)
    for dotted in dotted_keys:
        node: Any = out
        rest = dotted
        while isinstance(node, dict) and rest not in node:
            head = next((k for k in node if rest.startswith(f"{k}.")), None)
            if head is None:
                break
            node, rest = node[head], rest[len(head) + 1:]
        if isinstance(node, dict):
            node.pop(rest, None)
    return out


def load(path: str | Path, sets: list[str] | None = None, options: dict[str, str] | None = None) -> ResolvedRecipe:
    """Load a recipe file (or a bundled recipe by name) with its extends chain and --set overrides, validated.
    `options`: {dotted key: the option that set it} for keys set by another option than --set (apply_sets)."""
    p = Path(path)
    if not p.exists() and bundled_recipe(str(path)) is not None and "/" not in str(path):
        p = bundled_recipe(str(path))  # type: ignore[assignment]
    data, origins, chain, texts = _load_chain(p, [])
    apply_sets(data, sets or [], origins, options)
    recipe = validate(data, origins, texts, p.resolve())
    return ResolvedRecipe(recipe=recipe, data=data, path=p.resolve(), origins=origins, chain=chain)
