"""Environment: backend installed and its version, flags valid for it, W&B credentials, open-file limit, GNU
patch, GPUs visible, output directories writable. Never prints a secret."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from pathlib import Path

from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check, existing_parent


@check("env.backend")
def backend_installed(ctx: Context) -> Result:
    r = ctx.recipe
    if not ctx.backend.packages:
        return Result("env.backend", OK, f"{r.backend.name} needs no Python package of its own")
    installed = ctx.prepared.installed_version()
    pkg = ctx.backend.packages[0]
    pinned = r.backend.version
    how = ctx.backend.install_hint_for(r)
    if installed is None:
        remote = _executor(ctx).remote
        local = ctx.backend.needs_local_install and not remote
        hint = f" (or {how})" if how else ""
        pip = f"pip install {pkg}" + (f"=={pinned}" if pinned else "")
        return Result("env.backend", FAIL if local else WARN,
                      f"{pkg} is not installed in this Python on {ctx.machine}"
                      + (" (the Ray cluster must have it)" if remote else ""),
                      pip + hint if ctx.backend.on_pypi else how)
    if pinned and pinned != installed:
        get = (f"pip install {pkg}=={pinned}" if ctx.backend.on_pypi
               else how)
        return Result("env.backend", WARN, f"recipe pins {pkg} {pinned}; {installed} is installed on {ctx.machine}",
                      f"{get}, or set backend.version = \"{installed}\"", set={"backend.version": installed})
    return Result("env.backend", OK, f"{pkg} {installed} installed on {ctx.machine}")


@check("env.flags")
def flags(ctx: Context) -> list[Result]:
    findings = ctx.prepared.validate()
    if not findings:
        return [Result("env.flags", OK, f"{len(ctx.prepared.plan.keys)} flags/keys exist in "
                                        f"{ctx.prepared.plan.label}")]
    # render's notes (where each eval set runs, who rotates checkpoints) say how the recipe runs, nothing to fix
    verdict = {"error": FAIL, "note": OK}
    return [Result("env.flags", verdict.get(f.level, WARN), f.message, f.fix, set=f.set) for f in findings]


@check("env.backend_rules", hosts="env")
def backend_rules(ctx: Context) -> list[Result]:
    """The backend's own environment rules (e.g. whether a W&B key can reach a job on a remote cluster)."""
    return ctx.backend.preflight(ctx, "env")


def _netrc_has_wandb() -> bool:
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        if not path.is_file():  # NETRC=/dev/zero or a FIFO would never end
            return False
        with path.open("rb") as fh:
            return b"api.wandb.ai" in fh.read(1024 * 1024)
    except (OSError, ValueError):
        return False


@check("env.wandb")
def wandb(ctx: Context) -> Result | None:
    wb = ctx.recipe.logging.wandb
    if wb is None:
        return None
    if wb.offline:
        return Result("env.wandb", OK, "W&B offline: no credentials needed")
    if os.environ.get("WANDB_API_KEY"):
        return Result("env.wandb", OK, "WANDB_API_KEY is set (not shown)")
    if _netrc_has_wandb():
        return Result("env.wandb", OK, "W&B credentials found in ~/.netrc (not shown)")
    return Result("env.wandb", FAIL, "W&B is on but no API key is configured: the run dies at start",
                  "export WANDB_API_KEY=..., or set logging.wandb.offline = true", set={"logging.wandb.offline": True})


@check("env.open_files")
def open_files(ctx: Context) -> Result | None:
    r = ctx.recipe
    if not r.uses_vllm:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = r.preflight.min_open_files
    if soft != resource.RLIM_INFINITY and soft < need:
        return Result("env.open_files", WARN, f"ulimit -n is {soft}; vLLM wants >= {need} (seen: a silent vLLM "
                      "death under load)", f"ulimit -n {need} before launching (or in the pod's setup)")
    return Result("env.open_files", OK, f"ulimit -n {soft}")


@check("env.patch_tool")
def patch_tool(ctx: Context) -> Result | None:
    if not ctx.recipe.patches.set:
        return None
    exe = shutil.which("patch")
    if exe is None:
        return Result("env.patch_tool", FAIL, "patches are configured but `patch` is not installed",
                      "apt-get install patch")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "GNU patch" not in out:
        return Result("env.patch_tool", FAIL, f"{exe} is not GNU patch", "install GNU patch")
    return Result("env.patch_tool", OK, out.splitlines()[0] if out else "GNU patch")


@check("env.gpus")
def gpus(ctx: Context) -> Result | None:
    r = ctx.recipe
    if r.resources.gpus_per_node == 0:
        return None
    if _executor(ctx).remote:
        return Result("env.gpus", SKIP, f"GPUs are on the {r.resources.executor} executor's machines; checked when "
                      "the job is submitted")
    rows, _ = ctx.gpus()
    visible = rows if rows is not None else sorted(Path("/dev").glob("nvidia[0-9]*"))
    if not visible and shutil.which("nvidia-smi") is None:
        return Result("env.gpus", SKIP, "no NVIDIA GPU visible on this machine (fine for a login node; launch "
                      "needs them)")
    if len(visible) < r.resources.gpus_per_node:
        return Result("env.gpus", FAIL, f"{len(visible)} GPU(s) visible, recipe needs {r.resources.gpus_per_node}",
                      "run on a machine with enough GPUs or lower resources.gpus_per_node")
    return _card(ctx, rows or [], len(visible))


def _card(ctx: Context, rows: list[dict], count: int) -> Result:
    """The card this machine has against the one `resources.gpu` names: every memory check plans for the named
    card, and vLLM takes its gpu_memory_utilization of the card it is on (an H100 recipe ran on an H200: vLLM's 0.3
    was 42.1 GiB, the plan's 23.8)."""
    from rlctl.estimate.gpu_plan import run_devices
    from rlctl.estimate.memory import card_like, card_name, gpu_memory_gib

    r = ctx.recipe
    mine = {str(i) for i in run_devices(r)}
    cards = [g for g in rows if isinstance(g.get("memory_total_gib"), (int, float))]
    cards = [g for g in cards if str(g["index"]) in mine] or cards
    named = gpu_memory_gib(r.resources.gpu)
    unlike = [g for g in cards if named is None or not card_like(g["memory_total_gib"], named)]
    if not unlike:
        kinds = sorted({g.get("name") or "GPU" for g in cards})
        return Result("env.gpus", OK, f"{count} GPU(s) visible" + (f" ({', '.join(kinds)})" if kinds else "")
                      + _free(rows))
    g = min(unlike, key=lambda g: g["memory_total_gib"])
    total = g["memory_total_gib"]
    said = f"{named:.1f} GiB" if named else "a card rlctl does not know"
    vllm = (f"; vLLM's rollout.gpu_memory_utilization {r.rollout.gpu_memory_utilization} takes "
            f"{r.rollout.gpu_memory_utilization * total:.1f} GiB of it, not "
            f"{r.rollout.gpu_memory_utilization * named:.1f}") if r.uses_vllm and named else ""
    want = card_name(g.get("name") or "", total)
    return Result("env.gpus", WARN,
                  f"{count} GPU(s) visible{_free(rows)}; GPU {g['index']} is {g.get('name') or 'a GPU'} with "
                  f"{total:.1f} GiB, but resources.gpu = {r.resources.gpu!r} ({said}): every memory check plans for "
                  f"that card{vllm}",
                  f'set resources.gpu = "{want}"', set={"resources.gpu": want})


def _free(rows: list[dict]) -> str:
    """Which GPUs have nothing on them now: said here, where the machine's GPUs are listed (memory.gpus refers to it
    for the evaluator's GPU)."""
    from rlctl.core.gpus import idle_gpus

    idle = idle_gpus(rows=rows) if rows else []
    return f"; free now: GPU {','.join(idle)}" if idle else ""


def _writable(p: Path) -> bool:
    return os.access(existing_parent(p), os.W_OK)


@check("env.output_dirs")
def output_dirs(ctx: Context) -> Result:
    from rlctl.runs.state import runs_root

    root = runs_root()
    bad = [str(p) for p in (root, Path(ctx.recipe.checkpoint.dir)) if not _writable(p)]
    if bad:
        return Result("env.output_dirs", FAIL, f"not writable: {', '.join(bad)}",
                      "choose writable directories (RLCTL_RUNS_DIR, checkpoint.dir)")
    return Result("env.output_dirs", OK, f"runs go to {root}")


@check("env.executor")
def executor_checks(ctx: Context) -> list[Result]:
    """The executor's own checks (e.g. that its cluster answers and has the GPUs the recipe places work on)."""
    return _executor(ctx).preflight(ctx)


def _executor(ctx: Context):
    from rlctl.executors import get

    return get(ctx.recipe.resources.executor)
