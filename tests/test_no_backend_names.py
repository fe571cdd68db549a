"""The core never names a backend: everything rlctl knows about one lives in its adapter (rlctl/backends/<name>/).

Parses every module of rlctl/ outside rlctl/backends/: identifiers and string constants must not contain a bundled
backend's name as a word. Docstrings, comments and user-facing help/description texts may use one as an example."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rlctl.backends import BUILTIN

ROOT = Path(__file__).resolve().parents[1] / "rlctl"
# "command" is also an ordinary word of a CLI; the adapter names that matter are the frameworks'.
NAMES = sorted({n for n in BUILTIN if n != "command"} | {"prime-rl"})
WORD = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(re.escape(n) for n in NAMES) + r")(?![A-Za-z0-9])", re.IGNORECASE)
PROSE_KEYWORDS = {"help", "description", "epilog", "short_help", "rich_help_panel"}


def _exempt(tree: ast.AST) -> set[int]:
    """ids of string constants that are documentation: docstrings and help/description keyword values."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            out.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg in PROSE_KEYWORDS:
            out.update(id(n) for n in ast.walk(node.value))
    return out


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    exempt = _exempt(tree)
    out = []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exempt:
            texts = [node.value]
        elif isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts = [node.name]
        elif isinstance(node, ast.alias):
            texts = [node.name, node.asname or ""]
        for text in texts:
            if WORD.search(text) or WORD.search(text.replace("_", " ")):
                out.append(f"{path.relative_to(ROOT.parent)}:{getattr(node, 'lineno', '?')}: {text[:80]!r}")
    return out


def test_core_names_no_backend():
    core = [p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] != "backends"]
    assert core, "no core modules found"
    offences = [o for p in sorted(core) for o in _offences(p)]
    assert not offences, "the core names a backend (move the knowledge into the adapter):\n" + "\n".join(offences)
