"""What a prime-rl tag's processes need installed that `uv sync` (no extras) leaves out, read from the tag's sources
with `ast` (nothing imported, nothing of prime-rl's code kept): the `x-environment` entry of
rlctl/backends/prime_rl/schemas/<version>.json, read by rlctl/backends/prime_rl/environment.py (preflight
env.flash_attn, env.vllm_router).

    python scripts/prime_rl_schema.py --repo <prime-rl clone> --tag v0.8.0 --needs

- the trainer's attention (`trainer.model.attn`): which module each `flash_attention_N` imports
  (trainer/models/layers/attn.py), what `auto` resolves to per GPU (trainer/model.py resolve_auto_attn), prime-rl's
  own test that FlashAttention-4 is not shadowed (model.py _validate_flash_attn_4_installed);
- what the RL trainer imports whatever the attention: trainer/rl/train.py's module-level imports of a package that
  itself imports flash-attn at load (ring-flash-attn; its wheel at the tag's uv.lock version is read, not installed);
- the inference router (`inference.router`): its default (configs/inference.py) and the binary the local launcher
  starts (entrypoints/inference.py start_router);
- which optional extra of the tag's pyproject.toml installs each package.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

# the distribution each module comes from (a fact of those packages, not of prime-rl): checked against the extras
MODULE_DIST = {"flash_attn": "flash-attn", "flash_attn.flash_attn_interface": "flash-attn",
               "flash_attn_interface": "flash_attn_3", "flash_attn.cute": "flash-attn-4"}
ATTN_KEY, ROUTER_KEY = "trainer.model.attn", "inference.router"


def _extras(pyproject: dict) -> dict[str, str]:
    """distribution name -> the optional extra that installs it (the narrowest one: `all` is never chosen)."""
    out: dict[str, str] = {}
    for extra, reqs in pyproject["project"].get("optional-dependencies", {}).items():
        for req in reqs:
            name = re.match(r"[A-Za-z0-9_.-]+", req.strip()).group(0)
            if not name.startswith(pyproject["project"]["name"]):
                out.setdefault(name.lower().replace("_", "-"), extra)
    return out


def _extra_of(extras: dict[str, str], dist: str) -> str:
    key = dist.lower().replace("_", "-")
    if key not in extras:
        sys.exit(f"no optional extra of the tag installs {dist}: update MODULE_DIST in {__file__}")
    return extras[key]


def _attn_modules(src: str) -> dict[str, str]:
    """attn value -> module its kernel is imported from (the guarded imports, `_funcs`, ATTN_IMPL2CLASS)."""
    tree = ast.parse(src)
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    for a in stmt.names:
                        imported[a.asname or a.name] = stmt.module
    version_module: dict[int, str] = {}
    impl_version: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            target = node.targets[0]
            name = target.id if isinstance(target, ast.Name) else None
            for k, v in zip(node.value.keys, node.value.values, strict=True):
                if name == "_funcs" and isinstance(v, ast.Name) and v.id in imported:
                    version_module[k.value] = imported[v.id]
                if name == "ATTN_IMPL2CLASS" and isinstance(v, ast.Call):
                    impl_version[k.value] = next(kw.value.value for kw in v.keywords if kw.arg == "flash_attn_version")
    if not version_module or not impl_version:
        sys.exit("attn.py: no `_funcs` / ATTN_IMPL2CLASS found: update scripts/prime_rl_needs.py for this tag")
    return {impl: version_module[v] for impl, v in impl_version.items()}


def _condition(test: ast.expr) -> dict:
    """`(major, minor) == (10, 0)` -> {"capability": [10, 0]}; `major == 9` -> {"major": 9}."""
    if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, ast.literal_eval(test.comparators[0])
        if isinstance(left, ast.Tuple) and [e.id for e in left.elts] == ["major", "minor"]:
            return {"capability": list(right)}
        if isinstance(left, ast.Name) and left.id == "major":
            return {"major": right}
    sys.exit(f"resolve_auto_attn: unknown condition {ast.unparse(test)}: update scripts/prime_rl_needs.py")


def _auto(src: str) -> tuple[list[dict], int | None, str | None]:
    """resolve_auto_attn's rules in order (the last has no condition), and FA4's shadowing test (lines, fix)."""
    tree = ast.parse(src)
    fn = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    rules: list[dict] = []
    node = next(n for n in fn["resolve_auto_attn"].body if isinstance(n, ast.If) and "major" in ast.unparse(n.test))
    while True:
        rules.append({**_condition(node.test), "attn": node.body[0].value.value})
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
            continue
        rules.append({"attn": node.orelse[0].value.value})
        break
    lines = fix = None
    if "_validate_flash_attn_4_installed" in fn:
        text = ast.unparse(fn["_validate_flash_attn_4_installed"])
        m = re.search(r"num_lines < (\d+)", text)
        lines = int(m.group(1)) if m else None
        m = re.search(r"(scripts/[\w.-]+\.sh)", text)
        fix = m.group(1) if m else None
    return rules, lines, fix


def _module_level_imports(src: str) -> list[str]:
    return [n.module for n in ast.parse(src).body if isinstance(n, ast.ImportFrom) and n.module] + \
           [a.name for n in ast.parse(src).body if isinstance(n, ast.Import) for a in n.names]


def _wheel_imports(dist: str, version: str, prefix: str) -> list[str]:
    """Module-level (unguarded) imports of modules under `prefix` in a released wheel's package."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{dist}=={version}", "-d", tmp],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        found: set[str] = set()
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.endswith(".py"):
                    found |= {m for m in _module_level_imports(z.read(name).decode())
                              if m == prefix or m.startswith(prefix + ".")}
    return sorted(found)


def _router(inference_cfg: str, entry: str) -> tuple[str | None, str | None]:
    """The default router type (`router: ... = Field(default_factory=Cls)`, Cls.type's default) and the binary
    start_router runs (the first element of its `cmd` list)."""
    tree = ast.parse(inference_cfg)
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    default = None
    for n in ast.walk(tree):
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "router" \
                and isinstance(n.value, ast.Call):
            factory = next((kw.value.id for kw in n.value.keywords if kw.arg == "default_factory"), None)
            for stmt in classes[factory].body if factory in classes else []:
                if isinstance(stmt, ast.AnnAssign) and stmt.target.id == "type":
                    default = stmt.value.value
    binary = None
    for n in ast.walk(ast.parse(entry)):
        if isinstance(n, ast.FunctionDef) and n.name == "start_router":
            for stmt in ast.walk(n):
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.List) and \
                        getattr(stmt.targets[0], "id", None) == "cmd":
                    binary = stmt.value.elts[0].value
    return default, binary


def locked(uv_lock: str, name: str) -> str:
    m = re.search(rf'^\[\[package\]\]\nname = "{re.escape(name)}"\nversion = "([^"]+)"', uv_lock, re.M)
    if not m:
        sys.exit(f"{name} is not in the tag's uv.lock")
    return m.group(1)


def facts(tree: Path, source: str) -> dict:
    """The x-environment entry for the tag checked out (extracted) at `tree`."""
    pyproject = tomllib.loads((tree / "pyproject.toml").read_text())
    extras = _extras(pyproject)
    trainer = tree / "src" / "prime_rl" / "trainer"
    attn = _attn_modules((trainer / "models" / "layers" / "attn.py").read_text())
    auto, fa4_lines, fa4_fix = _auto((trainer / "model.py").read_text())
    out: dict = {"source": source, "generator": "scripts/prime_rl_needs.py", "attn_key": ATTN_KEY,
                 "attn": {impl: {"module": mod, "dist": MODULE_DIST[mod], "extra": _extra_of(extras, MODULE_DIST[mod])}
                          for impl, mod in sorted(attn.items())},
                 "attn_auto": auto, "fa4_min_lines": fa4_lines, "fa4_fix": fa4_fix}
    loads = []
    train = trainer / "rl" / "train.py"
    for mod in _module_level_imports(train.read_text()):
        if mod.split(".")[0] == "ring_flash_attn":
            version = locked((tree / "uv.lock").read_text(), "ring-flash-attn")
            for need in _wheel_imports("ring-flash-attn", version, "flash_attn"):
                loads.append({"module": need, "via": f"ring-flash-attn {version}",
                              "imported_by": str(train.relative_to(tree)), "dist": MODULE_DIST[need],
                              "extra": _extra_of(extras, MODULE_DIST[need])})
    out["trainer_load"] = loads
    default, binary = _router((tree / "packages" / "prime-rl-configs" / "src" / "prime_rl" / "configs" /
                               "inference.py").read_text(),
                              (tree / "src" / "prime_rl" / "entrypoints" / "inference.py").read_text())
    if default and binary:
        out.update(router_key=ROUTER_KEY, router_default=default,
                   router={default: {"binary": binary, "dist": binary, "extra": _extra_of(extras, binary)}})
    return out
