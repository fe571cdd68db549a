"""Run directories: `runs/<name>-<YYYYmmdd-HHMMSS>/`, never reused, never overwritten (DESIGN.md)."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from rlctl.core.secrets import is_secret_name
from rlctl.errors import RlctlError

SECRET_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")

# The libraries every run's outcome depends on; the backend's own distributions come from its adapter.
RECORDED_PACKAGES = ("rlctl", "torch", "transformers", "peft", "accelerate", "vllm", "ray", "deepspeed", "flash-attn",
                     "wandb")


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RUN_NAME_MAX = 100  # the directory adds -YYYYmmdd-HHMMSS[-N]; file systems allow 255 bytes per name


def check_run_name(name: str, option: str = "--name") -> str:
    """A run name becomes a directory name: letters, digits, '.', '_', '-', starting with a letter or digit."""
    fix = "use letters, digits, '.', '_' and '-', starting with a letter or digit (e.g. gsm8k-lr1e-6)"
    if not name:
        raise RlctlError(f"{option} '': a run needs a name.", hint=fix + "; or leave the option out for the recipe's")
    if len(name) > RUN_NAME_MAX:
        raise RlctlError(f"{option}: {len(name)} characters; a run name has at most {RUN_NAME_MAX}.", hint=fix)
    if not RUN_NAME.fullmatch(name):
        why = ("only whitespace" if not name.strip() else "a NUL byte" if "\0" in name
               else "a path separator" if "/" in name or "\\" in name else "a character outside the allowed set"
               if name[0].isalnum() else "a first character that is not a letter or digit")
        raise RlctlError(f"{option} {name!r}: not a run name ({why}).", hint=fix)
    return name


def create_run_dir(root: Path, name: str, now: float | None = None) -> Path:
    """Make a new, empty run directory. mkdir without exist_ok is the guard: a name is never reused."""
    check_run_name(name, "run name")
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    base = f"{name}-{stamp}"
    for i in range(1, 1000):
        candidate = root / (base if i == 1 else f"{base}-{i}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a unique run directory under {root}")


def create_named_run_dir(root: Path, name: str) -> Path:
    """A new run directory named exactly `name` (a pool run's attempt on another host: `<run>-g<generation>`)."""
    check_run_name(name, "run name")
    root.mkdir(parents=True, exist_ok=True)
    try:
        (root / name).mkdir()
    except FileExistsError:
        raise RlctlError(f"{root / name} exists already; a run directory is never reused.") from None
    return root / name


MASK = "<masked>"


def masked_recipe_data(data: dict[str, Any]) -> dict[str, Any]:
    """The resolved recipe as written into the run directory and sent to sinks: the value under every secret-named
    key (is_secret_name, at any depth) is replaced — `${NAME}` for [env], so the record says where it comes from."""
    out = json.loads(json.dumps(data, default=str))

    def walk(node: Any, in_env: bool) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in list(items):
            if isinstance(k, str) and is_secret_name(k) and v not in (None, "", True, False):
                node[k] = f"${{{k}}}" if in_env else MASK
            elif node is out and k == "env" and isinstance(v, dict):
                walk(v, True)
            else:
                walk(v, False)

    walk(out, False)
    return out


_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]*)=")


def mask_argv(argv: list[str], environ: dict[str, str] | None = None) -> list[str]:
    """A command line as recorded (env.json, logs): values given to secret-named flags or keys are masked —
    `--set env.DB_PASSWORD=x`, `HF_TOKEN=x`, `--api-key x`, `--api-key=x` — and so is any text equal to the value of
    a secret-named variable of the environment."""
    env = os.environ if environ is None else environ
    values = sorted({v for k, v in env.items() if is_secret_name(k) and len(v) >= 4}, key=len, reverse=True)
    out: list[str] = []
    hide_next = False
    for a in argv:
        a = str(a)
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if a.startswith("-") and "=" not in a and is_secret_name(a):
            out.append(a)
            hide_next = True
            continue
        for m in _ASSIGN.finditer(a):
            if is_secret_name(m.group(1)):
                a = a[: m.end()] + MASK
                break
        for v in values:
            a = a.replace(v, MASK)
        out.append(a)
    return out


def _git(args: list[str], cwd: Path) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_info(cwd: Path) -> dict[str, Any] | None:
    commit = _git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return None
    status = _git(["status", "--porcelain"], cwd) or ""
    return {"commit": commit, "dirty": bool(status), "changed_files": len(status.splitlines()),
            "branch": _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd),
            "root": _git(["rev-parse", "--show-toplevel"], cwd)}


def gpus() -> list[dict[str, str]]:
    """The GPUs of this machine as the run's environment record keeps them (nvidia-smi's view)."""
    from rlctl.core.gpus import smi_rows

    return [{"index": str(r["index"]), "name": r["name"],
             "memory": "" if r["memory_total_gib"] is None else f"{round(r['memory_total_gib'] * 1024)} MiB",
             "driver": r["driver"]} for r in smi_rows() or []]


def environment_record(cwd: Path, backend_packages: tuple[str, ...]) -> dict[str, Any]:
    pkgs = {}
    for name in dict.fromkeys((*backend_packages, *RECORDED_PACKAGES)):
        try:
            pkgs[name] = version(name)
        except PackageNotFoundError:
            continue
    return {
        "packages": pkgs,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "git": git_info(cwd),
        "host": {"name": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "gpus": gpus(),
        "argv": mask_argv(sys.argv),
    }


def child_environment(plan_env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The backend's environment: ours, the recipe's, rlctl's; `${NAME}` references resolved from ours."""
    env = dict(os.environ)
    missing = []
    for k, v in plan_env.items():
        m = SECRET_REF.match(v)
        if m:
            if m.group(1) not in os.environ:
                missing.append(m.group(1))
                continue
            env[k] = os.environ[m.group(1)]
        else:
            env[k] = v
    if missing:
        raise RlctlError(f"the run needs {', '.join(missing)} in the environment and it is not set.",
                         hint=f"export {missing[0]}=... (rlctl never writes it to disk)")
    env.update(extra)
    return env
