"""No import cycles in rlctl: every module's imports — top-level and inside functions — parsed, not executed.

An edge A -> B is any `import B` / `from B import x` in A (x a submodule counts as B.x), wherever it is in A; only
`if TYPE_CHECKING:` blocks are left out (they never run). Executors and backends are reached through registries of
"module:Class" strings, which is what keeps the core free of cycles.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlctl"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py") if "_data" not in p.parts}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in known else mod)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_the_parser_sees_function_level_and_relative_imports(tmp_path):
    g = graph()
    assert "rlctl.executors.base" in g["rlctl.executors.local"]
    assert "rlctl.runs.supervisor" in g["rlctl.executors.base"]  # imported inside Executor.submit


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_in_rlctl():
    found = cycles(graph())
    assert not found, "import cycles (A imports B imports ... A):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_core_imports_no_executor_by_name():
    g = graph()
    impls = {m for m in g if m.startswith("rlctl.executors.") and m not in ("rlctl.executors.base",)}
    offenders = {m: sorted(g[m] & impls) for m in g if not m.startswith("rlctl.executors") and g[m] & impls}
    # the one allowed: a Ray-only helper (cluster reachability for a recipe that names ray, following a Ray job)
    allowed = {"rlctl.preflight.env", "rlctl.runs.attach"}
    assert {m for m in offenders if m not in allowed} == set(), offenders


def test_executor_registry_is_lazy_and_checked():
    import subprocess
    import sys

    import pytest

    from rlctl import executors
    from rlctl.errors import RlctlError

    code = ("import sys, rlctl.executors as e; e.registry(); "
            "print(sorted(m for m in sys.modules if m.startswith('rlctl.executors.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # names only: nothing imported until asked for
    assert {"local", "ray"} <= set(executors.available())
    assert executors.get("local").name == "local"
    with pytest.raises(RlctlError, match="unknown executor 'nope'; known: local, ray, slurm, ssh"):
        executors.get("nope")


def test_the_shared_types_floor_imports_nothing_above_it():
    """rlctl/core holds the types runs/, executors/ and backends/ share; it may import only itself and errors."""
    known = set(modules())
    allowed = ("rlctl.core", "rlctl.errors")
    for name, path in modules().items():
        if name == "rlctl.core" or name.startswith("rlctl.core."):
            above = {m for m in imports(name, path, known) if not m.startswith(allowed)}
            assert not above, f"{name} imports {sorted(above)}"
