"""Run TRL's GRPOTrainer from a config rendered by rlctl: `python3 -m rlctl.backends.trl.runner trl_config.json`.

Each logged step is printed as a dict (TRL's PrinterCallback) with the global step added, which the TRL parser
turns into the unified metrics stream. SIGTERM stops training at the next step boundary (and saves when the
recipe checkpoints), then exits 143.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any


def load_reward(path: str, name: str):
    spec = importlib.util.spec_from_file_location("rlctl_reward", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"rlctl: cannot load reward file {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if fn is None:
        raise SystemExit(f"rlctl: {path} has no function {name!r} (reward.function_name)")
    return fn


def load_prompts(path: str, input_key: str):
    from datasets import load_dataset

    suffix = Path(path).suffix.lower()
    kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(suffix)
    ds = load_dataset(kind, data_files=path, split="train") if kind else load_dataset(path, split="train")
    if input_key != "prompt":
        if "prompt" in ds.column_names:
            ds = ds.remove_columns("prompt")
        ds = ds.rename_column(input_key, "prompt")
    return ds


def report_cuda_memory(torch) -> None:
    """torch's own peak figures, next to the NVML samples rlctl takes (docs/memory.md compares them)."""
    if not torch.cuda.is_available():
        return
    stats = {"torch_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
             "torch_peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}
    print("rlctl: cuda " + json.dumps(stats), flush=True)
    with contextlib.suppress(OSError):
        Path("torch_memory.json").write_text(json.dumps(stats) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m rlctl.backends.trl.runner trl_config.json", file=sys.stderr)
        return 2
    cfg: dict[str, Any] = json.loads(Path(args[0]).read_text())

    from rlctl.core.heavy_imports import imports_frozen
    from rlctl.recipe.tiny_model import model_cache, resolve_model

    with imports_frozen():  # seconds of the collector's time saved (rlctl.core.heavy_imports)
        import torch
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model_path = resolve_model(cfg["model"], model_cache())
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    train = load_prompts(cfg["train_data"], cfg["input_key"])
    evald = load_prompts(cfg["eval_data"], cfg["input_key"]) if cfg.get("eval_data") else None
    reward = load_reward(cfg["reward_file"], cfg["reward_name"])

    grpo_kwargs = dict(cfg["grpo"])
    resume = grpo_kwargs.pop("resume_from_checkpoint", None)
    config = GRPOConfig(**grpo_kwargs)
    peft_config = None
    if cfg.get("lora"):
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", **cfg["lora"])

    stop = {"requested": False}

    class StepInLogs(TrainerCallback):
        """Puts the global step into each logged dict (TRL prints the dict right after) and honours SIGTERM."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is not None:
                logs["step"] = state.global_step

        def on_step_end(self, args, state, control, **kwargs):
            if stop["requested"]:
                control.should_training_stop = True
                control.should_save = args.save_strategy != "no"

    def on_term(signum, frame):  # noqa: ARG001
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_term)

    # Precision is rendered into the config (model_init_kwargs.dtype + bf16/fp16, see TRLBackend.precision_config);
    # a config rendered before that field existed keeps the old meaning: parameters in `dtype` on a GPU.
    if "model_init_kwargs" not in cfg["grpo"] and cfg.get("dtype") in ("bfloat16", "float16", "float32") \
            and torch.cuda.is_available():
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "dtype": cfg["dtype"]}
    trainer = GRPOTrainer(
        model=model_path, reward_funcs=reward, args=config, train_dataset=train, eval_dataset=evald,
        processing_class=tokenizer, peft_config=peft_config, callbacks=[StepInLogs()],
    )
    if peft_config is not None and cfg.get("precision") == "pure" and cfg.get("dtype") in ("bfloat16", "float16"):
        # PEFT upcasts adapters to fp32 (autocast_adapter_dtype); pure means the adapters too are in `dtype`
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.data = p.data.to(getattr(torch, cfg["dtype"]))
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        report_cuda_memory(torch)
    # the final model is kept (checkpoint.final_dir, default <checkpoint.dir>/final) whether or not the recipe
    # checkpoints; a run stopped on SIGTERM saves it only when it checkpoints (the grace period may not hold a save)
    if not stop["requested"] or config.save_strategy != "no":
        trainer.save_model(cfg.get("final_dir") or str(Path(config.output_dir) / "final"))
    if stop["requested"]:
        print("rlctl: stopped on SIGTERM", flush=True)
        return 128 + signal.SIGTERM
    return 0


if __name__ == "__main__":
    from rlctl.core.heavy_imports import exit_without_final_collection

    exit_without_final_collection(main())
