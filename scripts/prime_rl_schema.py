"""Generate the JSON Schema of prime-rl's `rl` config (`RLConfig`) from its real sources at a release tag.

prime-rl is not on PyPI, so rlctl cannot import it at test time. This script checks a tag out of a git clone of
PrimeIntellect-ai/prime-rl into a temporary directory, builds a throwaway virtualenv with the pure-Python packages
its config classes import (pinned to the versions in that tag's uv.lock), stubs the heavy runtime modules that the
config modules import but never use for validation (torch, wandb, vllm, ...), imports `RLConfig` and writes
pydantic's `model_json_schema()` of it — types, constraints, defaults, `additionalProperties: false` — as data:

    rlctl/backends/prime_rl/schemas/<version>.json

Nothing of prime-rl's code is written into rlctl; only the schema (data) is committed.

    python scripts/prime_rl_schema.py --repo PATH/TO/prime-rl --tag v0.8.0 \
        [--verifiers-repo PATH/TO/verifiers] [--python python3.12] [--venv DIR]

    # build rendered rl.toml files with the real RLConfig (all its validators): one JSON line per file
    python scripts/prime_rl_schema.py --repo ... --tag v0.8.0 --check run/rl.toml [more.toml ...]

    # re-record tests/conformance/prime_rl_resolved_<v>.json: the conformance matrix rendered by rlctl, as
    # prime-rl's RLConfig resolves it (the test compares rlctl's own reading of each file with it)
    python scripts/prime_rl_schema.py --repo ... --tag v0.8.0 --verifiers-repo ... --record

and what a v0.8+ tag needs installed beyond `uv sync` (flash-attention, vllm-router: scripts/prime_rl_needs.py) into
the schema's `x-environment` entry (also written with the schema), without a venv:

    python scripts/prime_rl_schema.py --repo ... --tag v0.8.0 --needs

From v0.8 the config classes live in `packages/prime-rl-configs` and import `verifiers` (a git submodule, taken here
at the commit the tag pins, from a clone given by --verifiers-repo) and `renderers` / `prime-pydantic-config`
(installed from PyPI at the versions the tag's configs package asks for).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from prime_rl_needs import facts as needs_facts  # noqa: E402

OUT = ROOT / "rlctl" / "backends" / "prime_rl" / "schemas"

# Modules the config modules import (directly or through prime_rl.utils.*) that validation never needs.
HEAVY = ("torch", "wandb", "vllm", "transformers", "liger_kernel", "flash_attn", "torchtitan", "ring_flash_attn",
         "beartype", "jaxtyping", "loguru", "datasets", "numpy", "pyarrow", "zmq", "dion", "tilelang", "psutil",
         "safetensors", "huggingface_hub", "accelerate", "peft", "openai", "rich", "setproctitle", "uvloop",
         "msgspec", "prime_evals", "verifiers", "pylatexenc", "math_verify", "tenacity", "aiolimiter", "prime")

# pure-Python packages the config classes need, with their uv.lock names
CONFIG_DEPS = ("pydantic", "pydantic-core", "pydantic-settings", "tomli", "tomli-w", "annotated-types",
               "typing-extensions", "typing-inspection", "python-dotenv")

# Everything verifiers' `v1` package imports at module level (it is imported for its config classes only).
VERIFIERS_DEPS = ("anthropic", "datasets", "math-verify", "mcp", "openai", "openai-agents", "prime-tunnel",
                  "prime-sandboxes", "requests", "rich", "tenacity", "gepa", "pyzmq", "msgpack", "aiolimiter",
                  "setproctitle", "httpx", "aiohttp", "loguru", "tomli-w", "numpy")


def sh(*cmd: str, cwd: Path | None = None, capture: bool = True) -> str:
    r = subprocess.run(list(cmd), cwd=cwd, capture_output=capture, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr if capture else ''}")
    return r.stdout if capture else ""


def locked_versions(uv_lock: str) -> dict[str, str]:
    out = {}
    for m in re.finditer(r'^\[\[package\]\]\nname = "([^"]+)"\nversion = "([^"]+)"', uv_lock, re.M):
        out[m.group(1)] = m.group(2)
    return out


def extract(repo: Path, tag: str, dest: Path) -> str:
    commit = sh("git", "-C", str(repo), "rev-parse", f"{tag}^{{commit}}").strip()
    archive = subprocess.run(["git", "-C", str(repo), "archive", tag], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return commit


def submodule_commit(repo: Path, tag: str, path: str) -> str | None:
    out = sh("git", "-C", str(repo), "ls-tree", tag, path).split()
    return out[2] if len(out) >= 3 and out[1] == "commit" else None


def source_roots(tree: Path) -> list[Path]:
    configs = tree / "packages" / "prime-rl-configs" / "src"
    return [p for p in (configs, tree / "src") if p.is_dir()]


def build_venv(tree: Path, python: str, venv: Path, extra: list[str]) -> Path:
    py = venv / "bin" / "python"
    if not py.exists():
        sh(python, "-m", "venv", str(venv), capture=False)
    lock = locked_versions((tree / "uv.lock").read_text()) if (tree / "uv.lock").is_file() else {}
    pins = [f"{n}=={lock[n]}" if n in lock else n for n in CONFIG_DEPS]
    sh(str(py), "-m", "pip", "install", "-q", *pins, *extra, capture=False)
    return py


def inner(args: argparse.Namespace) -> None:
    """Runs inside the throwaway venv: import RLConfig from the extracted tree and dump its schema."""
    import importlib.abc
    import importlib.machinery
    import types
    import warnings

    class _StubBase:
        def __init_subclass__(cls, **kwargs):
            pass

        def __init__(self, *a, **k):
            pass

    class _Stub(types.ModuleType):
        __path__: list[str] = []

        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            sub = _Stub(f"{self.__name__}.{name}")
            setattr(self, name, sub)
            return sub

        def __call__(self, *a, **k):
            return self

        def __mro_entries__(self, bases):
            return (_StubBase,)

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            top = fullname.split(".")[0]
            if top in args.stub:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            return _Stub(spec.name)

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())
    for p in reversed(args.path):
        sys.path.insert(0, p)
    warnings.simplefilter("ignore")
    if (Path(args.path[0]) / "prime_rl" / "configs" / "rl.py").is_file():
        from prime_rl.configs.rl import RLConfig  # v0.8+
    else:
        from prime_rl.rl import RLConfig  # v0.3

    if args.check:
        import tomllib

        try:  # v0.8+: a v1 taskset id is installed from the hub to narrow its config class; not here (no network)
            import verifiers.v1 as vf
            from verifiers.v1.utils import loaders

            loaders.env_config_type = lambda *a, **k: vf.SingleAgentEnvConfig
            loaders.taskset_config_type = lambda *a, **k: vf.TasksetConfig
        except ImportError:
            pass
        for f in args.check:
            data = tomllib.loads(Path(f).read_text())
            try:
                cfg = RLConfig(**data)
            except Exception as e:  # noqa: BLE001 - report whatever prime-rl raises
                if os.environ.get("PRIME_RL_SCHEMA_TRACE"):
                    import traceback

                    traceback.print_exc()
                print(json.dumps({"file": str(f), "rejected": str(e)}))
                continue
            print(json.dumps({"file": str(f), "resolved": cfg.model_dump(mode="json")}, default=str))
        return

    from pydantic.json_schema import GenerateJsonSchema

    class Lenient(GenerateJsonSchema):
        def handle_invalid_for_json_schema(self, schema, error_info):  # e.g. callables: any value
            return {}

        def default_schema(self, schema):  # defaults that do not serialise (e.g. Path objects) are dropped
            try:
                return super().default_schema(schema)
            except Exception:  # noqa: BLE001
                return self.generate_inner(schema["schema"])

    schema = RLConfig.model_json_schema(mode="validation", schema_generator=Lenient)
    try:  # v0.8+: models whose chat format the `auto` renderer knows (orchestrator.renderer; others must pick one)
        from renderers.base import MODEL_RENDERER_MAP

        schema["x-renderer-models"] = sorted(MODEL_RENDERER_MAP)
    except ImportError:
        pass
    print(json.dumps(schema, sort_keys=True))


def concepts(real: dict, version: str) -> dict:
    """The recipe concepts of a config as prime-rl's RLConfig resolved it (what the conformance test compares with
    rlctl's own reading of the same rl.toml)."""
    t, o = real["trainer"], real["orchestrator"]
    v03 = version == "0.3.0"
    sampling = o["sampling"] if v03 else o["train"]["sampling"]
    env = o["env"][0] if v03 else o["train"]["source"][0]["legacy"]
    lora = t["model"].get("lora")
    return {
        "trainer.max_steps": t["max_steps"], "orchestrator.max_steps": o["max_steps"],
        "trainer.loss.kl_tau": t["loss"]["kl_tau"],
        "trainer.output_dir": t["output_dir"], "orchestrator.output_dir": o["output_dir"],
        "trainer.ckpt": {k: t["ckpt"][k] for k in ("interval", "keep_last", "resume_step")} if t.get("ckpt") else None,
        "trainer.wandb.offline": t["wandb"]["offline"] if t.get("wandb") else None,
        "orchestrator.wandb.offline": o["wandb"]["offline"] if o.get("wandb") else None,
        "trainer.wandb.project": t["wandb"]["project"] if t.get("wandb") else None,
        "trainer.model.ac_enabled": t["model"]["ac"] is not None,
        "trainer.scheduler": t["scheduler"], "trainer.optim.lr": t["optim"]["lr"],
        "trainer.optim.weight_decay": t["optim"]["weight_decay"],
        "trainer.model.fsdp_cpu_offload": t["model"]["fsdp_cpu_offload"],
        "trainer.model.optim_cpu_offload": t["model"].get("optim_cpu_offload"),
        "trainer.model.lora": None if lora is None else {k: lora[k] for k in ("rank", "alpha", "dropout")},
        "group_size": o.get("rollouts_per_example") or o.get("group_size"),
        "trainer.model.seq_len": t["model"]["seq_len"], "orchestrator.seq_len": o["seq_len"],
        "orchestrator.batch_size": o["batch_size"],
        "max_tokens": sampling["max_tokens" if v03 else "max_completion_tokens"],
        "inference.model.max_model_len": real["inference"]["model"]["max_model_len"],
        "env": [env["id"], env["args"]],
    }


def record(version: str, cmd: list[str], tmp: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.conformance import test_prime_rl as t  # the matrix the conformance test runs

    cases = {name: (sets, muts) for name, (sets, muts) in t.VARIANTS.items()}
    cases.update({"one-gpu": (t.ONE_GPU, {}), "one-gpu-full": (t.ONE_GPU, {"lora": None}),
                  "split-full": (t.SPLIT, {"lora": None})})
    files = {}
    for name, (sets, muts) in cases.items():
        _, plan, _ = t.render(t.TWO_GPU, version, sets, muts)
        files[name] = tmp / f"{name}.toml"
        files[name].write_text(plan.files["rl.toml"])
    out = subprocess.run([*cmd, "--check", *map(str, files.values())], capture_output=True, text=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    results = {Path(r["file"]).stem: r for r in map(json.loads, out.stdout.splitlines()) if r.get("file")}
    data = {}
    for name, f in files.items():
        r = results[name]
        if "rejected" in r:
            print(f"{name}: rejected by prime-rl {version}: {r['rejected'].splitlines()[0]}")
            continue
        data[name] = {"rl.toml": f.read_text(), "resolved by prime-rl": concepts(r["resolved"], version)}
    dest = ROOT / "tests" / "conformance" / f"prime_rl_resolved_{version}.json"
    dest.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {dest.relative_to(ROOT)} ({len(data)} renders)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, help="a git clone of PrimeIntellect-ai/prime-rl (with tags)")
    ap.add_argument("--tag", help="release tag, e.g. v0.3.0 or v0.8.0")
    ap.add_argument("--verifiers-repo", type=Path, help="a git clone of PrimeIntellect-ai/verifiers (v0.8+)")
    ap.add_argument("--python", default="python3.12", help="interpreter for the venv (prime-rl wants 3.12)")
    ap.add_argument("--venv", type=Path, help="reuse this venv (default: a temporary one)")
    ap.add_argument("--check", type=Path, nargs="+", help="build the real RLConfig from rendered rl.toml files instead "
                    "(all its validators): one JSON line per file, `resolved` (the whole config) or `rejected`")
    ap.add_argument("--record", action="store_true", help="render tests/conformance/test_prime_rl.py's matrix for the "
                    "tag, build each with the real RLConfig and write tests/conformance/prime_rl_resolved_<v>.json")
    ap.add_argument("--needs", action="store_true", help="only (re)write the schema's x-environment entry (what the "
                    "tag needs installed beyond `uv sync`: scripts/prime_rl_needs.py) from the tag's sources; no venv")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--stub", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args)
        return
    if not args.repo or not args.tag:
        ap.error("--repo and --tag are required")

    with tempfile.TemporaryDirectory(prefix="prime-rl-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        commit = extract(args.repo, args.tag, tree)
        source = f"PrimeIntellect-ai/prime-rl {args.tag} ({commit})"
        if args.needs:
            out = args.out / f"{args.tag.lstrip('v')}.json"
            schema = json.loads(out.read_text())
            schema["x-environment"] = needs_facts(tree, source)
            out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            print(f"wrote x-environment into {out}")
            return
        roots = [str(p) for p in source_roots(tree)]
        extra: list[str] = []
        stubs = list(HEAVY)
        configs_pyproject = tree / "packages" / "prime-rl-configs" / "pyproject.toml"
        versions: dict[str, str] = {}
        if configs_pyproject.is_file():  # v0.8+: verifiers (submodule) + renderers / prime-pydantic-config (PyPI)
            text = configs_pyproject.read_text()
            for name in ("prime-pydantic-config", "renderers"):
                m = re.search(rf'"{name}(\[[^\]]*\])?([<>=!~][^"]*)"', text)
                extra.append(f"{name}{m.group(2) if m else ''}")
            extra += list(VERIFIERS_DEPS)
            keep = ("openai", "numpy", "datasets", "rich", "setproctitle", "uvloop", "loguru", "verifiers", "tenacity",
                    "aiolimiter", "math_verify", "prime")
            stubs = [s for s in stubs if s not in keep]
            vcommit = submodule_commit(args.repo, args.tag, "deps/verifiers")
            if not args.verifiers_repo or not vcommit:
                sys.exit("v0.8+ needs --verifiers-repo (a clone of PrimeIntellect-ai/verifiers)")
            vtree = Path(tmp) / "verifiers"
            vtree.mkdir()
            extract(args.verifiers_repo, vcommit, vtree)
            roots.append(str(vtree))
            versions["verifiers"] = vcommit
        venv = args.venv or Path(tmp) / "venv"
        py = build_venv(tree, args.python, venv, extra)
        cmd = [str(py), __file__, "--inner", *[f"--path={p}" for p in roots], *[f"--stub={s}" for s in stubs]]
        if args.record:
            record(args.tag.lstrip("v"), cmd, Path(tmp))
            return
        if args.check:
            cmd += ["--check", *[str(p.resolve()) for p in args.check]]
            sys.exit(subprocess.run(cmd, env={**os.environ, "PYTHONWARNINGS": "ignore"}).returncode)
        schema = json.loads(sh(*cmd))
        freeze = sh(str(py), "-m", "pip", "freeze")
        for line in freeze.splitlines():
            name, _, v = line.partition("==")
            if name.lower() in ("pydantic", "pydantic-settings", "prime-pydantic-config", "renderers"):
                versions[name.lower()] = v
        version = args.tag.lstrip("v")
        if (tree / "src" / "prime_rl" / "configs").exists() or configs_pyproject.is_file():  # v0.8+ layout
            schema["x-environment"] = needs_facts(tree, source)
        schema["x-rlctl"] = {
            "source": source,
            "generator": "scripts/prime_rl_schema.py",
            "packages": versions,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        out = args.out / f"{version}.json"
        out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
