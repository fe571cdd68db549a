"""verl's own code, run on what rlctl renders: the released wheel (pip download --no-deps, cached), Hydra compose of
its packaged ppo_trainer config, validate_config, the v1 trainer's dataloader/epoch/step loop, its LR scheduler
builder and its checkpoint rotation. Heavy or GPU-only imports (ray, tensordict, transfer_queue, vllm, ...) are
stubbed; torch, omegaconf and hydra are real.

Each verl release runs in its own subprocess (`python -m tests.conformance._verl_support ROOT < jobs.json`), so two
releases never share `sys.modules`. Nothing from the wheel is copied into the repository.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("RLCTL_TEST_CACHE", Path.home() / ".cache" / "rlctl-tests"))
# third-party modules verl imports at module level that are heavy, GPU-only or absent on CI: stubbed
STUBBED = ("ray", "tensordict", "transfer_queue", "codetiming", "torchdata", "vllm", "sglang", "flash_attn",
           "liger_kernel", "zmq", "msgspec", "wandb", "mlflow", "swanlab", "megatron", "torch_npu", "pylatexenc",
           "math_verify")


# ---------------------------------------------------------------------------------------------------------------
# the parent side (pytest)


def verl_root(version: str) -> Path:
    """The unpacked wheel of a verl release (downloaded once into ~/.cache/rlctl-tests)."""
    wheels, unpacked = CACHE / "wheels", CACHE / "unpacked" / f"verl-{version}"
    if (unpacked / "verl" / "trainer" / "main_ppo.py").is_file():
        return unpacked
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"verl-{version}-*.whl"))
    if not found:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                            f"verl=={version}"], capture_output=True, text=True)
        found = sorted(wheels.glob(f"verl-{version}-*.whl"))
        if r.returncode != 0 or not found:
            raise RuntimeError(f"cannot download verl=={version}: {r.stderr.strip()[-300:]}")
    tmp = unpacked.with_name(unpacked.name + f".tmp{os.getpid()}")
    with zipfile.ZipFile(found[0]) as zf:
        zf.extractall(tmp)
    if not unpacked.exists():
        tmp.rename(unpacked)
    return unpacked


def run_jobs(version: str, jobs: list[dict[str, Any]], timeout: float = 600) -> list[dict[str, Any]]:
    root = verl_root(version)
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "tests.conformance._verl_support", str(root)],
                       input=json.dumps(jobs), capture_output=True, text=True, cwd=repo, timeout=timeout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("@@RESULTS ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"verl {version} worker failed (rc {r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(lines[-1][len("@@RESULTS "):])


# ---------------------------------------------------------------------------------------------------------------
# the worker side (a fresh interpreter per release)


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls

    def __getitem__(cls, item):
        return cls


def _stub(name: str) -> type:
    return _StubMeta(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: self,
                                "__getattr__": lambda self, n: _stub(n), "__iter__": lambda self: iter(()),
                                "__enter__": lambda self: self, "__exit__": lambda self, *a: False})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name == "__version__":
            return "0.0.0"
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def _install(root: Path) -> None:
    sys.meta_path.insert(0, _StubFinder())
    sys.path.insert(0, str(root))
    # verl/__init__.py imports the whole runtime; a hollow package lets submodules import one by one
    for pkg in ("verl", "verl.trainer", "verl.trainer.ppo", "verl.workers", "verl.utils.checkpoint",
                "verl.workers.rollout", "verl.workers.rollout.vllm_rollout"):
        m = types.ModuleType(pkg)
        m.__path__ = [str(root / pkg.replace(".", "/"))]
        sys.modules[pkg] = m
    # vllm is stubbed, but LoRA validation (vllm_rollout/utils.py get_vllm_max_lora_rank) must take verl's own
    # fallback list of vLLM's allowed ranks rather than a stub: a plain module makes the import fail as it should
    sys.modules["vllm.config.lora"] = types.ModuleType("vllm.config.lora")
    import verl.protocol

    sys.modules["verl"].DataProto = verl.protocol.DataProto


def _functions(path: Path, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Methods of verl's classes, compiled from the release's own source into plain functions over `namespace`."""
    exec(_compiled(path, frozenset(names)), namespace)
    return {n: namespace[n] for n in names}


@functools.cache
def _compiled(path: Path, names: frozenset[str]) -> Any:
    """The code of those functions (parsed once per worker: the agreement tests call them for every case)."""
    tree = ast.parse(path.read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names and node.name not in found:
            node.decorator_list = []
            found[node.name] = node
    missing = names - set(found)
    if missing:
        raise RuntimeError(f"{path.name}: no {sorted(missing)}")
    module = ast.Module(body=list(found.values()), type_ignores=[])
    return compile(module, str(path), "exec")


def _select(cfg: Any, key: str) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    v = OmegaConf.select(cfg, key, throw_on_missing=False)
    if isinstance(v, DictConfig | ListConfig):
        return OmegaConf.to_container(v, resolve=True)
    return v


class _Recorder:
    def __init__(self):
        self.calls: list[Any] = []


def _loop(root: Path, cfg: Any, dataset_size: int) -> dict[str, Any]:
    """The v1 trainer's own _init_dataloader and fit, with the rollout/update work replaced by a counter."""
    import torch
    from omegaconf import OmegaConf, open_dict

    src = root / "verl/trainer/ppo/v1/trainer_base.py"

    class _Null:
        def __getattr__(self, name):
            return lambda *a, **k: None

    @contextlib.contextmanager
    def marked_timer(*a, **k):
        yield

    class _Bar:
        def __init__(self, *a, **k):
            pass

        def update(self, *a):
            pass

        def close(self):
            pass

    ns: dict[str, Any] = {
        "os": os, "math": __import__("math"), "torch": torch, "OmegaConf": OmegaConf, "open_dict": open_dict,
        "logger": _Null(), "pprint": lambda *a, **k: None, "tqdm": _Bar, "marked_timer": marked_timer,
        "SkipManager": _Null(), "Tracking": lambda **k: _Null(), "ValidationGenerationsLogger": lambda **k: _Null(),
        "DapoFilteredRewardTableLogger": lambda **k: _Null(), "tq": _Null(),
        "DAPO_FILTERED_REWARD_COUNTS_KEY": "__dapo__", "collate_fn": lambda batch: batch,
        "create_rl_dataset": lambda files, data_cfg, tok, proc, is_train=True, max_samples=-1: (
            list(range(dataset_size)) if is_train else [0]),
        "create_rl_sampler": lambda data_cfg, dataset: None,
        "StatefulDataLoader": torch.utils.data.DataLoader,
    }
    fns = _functions(src, {"_init_dataloader", "fit"}, ns)
    rec = {"steps": [], "saves": [], "tests": []}

    class Trainer:
        pass

    t = Trainer()
    t.config = cfg
    t.tokenizer = t.processor = None
    t.global_steps = 0
    t.trainer_mode = cfg.trainer.v1.trainer_mode  # as PPOTrainer.__init__
    t.parameter_sync_step = cfg.trainer.v1.get(t.trainer_mode, {}).get("parameter_sync_step", 1)
    for hook in ("on_validate_begin", "on_validate_end", "on_train_begin", "on_train_end", "on_step_begin",
                 "on_step_end", "_start_profiling", "_stop_profiling", "_reissue_inflight_prompts",
                 "_shutdown_dump_executor", "_compute_metrics", "_log_rollout_data"):
        setattr(t, hook, lambda *a, **k: None)
    t._consume_sync_metrics = dict

    def step(metrics, timing_raw):
        rec["steps"].append(t.global_steps)
        return _Null()

    def validate():
        rec["tests"].append(t.global_steps)
        return {"val/score": 1.0}

    t.step = step
    t._save_checkpoint = lambda: rec["saves"].append(t.global_steps)
    t._validate = validate
    fns["_init_dataloader"](t)
    fns["fit"](t, None)
    rec.update(steps_per_epoch=t.steps_per_epoch, total_training_steps=t.total_training_steps,
               optim_total_training_steps=_select(cfg, "actor_rollout_ref.actor.optim.total_training_steps"))
    return rec


def _lrs(root: Path, cfg: Any) -> list[float]:
    """The LR of each scheduler step (= iteration) from the FSDP engine's own _build_lr_scheduler."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass

    optim_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.optim)
    fns = _functions(root / "verl/workers/engine/fsdp/transformer_impl.py", {"_build_lr_scheduler"}, {})

    class Engine:
        pass

    e = Engine()
    e.optimizer_config, e.rank = optim_config, 1
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=optim_config.lr)
    sched = fns["_build_lr_scheduler"](e, opt)
    out = []
    for _ in range(int(optim_config.total_training_steps)):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def _checkpoints(root: Path, cfg: Any, saves: list[list[int]]) -> None:
    """trainer_base._save_checkpoint (the release's code) at the given global steps, one list per process lifetime
    (a restart starts a new checkpoint manager), with the actor's FSDPCheckpointManager.save_checkpoint reduced to
    its rotation calls (checkpoint_manager.py) and the files it writes (fsdp_checkpoint_manager.py)."""
    import torch
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

    src = root / "verl/trainer/ppo/v1/trainer_base.py"
    ns: dict[str, Any] = {"os": os, "torch": torch, "tq": None, "Role": types.SimpleNamespace(Critic="critic"),
                          "logger": types.SimpleNamespace(info=lambda *a: None, warning=lambda *a: None)}
    save = _functions(src, {"_save_checkpoint"}, ns)["_save_checkpoint"]

    class Manager(BaseCheckpointManager):
        def __init__(self):  # what BaseCheckpointManager.__init__ sets that rotation uses
            self.previous_saved_paths = []

        def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
            # fsdp_checkpoint_manager.py save_checkpoint: ensure_checkpoint_capacity, write, register_checkpoint
            self.ensure_checkpoint_capacity(max_ckpt_to_keep)
            os.makedirs(local_path, exist_ok=True)
            for name in ("model", "optim", "extra_state"):
                Path(local_path, f"{name}_world_size_1_rank_0.pt").write_bytes(b"x" * 64)
            Path(local_path, "huggingface").mkdir(exist_ok=True)
            Path(local_path, "huggingface", "config.json").write_text("{}")
            Path(local_path, "fsdp_config.json").write_text("{}")
            self.register_checkpoint(local_path, max_ckpt_to_keep)

    class Trainer:
        pass

    for lifetime in saves:
        t = Trainer()
        t.config, t.trainer_mode, t.use_critic = cfg, "sync", bool(cfg.critic.get("enable") or False)
        actor, critic = Manager(), Manager()
        t.actor_rollout_wg = types.SimpleNamespace(save_checkpoint=actor.save_checkpoint)
        t.critic_wg = types.SimpleNamespace(save_checkpoint=critic.save_checkpoint)
        t.train_dataloader = types.SimpleNamespace(state_dict=dict)
        t.checkpoint_callback = types.SimpleNamespace(on_save=lambda **k: None)
        for step in lifetime:
            t.global_steps = step
            save(t)


def _resume(root: Path, cfg: Any) -> dict[str, Any]:
    """trainer_base._load_checkpoint (the release's code): which global_step_N a restart loads."""
    import torch
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    ns: dict[str, Any] = {"os": os, "torch": torch, "find_latest_ckpt_path": find_latest_ckpt_path,
                          "Role": types.SimpleNamespace(Critic="critic"),
                          "logger": types.SimpleNamespace(info=lambda *a: None, warning=lambda *a: None,
                                                          exception=lambda *a: None)}
    load = _functions(root / "verl/trainer/ppo/v1/trainer_base.py", {"_load_checkpoint"}, ns)["_load_checkpoint"]
    loaded: dict[str, Any] = {}

    class Trainer:
        pass

    t = Trainer()
    t.config, t.trainer_mode, t.use_critic = cfg, "sync", False
    t.actor_rollout_wg = types.SimpleNamespace(
        load_checkpoint=lambda local_path, del_local_after_load=False: loaded.update(actor=local_path))
    t.train_dataloader = types.SimpleNamespace(load_state_dict=lambda state: loaded.update(data=True))
    load(t)
    return {"global_steps": t.global_steps, **loaded}


def _statements(path: Path, function: str, match: str) -> list[Any]:
    """The top-level statements of one of verl's functions whose source contains `match`, in order (verl's own
    lines, compiled where a whole function cannot run without a GPU)."""
    tree = ast.parse(path.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function)
    found = [st for st in fn.body if match in ast.unparse(st)]
    if not found:
        raise RuntimeError(f"{path.name} {function}: no statement with {match!r}")
    return found


class _Reached(Exception):
    """Raised where verl's code would start GPU work: everything before it (its asserts) has run."""


def _plain(node: ast.AST) -> ast.AST:
    """`x: T = v` as `x = v` (an annotation verl evaluates in a module namespace we do not build)."""
    class Strip(ast.NodeTransformer):
        def visit_AnnAssign(self, n: ast.AnnAssign) -> ast.AST:
            return ast.copy_location(ast.Assign(targets=[n.target], value=n.value or ast.Constant(None),
                                                lineno=n.lineno), n)

    return ast.fix_missing_locations(Strip().visit(node))


@functools.cache
def _block_until(path: Path, function: str, match: str) -> Any:
    """The statements of `function` that lead to the assert whose source contains `match` (its own block, from its
    start to that assert), compiled: verl's lines, run where the whole function needs a GPU."""
    tree = ast.parse(path.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    for node in ast.walk(fn):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, st in enumerate(body):
            if isinstance(st, ast.Assert) and match in ast.unparse(st):
                module = ast.Module(body=[_plain(x) for x in body[:i + 1]], type_ignores=[])
                return compile(ast.fix_missing_locations(module), str(path), "exec")
    raise RuntimeError(f"{path.name} {function}: no assert with {match!r}")


def _workers(root: Path, cfg: Any) -> dict[str, Any]:
    """What verl's workers assert when they start and at their first update, from the release's own code, on the
    composed config (one FSDP rank per GPU, the hybrid worker group of nnodes x n_gpus_per_node):
    - engine_workers.py init_model: the rollout device mesh (`self.world_size % infer_world_size`);
    - rollout/replica.py RolloutReplica.__init__ (replica 0, gpus_per_node = rollout.n_gpus_per_node);
    - the update: the trainer's mini-batch (ray_trainer.py _update_actor: ppo_mini_batch_size x rollout.n), the
      rollout split over the data-parallel ranks (tensordict_utils.chunk_tensordict, as the dispatch does), then
      engine_workers.py train_mini_batch on one rank's share (its assert, then tensordict_utils.make_iterator's)
      up to where training starts.
    Returns {"error": the first assert's message} or {}."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass

    rollout_cfg = cfg.actor_rollout_ref.rollout
    world = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    ew = root / "verl/workers/engine_workers.py"
    try:
        me = types.SimpleNamespace(config=types.SimpleNamespace(rollout=rollout_cfg), world_size=world)
        exec(_block_until(ew, "init_model", "infer_world_size"),
             {"self": me, "omega_conf_to_dataclass": omega_conf_to_dataclass})
        init = _functions(root / "verl/workers/rollout/replica.py", {"__init__"},
                          {"omega_conf_to_dataclass": omega_conf_to_dataclass})["__init__"]
        init(types.SimpleNamespace(), replica_rank=0, config=rollout_cfg, model_config=None,
             gpus_per_node=rollout_cfg.n_gpus_per_node)
    except AssertionError as e:
        return {"error": f"workers start: AssertionError: {e}"}

    class TD(tu.TensorDict):  # what the dispatch and train_mini_batch read of the rollout's TensorDict
        def __init__(self, n: int, meta: dict[str, Any]):
            self.n, self.meta = n, meta

        def __len__(self) -> int:
            return self.n

        @property
        def shape(self) -> list[int]:
            return [self.n]

        @property
        def batch_size(self) -> list[int]:
            return [self.n]

        def keys(self) -> list[str]:
            return []

        def pop(self, key: str, default: Any = None) -> Any:
            if key not in self.meta:
                return default
            wrapped = tu.NonTensorData()
            wrapped.data = self.meta.pop(key)
            return wrapped

    class Engine:
        def get_data_parallel_size(self) -> int:
            return world

        def get_data_parallel_rank(self) -> int:
            return 0

        def train_mode(self, **kw: Any) -> Any:
            raise _Reached

    actor = cfg.actor_rollout_ref.actor
    n = int(rollout_cfg.n)
    samples = int(cfg.data.train_batch_size) * n
    mini = int(actor.ppo_mini_batch_size) * n
    meta = {"mini_batch_size": mini, "epochs": int(actor.ppo_epochs), "seed": 1, "dataloader_kwargs": {}}
    try:
        try:
            tu.chunk_tensordict(TD(samples, {}), world)
        except AssertionError:
            raise
        except Exception:  # past its assert: the stand-in has no tensors to split
            pass
        step = _functions(ew, {"train_mini_batch"}, {"tu": tu, "torch": torch, "Timer": None,
                                                     "maybe_fix_3d_position_ids": lambda d: None})
        step["train_mini_batch"](types.SimpleNamespace(engine=Engine()), TD(samples // world, meta))
    except _Reached:
        return {}
    except AssertionError as e:
        return {"error": f"first update: AssertionError: {e}"}
    return {}


def _dataset(root: Path, cfg: Any, job: dict[str, Any]) -> dict[str, Any]:
    """verl's RLHFDataset (utils/dataset/rl_dataset.py) on the rendered data config and the recipe's files, with the
    job's tokenizer; then, for each row it yields, the reads of the reward manager (experimental/reward_loop/
    reward_manager/naive.py run_single: its `data_source = ...` and `ground_truth = ...` lines)."""
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tok = AutoTokenizer.from_pretrained(job["tokenizer"])
    reads = _statements(root / "verl/experimental/reward_loop/reward_manager/naive.py", "run_single",
                        "data_item.non_tensor_batch[")
    module = ast.Module(body=[st for st in reads if isinstance(st, ast.Assign)], type_ignores=[])
    code = compile(module, "naive.py", "exec")
    out: dict[str, Any] = {}
    for key in ("train_files", "val_files"):
        files = cfg.data[key]
        try:
            with contextlib.redirect_stdout(sys.stderr):
                ds = RLHFDataset(data_files=files, tokenizer=tok, config=cfg.data)
        except Exception as e:  # verl's own refusal of the files
            out[key] = {"error": f"RLHFDataset: {type(e).__name__}: {e}"[:400]}
            continue
        res: dict[str, Any] = {"rows": len(ds)}
        try:
            for i in range(len(ds)):
                row = ds[i]
                exec(code, {"data_item": types.SimpleNamespace(non_tensor_batch=row)})
        except Exception as e:
            res["error"] = f"reward manager: {type(e).__name__}: {e}"[:400]
        out[key] = res
    return out


def _job(root: Path, job: dict[str, Any], compose: Any) -> dict[str, Any]:
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    out: dict[str, Any] = {"id": job["id"]}
    try:
        cfg = compose(config_name="ppo_trainer", overrides=job["overrides"])
    except Exception as e:  # Hydra's own error: the override does not fit the config
        out["error"] = f"compose: {type(e).__name__}: {e}"
        return out
    try:
        with contextlib.redirect_stdout(sys.stderr):
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except Exception as e:
        out["error"] = f"validate_config: {type(e).__name__}: {e}"
        return out
    out["use_critic"] = bool(need_critic(cfg))
    out["use_reference_policy"] = bool(need_reference_policy(cfg))
    with open_dict(cfg):
        cfg.critic.enable = out["use_critic"]
    main_ppo = (root / "verl/trainer/main_ppo.py").read_text()
    if "migrate_legacy_reward_impl(config)" in main_ppo:  # what this release's main() does before running
        from verl.experimental.reward_loop import migrate_legacy_reward_impl

        cfg = migrate_legacy_reward_impl(cfg)
    out["values"] = {k: _select(cfg, k) for k in job.get("select", [])}
    if job.get("reward_probe") is not None:
        from verl.trainer.ppo.reward import get_custom_reward_fn

        fn = get_custom_reward_fn(cfg)
        out["reward"] = None if fn is None else fn(**job["reward_probe"])
    if job.get("dataset_size"):
        out["loop"] = _loop(root, cfg, job["dataset_size"])
        out["lrs"] = _lrs(root, cfg)
    if job.get("checkpoints"):
        _checkpoints(root, cfg, job["checkpoints"])
    if job.get("prune_keep_last"):  # rlctl's own pruning, between verl's saves and verl's resume
        from rlctl.runs.checkpoints import prune

        ckpt_root = Path(cfg.trainer.default_local_dir).resolve()
        out["pruned"] = [c.step for c in prune("verl", ckpt_root.parent, job["prune_keep_last"], root=ckpt_root)]
    if job.get("resume"):
        out["resume"] = _resume(root, cfg)
    if job.get("tokenizer"):
        out["dataset"] = _dataset(root, cfg, job)
    if job.get("workers"):
        out["workers"] = _workers(root, cfg)
    return out


def worker(root: Path) -> None:
    jobs = json.load(sys.stdin)
    _install(root)
    from hydra import compose, initialize_config_dir

    results = []
    with initialize_config_dir(config_dir=str(root / "verl/trainer/config"), version_base=None):
        for job in jobs:
            if job.get("cwd"):
                os.chdir(job["cwd"])
            results.append(_job(root, job, compose))
    print("@@RESULTS " + json.dumps(results, default=str))


def stream_worker(root: Path) -> None:
    """One job per stdin line, one `@@RESULT {...}` line back per job (agreement tests: many small cases, one
    interpreter per release)."""
    _install(root)
    from hydra import compose, initialize_config_dir

    cwd = os.getcwd()
    with initialize_config_dir(config_dir=str(root / "verl/trainer/config"), version_base=None):
        for line in sys.stdin:
            job = json.loads(line)
            os.chdir(job.get("cwd") or cwd)
            try:
                result = _job(root, job, compose)
            except Exception as e:  # a crash of the harness itself is reported, not taken for verl's verdict
                result = {"id": job.get("id"), "harness_error": f"{type(e).__name__}: {e}"}
            print("@@RESULT " + json.dumps(result, default=str), flush=True)


class StreamWorker:
    """The parent side of stream_worker: `StreamWorker(version).run(job) -> result`."""

    def __init__(self, version: str):
        root = verl_root(version)
        repo = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.conformance._verl_support", str(root), "--stream"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, cwd=repo)

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("@@RESULT "):
                return json.loads(line[len("@@RESULT "):])
        raise RuntimeError(f"verl worker died (rc {self.proc.wait()})")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


if __name__ == "__main__":
    if "--stream" in sys.argv[2:]:
        stream_worker(Path(sys.argv[1]))
    else:
        worker(Path(sys.argv[1]))
