#!/usr/bin/env python3
"""What a stack does with the kit's GPU recipes before its first CUDA call, run on a CPU in the stack's own
environment by `kit.py cpucheck` (cpucheck.py, docs/gpu.md): the backend's own argument parser or config composer
on the command rlctl renders, the model loading its workers do, the reward file as the backend calls it. Each probe
prints what it saw and exits non-zero on the first thing that would fail on the GPU.

    python3 probes.py verl compose          # in the stack's environment (cpucheck sets it up)
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

KIT = Path(__file__).resolve().parent
WORK = Path(os.environ.get("RLCTL_PROBE_WORK", "/tmp/rlctl-probes"))


def say(*a: object) -> None:
    print(*a, flush=True)


# ---- the kit's GPU recipes, rendered by rlctl ------------------------------------------------------------------------
def rendered(stack: str, part: str) -> tuple[dict, Path, dict]:
    """(`rlctl render --json` of the part's GPU recipe, the recipe file, the data files) as run.py writes them for
    the GPU (render-only: the model's config and tokenizer at the real shape, no weights)."""
    sys.path.insert(0, str(KIT))
    import run

    work = WORK / stack
    ctx = run.Ctx(stack, work, cpu=False, log=[], render_only=True)
    data = run.write_data(work)
    model, _ = run.make_model(ctx, run.SHAPE)
    if stack == "prime-rl":
        recipe = run.prime_recipe(ctx, f"prime-{part}", model, data, steps=6, every=2)
        os.environ["PYTHONPATH"] = ctx.env["PYTHONPATH"]  # the environment's module, as run.py gives the runs
    elif stack == "verl":
        data = run.write_parquet(work, data)
        recipe = run.verl_recipe(ctx, f"verl-{part}", model, data, steps=6, every=2, gpus=2 if part == "2gpu" else 1)
    elif stack == "openrlhf":
        data = run.openrlhf_data(work, data)
        recipe = run.openrlhf_recipe(ctx, f"openrlhf-{part}", model, data, steps=6, every=2,
                                     colocated=part == "colocated")
    else:
        recipe = run.trl_recipe(ctx, f"trl-{part}", model, data, steps=12, every=2, evals=False)
    p = subprocess.run([sys.executable, "-m", "rlctl.cli", "render", recipe, "--json"], capture_output=True,
                       text=True, cwd=work)
    if p.returncode:
        raise SystemExit(f"rlctl render {recipe} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout), Path(recipe), data


def tiny_model(base: Path, out: Path) -> Path:
    """A randomly initialised Qwen2 of 2 small layers with the GPU recipe's tokenizer (what the workers load on a CPU
    in place of the 0.5B shape)."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(base)
    c = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id or tok.eos_token_id,
                    bos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(c).to(torch.bfloat16)
    m.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_rank_group() -> None:
    """torch.distributed as a one-process gloo group (what Ray gives each worker on the GPU, there with NCCL)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
        dist.init_process_group("gloo", rank=0, world_size=1)


# ---- verl ------------------------------------------------------------------------------------------------------------
def _verl_overrides(plan: dict, model: Path | None = None) -> list[str]:
    argv = plan["argv"]
    out = argv[argv.index("verl.trainer.main_ppo") + 1:]
    if model is not None:
        out = [f"actor_rollout_ref.model.path={model}" if o.startswith("actor_rollout_ref.model.path=") else o
               for o in out]
    return out


def verl_compose() -> None:
    """main_ppo itself (its imports, Hydra's compose of verl's packaged config with the rendered overrides), stopped
    by Hydra's `--cfg job` before the task runs; then the config's attention for every model verl loads."""
    for part in ("1gpu", "2gpu"):
        plan, recipe, _ = rendered("verl", part)
        p = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *_verl_overrides(plan), "--cfg", "job"],
                           capture_output=True, text=True, cwd=recipe.parent)
        if p.returncode:
            raise SystemExit(f"main_ppo {part}: exit {p.returncode}\n{p.stderr[-4000:]}")
        import yaml

        cfg = yaml.safe_load(p.stdout)
        model = cfg["actor_rollout_ref"]["model"]
        say(f"{part}: main_ppo composed the rendered config; actor_rollout_ref.model.override_config = "
            f"{model.get('override_config')}, use_remove_padding = {model.get('use_remove_padding')}, "
            f"n_gpus_per_node = {cfg['trainer']['n_gpus_per_node']}")
        if (model.get("override_config") or {}).get("attn_implementation") in (None, "flash_attention_2"):
            raise SystemExit(f"{part}: the actor and reference load with flash_attention_2 (verl's default): "
                             "flash-attn is not carried")


def verl_workers() -> None:
    """The actor/ref worker's own steps up to its first CUDA call, on this CPU: verl's config objects from the composed
    config (omega_conf_to_dataclass: HFModelConfig loads the tokenizer and the HF config with the attention the
    recipe asks for), the model loaded as the FSDP engine loads it (transformers' from_pretrained with that config:
    where FlashAttention-2 failed on the H100), verl's monkey patch for remove-padding, then one packed forward as the
    engine runs it (use_remove_padding: the micro batch's sequences concatenated, position ids restarting per
    sequence, no attention mask) against each sequence alone: with sdpa, transformers must keep the sequences apart."""
    import torch
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict
    from verl.utils.config import omega_conf_to_dataclass

    plan, recipe, _ = rendered("verl", "1gpu")
    key = "actor_rollout_ref.model.path="
    real = Path(next(o.split("=", 1)[1] for o in _verl_overrides(plan) if o.startswith(key)))
    model = tiny_model(real, WORK / "verl" / "models" / "tiny")
    os.chdir(recipe.parent)
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=_verl_overrides(plan, model))
    main_ppo = (Path(verl.__file__).parent / "trainer" / "main_ppo.py").read_text()
    if "migrate_legacy_reward_impl(config)" in main_ppo:
        from verl.experimental.reward_loop import migrate_legacy_reward_impl

        cfg = migrate_legacy_reward_impl(cfg)
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    say("validate_config: ok")
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    attn = model_config.hf_config._attn_implementation
    say(f"HFModelConfig: {type(model_config).__name__}, hf_config attention {attn!r}, use_remove_padding "
        f"{model_config.use_remove_padding}")
    # engine_workers.py init_model's own lines that turn the ref's log-prob keys into its batch config
    workers_py = Path(verl.__file__).parent / "workers" / "engine_workers.py"
    tree = ast.parse(workers_py.read_text())
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "init_model")
    block = next(n for n in ast.walk(init)
                 if isinstance(n, ast.With) and "open_dict(self.config.ref)" in ast.unparse(n))
    exec(compile(ast.Module(body=[block], type_ignores=[]), str(workers_py), "exec"),
         {"self": types.SimpleNamespace(config=cfg.actor_rollout_ref), "open_dict": open_dict})
    configs = {}
    for role in ("actor", "ref"):
        c = configs[role] = omega_conf_to_dataclass(cfg.actor_rollout_ref[role])
        say(f"{role} config: {type(c).__name__}, engine {type(c.engine).__name__} strategy {c.engine.strategy}")
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    from verl.utils.model import get_hf_auto_model_class

    auto = get_hf_auto_model_class(hf_config=model_config.hf_config)
    module = auto.from_pretrained(pretrained_model_name_or_path=model_config.local_path, torch_dtype=torch.float32,
                                  config=model_config.hf_config, trust_remote_code=model_config.trust_remote_code)
    say(f"from_pretrained ({auto.__name__}): attention {module.config._attn_implementation!r}")
    apply_monkey_patch(model=module, use_remove_padding=model_config.use_remove_padding, ulysses_sp_size=1)
    module.eval()
    torch.manual_seed(1)
    lens = [5, 9, 3]
    seqs = [torch.randint(3, module.config.vocab_size, (n,)) for n in lens]
    with torch.no_grad():
        packed = module(input_ids=torch.cat(seqs).unsqueeze(0),
                        position_ids=torch.cat([torch.arange(n) for n in lens]).unsqueeze(0),
                        attention_mask=None, use_cache=False).logits[0]
        alone = torch.cat([module(input_ids=s.unsqueeze(0), use_cache=False).logits[0] for s in seqs])
    diff = (packed - alone).abs().max().item()
    say(f"packed forward (remove padding, {attn}) against each sequence alone: max |diff| {diff:.2e}")
    if diff > 1e-4:
        raise SystemExit(f"with {attn} the packed sequences attend to each other (max |diff| {diff:.3g}): "
                         "use_remove_padding=False is needed with this attention")
    # the actor's FSDP engine itself, as TrainingWorker builds it (engine_workers.py), on a one-rank gloo group: it
    # goes as far as a CPU lets it; where it stops is said (a CUDA-only call is the expected end)
    one_rank_group()
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine import EngineRegistry

    a = configs["actor"]
    a.model_config = model_config
    twc = TrainingWorkerConfig(model_type="language_model", model_config=model_config, engine_config=a.engine,
                               optimizer_config=a.optim, checkpoint_config=a.checkpoint)
    twc.engine_config.use_remove_padding = model_config.get("use_remove_padding", False)
    twc.engine_config.micro_batch_size_per_gpu = cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    try:
        engine = EngineRegistry.new(model_type="language_model", backend=twc.engine_config.strategy,
                                    model_config=model_config, engine_config=twc.engine_config,
                                    optimizer_config=twc.optimizer_config, checkpoint_config=twc.checkpoint_config)
        say(f"engine: {type(engine).__name__}")
        engine.initialize()
        say("engine.initialize(): done on the CPU")
    except Exception as e:  # noqa: BLE001 - where it stops is the finding
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        text = f"{type(e).__name__}: {e}"
        cuda = any(w in text.lower() for w in ("cuda", "nccl", "nvml", "gpu", "device"))
        say(f"engine stopped at {Path(where.filename).name}:{where.lineno} ({where.name}): {text[:300]}")
        if not cuda:
            raise SystemExit(f"the FSDP engine stopped before any CUDA call: {text}") from e


# ---- OpenRLHF --------------------------------------------------------------------------------------------------------
def _openrlhf_args(part: str):
    """The rendered command through train_ppo_ray's own __main__ block: its argparse and every check it makes before
    train(args) (ray.init, the placement groups, the workers come after); the args train() would get."""
    import openrlhf.cli.train_ppo_ray as m

    tree = ast.parse(Path(m.__file__).read_text())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    plan, recipe, _ = rendered("openrlhf", part)
    argv = plan["argv"]
    seen: dict = {}
    ns = dict(vars(m))
    ns["train"] = lambda args: seen.setdefault("args", args)
    sys.argv = ["train_ppo_ray", *argv[argv.index("openrlhf.cli.train_ppo_ray") + 1:]]
    exec(compile(ast.Module(body=main.body, type_ignores=[]), m.__file__, "exec"), ns)
    return seen["args"], plan


def openrlhf_parse() -> None:
    """Both parts' rendered commands as train_ppo_ray reads them."""
    for part in ("2gpu", "colocated"):
        a, _ = _openrlhf_args(part)
        say(f"{part}: train_ppo_ray parsed the rendered command: attention {a.ds.attn_implementation!r}, packing "
            f"{a.ds.packing_samples}, vLLM engines {a.vllm.num_engines} x TP {a.vllm.tensor_parallel_size} at "
            f"{a.vllm.gpu_memory_utilization}, actor GPUs {a.actor.num_gpus_per_node}, colocate_all "
            f"{a.train.colocate_all}, sleep vllm/ds {a.vllm.enable_sleep}/{a.ds.enable_sleep}, zero "
            f"{a.ds.zero_stage}, eval {a.eval.dataset is not None} every {a.eval.steps}, save every "
            f"{a.ckpt.save_steps}")
        if "flash_attention" in a.ds.attn_implementation:
            raise SystemExit(f"{part}: OpenRLHF would load with {a.ds.attn_implementation}: flash-attn is not carried")


def openrlhf_actor() -> None:
    """OpenRLHF's Actor built as its PolicyModelActor builds it (trainer/ray/ppo_actor.py: the parsed args, the
    strategy's own DeepSpeed config) on the tiny model, then its forward: the log-probs of a padded batch
    (flash-attn's Triton cross-entropy absent: OpenRLHF's own fallback)."""
    import shutil

    import torch
    from openrlhf.models import Actor
    from openrlhf.utils import get_strategy
    from transformers.utils import is_flash_attn_2_available

    args, _ = _openrlhf_args("2gpu")
    say(f"transformers sees FlashAttention-2: {is_flash_attn_2_available()} (the stand-in must not count)")
    if is_flash_attn_2_available():
        raise SystemExit("transformers takes the flash-attn stand-in for FlashAttention-2")
    model = tiny_model(Path(args.actor.model_name_or_path), WORK / "openrlhf" / "models" / "tiny")
    strategy = get_strategy(args)
    ds = strategy.get_ds_train_config(is_actor=True)
    say(f"OpenRLHF's DeepSpeed config: zero stage {ds['zero_optimization']['stage']}, bf16 "
        f"{ds.get('bf16', {}).get('enabled')}")
    with contextlib.suppress(Exception):
        one_rank_group()
    a = strategy.args
    actor = Actor(str(model), attn_implementation=a.ds.attn_implementation,
                  experts_implementation=a.ds.experts_implementation, param_dtype=a.ds.param_dtype,
                  load_in_4bit=a.ds.load_in_4bit, lora_rank=a.ds.lora.rank, lora_alpha=a.ds.lora.alpha,
                  target_modules=a.ds.lora.target_modules, lora_dropout=a.ds.lora.dropout, ds_config=ds,
                  packing_samples=a.ds.packing_samples, temperature=a.rollout.temperature,
                  use_liger_kernel=a.ds.use_liger_kernel)
    say(f"Actor: {type(actor.model).__name__}, attention {actor.model.config._attn_implementation!r}")
    seq = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [3, 4, 5, 6, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    action_mask = torch.ones(2, 3, dtype=torch.bool)
    with torch.no_grad():
        logp = actor(seq, action_mask=action_mask, attention_mask=mask)
    say(f"Actor.forward: action log-probs {tuple(logp.shape)}, finite {bool(torch.isfinite(logp).all())}")
    if not torch.isfinite(logp).all():
        raise SystemExit("Actor.forward gave non-finite log-probs")
    from deepspeed.ops.op_builder import FusedAdamBuilder

    b = FusedAdamBuilder()
    say(f"DeepSpeed FusedAdam: not prebuilt, JIT-compiled on the GPU ({b.absolute_name()}, {len(b.sources())} "
        f"source files; ninja {'found' if shutil.which('ninja') else 'NOT found'} here)")


def openrlhf_ray_job() -> None:
    """rlctl's Ray executor as it runs OpenRLHF on one machine: a head on loopback with its dashboard (the job API
    lives there; the kit slims Ray's Java jars but keeps the dashboard's UI build, without which its HTTP server does
    not start), a job submitted through the job API whose entrypoint imports train_ppo_ray in the environment the
    head was started with (the kit's sites on PYTHONPATH), its log followed into stdout.log, the head stopped."""
    import time

    from rlctl.executors.ray import RayExecutor

    run = WORK / "openrlhf" / "ray-job-run"
    if run.exists():
        import shutil

        shutil.rmtree(run)
    run.mkdir(parents=True)
    code = "import openrlhf.cli.train_ppo_ray, flash_attn.bert_padding, deepspeed; print('rlctl job: imports ok')"
    spec = {"address": None, "num_gpus": 0, "env_keys": [], "secret_env": {}, "argv": [sys.executable, "-c", code]}
    ex = RayExecutor()
    t = time.time()
    ex.open(run, spec)
    try:
        say(f"Ray head up at {ex.address} in {time.time() - t:.0f} s")
        handle = ex.start(run, spec, dict(os.environ), 1)
        deadline = time.time() + 600
        code_ = None
        while code_ is None and time.time() < deadline:
            code_ = ex.poll(run, handle)
            time.sleep(1)
    finally:
        ex.close()
    log = (run / "stdout.log").read_text(errors="replace") if (run / "stdout.log").exists() else ""
    say(f"job {handle.ref['job_id']}: exit {code_}; its log: {log.strip().splitlines()[-1:] if log else '(none)'}")
    if code_ != 0 or "rlctl job: imports ok" not in log:
        raise SystemExit(f"the Ray job did not run as OpenRLHF's would (exit {code_}):\n{log[-3000:]}")


def openrlhf_reward() -> None:
    """The recipe's reward file loaded and called as OpenRLHF 0.10.4 does (utils/agent.py: spec_from_file_location,
    reward_func([query], [prompt], [label]) per sample), its result read as samples_generator.py reads it. OpenRLHF
    logs and swallows an exception there (the sample gets no reward): it must not raise."""
    import importlib.util

    import torch

    _, _, data = rendered("openrlhf", "2gpu")
    spec = importlib.util.spec_from_file_location("reward_func", data["reward"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    info = mod.reward_func(["sky: a banana"], ["sky:"], ["a"])
    reward, score = info.get("rewards"), info.get("scores")
    r = torch.tensor([reward])
    say(f"reward_func: rewards {reward!r} scores {score!r} -> info['reward'] {r!r}")
    if r.numel() != 1 or not 0 <= float(r.flatten()[0]) <= 1:
        raise SystemExit(f"reward_func returned {info!r}: one reward per sample in [0, 1] expected")


def openrlhf_standin() -> None:
    """The flash-attn stand-in against transformers' own pure-torch copies of flash-attn's padding helpers
    (modeling_flash_attention_utils), and the kernels flash-attn would have absent as without it."""
    import torch
    import transformers.modeling_flash_attention_utils as hf
    from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input

    torch.manual_seed(0)
    x = torch.randn(3, 6, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]])
    ours = unpad_input(x, mask)
    theirs = hf._unpad_input(x, mask)
    assert all(torch.equal(a, b) if torch.is_tensor(a) else a == b for a, b in zip(ours, theirs, strict=True))
    assert torch.equal(pad_input(ours[0], ours[1], 3, 6), hf._pad_input(theirs[0], theirs[1], 3, 6))
    assert torch.equal(index_first_axis(x.reshape(18, 4), ours[1]), hf._index_first_axis(x, theirs[1]))
    pad_input(ours[0], ours[1], 3, 6).sum().backward()
    assert torch.equal(x.grad, mask.unsqueeze(-1).expand_as(x).float())
    for mod in ("flash_attn.ops.triton.cross_entropy", "flash_attn.flash_attn_interface"):
        try:
            __import__(mod)
        except ImportError:
            continue
        raise SystemExit(f"{mod} imports: the stand-in must not pretend to have flash-attn's kernels")
    say("flash_attn.bert_padding stand-in = transformers' copies (unpad, pad, index, gradient); no kernels")


def trl_runner() -> None:
    """rlctl's TRL runner and what it takes from TRL at import."""
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401

    import rlctl.backends.trl.runner  # noqa: F401

    say("rlctl.backends.trl.runner and trl.GRPOTrainer import")


# ---- prime-rl ----------------------------------------------------------------------------------------------------
def prime_preflight() -> None:
    """`rlctl preflight` of the 2-GPU recipe in the stack's environment: no check fails but the GPU ones this CPU
    cannot pass (the checkout at v0.8.0 and `uv` found, the environment loaded for the prompt lengths)."""
    plan, recipe, _ = rendered("prime-rl", "2gpu")
    p = subprocess.run([sys.executable, "-m", "rlctl.cli", "preflight", str(recipe), "--json"], capture_output=True,
                       text=True, cwd=recipe.parent)
    results = json.loads(p.stdout)["results"]
    for r in results:
        if r["verdict"] != "ok":
            say(f"{r['verdict']:5} {r['check']:24} {r['figure'][:200]}")
    failed = [r for r in results if r["verdict"] == "fail" and not r["check"].startswith(("env.gpus", "memory."))]
    if failed:
        raise SystemExit(f"preflight fails: {[r['check'] for r in failed]}")
    say(f"rendered argv: {' '.join(plan['argv'])}")


def prime_dry_run() -> None:
    """The rendered rl.toml through the real launcher, as rlctl's launch.sh runs it (`uv run --project
    $PRIME_RL_DIR rl @ rl.toml`, in the run directory) with `--dry-run`: uv finds the checkout's project
    environment, v0.8.0's RLConfig takes the file with all its validators and writes the subconfigs the trainer,
    orchestrator, inference server and env server are started with."""
    plan, recipe, _ = rendered("prime-rl", "2gpu")
    rundir = WORK / "prime-rl" / "dry-run"
    rundir.mkdir(parents=True, exist_ok=True)
    for name, text in plan["files"].items():
        (rundir / name).write_text(text)
    argv = [os.path.expandvars(a.replace("${PRIME_RL_DIR}", os.environ["PRIME_RL_DIR"])) for a in plan["argv"]]
    p = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, cwd=rundir, timeout=600)
    say((p.stdout + p.stderr).strip()[-1500:])
    if p.returncode:
        raise SystemExit(f"{' '.join(argv)} --dry-run: exit {p.returncode}")
    configs = rundir / "checkpoints" / "configs"
    import tomllib

    trainer = tomllib.loads((configs / "trainer.toml").read_text())
    orch = tomllib.loads((configs / "orchestrator.toml").read_text())
    env_files = sorted(str(f.relative_to(configs)) for f in (configs / "envs").rglob("*.toml"))
    say(f"subconfigs: {sorted(f.name for f in configs.glob('*.toml'))} + {env_files}")
    say(f"trainer.model: attn={trainer['model']['attn']} impl={trainer['model'].get('impl')} "
        f"seq_len={trainer['model']['seq_len']}; orchestrator: batch_size={orch.get('batch_size')}, "
        f"client={orch['model']['client'].get('base_url')}, renderer={orch['renderer'].get('name')}")
    if not env_files:
        raise SystemExit("no env server config written")


def prime_env() -> None:
    """The recipe's verifiers environment loaded as the env server loads a classic (v0) one
    (verifiers.utils.env_utils.load_environment: by its id, from PYTHONPATH), and its rubric scoring completions."""
    rendered("prime-rl", "2gpu")  # writes the environment's module and puts its folder on PYTHONPATH
    sys.path[:0] = [p for p in os.environ["PYTHONPATH"].split(":") if p not in sys.path]
    from verifiers.utils.env_utils import load_environment

    env = load_environment("a-fraction")
    ds = env.get_dataset()
    say(f"{type(env).__name__}: {len(ds)} prompts, first {ds[0]['prompt']}")
    import a_fraction

    got = [a_fraction.a_fraction(c) for c in ("aaaa", [{"role": "assistant", "content": "abab"}], "")]
    if got != [1.0, 0.5, 0.0]:
        raise SystemExit(f"reward {got}")
    say(f"reward of 'aaaa', 'abab', '': {got}")


PROBES = {
    "trl-vllm": {"runner": trl_runner},
    "prime-rl": {"preflight": prime_preflight, "dry-run": prime_dry_run, "env": prime_env},
    "verl": {"compose": verl_compose, "workers": verl_workers},
    "openrlhf": {"standin": openrlhf_standin, "parse": openrlhf_parse, "reward": openrlhf_reward,
                 "actor": openrlhf_actor, "ray-job": openrlhf_ray_job},
}


if __name__ == "__main__":
    stack, name = sys.argv[1], sys.argv[2]
    PROBES[stack][name]()
