"""OpenRLHF's own checkpoint save and resume, on CPU, with a hook before every file a save writes.

`Saves(version, args)` (inside it OpenRLHF's modules are the release's) runs `PolicyModelActor.save_checkpoint` ->
`DeepspeedStrategy.save_ckpt` (its rotation, DeepSpeed's own `save_checkpoint` from the pinned release: the tag's
files, then `latest`; then the metric json) -> the HF export in `save_model`'s order (os.makedirs, weights,
config.json, tokenizer), and `strategy.load_ckpt` for what --load_checkpoint loads. `event(what)` is called before each
write: raising there (or SIGKILLing the process) leaves the directory exactly as a kill at that point would.

Also a stand-in trainer for the supervisor's tests: `python -m tests.conformance._openrlhf_saves [--kill-at K
--kill-step S] -- ARGS...` parses the rendered arguments with the release's parser, resumes as --load_checkpoint
does, prints the release's `Global step N: {...}` lines and saves every --save_steps; it SIGKILLs itself before the
K-th write of step S's save (after all of it when K is past its writes).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conformance._deepspeed_support import engine_class, loaded_step, pinned
from tests.conformance._openrlhf_support import SAVE_MODULES, OpenRLHF, dest


def _hf_export(event: Callable[[str], None]) -> Callable[..., None]:
    def save_model(model: Any, tokenizer: Any, output_dir: str, **kw: Any) -> None:
        # utils/deepspeed/deepspeed.py save_model (rank 0): os.makedirs, model.save_pretrained, config.json, tokenizer
        out = Path(output_dir)
        event("hf dir")
        out.mkdir(parents=True, exist_ok=True)
        event("weights")
        (out / "model.safetensors").write_bytes(b"w")
        event("config")
        (out / "config.json").write_text("{}")
        event("tokenizer")
        (out / "tokenizer_config.json").write_text("{}")  # tokenizer.save_pretrained: its config, then tokenizer.json
        (out / "tokenizer.json").write_text("{}")

    return save_model


class Saves:
    def __init__(self, version: str, args: Any, event: Callable[[str], None] = lambda what: None, hf: bool = True):
        self.version, self.args, self.event, self.hf = version, args, event, hf
        self.ctx = OpenRLHF(version, SAVE_MODULES)

    def __enter__(self) -> Saves:
        o = self.ctx.__enter__()
        ds = o.module("openrlhf.utils.deepspeed.deepspeed")
        self.actor_mod = o.module("openrlhf.trainer.ray.ppo_actor")
        strategy = ds.DeepspeedStrategy.__new__(ds.DeepspeedStrategy)
        strategy.args = self.args
        strategy.is_rank_0 = lambda: True
        strategy.print = lambda *a, **k: None
        strategy.save_model = _hf_export(self.event)
        if hasattr(strategy, "_write_ckpt_metric"):  # 0.9.9 on: after DeepSpeed's save
            real = strategy._write_ckpt_metric

            def metric(*a: Any, **k: Any) -> Any:
                self.event("metric")
                return real(*a, **k)

            strategy._write_ckpt_metric = metric
        self.strategy = strategy
        self.engine = engine_class(sys.modules["deepspeed"].DeepSpeedEngine, pinned(self.version), self.event)()
        self.me = types.SimpleNamespace(strategy=strategy, actor=types.SimpleNamespace(model=self.engine),
                                        ema_model=None, tokenizer=object(), disable_ds_ckpt=False, save_hf_ckpt=self.hf)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ctx.__exit__(*exc)

    def save(self, step: int) -> None:
        self.actor_mod.PolicyModelActor.save_checkpoint(self.me, f"global_step{step}", {"global_step": step})

    def loads(self, ckpt_path: Path) -> int | None:
        """The step --load_checkpoint resumes at (ppo_actor: strategy.load_ckpt on `_actor` when it exists)."""
        return loaded_step(_Loader(self.strategy, self.engine), ckpt_path / "_actor")


class _Loader:
    def __init__(self, strategy: Any, engine: Any):
        self.strategy, self.engine = strategy, engine

    def load_checkpoint(self, load_dir: str) -> Any:
        return self.strategy.load_ckpt(self.engine, load_dir)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--kill-at", type=int)  # before the K-th write of the save of --kill-step
    ap.add_argument("--kill-step", type=int)
    ap.add_argument("--record", required=True)
    ap.add_argument("rendered", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    rendered = a.rendered[1:] if a.rendered[:1] == ["--"] else a.rendered
    with OpenRLHF(a.version) as o:
        args, _, _ = o.parse(rendered)
    from rlctl.backends.openrlhf.releases import release

    rel = release(a.version)
    ckpt, every = Path(dest(args, rel.flag("ckpt_path"))), int(dest(args, rel.flag("save_steps")))
    load = bool(dest(args, rel.flag("load_checkpoint")))
    writes = {"n": 0, "armed": False}

    def event(what: str) -> None:
        if writes["armed"]:
            writes["n"] += 1
            if writes["n"] == a.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # the whole trainer, mid-save

    with Saves(a.version, args, event) as s:
        start = (s.loads(ckpt) or 0) if load else 0
        with open(a.record, "a") as fh:
            fh.write(json.dumps({"load": load, "loaded": start}) + "\n")
        for step in range(start + 1, a.steps + 1):
            print(f"✨ Global step {step}: {{'policy_loss': -0.01, 'reward': {step / 10}, 'kl': 0.001}}", flush=True)
            if step % every == 0:
                writes["armed"] = a.kill_at is not None and step == a.kill_step
                s.save(step)
                if writes["armed"]:
                    os.kill(os.getpid(), signal.SIGKILL)  # after the whole save, before the next step


if __name__ == "__main__":
    main(sys.argv[1:])
