#!/usr/bin/env python3
"""Regenerate rlctl/backends/snapshots/openrlhf-<version>.json from OpenRLHF's released wheels.

    python scripts/snapshot_openrlhf.py                 # every release >= 0.9.3 that `pip index versions` lists
    python scripts/snapshot_openrlhf.py 0.11.2 0.11.3   # just these

Each snapshot holds facts about one release's interface, never its code: the `train_ppo_ray` flags (name, type,
default, choices: read statically from the argparse calls) and the behaviours rlctl's adapter depends on, each found
by a source pattern. When a release changes one of those behaviours no pattern matches and this script stops with
the file and the fact it could not establish: read the new code, then teach the adapter and this script.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlctl.backends._static import argparse_flags  # noqa: E402
from rlctl.backends.base import version_key  # noqa: E402

OUT = ROOT / "rlctl" / "backends" / "snapshots"
CACHE = Path.home() / ".cache" / "rlctl-tests" / "wheels"
FIRST = "0.9.3"
# wheels are cp311 manylinux only: ask for that platform explicitly so any interpreter can fetch them
PLATFORM = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
            "--platform", "manylinux1_x86_64"]


def download(version: str, cache: Path = CACHE) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"openrlhf-{version}-*.whl"))
    if found:
        return found[0]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), *PLATFORM,
                    f"openrlhf=={version}"], check=True)
    return sorted(cache.glob(f"openrlhf-{version}-*.whl"))[0]


def released_versions() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "openrlhf"],
                         capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("Available versions:"))
    vs = [v.strip() for v in line.split(":", 1)[1].split(",")]
    return sorted((v for v in vs if version_key(v) >= version_key(FIRST)), key=version_key)


class Source:
    """The openrlhf/ files of one wheel (purelib layout), by path relative to the package."""

    def __init__(self, wheel: Path):
        self.zf = zipfile.ZipFile(wheel)
        self.names = {n.split("openrlhf/", 1)[1]: n for n in self.zf.namelist()
                      if "/openrlhf/" in f"/{n}" and n.endswith(".py")}

    def text(self, rel: str) -> str:
        return self.zf.read(self.names[rel]).decode()


def _fact(name: str, rel: str, text: str, table: list[tuple[str, object]]) -> object:
    for pattern, value in table:
        if re.search(pattern, text):
            return value
    raise SystemExit(f"cannot establish `{name}` from openrlhf/{rel}: none of its known forms matches; read the "
                     f"release's code and extend scripts/snapshot_openrlhf.py and the adapter")


def _method(text: str, name: str) -> str:
    """The source of the first method `name` of a class in `text` (up to the next method or top-level statement)."""
    m = re.search(rf"\n    def {name}\(self[^\n]*\n(.|\n)*?(?=\n    def |\n\S)", text)
    if not m:
        raise SystemExit(f"cannot find a method {name} in openrlhf/trainer/ray/ppo_actor.py")
    return m.group(0)


def facts(src: Source) -> dict:
    cli = src.text("cli/train_ppo_ray.py")
    actor = src.text("trainer/ray/ppo_actor.py")
    ds = src.text("utils/deepspeed/deepspeed.py")
    trainer = src.text("trainer/ppo_trainer.py")
    agent = src.text("utils/agent.py")
    logging_utils = src.text("utils/logging_utils.py")
    f: dict = {}
    # how the actor's LR scheduler gets its floor (transformers' get_scheduler passes these kwargs through)
    f["scheduler_kwargs"] = _fact("scheduler_kwargs", "trainer/ray/ppo_actor.py + utils/deepspeed/deepspeed.py",
                                  actor + ds, [
        (r'scheduler_specific_kwargs=\{"min_lr": args\.actor_learning_rate \* 0\.1\}', "min_lr=0.1*lr, always"),
        (r'if scheduler_name in \{"cosine_with_min_lr", "cosine_warmup_with_min_lr"\}',
         "min_lr_rate=min_lr_ratio, cosine_with_min_lr only"),
        (r'scheduler_specific_kwargs=\{"min_lr_rate": cfg\.get\("min_lr_ratio", 0\.1\)\}',
         "min_lr_rate=min_lr_ratio, always"),
    ])
    f["warmup"] = _fact("warmup", "trainer/ray/ppo_actor.py + utils/deepspeed/deepspeed.py", actor + ds, [
        (r"num_warmup_steps=math\.ceil\(max_steps \* args\.lr_warmup_ratio\)", "ceil(max_steps * lr_warmup_ratio)"),
        (r'num_warmup_steps=math\.ceil\(scheduler_steps \* cfg\.get\("lr_warmup_ratio", 0\.03\)\)',
         "ceil(max_steps * lr_warmup_ratio)"),
    ])
    f["max_steps"] = _fact("max_steps", "trainer/ppo_trainer.py", trainer, [
        (r"len\(prompts_dataset\) \* args\.n_samples_per_prompt // args\.train_batch_size \* args\.num_episodes "
         r"\* args\.max_epochs", "len(prompts) * n_samples_per_prompt // train_batch_size * num_episodes * max_epochs"),
        (r"len\(prompts_dataset\)\s*\*\s*args\.rollout\.n_samples_per_prompt\s*//\s*args\.train\.batch_size\s*\*\s*"
         r"args\.train\.num_episodes\s*\*\s*args\.train\.max_epochs",
         "len(prompts) * n_samples_per_prompt // train_batch_size * num_episodes * max_epochs"),
    ])
    f["ds_rotation"] = _fact("ds_rotation", "utils/deepspeed/deepspeed.py", ds, [
        (r'is_best = tag is not None and tag\.startswith\("best"\)', "max_num regular + best kept apart"),
        (r"if len\(subdirs\) >= max_num or total_size > MAX_SIZE:", "max_num, oldest by mtime"),
    ])
    f["hf_export"] = _fact("hf_export", "trainer/ray/ppo_actor.py", actor, [
        (r'os\.path\.join\(args\.(ckpt_path|ckpt\.path), f"\{tag\}_hf"\)', "{ckpt_path}/{tag}_hf, never pruned"),
    ])
    f["ds_dir"] = _fact("ds_dir", "trainer/ray/ppo_actor.py", actor, [
        (r'os\.path\.join\(args\.(ckpt_path|ckpt\.path), "_actor"\)', "{ckpt_path}/_actor/{tag}"),
    ])
    f["best_checkpoints"] = _fact("best_checkpoints", "trainer/ppo_trainer.py", trainer, [
        (r'tag = f"best_global_step\{global_step\}"', True),
        (r".", False),
    ])
    f["reward_file"] = _fact("reward_file", "utils/agent.py", agent, [
        (r'self\.reward_endpoints\[0\]\.endswith\("\.py"\)(.|\n)*?self\.reward_func = reward_module\.reward_func',
         "remote_rm_url ending in .py: the file's `reward_func`"),
    ])
    f["wandb_login"] = _fact("wandb_login", "utils/logging_utils.py", logging_utils, [
        (r"if not wandb\.api\.api_key:\s*wandb\.login\(key=args\.use_wandb\)", "--use_wandb"),
        (r"if not wandb\.api\.api_key:\s*wandb\.login\(key=args\.logger\.wandb\.key\)", "--logger.wandb.key"),
    ])
    f["wandb_gate"] = _fact("wandb_gate", "trainer/ppo_trainer.py", trainer, [
        (r"WandbLogger\(self\.args\) if self\.args\.use_wandb else None", "--use_wandb"),
        (r"WandbLogger\(self\.args\) if self\.args\.logger\.wandb\.key else None", "--logger.wandb.key"),
    ])
    # whether ActorPPOTrainer.broadcast_to_vllm can sync a LoRA (PEFT) actor: every release sends the actor's
    # model.named_parameters() under their own names, a PeftModel's `base_model.model.….base_layer.weight`,
    # `lora_A`, `lora_B`, which vLLM's model does not have (ValueError: no module or parameter named 'base_model')
    sync = _method(actor, "broadcast_to_vllm")
    if re.search(r"(?i)peft|lora|merge_adapter|base_layer", sync):
        raise SystemExit("openrlhf/trainer/ray/ppo_actor.py broadcast_to_vllm now mentions LoRA/PEFT: read how it "
                         "syncs a LoRA actor and teach scripts/snapshot_openrlhf.py (fact lora_vllm_sync) and the "
                         "adapter")
    f["lora_vllm_sync"] = _fact("lora_vllm_sync", "trainer/ray/ppo_actor.py", sync, [
        (r"count, num_params = 0, len\(list\(model\.named_parameters\(\)\)\)\n(.|\n)*"
         r"for name, param in model\.named_parameters\(\):", False),
        (r"params_to_sync = \[\s*\(n, p\) for n, p in model\.named_parameters\(\)(.|\n)*"
         r"for name, param in params_to_sync:", False),
    ])
    m = re.search(r'ray\.init\(\s*runtime_env=\{\s*"env_vars":\s*\{(.*?)\}\s*\}', cli, re.S)
    if not m:
        raise SystemExit("cannot find train()'s ray.init(runtime_env=...) in openrlhf/cli/train_ppo_ray.py")
    fixed = dict(re.findall(r'"([A-Z_]+)":\s*"([^"]*)"', m.group(1)))
    from_env = dict(re.findall(r'"([A-Z_]+)":\s*os\.environ\.get\("[A-Z_]+",\s*"([^"]*)"\)', m.group(1)))
    # Ray merges the driver's ray.init env_vars with the job's runtime_env and fails on a conflicting value
    f["ray_init_env_fixed"] = fixed
    f["ray_init_env_from_environ"] = from_env
    return f


def snapshot(version: str) -> dict:
    src = Source(download(version))
    return {"backend": "openrlhf", "version": version,
            "source": f"openrlhf=={version} openrlhf/cli/train_ppo_ray.py (+ facts from the files named in them)",
            "flags": argparse_flags(src.text("cli/train_ppo_ray.py")), "facts": facts(src)}


RECIPE_KEYS = {
    "ref_num_nodes": "resources.nodes", "ref_num_gpus_per_node": "trainer GPUs per node",
    "actor_num_nodes": "resources.nodes", "actor_num_gpus_per_node": "trainer GPUs per node",
    "critic_num_nodes": "resources.nodes (ppo)", "critic_num_gpus_per_node": "trainer GPUs per node (ppo)",
    "colocate_actor_ref": "(always)", "colocate_all": "resources.colocate", "vllm_num_engines": "rollout.engines",
    "vllm_tp": "rollout.tensor_parallel", "vllm_mem": "rollout.gpu_memory_utilization",
    "enforce_eager": "rollout.enforce_eager", "pretrain": "model.path", "remote_rm_url": "reward.function",
    "save_path": "checkpoint.final_dir", "ckpt_path": "checkpoint.dir", "save_hf_ckpt": "(always)",
    "max_ckpt_num": "checkpoint.keep_last", "disable_ds_ckpt": "checkpoint.save_optimizer = false",
    "save_steps": "checkpoint.every", "load_checkpoint": "checkpoint.resume", "best_metric_key":
    "`none` with keep_last + data.eval", "micro_train_batch_size": "train.micro_batch_size",
    "train_batch_size": "train.train_batch_size", "micro_rollout_batch_size": "rollout.micro_batch_size",
    "rollout_batch_size": "rollout.prompts_per_step", "n_samples_per_prompt": "rollout.group_size",
    "num_episodes": "train.episodes (or from train.steps)", "max_epochs": "train.epochs_per_rollout",
    "max_samples": "from train.steps", "prompt_max_len": "data.max_prompt_tokens",
    "generate_max_len": "rollout.max_tokens", "max_new_tokens": "rollout.max_tokens",
    "max_len": "data.max_prompt_tokens + rollout.max_tokens", "zero_stage": "train.zero_stage",
    "gradient_checkpointing": "train.gradient_checkpointing", "param_dtype": "model.dtype",
    "adam_offload": "train.offload", "actor_learning_rate": "optim.lr",
    "lr_warmup_ratio": "optim.warmup_ratio / warmup_steps", "lr_scheduler": "optim.schedule",
    "min_lr_ratio": "optim.min_lr_ratio", "max_norm": "optim.max_grad_norm", "l2": "optim.weight_decay",
    "init_kl_coef": "algorithm.kl_coef", "kl_estimator": "algorithm.kl_estimator",
    "use_kl_loss": "algorithm.use_kl_loss", "eps_clip": "algorithm.eps_clip", "entropy_loss_coef":
    "algorithm.entropy_coef", "advantage_estimator": "algorithm.name", "lora_rank": "lora.rank",
    "lora_alpha": "lora.alpha", "target_modules": "lora.target_modules", "lora_dropout": "lora.dropout",
    "prompt_data": "data.train", "input_key": "data.input_key", "label_key": "data.label_key",
    "apply_chat_template": "data.apply_chat_template", "eval_dataset": "data.eval", "eval_steps": "eval.every",
    "eval_temperature": "eval.temperature", "eval_n_samples_per_prompt": "eval.n_samples",
    "temperature": "rollout.temperature", "top_p": "rollout.top_p", "seed": "train.seed",
    "wandb_key": "logging.wandb (placeholder, never the key)", "wandb_project": "logging.wandb.project",
    "wandb_org": "logging.wandb.entity", "wandb_run_name": "logging.wandb.name", "tensorboard": "logging.tensorboard",
}


def flag_table() -> str:
    """The concept -> flag table of docs/backends/openrlhf.md, one column per group of releases with the same flags
    (from the committed snapshots; `python scripts/snapshot_openrlhf.py --doc` prints it)."""
    from rlctl.backends.openrlhf.releases import FLAGS, KNOWN_VERSIONS, release

    groups: list[tuple[tuple[str, ...], list[str]]] = []
    for v in KNOWN_VERSIONS:
        col = tuple(release(v).flag(c) or "—" for c in FLAGS)
        if groups and groups[-1][0] == col:
            groups[-1][1].append(v)
        else:
            groups.append((col, [v]))
    head = ["recipe"] + [vs[0] if len(vs) == 1 else f"{vs[0]} – {vs[-1]}" for _, vs in groups]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, concept in enumerate(FLAGS):
        cells = [f"`{col[i]}`" if col[i] != "—" else "—" for col, _ in groups]
        lines.append("| " + " | ".join([RECIPE_KEYS.get(concept, concept), *cells]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*")
    ap.add_argument("--doc", action="store_true", help="print the flag table of docs/backends/openrlhf.md")
    a = ap.parse_args()
    if a.doc:
        print(flag_table(), end="")
        return
    for v in a.versions or released_versions():
        snap = snapshot(v)
        path = OUT / f"openrlhf-{v}.json"
        path.write_text(json.dumps(snap, indent=1, sort_keys=True, default=str) + "\n")
        print(f"wrote {path.relative_to(ROOT)} ({len(snap['flags'])} flags)")


if __name__ == "__main__":
    main()
