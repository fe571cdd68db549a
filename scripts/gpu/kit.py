#!/usr/bin/env python3
"""The GPU carry kit, build side: the wheel set of a named stack, slimmed and packed into pieces that each fit one
transfer to a GPU machine with no network (docs/gpu.md).

    python scripts/gpu/kit.py lock trl-vllm            # resolve stacks.toml into locks/trl-vllm.txt (uv, PyPI)
    python scripts/gpu/kit.py build trl-vllm --out .gpu --piece-mib 56
    python scripts/gpu/kit.py verify .gpu/trl-vllm     # sha256 of every piece against the manifest

Packages that are not on PyPI, or that a stack pins to a commit (stacks.toml `source`: prime-rl, its verifiers), are
built here into wheels from their git sources: a clone under $RLCTL_GPU_KIT_SRC when one is there, else one cloned
from GitHub into the cache. A `checkout = true` source also travels as a shallow clone of its ref (prime-rl's runs
need a checkout: rlctl launches `uv run --project <checkout> rl`).

`build` downloads the lock's wheels for CPython 3.12 on manylinux x86_64 (those the GPU image lacks, stacks.toml
[device]), builds rlctl's own wheel from this checkout and the kit's stand-ins, unpacks them all into one site
directory (what `pip install --target --no-deps` would make), removes what a Hopper run never loads (`slim`), packs it
as one tar.xz and splits that into pieces. `manifest.json` lists every piece and the whole with their sha256, every
package with its version and wheel, and every slimmed path with its bytes. The GPU side (assemble.py) needs only the
standard library. Built wheels and pieces live in ignored folders (.gpu/, ~/.cache/rlctl-gpu-kit): never committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

KIT = Path(__file__).resolve().parent
ROOT = KIT.parents[1]
STACKS = KIT / "stacks.toml"
LOCKS = KIT / "locks"
CACHE = Path(os.environ.get("RLCTL_GPU_KIT_CACHE", Path.home() / ".cache" / "rlctl-gpu-kit"))
MiB = 1024**2
PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
# the kit's scripts that travel with every call (the GPU machine gets a checkout that may not hold this branch)
KIT_FILES = ("assemble.py", "go.py", "run.py", "stacks.toml", "kit.py", "standins.py", "probes.py")


class KitError(Exception):
    pass


def norm(name: str) -> str:
    """PEP 503 normalised name (wheel files and dist-info use `_`; locks use `-`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def stacks() -> dict:
    return tomllib.loads(STACKS.read_text())


def stack(name: str) -> dict:
    data = stacks()
    if name not in data["stacks"]:
        raise KitError(f"unknown stack {name!r}; stacks.toml has: {', '.join(data['stacks'])}")
    return data["stacks"][name]


# ---- lock ----------------------------------------------------------------------------------------------------------
def lock_inputs(name: str) -> tuple[list[str], list[str]]:
    """(requirements, uv overrides) of a stack: rlctl's own needs + the stack's, pinned to the device's versions
    except the packages the stack carries itself (`carry`, `overrides`), the never-imported kernels excluded by a
    marker that is never true. An override wins over every requirement (vLLM pins numba, whose numpy range the
    image's numpy is outside of, and runs with the image's numba): a release that refuses the image's version at
    import is named in `carry`, and the resolver then picks what it accepts. A stack that imports one of the common
    `never` kernels names it in `allow`."""
    data = stacks()
    s = stack(name)
    reqs = list(data["common"]["requires"]) + list(s["requires"])
    own = carried_anyway(name) | {norm(re.split(r"[=<>!;\s]", o, maxsplit=1)[0]) for o in s.get("overrides", [])}
    over = [f"{k}=={v}" for k, v in data["device"]["versions"].items() if norm(k) not in own]
    allowed = {norm(n) for n in s.get("allow", [])}
    over += list(s.get("overrides", [])) + [f"{n}; sys_platform == 'never'" for n in data["common"]["never"]
                                            if norm(n) not in allowed]
    return reqs, over


def uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    raise KitError("`uv` is needed to resolve a lock (pip install uv); building from an existing lock does not need it")


def upstream_pins(name: str, over: list[str]) -> list[str]:
    """Constraints from the uv.lock a stack's own source locks its environment with (`lock_like`: a `source`
    entry): each PyPI package at the version the release was tested with, except the device's own, the ones the stack
    overrides or carries, the never-imported, the ones built from source, those in `lock_like_skip` (what an
    override's own dependencies decide), and a package the lock holds in several versions (the resolver picks)."""
    src = stack(name).get("lock_like")
    if not src:
        return []
    gd, commit = source_commit(stack(name)["source"][src])
    text = _git(gd, "show", f"{commit}:uv.lock").stdout
    found: dict[str, set[str]] = {}
    for m in re.finditer(r'^\[\[package\]\]\nname = "([^"]+)"\nversion = "([^"]+)"\nsource = \{ registry = ', text,
                         re.M):
        found.setdefault(norm(m.group(1)), set()).add(m.group(2))
    skip = device_names() | carried_anyway(name) | {norm(re.split(r"[\[=<>!;@\s]", o, maxsplit=1)[0]) for o in over}
    skip |= {norm(n) for n in [*stack(name).get("source", {}), *stack(name).get("lock_like_skip", [])]}
    return [f"{n}=={next(iter(v))}" for n, v in sorted(found.items()) if len(v) == 1 and n not in skip]


def lock(name: str) -> Path:
    reqs, over = lock_inputs(name)
    built = source_wheels(name)  # the resolver reads each one's own metadata through its file URL
    reqs += [f"{n} @ {w.resolve().as_uri()}" for n, (w, _) in built.items()]
    LOCKS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "req.in").write_text("\n".join(reqs) + "\n")
        (Path(tmp) / "over.txt").write_text("\n".join(over) + "\n")
        (Path(tmp) / "constraints.txt").write_text("\n".join(upstream_pins(name, over)) + "\n")
        out = Path(tmp) / "lock.txt"
        cmd = [uv(), "pip", "compile", str(Path(tmp) / "req.in"), "--override", str(Path(tmp) / "over.txt"),
               "--constraint", str(Path(tmp) / "constraints.txt"),
               "--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28", "--no-header",
               "--no-annotate", "--index-url", os.environ.get("RLCTL_GPU_KIT_INDEX", "https://pypi.org/simple"),
               "-o", str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            raise KitError(f"uv pip compile failed for {name}:\n{p.stderr[-3000:]}")
        pins = [ln.strip() for ln in out.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    pins = [source_pin(p, built, stack(name)) for p in pins]
    dest = LOCKS / f"{name}.txt"
    head = [f"# {name}: resolved by `python scripts/gpu/kit.py lock {name}` from stacks.toml (CPython 3.12,",
            "# manylinux_2_28 x86_64). Lines marked `device` are the GPU image's own and are not carried."]
    dev = device_names()
    carry = carried_anyway(name)
    body = [p + ("    # device" if norm(p.split("==")[0]) in dev and norm(p.split("==")[0]) not in carry else "")
            for p in pins]
    dest.write_text("\n".join(head + body) + "\n")
    return dest


def device_names() -> set[str]:
    return {norm(n) for n in stacks()["device"]["names"]}


def carried_anyway(name: str) -> set[str]:
    """Packages carried although the device has them ([common] carry + the stack's)."""
    return {norm(c) for c in stacks()["common"].get("carry", []) + stack(name).get("carry", [])}


def read_lock(name: str) -> list[tuple[str, str]]:
    """(name, version) of every package the stack carries (the lock minus the device's own)."""
    path = LOCKS / f"{name}.txt"
    if not path.is_file():
        raise KitError(f"no lock for {name}: run `python scripts/gpu/kit.py lock {name}` first")
    out = []
    for ln in path.read_text().splitlines():
        if not ln.strip() or ln.startswith("#") or ln.rstrip().endswith("# device"):
            continue
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", ln.strip())
        if not m:
            raise KitError(f"{path}: cannot read {ln!r} (want name==version)")
        out.append((norm(m.group(1)), m.group(2)))
    return out


# ---- packages built from their git sources (stacks.toml `source`) ---------------------------------------------------
def _git(where: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True)


def git_dir(repo: str) -> Path:
    """A git directory (a clone, bare or not) holding `owner/name`: under a folder of $RLCTL_GPU_KIT_SRC
    (os.pathsep-separated) as <owner>+<name>/repo, <owner>+<name> or <name>, else cloned from GitHub into the cache."""
    owner, name = repo.split("/", 1)
    for root in filter(None, os.environ.get("RLCTL_GPU_KIT_SRC", "").split(os.pathsep)):
        for cand in (Path(root) / f"{owner}+{name}" / "repo", Path(root) / f"{owner}+{name}", Path(root) / name):
            if cand.is_dir() and _git(cand, "rev-parse", "--git-dir").returncode == 0:
                return cand
    dest = CACHE / "src" / f"{owner}+{name}.git"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(["git", "clone", "--bare", "--filter=blob:none", f"https://github.com/{repo}", str(dest)],
                           capture_output=True, text=True)
        if p.returncode:
            raise KitError(f"cannot clone {repo} (set RLCTL_GPU_KIT_SRC to a folder holding a clone):\n{p.stderr}")
    return dest


def source_commit(spec: dict) -> tuple[Path, str]:
    """(git directory, commit) of a `source` entry's ref."""
    gd = git_dir(spec["repo"])
    p = _git(gd, "rev-parse", "--verify", "--quiet", f"{spec['ref']}^{{commit}}")
    if p.returncode and gd.is_relative_to(CACHE):  # the kit's own clone may predate the ref
        _git(gd, "fetch", "--tags", "origin", spec["ref"])
        p = _git(gd, "rev-parse", "--verify", "--quiet", f"{spec['ref']}^{{commit}}")
    if p.returncode:
        raise KitError(f"{spec['repo']}: {gd} has no commit {spec['ref']}")
    return gd, p.stdout.strip()


def source_wheel(name: str, spec: dict) -> tuple[Path, str]:
    """(wheel, commit) of one `source` entry: the ref's tree (`git archive`; only `paths` when given: a snapshot may
    lack its test data), its `subdir` built by `pip wheel --no-deps`; `version` for a tree whose version comes from
    git tags it does not carry (hatch-vcs, setuptools-scm). Kept in the cache per commit; a wheel built here must be
    pure Python."""
    gd, commit = source_commit(spec)
    out = CACHE / "source" / f"{norm(name)}-{commit[:12]}"
    found = sorted(out.glob("*.whl"))
    if not found:
        with tempfile.TemporaryDirectory(dir=os.environ.get("RLCTL_GPU_KIT_TMP")) as tmp:
            archive = subprocess.run(["git", "-C", str(gd), "archive", "--format=tar", commit, "--",
                                      *spec.get("paths", [])], capture_output=True)
            if archive.returncode:
                raise KitError(f"git archive {spec['repo']} {commit} failed: {archive.stderr.decode()[-1000:]}")
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            env = dict(os.environ)
            if spec.get("version"):
                env["SETUPTOOLS_SCM_PRETEND_VERSION"] = spec["version"]
            # a pure-Python wheel does not depend on the Python that builds it (prime-rl asks for ~=3.12.0)
            p = _pip("wheel", "--no-deps", "--ignore-requires-python", "-w", str(out),
                     str(Path(tmp) / spec.get("subdir", "")), env=env)
            if p.returncode:
                raise KitError(f"pip wheel {name} ({spec['repo']} {spec['ref']}) failed:\n{p.stderr[-3000:]}")
        found = sorted(out.glob("*.whl"))
    wheel = found[0]
    if norm(wheel.name.split("-")[0]) != norm(name) or not wheel.name.endswith("-none-any.whl"):
        raise KitError(f"{spec['repo']} {spec['ref']} built {wheel.name}: want a pure-Python wheel of {name}")
    return wheel, commit


def source_wheels(name: str) -> dict[str, tuple[Path, str]]:
    """{package: (wheel, commit)} of a stack's `source` entries."""
    return {norm(n): source_wheel(n, spec) for n, spec in stack(name).get("source", {}).items()}


def source_pin(line: str, built: dict[str, tuple[Path, str]], s: dict) -> str:
    """A resolver's `name @ file:///...whl` line as the lock keeps it: name==version, where it came from."""
    m = re.match(r"^([A-Za-z0-9_.\-]+) @ file://\S+", line)
    if not m or norm(m.group(1)) not in built:
        return line
    n = norm(m.group(1))
    wheel, commit = built[n]
    spec = next(v for k, v in s["source"].items() if norm(k) == n)
    return f"{n}=={wheel.name.split('-')[1]}    # source {spec['repo']} {spec['ref']} ({commit[:12]})"


def checkout(spec: dict, dest: Path) -> Path:
    """A shallow clone of a source's ref at dest (what a user's `git clone --branch` gives: `git describe` names it)."""
    gd, commit = source_commit(spec)
    dest.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", spec["ref"],
                        Path(gd).resolve().as_uri(), str(dest)], capture_output=True, text=True)
    if p.returncode:
        raise KitError(f"cannot clone {spec['repo']} {spec['ref']} into {dest}:\n{p.stderr[-1500:]}")
    _git(dest, "remote", "set-url", "origin", f"https://github.com/{spec['repo']}")
    return dest


def stack_wheels(name: str, pins: list[tuple[str, str]], python: str = "3.12") -> list[Path]:
    """The wheels of a stack's pins: built from source (`source`), downloaded or built (fetch), plus the kit's own
    stand-ins (`local`)."""
    s = stack(name)
    built = source_wheels(name)
    wheels = []
    for n, v in pins:
        if n in built:
            have = built[n][0].name.split("-")[1]
            if have != v:
                raise KitError(f"locks/{name}.txt pins {n}=={v}, its source builds {have}: "
                               f"`python scripts/gpu/kit.py lock {name}` again")
            wheels.append(built[n][0])
    wheels += fetch([p for p in pins if p[0] not in built], {norm(x) for x in s.get("sdist", [])}, CACHE / "wheels",
                    python=python, build_env=s.get("build_env"))
    if s.get("local"):
        from standins import build_standins  # noqa: PLC0415 (the kit's folder is on sys.path)

        wheels += build_standins(s["local"], CACHE / "local")
    return wheels


# ---- build ---------------------------------------------------------------------------------------------------------
def _pip(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env)


def _tags(python: str) -> set:
    """The wheel tags CPython `python` on manylinux x86_64 installs (pip's own rules, from `packaging`)."""
    try:
        from packaging import tags
    except ImportError:  # pip carries it
        from pip._vendor.packaging import tags  # type: ignore[no-redef]
    version = tuple(int(x) for x in python.split("."))
    plats = [*PLATFORMS, "linux_x86_64"]
    return set(tags.cpython_tags(version, platforms=plats)) | set(
        tags.compatible_tags(version, f"cp{version[0]}{version[1]}", plats))


def _find_wheel(folder: Path, name: str, version: str, python: str = "3.12") -> Path | None:
    """The cached wheel of name==version that CPython `python` on manylinux x86_64 can install."""
    try:
        from packaging.utils import parse_wheel_filename
    except ImportError:
        from pip._vendor.packaging.utils import parse_wheel_filename  # type: ignore[no-redef]
    ok = _tags(python)
    for w in folder.glob("*.whl"):
        parts = w.name.split("-")
        if norm(parts[0]) != name or parts[1] != version:
            continue
        if set(parse_wheel_filename(w.name)[3]) & ok:
            return w
    return None


def fetch(pins: list[tuple[str, str]], sdist: set[str], wheels: Path, python: str = "3.12",
          build_env: dict[str, str] | None = None) -> list[Path]:
    """A wheel for each pin, from the cache or PyPI: binary wheels for CPython `python` manylinux x86_64; the
    source-only ones built here (pure Python, with `build_env`: DeepSpeed's DS_BUILD_OPS=0 leaves its CUDA ops to be
    JIT-compiled on the GPU machine)."""
    wheels.mkdir(parents=True, exist_ok=True)
    missing = [(n, v) for n, v in pins if _find_wheel(wheels, n, v, python) is None]
    binary = [f"{n}=={v}" for n, v in missing if n not in sdist]
    if binary:
        plat = [a for p in PLATFORMS for a in ("--platform", p)]
        p = _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                 *plat, "-d", str(wheels), *binary)
        if p.returncode:
            raise KitError(f"pip download failed:\n{p.stderr[-3000:]}")
    for n, v in missing:
        if n in sdist:
            p = _pip("wheel", "--no-deps", "--no-binary", n, "-w", str(wheels), f"{n}=={v}",
                     env={**os.environ, **(build_env or {})})
            if p.returncode:
                raise KitError(f"pip wheel {n}=={v} failed:\n{p.stderr[-3000:]}")
    out = []
    for n, v in pins:
        w = _find_wheel(wheels, n, v, python)
        if w is None:
            raise KitError(f"no wheel for {n}=={v} in {wheels}")
        if n in sdist and not w.name.endswith("-none-any.whl"):
            raise KitError(f"{w.name}: a wheel built from source here must be pure Python to run on the GPU machine")
        out.append(w)
    return out


def rlctl_wheel(dest: Path) -> Path:
    """rlctl's own wheel from this checkout (the GPU machine runs the code under test, not a release)."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("rlctl-*.whl"):
        old.unlink()
    p = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), str(ROOT))
    if p.returncode:
        raise KitError(f"building rlctl's wheel failed:\n{p.stderr[-3000:]}")
    return next(dest.glob("rlctl-*.whl"))


def unpack(wheel: Path, site: Path) -> None:
    """What `pip install --target --no-deps` does with a wheel: its files into site/, `.data/purelib|platlib` merged,
    `.data/scripts` and a launcher for each console script (`ray`, `deepspeed`, ...) into site/bin (the GPU side
    puts that on PATH)."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(".dist-info/entry_points.txt") and name.count("/") == 1:
                console_scripts(z.read(name).decode(errors="replace"), site / "bin")
        for info in z.infolist():
            name = info.filename
            parts = name.split("/")
            if parts[0].endswith(".data") and len(parts) > 2:
                kind = parts[1]
                rest = "/".join(parts[2:])
                if kind in ("purelib", "platlib"):
                    name = rest
                elif kind == "scripts":
                    name = "bin/" + rest
                else:
                    continue  # headers, data: nothing a run imports
            target = site / name
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode | 0o600)


def console_scripts(entry_points: str, bin_dir: Path) -> list[Path]:
    """The launchers pip writes for a wheel's [console_scripts] (`ray = ray.scripts.scripts:main`), run by the
    machine's python3 (the one that holds torch). The `__main__` guard is pip's too: a child started with
    multiprocessing's spawn re-imports the launcher (prime-rl's inference server died on the GPU without it)."""
    out, section = [], None
    for line in entry_points.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
            continue
        if section != "console_scripts" or "=" not in line:
            continue
        name, target = (x.strip() for x in line.split("=", 1))
        module, _, attr = target.split("[")[0].strip().partition(":")
        bin_dir.mkdir(parents=True, exist_ok=True)
        path = bin_dir / name
        head = attr.split(".")[0] if attr else ""
        call = f"{attr}()" if attr else "None"
        path.write_text("#!/usr/bin/env python3\nimport sys\n"
                        + (f"from {module} import {head}\n" if head else f"import {module}\n")
                        + f"if __name__ == '__main__':\n    sys.exit({call})\n")
        path.chmod(0o755)
        out.append(path)
    return out


def slim(site: Path, globs: list[str]) -> list[dict]:
    """Remove what a Hopper run never loads; returns each removed path with its bytes."""
    removed = []
    for pattern in globs:
        hits = site.rglob(pattern[2:]) if pattern.startswith("*/") else site.glob(pattern)
        for p in sorted(hits):
            size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
            removed.append({"path": str(p.relative_to(site)), "bytes": size})
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return removed


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 * MiB), b""):
            h.update(block)
    return h.hexdigest()


def pack(site: Path, out: Path, piece_bytes: int, threads: int = 0) -> tuple[list[dict], dict]:
    """site/ as one tar.xz, split into pieces of at most piece_bytes: (pieces, whole) with sizes and sha256."""
    whole = out / "site.tar.xz"
    xz = shutil.which("xz")
    if xz:  # the xz tool compresses on several threads; the GPU side reads it with Python's lzma either way
        tar = subprocess.Popen(["tar", "-C", str(site), "--sort=name", "--owner=0", "--group=0", "-cf", "-", "."],
                               stdout=subprocess.PIPE)
        with open(whole, "wb") as fh:
            z = subprocess.run([xz, f"-T{threads}", "-6", "-c"], stdin=tar.stdout, stdout=fh)
        if tar.wait() or z.returncode:
            raise KitError("tar | xz failed")
    else:
        with tarfile.open(whole, "w:xz", preset=6) as t:
            t.add(site, arcname=".")
    pieces = []
    size = piece_bytes
    with open(whole, "rb") as fh:
        i = 0
        while True:
            block = fh.read(size)
            if not block:
                break
            p = out / f"site.tar.xz.{i:02d}"
            p.write_bytes(block)
            pieces.append({"name": p.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
            i += 1
    info = {"name": whole.name, "bytes": whole.stat().st_size, "sha256": sha256(whole)}
    whole.unlink()
    return pieces, info


def dist_versions(site: Path) -> dict[str, str]:
    out = {}
    for d in site.glob("*.dist-info"):
        meta = d / "METADATA"
        if meta.is_file():
            head = meta.read_text(errors="replace").split("\n\n", 1)[0]
            n = re.search(r"^Name: (.+)$", head, re.M)
            v = re.search(r"^Version: (.+)$", head, re.M)
            if n and v:
                out[norm(n.group(1).strip())] = v.group(1).strip()
    return dict(sorted(out.items()))


def bases(name: str) -> list[str]:
    """The stacks `name` lies on, nearest first (verl -> trl-vllm)."""
    out = []
    b = stack(name).get("base")
    while b:
        if b in out or b == name:
            raise KitError(f"stacks.toml: the bases of {name} form a cycle")
        out.append(b)
        b = stack(b).get("base")
    return out


def build(name: str, out_root: Path, piece_mib: int) -> Path:
    s = stack(name)
    data = stacks()
    pins = read_lock(name)
    under = bases(name)
    if under:  # only what the bases do not carry, as they carry it
        have = {p for b in under for p in read_lock(b)}
        pins = [p for p in pins if p not in have]
    wheels = stack_wheels(name, pins)
    trees = {f"checkouts/{n}": spec for n, spec in s.get("source", {}).items() if spec.get("checkout")}
    out = make_pack(name, wheels, out_root / name, piece_mib * MiB,
                    slim_globs=list(data["common"]["slim"]) + list(s.get("slim", [])),
                    env={**data["common"]["env"], **s.get("env", {})}, gpus=s.get("gpus", 1), bases=under,
                    trees=trees)
    copy_kit(out_root)
    return out


def make_pack(name: str, wheels: list[Path], out: Path, piece_bytes: int, *, slim_globs: list[str],
              env: dict[str, str], gpus: int = 1, bases: list[str] | None = None,
              trees: dict[str, dict] | None = None) -> Path:
    """Wheels -> one site dir -> slimmed -> tar.xz in pieces of at most piece_bytes, with manifest.json; `trees`:
    {path in the site: source entry} cloned there (a checkout a run needs)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("RLCTL_GPU_KIT_TMP")) as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        for w in wheels:
            unpack(w, site)
        unpacked = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
        removed = slim(site, slim_globs)
        for rel, spec in (trees or {}).items():
            checkout(spec, site / rel)
        versions = dist_versions(site)
        pieces, whole = pack(site, out, piece_bytes)
    manifest = {
        "stack": name, "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": "3.12", "platform": "manylinux_2_28_x86_64",
        "pieces": pieces, "whole": whole,
        "unpacked_bytes": unpacked, "slimmed": removed,
        "packages": versions,
        "wheels": sorted(w.name for w in wheels),
        "env": env, "gpus": gpus, "bases": bases or [],
        "trees": {rel: {"repo": spec["repo"], "ref": spec["ref"]} for rel, spec in (trees or {}).items()},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out


def copy_kit(out_root: Path) -> None:
    """The kit's scripts beside the pieces: the GPU machine's checkout may not hold this branch."""
    kit_out = out_root / "kit"
    kit_out.mkdir(parents=True, exist_ok=True)
    for f in KIT_FILES:
        if (KIT / f).is_file():
            shutil.copy2(KIT / f, kit_out / f)


def resplit(folder: Path, piece_bytes: int) -> list[dict]:
    """Cut a packed stack's pieces again at another size (the whole and its sha256 stay): fewer transfers when the
    working tree beside them is small."""
    if verify(folder):
        raise KitError(f"{folder}: the pieces do not match manifest.json; rebuild instead")
    m = json.loads((folder / "manifest.json").read_text())
    old = [folder / p["name"] for p in m["pieces"]]
    whole = folder / "site.tar.xz"
    with open(whole, "wb") as out:
        for p in old:
            out.write(p.read_bytes())
    for p in old:
        p.unlink()
    pieces = []
    with open(whole, "rb") as fh:
        for i, block in enumerate(iter(lambda: fh.read(piece_bytes), b"")):
            (folder / f"site.tar.xz.{i:02d}").write_bytes(block)
            pieces.append({"name": f"site.tar.xz.{i:02d}", "bytes": len(block),
                           "sha256": hashlib.sha256(block).hexdigest()})
    whole.unlink()
    m["pieces"] = pieces
    (folder / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
    return pieces


def verify(folder: Path) -> list[str]:
    """Problems with a packed stack's pieces (missing, wrong size, wrong sha256), none when it is whole."""
    m = json.loads((folder / "manifest.json").read_text())
    problems = []
    h = hashlib.sha256()
    for p in m["pieces"]:
        f = folder / p["name"]
        if not f.is_file():
            problems.append(f"{p['name']}: missing")
            continue
        b = f.read_bytes()
        h.update(b)
        if len(b) != p["bytes"] or hashlib.sha256(b).hexdigest() != p["sha256"]:
            problems.append(f"{p['name']}: size or sha256 differs from manifest.json")
    if not problems and h.hexdigest() != m["whole"]["sha256"]:
        problems.append("the pieces together differ from the packed whole")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("lock")
    a.add_argument("stack")
    b = sub.add_parser("build")
    b.add_argument("stack")
    b.add_argument("--out", type=Path, default=ROOT / ".gpu")
    b.add_argument("--piece-mib", type=int, default=56, help="piece size (MiB): one transfer carries one piece")
    c = sub.add_parser("verify")
    c.add_argument("folder", type=Path)
    e = sub.add_parser("resplit", help="cut a packed stack's pieces again at another size")
    e.add_argument("folder", type=Path)
    e.add_argument("--piece-mib", type=int, required=True)
    d = sub.add_parser("rlctl", help="rlctl's wheel from this checkout and the kit's scripts, into OUT/rlctl, OUT/kit")
    d.add_argument("--out", type=Path, default=ROOT / ".gpu")
    f = sub.add_parser("cpucheck", help="install a stack for this CPU and run its imports and probes (cpucheck.py)")
    f.add_argument("stack")
    f.add_argument("--root", type=Path, default=Path(os.environ.get("RLCTL_GPU_CPUCHECK", "/tmp/rlctl-cpucheck")))
    f.add_argument("--report", type=Path, help="write the results as JSON here")
    f.add_argument("--only", action="append", help="run only this probe (repeatable); no import checks")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(KIT))
    try:
        if args.cmd == "lock":
            print(lock(args.stack))
        elif args.cmd == "build":
            out = build(args.stack, args.out, args.piece_mib)
            m = json.loads((out / "manifest.json").read_text())
            print(f"{out}: {len(m['pieces'])} piece(s), {m['whole']['bytes'] / MiB:.1f} MiB packed, "
                  f"{m['unpacked_bytes'] / MiB:.0f} MiB unpacked before slimming, "
                  f"{sum(r['bytes'] for r in m['slimmed']) / MiB:.0f} MiB slimmed, {len(m['packages'])} packages")
        elif args.cmd == "resplit":
            print(f"{args.folder}: {len(resplit(args.folder, args.piece_mib * MiB))} piece(s)")
        elif args.cmd == "rlctl":
            print(rlctl_wheel(args.out / "rlctl"))
            copy_kit(args.out)
        elif args.cmd == "cpucheck":
            import cpucheck

            return cpucheck.run(args.stack, args.root / args.stack, args.report, args.only)
        else:
            problems = verify(args.folder)
            print("\n".join(problems) or f"{args.folder}: every piece matches manifest.json")
            return 1 if problems else 0
    except Exception as e:  # KitError, also as cpucheck raises it (`kit.KitError`: this file imported as a module)
        if type(e).__name__ != "KitError":
            raise
        print(f"kit: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
