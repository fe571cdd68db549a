"""env.flash_attn, env.vllm_router: what prime-rl's processes need that its `uv sync` (no extras) leaves out, per the
tag's `x-environment` facts (schemas/<version>.json, read from the tag's sources by scripts/prime_rl_needs.py): the
trainer's flash-attention package and the inference router's binary. Looked up where `uv run --project <checkout>`
runs them: the checkout's .venv ($UV_PROJECT_ENVIRONMENT), else this Python; by file lookup in a child interpreter
(importlib's finders, nothing imported: flash_attn's __init__ imports torch)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# prints {module: origin-or-null} for the dotted names in argv[1]; parents are searched, never imported
PROBE = r"""
import importlib.machinery, importlib.util, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None or not spec.submodule_search_locations:
                spec = None
                break
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]),
                                                            list(spec.submodule_search_locations))
    except (ImportError, ValueError):
        spec = None
    out[name] = None if spec is None else (spec.origin or "namespace")
print(json.dumps(out))
"""


def environment(checkout: str | None) -> tuple[Path, Path | None, str]:
    """(python, its bin directory or None, words) of the environment `uv run --project checkout` runs in."""
    if checkout:
        root = Path(checkout).expanduser()
        venv = Path(os.environ.get("UV_PROJECT_ENVIRONMENT") or ".venv")
        venv = venv if venv.is_absolute() else root / venv
        if (venv / "pyvenv.cfg").is_file():
            return venv / "bin" / "python", venv / "bin", f"prime-rl's environment {venv}"
        where = f"this Python {sys.executable} ({venv} does not exist: `uv run` would create it without extras)"
    else:
        where = f"this Python {sys.executable} (no prime-rl checkout named)"
    return Path(sys.executable), None, where


def locate(python: Path, modules: list[str]) -> dict[str, str | None] | str:
    """Where each module would be imported from in that interpreter, or why it could not be asked."""
    try:
        res = subprocess.run([str(python), "-c", PROBE, json.dumps(modules)], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} did not run ({type(e).__name__}: {e})"
    if res.returncode != 0:
        return f"{python} exited {res.returncode}: {(res.stderr.strip().splitlines() or ['no output'])[-1]}"
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"{python} printed no answer"


def compute_capabilities() -> set[tuple[int, int]] | None:
    """The compute capabilities of this machine's GPUs (nvidia-smi), None when none can be read."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        caps = {tuple(int(x) for x in line.strip().split(".")) for line in res.stdout.splitlines() if line.strip()}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return caps or None  # type: ignore[return-value]


def auto_attn(rules: list[dict], cap: tuple[int, int]) -> str:
    """prime-rl's resolve_auto_attn for one GPU, from its recorded rules."""
    for r in rules:
        if "capability" in r and tuple(r["capability"]) != cap:
            continue
        if "major" in r and r["major"] != cap[0]:
            continue
        return r["attn"]
    raise ValueError("no catch-all rule")


def sync(checkout: str | None, extra: str) -> str:
    at = f"--project {checkout} " if checkout else ""
    return (f"uv sync {at}--extra {extra} (uv sync removes the extras it is not given: name every one you use)")


def results(backend: Any, recipe: Any, checkout: str | None) -> list[Any]:
    from rlctl.backends.prime_rl.schema import load_schema, resolved
    from rlctl.preflight import SKIP, WARN, Result

    version = backend.target_version(recipe)
    facts = load_schema(version).get("x-environment") if version in backend.known_versions else None
    if not facts:
        return [Result(c, SKIP, f"rlctl has no record of what prime-rl {version} needs beyond `uv sync` (recorded "
                       "for v0.8.0 only: scripts/prime_rl_schema.py --needs)") for c in ("env.flash_attn",
                                                                                          "env.vllm_router")]
    cfg = resolved(backend.config(recipe, None, version), version)
    router = cfg.get("inference", {}).get("router", facts.get("router_default")) if "inference" in cfg else None
    if isinstance(router, dict):
        router = router.get("type", facts.get("router_default"))
    router_need = facts.get("router", {}).get(router) if router else None
    attn = cfg.get("trainer", {}).get("model", {}).get("attn", "auto")
    if recipe.resources.executor != "local":
        on = f"the {recipe.resources.executor} executor's machines"
        out = [Result("env.flash_attn", WARN, f"prime-rl's trainer ({facts['attn_key']} = {attn}) runs on {on}: its "
                      "flash-attention package is not checked from here",
                      "install prime-rl's extras there ("
                      + ", ".join(sorted({a["extra"] for a in facts["attn"].values()})) + ")")]
        if router_need:
            out.append(Result("env.vllm_router", WARN, f"{facts['router_key']} = {router} starts the "
                              f"`{router_need['binary']}` binary on {on}: not checked from here",
                              sync(None, router_need["extra"]) + f', or backend.prime_rl.extra "{facts["router_key"]}" '
                              '= "None"'))
        return out
    python, bindir, where = environment(checkout)
    return [_flash_attn(facts, attn, python, where, checkout), _router(facts, router, router_need, bindir, where,
                                                                       checkout)]


def _flash_attn(facts: dict, attn: str, python: Path, where: str, checkout: str | None) -> Any:
    from rlctl.preflight import FAIL, OK, WARN, Result

    key = facts["attn_key"]
    choices = facts["attn"]
    fa4 = {choices["flash_attention_4"]["module"] + ".interface"} if "flash_attention_4" in choices else set()
    modules = sorted({n["module"] for n in facts["trainer_load"]} | {c["module"] for c in choices.values()} | fa4)
    found = locate(python, modules)
    if isinstance(found, str):
        return Result("env.flash_attn", WARN, f"could not check the trainer's flash-attention in {where}: {found}",
                      f"check by hand that {', '.join(modules)} import there")
    # an installed attention the trainer could load with instead: the fix as data (`set`), as `--set` would give it
    usable = [a for a in sorted(choices) if found.get(choices[a]["module"]) and not _fa4_stub(facts, a, found)]
    sets = {f"backend.prime_rl.extra.{key}": usable[-1]} if usable else None
    problems: list[tuple[str, str]] = []
    for need in facts["trainer_load"]:
        if not found.get(need["module"]):
            problems.append((f"{need['imported_by']} imports {need['via']}, which imports {need['module']} at load "
                             f"whatever {key} is: it is not there", sync(checkout, need["extra"])))
    said = f"{key} = {attn}"
    resolved_attn = attn
    if attn == "auto":
        caps = compute_capabilities()
        picks = {auto_attn(facts["attn_auto"], c) for c in caps} if caps else set()
        if len(picks) != 1:
            have = [a for a, c in sorted(choices.items()) if found.get(c["module"])]
            if not have:
                problems.append((f"{said} (prime-rl's default: FlashAttention-4 on SM100, 3 on SM90, 2 otherwise) "
                                 f"needs one of {', '.join(c['module'] for c in choices.values())}: none is there",
                                 "install the extra of the one the trainer's GPU gets ("
                                 + ", ".join(f"{a}: {c['extra']}" for a, c in sorted(choices.items()))
                                 + f") and set backend.prime_rl.extra \"{key}\" to it"))
            elif not problems:
                return Result("env.flash_attn", WARN, f"could not check which flash-attention {said} picks: "
                              f"{'no GPU visible here' if not caps else 'GPUs of several kinds'} (it picks by the "
                              f"trainer GPU's compute capability); {', '.join(have)} installed in {where}",
                              f"set backend.prime_rl.extra \"{key}\" = \"{have[-1]}\" to say which one runs",
                              set=sets if sets and have[-1] in sets.values() else None)
        else:
            resolved_attn = picks.pop()
            said += f" (prime-rl resolves it to {resolved_attn} on this machine's GPU)"
    need = choices.get(resolved_attn)
    attention_only = False  # the one problem is the attention: another installed one closes the check
    if need and not found.get(need["module"]):
        attention_only = not problems
        problems.append((f"{said} imports {need['module']} ({need['dist']}): it is not there",
                         f"{sync(checkout, need['extra'])}, or set backend.prime_rl.extra \"{key}\" to an attention "
                         "that is installed" + (f" ({usable[-1]})" if usable else "")))
    elif need and resolved_attn == "flash_attention_4" and facts.get("fa4_min_lines"):
        iface = found.get(need["module"] + ".interface")
        try:
            lines = len(Path(iface).read_text(errors="replace").splitlines()) if iface else 0
        except OSError:
            lines = 0
        if lines < facts["fa4_min_lines"]:
            problems.append((f"{said}: {iface or need['module'] + '.interface'} has {lines} lines, flash-attn's stub "
                             f"shadowing FlashAttention-4 (prime-rl refuses fewer than {facts['fa4_min_lines']})",
                             f"run {facts['fa4_fix']} in the prime-rl checkout"))
    if problems:
        return Result("env.flash_attn", FAIL, "; ".join(p for p, _ in problems) + f" (looked in {where}): the trainer "
                      "dies at start", "; ".join(dict.fromkeys(f for _, f in problems)),
                      set=sets if attention_only and len(problems) == 1 else None)
    return Result("env.flash_attn", OK, f"{said}: {', '.join(sorted(m for m in modules if found.get(m)))} "
                  f"found in {where}")


def _fa4_stub(facts: dict, attn: str, found: dict) -> bool:
    """Whether FlashAttention-4's interface is flash-attn's short stub, which prime-rl refuses (fa4_min_lines)."""
    if attn != "flash_attention_4" or not facts.get("fa4_min_lines"):
        return False
    iface = found.get(facts["attn"][attn]["module"] + ".interface")
    try:
        return len(Path(iface).read_text(errors="replace").splitlines()) < facts["fa4_min_lines"] if iface else True
    except OSError:
        return True


def _router(facts: dict, router: str | None, need: dict | None, bindir: Path | None, where: str,
            checkout: str | None) -> Any:
    from rlctl.preflight import FAIL, OK, Result

    key = facts.get("router_key", "inference.router")
    if not need:
        return Result("env.vllm_router", OK, f"{key} = {router}: no router binary started")
    path = os.pathsep.join(p for p in (str(bindir) if bindir else "", os.environ.get("PATH", "")) if p)
    exe = shutil.which(need["binary"], path=path)
    default = " (prime-rl's default)" if router == facts.get("router_default") else ""
    if exe is None:
        return Result("env.vllm_router", FAIL, f"{key} = {router}{default} starts the `{need['binary']}` binary in "
                      f"front of the vLLM engine, and it is not in {where} nor on PATH: inference dies at start",
                      f"{sync(checkout, need['extra'])}, or set backend.prime_rl.extra \"{key}\" = \"None\" (the "
                      "orchestrator then talks to the engine itself)")
    return Result("env.vllm_router", OK, f"{key} = {router}{default}: {exe}")
