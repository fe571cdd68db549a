"""A stand-in for flash-attn, carried by rlctl's GPU kit (scripts/gpu/standins.py, docs/gpu.md).

flash-attn is published as source only and builds for an hour against CUDA; OpenRLHF 0.10.4 imports
`flash_attn.bert_padding` and `flash_attn.utils.distributed` at module load (models/ring_attn_utils.py), whatever
attention the run uses. This package provides those two modules in pure torch, nothing else: the attention kernels
are absent, so a run must use `--ds.attn_implementation sdpa` (eager works too), and every guarded import of a
kernel (`flash_attn.ops.triton.cross_entropy`, `flash_attn.flash_attn_interface`) fails as without flash-attn.
Its distribution is `flash-attn-standin`, not `flash-attn`: transformers' is_flash_attn_2_available() stays False.
"""

__version__ = "0.0.0"

