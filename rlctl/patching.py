"""Versioned patch sets for installed backends: discover, status, apply, revert — atomic and idempotent.

A set is a directory `<backend>/<version>/` with `*.patch` files (`a/<package>/...` paths, for `patch -p1` run in
site-packages) and a `manifest.toml` naming their order, targets and purpose. Apply and revert change either every
target file or none: all targets are backed up first and restored byte for byte if any step fails. What was
applied is recorded next to the package (with hashes of the patched files), so a later status can tell that a
reinstall wiped the patches.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rlctl.errors import PatchError
from rlctl.resources import patches_dir

RECORD_PREFIX = ".rlctl-patches-"


@dataclass
class PatchEntry:
    file: Path
    targets: list[str]
    purpose: str


@dataclass
class PatchSet:
    name: str  # "<backend>/<version>"
    root: Path
    backend: str
    package: str
    version: str
    description: str
    patches: list[PatchEntry] = field(default_factory=list)
    source: str = "bundled"
    fixes: list[str] = field(default_factory=list)  # preflight checks the set declares it fixes (manifest `fixes`)
    shadowed: bool = False  # a bundled set hidden by a user's set of the same name (the user's wins)


@dataclass
class Installed:
    package: str
    version: str | None
    site: Path  # the directory that holds the package directory

    @property
    def package_dir(self) -> Path:
        return self.site / self.package


# ---------------------------------------------------------------------------------------------------------------
# discovery


MANIFEST_MAX_BYTES = 1 << 20
SCAN_LIMIT = 10_000  # entries read per directory of a user's --dir
_TOP_KEYS = {"backend": "a string", "package": "a string (the import name)", "version": "a string",
             "description": "a string", "patch": "[[patch]] tables",
             "fixes": "a list of preflight check names the set fixes (a patch set silences only those)"}
_ENTRY_KEYS = {"file": "a string", "targets": "a list of strings", "purpose": "a string"}


def _type_name(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(v), type(v).__name__)


def _line_of(text: str, key: str, entry: int | None = None) -> int | None:
    """The line of `key = ...` in a manifest: at the top level, or in the `entry`-th [[patch]] table (1-based)."""
    import re

    seen = 0
    in_scope = entry is None
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if s.startswith("["):
            if entry is None:
                return None
            if re.match(r"\[\[\s*patch\s*\]\]", s):
                seen += 1
                in_scope = seen == entry
                if in_scope and key == "":
                    return n
            else:
                in_scope = False
            continue
        if in_scope and re.match(rf"""["']?{re.escape(key)}["']?\s*=""", s):
            return n
    return None


class _Manifest:
    """Where a manifest's values are, for errors that name file:line and key."""

    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text

    def error(self, key: str, msg: str, entry: int | None = None, hint: str | None = None) -> PatchError:
        line = _line_of(self.text, key, entry)
        where = f"{self.path}:{line}" if line else str(self.path)
        what = f"[[patch]] #{entry}" + (f" `{key}`" if key else "") if entry else f"`{key}`"
        return PatchError(f"{where}: {what} {msg}", hint=hint)


def _relative_path(v: str) -> bool:
    p = Path(v)
    return bool(v) and "\0" not in v and not p.is_absolute() and ".." not in p.parts


def fixable_checks() -> list[str]:
    """The checks a manifest's `fixes` may name: those whose backend rules consult it (Backend.patch_fixable)."""
    from rlctl.backends import available, get_backend

    out: set[str] = set()
    for name in available():
        try:
            out.update(getattr(get_backend(name), "patch_fixable", ()) or ())
        except Exception:  # a broken third-party backend is `rlctl backends`' finding, not a manifest's
            continue
    return sorted(out)


def load_set(root: Path, source: str = "bundled") -> PatchSet:
    # absolute: each patch is run with site-packages as the working directory
    root = Path(os.path.abspath(root))
    manifest = root / "manifest.toml"
    if not manifest.is_file():
        what = "is not a regular file" if manifest.exists() or manifest.is_symlink() else "is missing"
        raise PatchError(f"{root}: not a patch set: its manifest.toml {what}.",
                         hint="a patch set is a directory with *.patch files and a manifest.toml (see docs/checks.md)")
    if manifest.stat().st_size > MANIFEST_MAX_BYTES:
        raise PatchError(f"{manifest}: {manifest.stat().st_size} bytes; a manifest is a few lines of TOML "
                         f"(at most {MANIFEST_MAX_BYTES} bytes).")
    try:
        text = manifest.read_bytes().decode("utf-8")
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise PatchError(f"{manifest}: malformed TOML ({str(e) or type(e).__name__}).",
                         hint="fix the TOML syntax; the bundled sets' manifests are examples") from None
    m = _Manifest(manifest, text)
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise m.error(unknown[0], f"is not a manifest key (known: {', '.join(_TOP_KEYS)}).")
    for key in ("backend", "package", "version"):
        v = data.get(key)
        if v is None:
            raise PatchError(f"{manifest}: missing `{key}` ({_TOP_KEYS[key]}).",
                             hint=f'add a line such as {key} = "..." at the top of the manifest')
        if not isinstance(v, str):
            raise m.error(key, f"must be {_TOP_KEYS[key]}, not {_type_name(v)} ({v!r:.40}).")
        if not v.strip() or "\0" in v or "/" in v or v in (".", ".."):
            raise m.error(key, f"{v!r:.40} is not a usable {key} (non-empty, no '/', no NUL).")
    if not data["package"].isidentifier():
        raise m.error("package", f"{data['package']!r:.40} is not a Python package name (the import name, e.g. "
                      "my_trainer).")
    if not isinstance(data.get("description", ""), str):
        raise m.error("description", f"must be a string, not {_type_name(data['description'])}.")
    patches = data.get("patch", [])
    if not isinstance(patches, list):
        raise m.error("patch", f"must be [[patch]] tables, not {_type_name(patches)}.",
                      hint="write each patch as a table: a [[patch]] line, then file = \"0001-x.patch\" under it")
    entries = []
    for i, p in enumerate(patches, start=1):
        if not isinstance(p, dict):
            raise m.error("patch", f"#{i} must be a [[patch]] table, not {_type_name(p)}.")
        unknown = sorted(set(p) - set(_ENTRY_KEYS))
        if unknown:
            raise m.error(unknown[0], f"is not a [[patch]] key (known: {', '.join(_ENTRY_KEYS)}).", i)
        name = p.get("file")
        if name is None:
            raise m.error("", "needs a `file` (the .patch file, relative to the set's directory).", i)
        if not isinstance(name, str):
            raise m.error("file", f"must be a string, not {_type_name(name)}.", i)
        if not _relative_path(name):
            raise m.error("file", f"{name!r:.60} must be a path inside {root} (relative, no '..').", i)
        f = root / name
        if not f.is_file():
            raise m.error("file", f"names {name}, which does not exist in {root} (or is not a regular file).", i)
        targets = p.get("targets")
        if targets is not None and not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
            raise m.error("targets", f"must be a list of strings, not {_type_name(targets)}.", i,
                          hint='e.g. targets = ["my_trainer/train.py"] (paths inside site-packages)')
        if targets is None:
            targets = _targets_of(f)
        bad = [t for t in targets if not _relative_path(t)]
        if bad:
            raise m.error("targets" if p.get("targets") is not None else "file",
                          f"target {bad[0]!r:.60} must be a path inside site-packages (relative, no '..').", i)
        if not targets:
            raise m.error("file", f"{name} changes no file (no `+++` lines) and names no `targets`.", i)
        if not _has_hunk(f):
            what = "is empty" if f.stat().st_size == 0 else "holds no diff hunk (no `@@` line)"
            raise m.error("file", f"{name} changes nothing: it {what}.", i,
                          hint="a patch is a unified diff (diff -u, git diff) of the files it names in `targets`")
        purpose = p.get("purpose", "")
        if not isinstance(purpose, str):
            raise m.error("purpose", f"must be a string, not {_type_name(purpose)}.", i)
        entries.append(PatchEntry(f, list(targets), purpose))
    if not entries:
        raise PatchError(f"{manifest}: the set has no [[patch]] entries.",
                         hint="add one per patch file: a [[patch]] line, then file = \"0001-x.patch\" under it")
    fixes = data.get("fixes", [])
    if not isinstance(fixes, list) or not all(isinstance(c, str) for c in fixes):
        raise m.error("fixes", f"must be a list of preflight check names, not {_type_name(fixes)}.",
                      hint='e.g. fixes = ["disk.lora_zero3"]')
    known = fixable_checks()
    unknown = [c for c in fixes if c not in known]
    if unknown:
        raise m.error("fixes", f"names {unknown[0]!r:.60}, which is not a check a patch set can fix (known: "
                      f"{', '.join(known) or 'none'}).",
                      hint="name only checks the set's patches really fix; any other stays as preflight says")
    return PatchSet(f"{data['backend']}/{data['version']}", root, data["backend"], data["package"], data["version"],
                    data.get("description", ""), entries, source, list(fixes))


# what makes a diff change something: a unified or context hunk, or a git header that renames or re-modes a file
_CHANGE_STARTS = ("@@ -", "***************", "rename from ", "copy from ", "old mode ", "deleted file mode ")


def _has_hunk(patch_file: Path) -> bool:
    with patch_file.open(errors="replace") as fh:
        return any(line.startswith(_CHANGE_STARTS) for line in fh)


def _targets_of(patch_file: Path) -> list[str]:
    out = []
    for line in patch_file.read_text(errors="replace").splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].strip()
            out.append(path.split("/", 1)[1] if "/" in path else path)
    return out


def _scan_user_dir(user_dir: Path, label: str) -> tuple[list[PatchSet], list[str]]:
    """The sets under a user's directory (`<backend>/<version>/manifest.toml`), and what else is there and why it
    is not a set."""
    import itertools

    def entries(d: Path) -> list[Path]:
        return sorted(itertools.islice(d.iterdir(), SCAN_LIMIT))

    if (user_dir / "manifest.toml").exists():
        raise PatchError(f"{label} {user_dir}: this is one patch set (it holds manifest.toml), not a directory of "
                         "<backend>/<version>/ sets.",
                         hint=f"name the set by its path (rlctl patch apply {user_dir}), or give {label} the "
                              "directory two levels above it")
    sets: list[PatchSet] = []
    other: list[str] = []
    for b in entries(user_dir):
        if not b.is_dir():
            other.append(f"{b.name} (a file, not a <backend>/ directory)")
            continue
        if (b / "manifest.toml").exists():
            other.append(f"{b.name}/manifest.toml (one level too shallow: expected {b.name}/<version>/manifest.toml)")
            continue
        versions = entries(b)
        if not versions:
            other.append(f"{b.name}/ (empty)")
        for v in versions:
            rel = f"{b.name}/{v.name}"
            if not v.is_dir():
                other.append(f"{rel} (a file, not a <version>/ directory)")
            elif not (v / "manifest.toml").exists():
                n = sum(1 for _ in itertools.islice(v.glob("*.patch"), SCAN_LIMIT))
                other.append(f"{rel}/ (no manifest.toml" + (f"; {n} .patch files)" if n else ")"))
            else:
                sets.append(load_set(v, "user"))
    return sets, other


def discover(user_dir: Path | None = None, label: str = "--dir") -> list[PatchSet]:
    """The bundled sets, then those in `user_dir`. A user directory holding no set is an error saying what it holds;
    anything in it that is not a set is named in a warning (hidden files aside)."""
    if user_dir is not None and not user_dir.is_dir():
        raise PatchError(f"{label} {user_dir}: not a directory of patch sets.",
                         hint=f"point {label} at a directory holding <backend>/<version>/manifest.toml")
    base = patches_dir()
    sets = [load_set(m.parent, "bundled") for m in sorted(base.glob("*/*/manifest.toml"))] if base.is_dir() else []
    if user_dir is None:
        return sets
    user, other = _scan_user_dir(Path(os.path.abspath(user_dir)), label)
    if not user:
        found = "; ".join(other[:8]) + (f"; and {len(other) - 8} more" if len(other) > 8 else "") if other else \
            "nothing (an empty directory)"
        raise PatchError(f"{label} {user_dir}: holds no patch set. Found: {found}.",
                         hint="a patch set is <dir>/<backend>/<version>/ with its *.patch files and a manifest.toml "
                              "(backend, package, version, [[patch]] file/targets/purpose); see docs/checks.md")
    shown = [o for o in other if not o.startswith(".")]
    if shown:
        sys.stderr.write(f"rlctl: warning: {label} {user_dir}: not patch sets, ignored: {'; '.join(shown[:8])}"
                         + (f"; and {len(shown) - 8} more" if len(shown) > 8 else "") + "\n")
    mine = {s.name for s in user}
    for s in sets:
        s.shadowed = s.name in mine  # the user's directory wins (find_set)
    return sets + user


def describe(ps: PatchSet, user_dir: Path | None = None, label: str = "--dir") -> str:
    """`openrlhf/0.9.3 (bundled)`, `openrlhf/0.9.3 (--dir mypatches)`: which of two same-named sets is which."""
    where = f"{label} {user_dir}" if ps.source == "user" and user_dir is not None else ps.source
    return f"{ps.name} ({where}" + (", shadowed by the user's set)" if ps.shadowed else ")")


def find_set(name: str, user_dir: Path | None = None, label: str = "--dir") -> PatchSet:
    """A set by its path (relative to the current directory) or its name; a user's set wins over a bundled one."""
    p = Path(name)
    if (p / "manifest.toml").is_file():
        return load_set(p, "path")
    sets = discover(user_dir, label)
    for s in sets:
        if s.name == name and not s.shadowed:
            return s
    known = ", ".join(describe(s, user_dir, label) for s in sets) or "none"
    raise PatchError(f"no patch set {name!r}.", hint=f"known sets: {known} (rlctl patch list)")


def recipe_set(recipe: Any, version: str | None, where: str = "patches.set") -> PatchSet | None:
    """The recipe's patch set (`patches.set`, from `patches.dir` too), which must exist and be for the recipe's
    backend and release (`version`, what it renders for): render, preflight and launch all ask here, and a set
    that fails this credits no `fixes`. None when the recipe names no set."""
    name = recipe.patches.set
    if not name:
        return None
    user_dir = Path(recipe.patches.dir) if recipe.patches.dir else None
    try:
        ps = find_set(name, user_dir, "patches.dir")
    except PatchError as e:
        raise PatchError(f"{where}: patches.set = {name!r}: {e.message}", hint=e.hint) from None
    backend = recipe.backend.name
    if ps.backend != backend or (version is not None and ps.version != version):
        want = f"{backend}/{version}" if version else backend
        try:
            match = [s.name for s in discover(user_dir, "patches.dir")
                     if s.backend == backend and s.version == version and not s.shadowed]
        except PatchError:
            match = []
        raise PatchError(f"{where}: patches.set = {name!r} is for {ps.backend} {ps.version}, but the recipe runs "
                         f"{backend} {version or '(any release)'}: its patches would not apply there and its "
                         "`fixes` do not hold.",
                         hint=f'set patches.set = "{match[0]}"' if match else
                         f"use a patch set made for {want}, or remove patches.set")
    return ps


# ---------------------------------------------------------------------------------------------------------------
# the installed package


_LOCATE = (
    "import importlib.util, importlib.metadata, json, sys\n"
    "name = sys.argv[1]\n"
    "spec = importlib.util.find_spec(name)\n"
    "locs = list(spec.submodule_search_locations or []) if spec else []\n"
    "try:\n    v = importlib.metadata.version(name)\nexcept Exception:\n    v = None\n"
    "print(json.dumps({'locations': locs, 'version': v}))\n"
)


def locate(package: str, python: str | None = None, versions: tuple[str, ...] = ()) -> Installed:
    """Where `package` is installed for an interpreter (ours by default), found without importing it. `versions`: the
    releases a patch set is for (the one to install where the package is missing)."""
    exe = python or sys.executable
    try:
        r = subprocess.run([exe, "-c", _LOCATE, package], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PatchError(f"cannot run {exe}: {e}.") from None
    if r.returncode != 0:
        raise PatchError(f"{exe} could not look up {package} (exit {r.returncode}): "
                         f"{r.stderr.strip()[-300:] or 'no output'}",
                         hint="--python must name a Python interpreter, e.g. --python /path/to/venv/bin/python")
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
        locations = [str(x) for x in info["locations"]]
        found_version = info.get("version")
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        raise PatchError(f"{exe} did not answer like a Python interpreter (got {r.stdout.strip()[:100]!r}).",
                         hint="--python must name a Python interpreter, e.g. --python /path/to/venv/bin/python"
                         ) from None
    info = {"locations": locations, "version": found_version if isinstance(found_version, str) else None}
    if not info["locations"]:
        pin = f"{package}=={versions[0]}" if versions else package
        more = f" (a release with a patch set: {', '.join(versions)})" if len(versions) > 1 else ""
        raise PatchError(f"{package} is not installed for {exe}.", hint=f"pip install {pin}{more}")
    pkg_dir = Path(info["locations"][0])
    return Installed(package, info["version"], pkg_dir.parent)


def _patch_exe() -> str:
    exe = shutil.which("patch")
    if exe is None:
        raise PatchError("GNU patch is not installed.", hint="apt-get install patch")
    return exe


def _run_patch(args: list[str], site: Path, patch_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_patch_exe(), "-p1", "--batch", "--no-backup-if-mismatch", "-r", "-", *args,
                           "-d", str(site), "-i", str(patch_file)], capture_output=True, text=True)


def _split_by_file(patch_file: Path, tmp: Path) -> list[Path]:
    """One patch per target file, to tell 'partly applied' (some files) from 'conflicting'."""
    text = patch_file.read_text(errors="replace")
    chunks, cur = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("--- ") and cur and any(c.startswith("@@") for c in cur):
            chunks.append(cur)
            cur = []
        cur.append(line)
    if cur:
        chunks.append(cur)
    out = []
    for i, c in enumerate(chunks):
        p = tmp / f"{patch_file.stem}.{i}.patch"
        p.write_text("".join(c))
        out.append(p)
    return out


def patch_state(entry: PatchEntry, site: Path) -> str:
    """applied | not applied | partly applied | conflicting (nothing is changed)."""
    fwd = _run_patch(["--dry-run", "--forward"], site, entry.file)
    if "Only garbage was found" in fwd.stdout + fwd.stderr or "malformed patch" in fwd.stdout + fwd.stderr:
        raise PatchError(f"{entry.file}: not a valid patch (patch says: "
                         f"{(fwd.stdout + fwd.stderr).strip().splitlines()[-1]}).")
    if fwd.returncode == 0:
        return "not applied"
    rev = _run_patch(["--dry-run", "-R", "--force"], site, entry.file)
    if rev.returncode == 0:
        return "applied"
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        parts = _split_by_file(entry.file, Path(d))
        if len(parts) > 1:
            states = []
            for part in parts:
                if _run_patch(["--dry-run", "--forward"], site, part).returncode == 0:
                    states.append("not applied")
                elif _run_patch(["--dry-run", "-R", "--force"], site, part).returncode == 0:
                    states.append("applied")
                else:
                    states.append("conflicting")
            if "conflicting" not in states and len(set(states)) > 1:
                return "partly applied"
    return "conflicting"


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def record_path(inst: Installed) -> Path:
    return inst.site / f"{RECORD_PREFIX}{inst.package}.json"


def read_record(inst: Installed) -> dict[str, Any]:
    try:
        return json.loads(record_path(inst).read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class PatchStatus:
    patch: str
    state: str
    purpose: str
    note: str = ""


def status(ps: PatchSet, inst: Installed) -> tuple[list[PatchStatus], str | None]:
    """Per patch: its state; plus a set-level note (version mismatch, patches wiped by a reinstall)."""
    notes = []
    recovered = recover(inst)
    if recovered:
        notes.append(recovered)
    if inst.version != ps.version:
        notes.append(f"set is for {ps.package} {ps.version}, installed is {inst.version}")
    note = "; ".join(notes) or None
    rec = read_record(inst).get(ps.name, {})
    out = []
    for e in ps.patches:
        state = patch_state(e, inst.site)
        n = ""
        recorded = rec.get("applied", {}).get(e.file.name)
        if recorded and state != "applied":
            hashes = recorded.get("hashes", {})
            changed = [t for t, h in hashes.items() if sha256(inst.site / t) != h]
            n = ("recorded as applied, but the files changed since (reinstalled?): re-apply"
                 if changed else "recorded as applied")
        out.append(PatchStatus(e.file.name, state, e.purpose, n))
    return out, note


# ---------------------------------------------------------------------------------------------------------------
# apply / revert, atomically


JOURNAL_SUFFIX = ".journal"
SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def journal_path(inst: Installed) -> Path:
    return inst.site / f"{RECORD_PREFIX}{inst.package}{JOURNAL_SUFFIX}"


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: Any, create_time: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        import psutil

        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and (
            not isinstance(create_time, (int, float)) or abs(proc.create_time() - create_time) < 1.0)
    except Exception:
        return False


class _Journal:
    """A transaction's undo log, on disk before any target is touched: every target's bytes and mode (or that it
    did not exist) plus the applied-record, written to a temporary directory, fsynced, then renamed into place.
    If rlctl dies mid-transaction (SIGKILL, power loss), the journal survives and the next `patch status`, `apply`
    or `revert` restores every file from it (`recover`). Committing is removing it."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def begin(cls, inst: Installed, ps: PatchSet, verb: str, targets: list[str]) -> _Journal:
        final = journal_path(inst)
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "files").mkdir(parents=True)
        entries: dict[str, Any] = {}
        names = list(dict.fromkeys([*targets, record_path(inst).name]))
        for i, t in enumerate(names):
            src = inst.site / t
            if src.is_file() and not src.is_symlink():
                dst = tmp / "files" / str(i)
                dst.write_bytes(src.read_bytes())
                with open(dst, "rb") as fh:
                    os.fsync(fh.fileno())
                entries[t] = {"saved": str(i), "mode": src.stat().st_mode & 0o7777}
            else:
                entries[t] = {"saved": None}
        created = None
        try:
            import psutil

            created = psutil.Process().create_time()
        except Exception:
            pass
        meta = {"set": ps.name, "verb": verb, "pid": os.getpid(), "pid_create_time": created, "targets": entries}
        (tmp / "journal.json").write_text(json.dumps(meta, indent=2) + "\n")
        with open(tmp / "journal.json", "rb") as fh:
            os.fsync(fh.fileno())
        os.rename(tmp, final)  # the transaction exists from here on, complete
        _fsync_dir(inst.site)
        return cls(final)

    def meta(self) -> dict[str, Any]:
        try:
            data = json.loads((self.path / "journal.json").read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def restore(self, site: Path) -> list[str]:
        """Every target back to its journaled bytes (or absent); leftovers of `patch` removed."""
        targets = self.meta().get("targets")
        if not isinstance(targets, dict):
            raise PatchError(f"{self.path}: the patch journal is damaged; cannot tell what to restore.",
                             hint="reinstall the package (pip install --force-reinstall ...) and remove the journal")
        restored = []
        for t, info in targets.items():
            p = site / t
            if not isinstance(info, dict) or Path(t).is_absolute() or ".." in Path(t).parts:
                continue
            saved = info.get("saved")
            if saved is None:
                if p.exists() or p.is_symlink():
                    p.unlink()
                    restored.append(t)
            else:
                data = (self.path / "files" / str(saved)).read_bytes()
                if not p.is_file() or p.read_bytes() != data:
                    restored.append(t)
                tmp = p.with_name(p.name + ".rlctl-restore")
                tmp.write_bytes(data)
                os.chmod(tmp, int(info.get("mode", 0o644)))
                os.replace(tmp, p)
            for suffix in (".rej", ".orig", ".rlctl-restore"):
                extra = site / (t + suffix)
                if extra.exists():
                    extra.unlink()
        _fsync_dir(site)
        return restored

    def commit(self) -> None:
        done = self.path.with_name(f"{self.path.name}.done-{os.getpid()}")
        os.rename(self.path, done)  # atomic: from here the transaction is over
        shutil.rmtree(done, ignore_errors=True)


def recover(inst: Installed) -> str | None:
    """Finish what an interrupted apply/revert left: restore every file from its journal. Returns what was done
    (for `patch status` to say), or None when there was nothing to recover."""
    for stale in inst.site.glob(f"{RECORD_PREFIX}{inst.package}{JOURNAL_SUFFIX}.*"):
        if ".tmp-" in stale.name or ".done-" in stale.name:  # a journal never completed / already committed
            pid = stale.name.rsplit("-", 1)[-1]
            if not (pid.isdigit() and _pid_alive(int(pid), None)):
                shutil.rmtree(stale, ignore_errors=True)
    path = journal_path(inst)
    if not path.is_dir():
        return None
    j = _Journal(path)
    meta = j.meta()
    if _pid_alive(meta.get("pid"), meta.get("pid_create_time")):
        raise PatchError(f"another rlctl (pid {meta.get('pid')}) is changing {inst.package} right now "
                         f"({meta.get('verb')} {meta.get('set')}); nothing was changed.",
                         hint="wait for it to finish, then retry")
    restored = j.restore(inst.site)
    j.commit()
    return (f"an interrupted {meta.get('verb', 'transaction')} of {meta.get('set', '?')} "
            f"(pid {meta.get('pid', '?')}) was rolled back from its journal: "
            f"{len(restored)} file(s) restored, nothing is half-patched")


class _SignalGuard:
    """While a transaction runs, SIGINT, SIGTERM and SIGHUP (a dropped SSH session) are caught and remembered
    instead of killing the process; the transaction checks between steps and rolls back from its journal before
    exiting. A handler only records the signal, so nothing — not a second Ctrl-C — can interrupt the rollback."""

    def __init__(self) -> None:
        import signal
        import threading

        self.signal = signal
        self.active = threading.current_thread() is threading.main_thread()
        self.old: dict[int, Any] = {}
        self.pending: list[int] = []
        self.nums = [getattr(signal, n) for n in SIGNALS if hasattr(signal, n)]

    def _record(self, signum: int, frame: Any) -> None:
        self.pending.append(signum)

    def check(self) -> None:
        if self.pending:
            raise Interrupted(self.pending[0])

    def __enter__(self) -> _SignalGuard:
        if self.active:
            for n in self.nums:
                self.old[n] = self.signal.signal(n, self._record)
        return self

    def __exit__(self, *exc: Any) -> None:
        for n, h in self.old.items():
            self.signal.signal(n, h)


class Interrupted(BaseException):
    """A signal arrived in the middle of a transaction."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _check_writable(inst: Installed, targets: list[str]) -> None:
    for t in targets:
        p = inst.site / t
        d = p.parent
        if (p.exists() and not os.access(p, os.W_OK)) or (d.exists() and not os.access(d, os.W_OK)):
            raise PatchError(f"{p} is not writable; nothing was changed.",
                             hint="run with the permissions of whoever installed the package (or use a venv)")


def _write_record(inst: Installed, ps: PatchSet, applied: dict[str, Any]) -> None:
    rec = read_record(inst)
    if applied:
        rec[ps.name] = {"version": ps.version, "applied": applied}
    else:
        rec.pop(ps.name, None)
    path = record_path(inst)
    if rec:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(rec, indent=2) + "\n")
        os.replace(tmp, path)
    elif path.exists():
        path.unlink()


@dataclass
class Outcome:
    changed: list[str]
    skipped: list[str]
    dry_run_output: str = ""


def _states_or_refuse(ps: PatchSet, inst: Installed, verb: str) -> dict[str, str]:
    recover(inst)
    states = {e.file.name: patch_state(e, inst.site) for e in ps.patches}
    bad = {k: v for k, v in states.items() if v in ("conflicting", "partly applied")}
    if bad:
        raise PatchError(f"cannot {verb}: " + "; ".join(f"{k} is {v}" for k, v in bad.items())
                         + "; nothing was changed.", hint="rlctl patch status shows each file")
    return states


def _transaction(inst: Installed, ps: PatchSet, todo: list[PatchEntry], args: list[str], verb: str,
                 on_success: Any) -> None:
    """Run `patch ARGS` for each entry, journaled: on any failure or signal, every target is restored byte for
    byte; if rlctl is killed outright, the journal lets the next command restore them."""
    targets = [t for e in todo for t in e.targets]
    _check_writable(inst, targets)
    with _SignalGuard() as guard:
        try:
            journal = _Journal.begin(inst, ps, verb, targets)
        except OSError as exc:
            raise PatchError(f"cannot write the patch journal in {inst.site} ({exc.strerror or exc}); "
                             "nothing was changed.", hint="free disk space or fix permissions") from None
        try:
            guard.check()
            for e in todo:
                r = _run_patch(args, inst.site, e.file)
                guard.check()  # a signal that also hit `patch` (Ctrl-C reaches the whole group) wins over its error
                if r.returncode != 0:
                    raise PatchError(f"{e.file.name} failed to {verb}: {(r.stdout + r.stderr).strip()[-400:]}")
                on_success(e)
            _write_record(inst, ps, on_success(None))
            guard.check()
            journal.commit()
        except BaseException as exc:
            journal.restore(inst.site)
            journal.commit()
            signum = exc.signum if isinstance(exc, Interrupted) else 2 if isinstance(exc, KeyboardInterrupt) else 0
            if signum:
                raise _interrupted(signum, ps, verb) from None
            if isinstance(exc, PatchError):
                raise PatchError(f"{exc.message} Every file was restored; nothing is half-patched.") from None
            if isinstance(exc, OSError):
                raise PatchError(f"{verb} {ps.name} failed ({exc}); every file was restored.") from None
            raise
        if guard.pending:  # arrived after the commit: the transaction is complete; still exit as signalled
            raise _interrupted(guard.pending[0], ps, verb, completed=True)


def _interrupted(signum: int, ps: PatchSet, verb: str, completed: bool = False) -> PatchError:
    import signal

    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    what = ("it had completed: every file is patched as recorded" if completed
            else "every file was restored, nothing is half-patched")
    err = PatchError(f"{verb} {ps.name} interrupted by {name}; {what}.")
    err.exit_code = 128 + int(signum)
    return err


def apply(ps: PatchSet, inst: Installed, dry_run: bool = False, allow_version_mismatch: bool = False) -> Outcome:
    if inst.version != ps.version and not allow_version_mismatch:
        raise PatchError(f"patch set {ps.name} is for {ps.package} {ps.version}, installed is {inst.version}; "
                         "nothing was changed.", hint=f"pip install {ps.package}=={ps.version}")
    states = _states_or_refuse(ps, inst, "apply")
    todo = [e for e in ps.patches if states[e.file.name] == "not applied"]
    skipped = [e.file.name for e in ps.patches if states[e.file.name] == "applied"]
    if dry_run:
        out = []
        for e in todo:
            r = _run_patch(["--dry-run", "--forward"], inst.site, e.file)
            out.append(f"{e.file.name}:\n{r.stdout.strip()}")
        return Outcome([e.file.name for e in todo], skipped, "\n".join(out))
    applied = dict(read_record(inst).get(ps.name, {}).get("applied", {}))

    def record(e: PatchEntry | None) -> dict[str, Any]:
        if e is not None:
            applied[e.file.name] = {"hashes": {t: sha256(inst.site / t) for t in e.targets}}
        return applied

    _transaction(inst, ps, todo, ["--forward"], "apply", record)
    return Outcome([e.file.name for e in todo], skipped)


def revert(ps: PatchSet, inst: Installed, dry_run: bool = False) -> Outcome:
    states = _states_or_refuse(ps, inst, "revert")
    todo = [e for e in reversed(ps.patches) if states[e.file.name] == "applied"]
    skipped = [e.file.name for e in ps.patches if states[e.file.name] == "not applied"]
    if dry_run:
        return Outcome([e.file.name for e in todo], skipped)
    _transaction(inst, ps, todo, ["-R", "--force"], "revert", lambda e: {})
    return Outcome([e.file.name for e in todo], skipped)


def apply_for_launch(recipe: Any, out: IO[str]) -> None:
    """`rlctl launch`: the recipe's patch set must be applied (or already be); otherwise refuse to start."""
    user_dir = Path(recipe.patches.dir) if recipe.patches.dir else None
    ps = find_set(recipe.patches.set, user_dir, "patches.dir")  # prepare() already checked it (recipe_set)
    from rlctl.backends import get_backend

    if not get_backend(recipe.backend.name).patch_locally(recipe):
        try:
            inst = locate(ps.package, versions=(ps.version,))
        except PatchError:
            out.write(f"rlctl: {ps.package} is not installed here; patch set {ps.name} must be applied on the "
                      "cluster's nodes (rlctl patch apply there).\n")
            return
    else:
        inst = locate(ps.package, versions=(ps.version,))
    try:
        result = apply(ps, inst)
    except PatchError as e:
        raise PatchError(f"patch set {ps.name} could not be applied, so the run was not started: {e.message}",
                         hint=e.hint) from None
    if result.changed:
        out.write(f"rlctl: applied {', '.join(result.changed)} ({ps.name}) to {inst.site}\n")
