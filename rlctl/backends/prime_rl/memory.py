"""What prime-rl's trainer does with GPU memory, read from the rendered rl.toml as prime-rl constructs it (the file
plus the tag's schema defaults, schemas/<version>.json) and its own validators:

- activation checkpointing (`trainer.model.ac`, every `freq`-th layer: `layer_id % freq == 0`, trainer/model.py
  apply_ac); v0.8.0 turns it on by default, and both tags turn it back on while `ac_offloading` is set
  (ModelConfig.ac_offloading_requires_ac);
- activation offloading (`ac_offloading.max_inflight_activations` saved tensors stay on the GPU;
  utils/act_offloading.py);
- optimizer states: `optim_cpu_offload` (v0.8.0, default true: on the GPU for the step only, trainer/optim.py
  CPUOffloadOptimizer) and `fsdp_cpu_offload` (parameters, gradients and states on the CPU);
- the fused LM head (trainer/models/layers/lm_head.py): v0.3.0 chunks the vocabulary (`fused_lm_head_chunk_size`,
  set to 2048 for RL when unset: rl/config.py auto_setup_fused_lm_head_chunk_size) over all tokens; v0.8.0 chunks
  tokens (`fused_lm_head_token_chunk_size`, default 1024) and the vocabulary by min(vocab, 8192). Logits are never
  materialised for the whole sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlctl.backends.base import MemoryFeatures

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

VOCAB_CHUNK_V08 = 8192  # lm_head.py: vocab_chunk_size = min(vocab, 8192); every supported vocabulary is larger


def features(recipe: Recipe, model: dict[str, Any], style: str, micro_tokens: int) -> MemoryFeatures:
    """`model`: the resolved trainer.model table."""
    notes: list[str] = []
    ac = model.get("ac")
    offload = model.get("ac_offloading")
    if offload is not None and ac is None:
        ac = {"freq": 1}  # ac_offloading_requires_ac
    every = int(ac.get("freq", 1)) if isinstance(ac, dict) else None
    inflight = int(offload.get("max_inflight_activations", 5)) if isinstance(offload, dict) else None
    if model.get("fsdp_cpu_offload"):
        optimizer = "cpu"
        notes.append("fsdp_cpu_offload: parameters, gradients and optimizer states live on the CPU (the plan still "
                     "counts parameters and gradients on the GPU: an upper bound)")
    elif style == "v0.8" and model.get("optim_cpu_offload", True):
        optimizer = "step"
    else:
        optimizer = "gpu"
    if style == "v0.3":
        chunk = model.get("fused_lm_head_chunk_size")
        if chunk is None and model.get("impl") != "liger_kernel":
            chunk = 2048
        elems = micro_tokens * int(chunk) if chunk is not None else None
    else:
        chunk = model.get("fused_lm_head_token_chunk_size", 1024)
        elems = int(chunk) * VOCAB_CHUNK_V08 if isinstance(chunk, int) else None
    return MemoryFeatures(checkpoint_every=every, activation_offload=inflight, optimizer=optimizer,
                          logits_chunk=elems, notes=notes)
