"""References: everything a recipe points at must exist and be usable before a GPU is touched — the reward file
(parsed with `ast`, never imported) and the function it names, the data files, the model directory and its
config.json, a user patch directory. A reference that cannot work fails with where it was set and the fix."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError
from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check
from rlctl.recipe.loader import file_problem
from rlctl.recipe.paths import is_id

MAX_REWARD_BYTES = 16 * 1024 * 1024
# where relative paths point (rlctl.recipe.paths resolved them so when the recipe was loaded)
RELATIVE = "a path in a recipe file is relative to that file, one given with --set to the current directory"


def verdict_for(ctx: Context, problem: str) -> str:
    """A path that does not exist here fails a local run; a run on a remote cluster reads it there, so only a
    warning. Any other problem (a FIFO, unreadable, a directory) fails."""
    res = ctx.recipe.resources
    remote = res.executor != "local" and bool(res.ray_address)
    return WARN if remote and problem == "does not exist" else FAIL


def where(ctx: Context, dotted: str) -> str:
    """`recipe.toml:12` (or `--set`) for the key that set `dotted`, for messages."""
    return key_where(ctx.prepared.resolved, dotted)


def key_where(resolved: Any, dotted: str) -> str:
    """`recipe.toml:12` (or `--set`) for the key of a resolved recipe that set `dotted`."""
    from rlctl.recipe.loader import locate

    src = resolved.origins.get(dotted, resolved.path)
    if str(src) == "--set":
        return f"--set {dotted}"
    try:
        line = locate(Path(src).read_text(errors="replace"), dotted)
    except (OSError, ValueError):
        line = None
    return f"{src}:{line}" if line else str(src)


def looks_local(value: str) -> bool:
    """A value meant as a local path (not a Hub id like `openai/gsm8k` or a URL): the loader made every local path
    absolute (rlctl.recipe.paths); what it left relative is an id, whatever the current directory holds."""
    return not is_id(value) and Path(value).is_absolute()


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except (OSError, ValueError):
        return False


def defined_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Top-level names a module defines (functions, classes, assignments, imports), and whether it has a
    `from x import *` that could define more."""
    names: set[str] = set()
    star = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    star = True
                else:
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):  # `try: from fast import f / except: def f(...)`
            sub = ast.Module(body=[*node.body, *getattr(node, "orelse", []),
                                   *(h for hd in getattr(node, "handlers", []) for h in hd.body),
                                   *getattr(node, "finalbody", [])], type_ignores=[])
            more, more_star = defined_names(sub)
            names |= more
            star = star or more_star
    return names, star


@check("reference.reward")
def reward(ctx: Context) -> Result | None:
    r = ctx.recipe.reward
    if not r.function:
        return None
    name = "reference.reward"
    at = where(ctx, "reward.function")
    if re.match(r"^https?://", r.function):
        return Result(name, SKIP, f"reward.function is a URL ({r.function}); a remote reward is not checked")
    p = Path(r.function).expanduser()
    problem = file_problem(p)
    if problem:
        return Result(name, verdict_for(ctx, problem), f"{at}: reward.function {r.function} {problem}",
                      f"point reward.function at the Python file that defines the reward ({RELATIVE})")
    try:
        if p.stat().st_size > MAX_REWARD_BYTES:
            return Result(name, FAIL, f"{at}: reward.function {p} is {p.stat().st_size} bytes: not a reward module",
                          "point reward.function at the .py file")
        source = p.read_bytes()
    except OSError as e:
        return Result(name, FAIL, f"{at}: reward.function {p} cannot be read ({e.strerror})",
                      "check its permissions")
    try:
        tree = ast.parse(source, filename=str(p))
    except SyntaxError as e:
        return Result(name, FAIL, f"{p}:{e.lineno or '?'}: the reward file is not valid Python ({e.msg})",
                      "fix the syntax at that line (python -m py_compile shows it too)")
    except (ValueError, RecursionError, MemoryError) as e:
        return Result(name, FAIL, f"{p}: the reward file cannot be parsed as Python ({type(e).__name__})",
                      "check that it is a Python source file")
    names, star = defined_names(tree)
    fn = r.function_name
    if fn in names:
        return Result(name, OK, f"{p.name} defines {fn}")
    if star:
        return Result(name, WARN, f"{p.name} does not define {fn} itself; it may come from a `import *`",
                      f"define {fn} in {p.name}, or import it by name")
    funcs = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    close = ", ".join(funcs[:8]) or "no functions"
    return Result(name, FAIL, f"{at}: {p.name} defines no {fn!r} (reward.function_name); it defines: {close}",
                  f"set reward.function_name = \"{funcs[0]}\"" if len(funcs) == 1 else
                  f"define {fn}(completions, **kwargs) in {p.name}, or set reward.function_name")


def _data_result(ctx: Context, key: str, value: str) -> Result:
    from rlctl.recipe.data import count_records

    name = "reference.data"
    at = where(ctx, key)
    if not looks_local(value):
        return Result(name, SKIP, f"{key} = {value!r} is not a local path (a dataset id?); the backend fetches it")
    p = Path(value).expanduser()
    if not _is_dir(p):
        problem = file_problem(p)
        if problem:
            return Result(name, verdict_for(ctx, problem), f"{at}: {key} {value} {problem}",
                          f"point {key} at a JSONL, JSON or Parquet file ({RELATIVE})")
    try:
        n = count_records(p)
    except RlctlError as e:
        return Result(name, FAIL, f"{at}: {key}: {e.message}", e.hint or f"fix or replace {p}")
    if n == 0:
        return Result(name, FAIL, f"{at}: {key} {p} has no records", f"fill {p.name} with prompts, one per line")
    return Result(name, OK, f"{key}: {n} records in {p.name}")


@check("reference.data", hosts="reference")
def data(ctx: Context) -> list[Result]:
    d = ctx.recipe.data
    out = [_data_result(ctx, "data.train", d.train)]
    if d.eval:
        out.append(_data_result(ctx, "data.eval", d.eval))
    for name, s in ctx.recipe.eval.sets.items():
        out.append(_data_result(ctx, f"eval.sets.{name}.data", s.data))
    return out + ctx.backend.preflight(ctx, "reference")  # the columns and shapes the backend reads


@check("reference.model")
def model(ctx: Context) -> Result:
    from rlctl.recipe.models import KNOWN, resolve_arch

    name = "reference.model"
    value = ctx.recipe.model.path
    at = where(ctx, "model.path")
    if value.startswith("random:"):
        try:
            resolve_arch(value)
        except RlctlError as e:
            return Result(name, FAIL, f"{at}: {e.message}", e.hint or "e.g. random:qwen2?hidden=64&layers=2")
        return Result(name, OK, f"{value}: created locally at launch")
    if not looks_local(value):
        if value.lower() in KNOWN:
            return Result(name, OK, f"{value}: a known Hub model (fetched by the backend)")
        return Result(name, SKIP, f"model.path {value!r} is not a local directory (a Hub id?); not checked",
                      f"point model.path at a local directory to have its config checked ({RELATIVE}; "
                      "write ./ before a relative one)")
    p = Path(value).expanduser()
    if not _is_dir(p):
        problem = file_problem(p) or "is a file, not a model directory"
        return Result(name, verdict_for(ctx, problem), f"{at}: model.path {value} {problem}",
                      "point model.path at the directory holding config.json and the weights (or a Hub id)")
    try:
        arch = resolve_arch(str(p))
    except RlctlError as e:
        return Result(name, FAIL, f"{at}: {e.message}", e.hint or f"check {p / 'config.json'}")
    try:
        entries = {q.name for q in p.iterdir()}
    except OSError as e:
        return Result(name, FAIL, f"{at}: model.path {p} cannot be listed ({e.strerror})", "check its permissions")
    weights = any(n.endswith((".safetensors", ".bin", ".pt", ".pth")) or n.endswith(".index.json") for n in entries)
    tok = any(n in entries for n in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json"))
    missing = [w for w, ok in (("weights (*.safetensors / *.bin)", weights), ("a tokenizer", tok)) if not ok]
    if missing:
        return Result(name, WARN, f"{p.name}: config.json is usable ({arch.params / 1e9:.3g}B params) but the "
                                  f"directory has no {' and no '.join(missing)}",
                      "copy the full model (huggingface-cli download MODEL --local-dir DIR)")
    return Result(name, OK, f"{p.name}: config.json, weights and tokenizer present")


@check("reference.patches")
def patches_dir(ctx: Context) -> Result | None:
    d = ctx.recipe.patches.dir
    if not d:
        return None
    p = Path(d).expanduser()
    if not _is_dir(p):
        return Result("reference.patches", FAIL, f"{where(ctx, 'patches.dir')}: patches.dir {d} is not a directory",
                      "point patches.dir at a directory of <backend>/<version>/ patch sets")
    return Result("reference.patches", OK, f"patches.dir {p} exists")
