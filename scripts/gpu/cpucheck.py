"""A stack checked on this CPU machine before a GPU sitting (docs/gpu.md): what a missing module or a config error
costs on the GPU is a failed call; here it costs a minute.

    python scripts/gpu/kit.py cpucheck verl [--root /tmp/rlctl-cpucheck] [--report verl.json]

The stack is installed as the GPU machine gets it, for this machine's CPython: a bare virtual environment (no
site-packages of its own), the GPU image's packages the lock names (`# device`, at the versions of
docs/gpu/h100-image-pip-freeze.txt) in one site, then each layer of the stack's chain (trl-vllm, verl, openrlhf) in
its own, on PYTHONPATH in the GPU side's order. CUDA-only packages stay out (nvidia-*, cuda-*, cupy, triton); torch
is its CPU build of the same release. Then every import assemble.py checks on the GPU, and the stack's probes
(probes.py: its entry point's own argument parser or config composer on the kit's GPU recipe, and what its workers
do before the first CUDA call) run in that environment, each in its own process. Exit 1 when any fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import kit

FREEZE = kit.ROOT / "docs" / "gpu" / "h100-image-pip-freeze.txt"
# (nvidia-ml-py is pure Python: the `pynvml` module rlctl's GPU sampler and vLLM import)
CUDA_ONLY = re.compile(r"^((?!nvidia-ml-py$)nvidia-.*|cuda-.*|cupy-.*|jax-cuda.*|triton|torch|torchvision|torchaudio)$")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# what the GPU image's torch family is, as CPU builds (torchvision/torchaudio: only when a stack imports them)
TORCH = ["torch"]


def image_versions() -> dict[str, str]:
    out = {}
    for line in FREEZE.read_text().splitlines():
        if "==" in line:
            n, v = line.strip().split("==", 1)
            out[kit.norm(n)] = v
    return out


def device_pins(stack: str) -> list[tuple[str, str]]:
    """The lock's `# device` packages, at the image's versions, CUDA-only ones and torch left out (except those the
    stack's code imports at load and that import on a CPU: stacks.toml `cpucheck_device`, prime-rl's triton)."""
    image = image_versions()
    wanted = {kit.norm(n) for n in kit.stack(stack).get("cpucheck_device", [])}
    out = []
    for line in (kit.LOCKS / f"{stack}.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)\s+# device", line.strip())
        if m and (not CUDA_ONLY.match(kit.norm(m.group(1))) or kit.norm(m.group(1)) in wanted):
            name = kit.norm(m.group(1))
            out.append((name, image.get(name, m.group(2))))
    return out


def layers(stack: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(layer, its pins) from the device up: the stacks of the chain each carry what the ones below lack."""
    chain = [*reversed(kit.bases(stack)), stack]
    out: list[tuple[str, list[tuple[str, str]]]] = [("device", device_pins(stack))]
    below: set[tuple[str, str]] = set()
    for s in chain:
        pins = [p for p in kit.read_lock(s) if p not in below]
        below |= set(kit.read_lock(s))
        out.append((s, pins))
    return out


def _torch_cpu(python: str, dest: Path) -> tuple[Path, str | None]:
    """torch's CPU build of the image's release, else the CPU build this machine's own torch is (PyTorch's CPU index
    may be out of reach; PyPI's Linux torch is the CUDA build): (wheel, what it substitutes or None)."""
    import importlib.metadata

    version = image_versions()["torch"]
    tries = [f"{version}+cpu"]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        own = importlib.metadata.version("torch")
        if own.endswith("+cpu") and own not in tries:
            tries.append(own)
    dest.mkdir(parents=True, exist_ok=True)
    for v in tries:
        found = sorted(dest.glob(f"torch-{v}-cp{python.replace('.', '')}-*.whl"))
        if not found:
            for index in ([TORCH_CPU_INDEX] if v == tries[0] else []) + [None]:
                kit._pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation",
                         "cp", "--platform", "manylinux_2_28_x86_64", *(["--index-url", index] if index else []),
                         "-d", str(dest), f"torch=={v}")
                found = sorted(dest.glob(f"torch-{v}-cp{python.replace('.', '')}-*.whl"))
                if found:
                    break
        if found:
            return found[0], (None if v == tries[0] else f"{v} for {version} (no CPU build of {version} in reach)")
    raise kit.KitError(f"no CPU build of torch {' or '.join(tries)} for CPython {python} in reach")


def install(stack: str, root: Path) -> tuple[Path, dict[str, str], dict[str, dict[str, str]]]:
    """The bare environment and the sites of the stack's layers (made once, kept under root): (python, env,
    {layer: {package: version}})."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = root / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    sites, versions = [], {}
    substituted: dict[str, str] = {}
    for name, pins in layers(stack):
        site = root / f"site-{name}"
        done = site / ".rlctl-cpucheck.json"
        want = sorted(f"{n}=={v}" for n, v in pins)
        if not done.is_file() or json.loads(done.read_text()).get("pins") != want:
            sdist = {kit.norm(x) for s in kit.stacks()["stacks"].values() for x in s.get("sdist", [])}
            # built from source (pure Python): the same wheel on any CPython
            built = {kit.norm(n) for n in kit.stack(name).get("source", {})} if name != "device" else set()
            subst, subs = substitute([p for p in pins if p[0] not in built], sdist, python)
            pins = [p for p in pins if p[0] in built] + subst
            substituted.update(subs)
            if name == "device":
                wheels = kit.fetch(pins, sdist, kit.CACHE / "wheels", python=python)
                torch_wheel, sub = _torch_cpu(python, kit.CACHE / "cpu")
                wheels.append(torch_wheel)
                if sub:
                    substituted["torch"] = sub
            else:
                wheels = kit.stack_wheels(name, pins, python=python)
            if site.exists():
                import shutil

                shutil.rmtree(site)
            site.mkdir(parents=True)
            for w in wheels:
                kit.unpack(w, site)
            if name != "device":  # what the kit removes before packing is absent here too, its checkouts there
                data = kit.stacks()
                kit.slim(site, list(data["common"]["slim"]) + list(kit.stack(name).get("slim", [])))
                import assemble

                assemble.pth_hook(site)  # the .pth files run as on the GPU machine
                trees = [f"checkouts/{n}" for n, spec in kit.stack(name).get("source", {}).items()
                         if spec.get("checkout")]
                for rel in trees:
                    kit.checkout(kit.stack(name)["source"][rel.split("/", 1)[1]], site / rel)
                # from the bare venv's python, no system site: the device layer is on PYTHONPATH here
                problems = subprocess.run([str(venv / "bin" / "python"), "-c",
                                           "import sys, assemble; from pathlib import Path; "
                                           f"print(assemble.project_envs(Path({str(site)!r}), {trees!r}, False))"],
                                          capture_output=True, text=True, cwd=kit.KIT)
                if problems.returncode or problems.stdout.strip() != "[]":
                    raise kit.KitError(f"project environments: {problems.stdout}{problems.stderr}")
            done.write_text(json.dumps({"pins": want, "substituted": substituted}))
        substituted.update(json.loads(done.read_text()).get("substituted") or {})
        sites.insert(0, site)
        versions[name] = kit.dist_versions(site)
    data = kit.stacks()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "RLCTL_"))}
    own = root / f"site-{stack}"
    env.update({k: v.replace("{site}", str(own)) for k, v in {**data["common"]["env"],
                                                               **kit.stack(stack).get("env", {})}.items()})
    # rlctl from this checkout in front, as go.py puts the checkout's wheel in front on the GPU machine
    env.update({"PYTHONPATH": ":".join([str(kit.ROOT), *(str(s) for s in sites)]), "CUDA_VISIBLE_DEVICES": "",
                "PATH": ":".join([*(str(s / "bin") for s in sites), str(venv / "bin"), env.get("PATH", "")]),
                "PYTHONNOUSERSITE": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    versions["substituted for this CPython"] = substituted
    return venv / "bin" / "python", env, versions


def substitute(pins: list[tuple[str, str]], sdist: set[str], python: str) -> tuple[list[tuple[str, str]], dict]:
    """The pins with a release this CPython can install in place of each that has none for it (numpy 2.5 requires
    Python >= 3.12; this machine may have an older one): the newest release up to the pinned one. Said in the report:
    a substitute checks imports and wiring, not the pinned release's own behaviour."""
    out, subs = [], {}
    plat = [a for p in kit.PLATFORMS for a in ("--platform", p)]
    args = ["download", "--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            *plat, "-d", str(kit.CACHE / "wheels")]
    missing = [f"{n}=={v}" for n, v in pins
               if n not in sdist and kit._find_wheel(kit.CACHE / "wheels", n, v, python) is None]
    if missing and kit._pip(*args, *missing).returncode == 0:  # all at once; one by one only when one has none
        missing = []
    for n, v in pins:
        if n in sdist or f"{n}=={v}" not in missing:
            out.append((n, v))
            continue
        if kit._pip(*args, f"{n}=={v}").returncode == 0:
            out.append((n, v))
            continue
        p = kit._pip(*args, f"{n}<={v}")
        saved = re.findall(r"(?:Saved|File was already downloaded) (\S+\.whl)", p.stdout)
        got = Path(saved[-1]).name.split("-")[1] if saved else None
        if p.returncode or not got:
            raise kit.KitError(f"no release of {n} up to {v} installs on CPython {python}:\n{p.stderr[-1500:]}")
        subs[n] = f"{got} for {v}"
        out.append((n, got))
    return out, subs


def run(stack: str, root: Path, report: Path | None, only: list[str] | None = None) -> int:
    import assemble

    t0 = time.time()
    python, env, versions = install(stack, root)
    out: dict = {"stack": stack, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
                 "versions": {k: {n: v for n, v in vs.items() if n in KEY} for k, vs in versions.items()},
                 "install_s": round(time.time() - t0, 1), "checks": []}
    checks = [] if only else [("import", spec) for spec in assemble.IMPORTS.get(stack, [])]
    import probes

    checks += [("probe", name) for name in probes.PROBES.get(stack, {}) if not only or name in only]
    for kind, what in checks:
        t = time.time()
        if kind == "import":
            mod, _, attr = what.partition(":")
            code = f"import importlib; m = importlib.import_module({mod!r})" + (
                f"; getattr(m, {attr!r})" if attr else "")
            cmd = [str(python), "-c", code]
        else:
            cmd = [str(python), str(kit.KIT / "probes.py"), stack, what]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=1800)
        ok = p.returncode == 0
        row = {"check": f"{kind} {what}", "ok": ok, "s": round(time.time() - t, 1),
               "out": p.stdout.strip()[-3000:], "error": None if ok else (p.stderr.strip()[-4000:] or p.stdout[-2000:])}
        out["checks"].append(row)
        last = (row["error"] or "").strip().splitlines()[-1:] if not ok else []
        print(f"  {row['check']}: {'ok' if ok else 'FAILED'} ({row['s']} s)" + (f" {last[0][:300]}" if last else ""),
              flush=True)
        if ok and row["out"] and kind == "probe":
            for line in row["out"].splitlines()[-12:]:
                print(f"      {line[:300]}")
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(c["ok"] for c in out["checks"]) else 1


KEY = {"torch", "transformers", "tokenizers", "vllm", "trl", "peft", "accelerate", "verl", "ray", "openrlhf",
       "deepspeed", "hydra-core", "tensordict", "flash-attn-standin", "rlctl", "numpy", "datasets"}
