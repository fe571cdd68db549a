"""Run OpenRLHF's own code from its released wheels, without a GPU, Ray, DeepSpeed or vLLM.

- `wheel_root(version)`: the released wheel, fetched once with `pip download --no-deps` into the cache
  (~/.cache/rlctl-tests/wheels, or $RLCTL_TEST_WHEELS) and unpacked next to it.
- `OpenRLHF(version)`: a context in which the release's modules import for real from the unpacked wheel, where
  heavy dependencies (ray, deepspeed, vllm, peft, flash_attn, ...; `real_deps` names those the code under test uses
  for real, e.g. peft for a real LoRA model) and the OpenRLHF modules not under test are permissive stubs (sys.modules
  stubs, scoped: see _module_scope.py), so that:
    * `parse(argv)` runs `openrlhf/cli/train_ppo_ray.py` as `__main__`: the real argparse parser, every post-parse
      check, and `train(args)` up to the first thing that starts Ray work (vLLM engines or actor groups); it returns
      the parsed namespace and train()'s locals at that point (e.g. `max_len`, vLLM's context);
    * `module(name)` imports one real OpenRLHF module (utils/agent.py, utils/deepspeed/deepspeed.py, ...).
Nothing here re-implements OpenRLHF: what runs is its code; only what it would call outside itself is stubbed.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import runpy
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

from tests.conformance._module_scope import ModuleScope

CACHE = Path(os.environ.get("RLCTL_TEST_WHEELS", Path.home() / ".cache" / "rlctl-tests" / "wheels"))
# the wheels are cp311 manylinux only: ask for that platform so any interpreter can fetch them
PLATFORM = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
            "--platform", "manylinux1_x86_64"]
HEAVY = ("ray", "deepspeed", "vllm", "flash_attn", "peft", "torchdata", "bitsandbytes", "liger_kernel", "modelscope",
         "wandb", "tensorboard", "tensorboardX", "datasets", "optimum", "accelerate", "jsonlines", "torchmetrics")


def wheel_root(version: str) -> Path:
    """The unpacked wheel's purelib root (holding `openrlhf/`)."""
    out = CACHE / "unpacked" / f"openrlhf-{version}"
    if (out / "openrlhf" / "cli" / "train_ppo_ray.py").is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob(f"openrlhf-{version}-*.whl"))
    if not wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(CACHE), *PLATFORM,
                            f"openrlhf=={version}"], capture_output=True, text=True)
        wheels = sorted(CACHE.glob(f"openrlhf-{version}-*.whl"))
        if r.returncode != 0 or not wheels:
            raise RuntimeError(f"cannot download openrlhf=={version}: {r.stderr.strip()[-300:]}")
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(wheels[0]) as zf:
        for name in zf.namelist():
            rel = name.split(".data/purelib/", 1)[-1]
            if rel.startswith("openrlhf/") and rel.endswith(".py"):
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(name))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


# ---------------------------------------------------------------------------------------------------------------
# permissive stubs


class _Meta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return stub_class(f"{cls.__name__}.{name}")

    def __call__(cls, *a: Any, **k: Any) -> Any:
        if len(a) == 1 and not k and (isinstance(a[0], type) or callable(a[0])):
            return a[0]  # used as a decorator (@ray.remote, @torch.compile, ...): leave the thing as it is
        return super().__call__(*a, **k)


class Stub(metaclass=_Meta):
    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return stub_class(name)()

    def __call__(self, *a: Any, **k: Any) -> Any:
        if len(a) == 1 and not k and (isinstance(a[0], type) or callable(a[0])):
            return a[0]  # @ray.remote(num_gpus=1) and the like
        return stub_class("result")()

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return True


def stub_class(name: str) -> type:
    return _Meta(name.rsplit(".", 1)[-1], (Stub,), {})


class StubModule(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__path__: list[str] = []  # a package: its submodules are stubs too
        self.__file__ = f"<stub {name}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = stub_class(name)
        setattr(self, name, value)
        return value


class ReachedRay(Exception):
    """train() got to its first Ray work; `locals` are train()'s at that point."""

    def __init__(self, where: str, frame_locals: dict[str, Any]):
        super().__init__(where)
        self.where = where
        self.locals = frame_locals


def _stop_here(where: str):
    def stop(*a: Any, **k: Any) -> Any:
        raise ReachedRay(where, dict(sys._getframe(1).f_locals))

    return stop


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stubs for HEAVY packages and for every openrlhf module not in `real`; real ones load from the wheel."""

    def __init__(self, root: Path, real: set[str], heavy: tuple[str, ...] = HEAVY):
        self.root = root
        self.real = real
        self.heavy = heavy

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top == "openrlhf":
            if fullname in self.real:
                file = self.root / (fullname.replace(".", "/") + ".py")
                return importlib.util.spec_from_file_location(fullname, file)
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if top in self.heavy:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


PARSE_MODULES = {"openrlhf.utils.config", "openrlhf.utils.agent", "openrlhf.utils.logging_utils"}
SAVE_MODULES = {"openrlhf.utils.deepspeed.deepspeed", "openrlhf.trainer.ray.ppo_actor", "openrlhf.utils.logging_utils"}


def _discard(name: str, module: Any) -> bool:
    return name.split(".")[0] in ("openrlhf", *HEAVY) or isinstance(module, StubModule)


def is_stub(value: Any) -> bool:
    t = type(value)  # not isinstance(): some objects' __class__ warns when read
    return issubclass(t, (Stub, StubModule)) or (t is _Meta and value is not Stub)


class OpenRLHF:
    """`with OpenRLHF("0.9.3") as o: args, where = o.parse([...])`. Scoped (_module_scope.py): on exit no stub and
    nothing that holds one is left in sys.modules, and every module loaded before is the same object again."""

    real_first: set[str] = set()  # real modules an earlier context removed for holding a stub

    def __init__(self, version: str, real: set[str] = PARSE_MODULES, root: Path | None = None,
                 real_deps: tuple[str, ...] = ()):
        self.version = version
        self.real = real
        # heavy dependencies the code under test uses for real (peft: a real LoRA model), imported before the scope
        self.heavy = tuple(h for h in HEAVY if h not in real_deps)
        self.real_deps = real_deps
        self.root = root or wheel_root(version)  # root: another copy of the release (e.g. one rlctl patched)
        self.cli = self.root / "openrlhf" / "cli" / "train_ppo_ray.py"

    def __enter__(self) -> OpenRLHF:
        for name in sorted(OpenRLHF.real_first):  # loaded for real while no stub exists: they stay clean
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        for name in self.real_deps:
            importlib.import_module(name)
        self._scope = ModuleScope(_discard, is_stub).__enter__()
        self._saved_path = list(sys.path)
        for name in list(sys.modules):  # the scope puts these back on exit
            if name.split(".")[0] in ("openrlhf", *self.heavy):
                del sys.modules[name]
        self._finder = _Finder(self.root, self.real, self.heavy)
        sys.meta_path.insert(0, self._finder)
        import openrlhf.trainer.ray as tray
        import openrlhf.trainer.ray.launcher as launcher
        import ray

        tray.create_vllm_engines = _stop_here("create_vllm_engines")
        launcher.RayActorGroup = _stop_here("RayActorGroup")
        ray.is_initialized = lambda: True  # train() then skips ray.init()
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.meta_path.remove(self._finder)
        sys.path[:] = self._saved_path
        self._scope.__exit__(*exc)
        OpenRLHF.real_first.update(self._scope.discarded_real)

    def parse(self, argv: list[str]) -> tuple[Any, dict[str, Any], str]:
        """(parsed args after the post-parse checks, train()'s locals at its first Ray work, what it printed).
        An argparse error raises SystemExit, a failed check AssertionError, as they would in OpenRLHF."""
        old_argv = sys.argv
        sys.argv = [str(self.cli), *argv]
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                runpy.run_path(str(self.cli), run_name="__main__")
        except ReachedRay as reached:
            return reached.locals["args"], reached.locals, out.getvalue()
        except SystemExit as e:
            raise SystemExit(f"openrlhf {self.version} argparse: {out.getvalue()[-800:]}") from e
        finally:
            sys.argv = old_argv
        raise AssertionError(f"openrlhf {self.version}: train() returned without reaching Ray work")

    def module(self, name: str) -> types.ModuleType:
        return importlib.import_module(name)

    def source(self, rel: str) -> str:
        return (self.root / "openrlhf" / rel).read_text()


def dest(args: Any, flag: str) -> Any:
    """The parsed value of a flag: `--n_samples_per_prompt` -> args.n_samples_per_prompt, `--rollout.batch_size` ->
    args.rollout.batch_size (hierarchize's nesting)."""
    node = args
    for part in flag.lstrip("-").split("."):
        node = getattr(node, part)
    return node


# ---------------------------------------------------------------------------------------------------------------
# OpenRLHF's own expressions, evaluated


def _function_calls(tree: ast.AST, func_name: str) -> list[ast.Call]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == func_name:
                out.append(node)
    return out


def _enclosing_function(tree: ast.AST, target: ast.AST) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(n is target for n in ast.walk(node)):
            return node
    raise LookupError("no enclosing function")


def _ev(node: ast.AST, ns: dict[str, Any]) -> Any:
    return eval(compile(ast.Expression(node), "<openrlhf>", "eval"), ns)  # noqa: S307 - OpenRLHF's own expression


def max_steps_expr(o: OpenRLHF, args: Any, prompts: int) -> int:
    """prepare_datasets()'s `max_steps = ...` (trainer/ppo_trainer.py), evaluated with the parsed args."""
    tree = ast.parse(o.source("trainer/ppo_trainer.py"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "max_steps" for t in node.targets):
            return _ev(node.value, {"args": args, "prompts_dataset": range(prompts), "len": len})
    raise LookupError("max_steps not found in trainer/ppo_trainer.py")


def actor_scheduler_call(o: OpenRLHF, args: Any, max_steps: int) -> tuple[str, dict[str, Any]]:
    """(scheduler name, get_scheduler keyword arguments) exactly as the release builds the actor's scheduler: the
    `get_scheduler(...)` call in trainer/ray/ppo_actor.py (<= 0.10.1), or `actor_cfg = dict(...)` there and the
    `partial(get_scheduler, ...)` in utils/deepspeed/deepspeed.py (>= 0.10.2), each expression evaluated."""
    import math

    actor = ast.parse(o.source("trainer/ray/ppo_actor.py"))
    calls = _function_calls(actor, "get_scheduler")
    if calls:
        call = calls[0]
        ns = {"args": args, "max_steps": max_steps, "math": math}
        return _ev(call.args[0], ns), {k.arg: _ev(k.value, ns) for k in call.keywords}
    cfg_node = next(n for n in ast.walk(actor) if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "actor_cfg" for t in n.targets))
    # muon/adam are vars() of sub-namespaces that may be absent: only what the scheduler reads is needed
    ns = {"args": args, "max_steps": max_steps, "vars": lambda x: dict(getattr(x, "__dict__", {}) or {})}
    cfg = _ev(cfg_node.value, ns)
    ds = ast.parse(o.source("utils/deepspeed/deepspeed.py"))
    part = next(c for c in _function_calls(ds, "partial") if c.args and getattr(c.args[0], "id", "") == "get_scheduler")
    fn = _enclosing_function(ds, part)
    ns = {"cfg": cfg, "math": math}
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", None) in (
                "scheduler_steps", "scheduler_name", "scheduler_kwargs"):
            ns[stmt.targets[0].id] = _ev(stmt.value, ns)
    return _ev(part.args[1], ns), {k.arg: _ev(k.value, ns) for k in part.keywords}
