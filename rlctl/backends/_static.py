"""Read a backend's own definitions of its flags and keys *statically* (no import, so no torch/ray/vllm).

- argparse: `parser.add_argument("--flag", ...)` calls, including f-string flags built in a loop over constants
  (OpenRLHF >= 0.10.2 declares `--actor.adam.lr` that way).
- pydantic: nested config classes (prime-rl), flattened to dotted key paths from a root class.
- dataclasses: field names of a class and its bases (TRL's GRPOConfig on top of transformers' TrainingArguments).
- YAML: dotted key paths of a Hydra config (verl's generated ppo_trainer.yaml).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any


def _const_str(node: ast.AST, env: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in env:
                parts.append(env[v.value.id])
            else:
                return None
        return "".join(parts)
    return None


def _kw(call: ast.Call) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in call.keywords:
        if k.arg in ("type", "action", "nargs", "choices", "default"):
            try:
                out[k.arg] = ast.literal_eval(k.value)
            except (ValueError, SyntaxError, TypeError):
                out[k.arg] = ast.unparse(k.value)
    return out


def argparse_flags(source: str) -> dict[str, dict[str, Any]]:
    """Every `--flag` declared with add_argument in a module, with type/action/nargs/choices/default."""
    tree = ast.parse(source)
    flags: dict[str, dict[str, Any]] = {}

    def visit(node: ast.AST, env: dict[str, str]) -> None:
        loop = isinstance(node, ast.For) and isinstance(node.target, ast.Name)
        if loop and isinstance(node.iter, (ast.Tuple, ast.List)):
            values = [e.value for e in node.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            for value in values:
                for child in node.body:
                    visit(child, {**env, node.target.id: value})
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                name = _const_str(arg, env)
                if name and name.startswith("-"):
                    info = _kw(node)
                    if isinstance(info.get("default"), str) and "{" in info["default"]:
                        info.pop("default")
                    flags[name] = info
        for child in ast.iter_child_nodes(node):
            visit(child, env)

    visit(tree, {})
    return flags


# ---------------------------------------------------------------------------------------------------------------


def _annotation_names(node: ast.AST | None) -> list[str]:
    """Names appearing in a type annotation, unwrapping Annotated[...] metadata (only its first argument counts)."""
    if node is None:
        return []
    if isinstance(node, ast.Subscript):
        base = node.value
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        if base_name == "Annotated":
            sl = node.slice
            first = sl.elts[0] if isinstance(sl, ast.Tuple) else sl
            return _annotation_names(first)
        inner = node.slice
        items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        out = [base_name]
        for it in items:
            out.extend(_annotation_names(it))
        return out
    if isinstance(node, ast.BinOp):
        return _annotation_names(node.left) + _annotation_names(node.right)
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):  # `vf.EnvConfig`: another package's class, opaque here
        return [ast.unparse(node)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation_names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return []
    return []


Sources = dict[str, str]  # module name -> source text


class _Namespace:
    """Classes, type aliases and imported names of a set of modules, resolved per module."""

    def __init__(self, sources: Sources):
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        self.aliases: dict[tuple[str, str], ast.AST] = {}
        self.imports: dict[tuple[str, str], tuple[str, str]] = {}
        for module, src in sources.items():
            tree = ast.parse(src)
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes[(module, node.name)] = node
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                    self.aliases[(module, node.target.id)] = node.value  # X: TypeAlias = A | B
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    self.aliases[(module, node.targets[0].id)] = node.value
                elif isinstance(node, ast.ImportFrom) and node.module is not None:
                    base = node.module
                    if node.level:  # relative import
                        parts = module.split(".")[: -node.level]
                        base = ".".join([*parts, node.module]) if node.module else ".".join(parts)
                    for a in node.names:
                        self.imports[(module, a.asname or a.name)] = (base, a.name)

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """The (module, name) of the class or alias a name refers to in a module."""
        key = (module, name)
        if key in self.classes or key in self.aliases:
            return key
        if key in self.imports and depth < 10:
            return self.resolve(*self.imports[key], depth=depth + 1)
        return None

    def class_targets(self, module: str, ann: ast.AST | None, depth: int = 0) -> list[tuple[str, str]]:
        out = []
        for n in _annotation_names(ann):
            ref = self.resolve(module, n)
            if ref is None:
                continue
            if ref in self.classes:
                out.append(ref)
            elif depth < 5:
                out.extend(self.class_targets(ref[0], self.aliases[ref], depth + 1))
        return out

    def fields(self, ref: tuple[str, str], depth: int = 0) -> dict[str, tuple[str, ast.AST | None]]:
        module, _ = ref
        cls = self.classes[ref]
        out: dict[str, tuple[str, ast.AST | None]] = {}
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            bref = self.resolve(module, name) if name else None
            if bref in self.classes and bref != ref and depth < 10:
                out.update(self.fields(bref, depth + 1))
        for stmt in cls.body:
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and not stmt.target.id.startswith("_") and stmt.target.id != "model_config"):
                out[stmt.target.id] = (module, stmt.annotation)
        return out


def _root(ns: _Namespace, root: str) -> tuple[str, str]:
    for (module, name) in ns.classes:
        if name == root:
            return (module, name)
    raise KeyError(f"class {root} not found")


def pydantic_key_paths(sources: Sources, root: str) -> dict[str, str]:
    """Dotted key paths of a nested pydantic config rooted at class `root`: {path: "table" | "value"}."""
    ns = _Namespace(sources)
    out: dict[str, str] = {}

    def walk(ref: tuple[str, str], prefix: str, stack: tuple) -> None:
        for name, (module, ann) in ns.fields(ref).items():
            path = f"{prefix}.{name}" if prefix else name
            subs = ns.class_targets(module, ann)
            if subs and len(stack) < 8:
                out[path] = "table"
                for sub in subs:
                    if sub not in stack:
                        walk(sub, path, (*stack, sub))
            else:
                out.setdefault(path, "value")

    r = _root(ns, root)
    walk(r, "", (r,))
    return dict(sorted(out.items()))


def dataclass_fields(sources: Sources, root: str) -> list[str]:
    ns = _Namespace(sources)
    return sorted(ns.fields(_root(ns, root)))


def yaml_key_paths(text: str) -> list[str]:
    import yaml

    data = yaml.safe_load(text) or {}
    out: list[str] = []

    def walk(d: Any, prefix: str) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                p = f"{prefix}.{k}" if prefix else str(k)
                out.append(p)
                walk(v, p)

    walk(data, "")
    return sorted(out)


# ---------------------------------------------------------------------------------------------------------------


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_file(package: str, relpath: str) -> Path | None:
    """A file inside an installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        candidate = Path(loc) / relpath
        if candidate.is_file():
            return candidate
    return None
