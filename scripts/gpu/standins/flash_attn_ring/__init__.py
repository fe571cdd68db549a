"""A stand-in for flash-attn's `flash_attn.flash_attn_interface`, carried by rlctl's GPU kit for prime-rl
(scripts/gpu/standins.py, docs/gpu.md).

prime-rl v0.8.0's trainer imports ring-flash-attn at load (trainer/rl/train.py), and ring-flash-attn 0.1.8 imports
`_flash_attn_forward`, `_flash_attn_backward` and their varlen forms from `flash_attn.flash_attn_interface` in every
module; it calls them only for context-parallel ring attention (`trainer.model.cp > 1`). flash-attn is a source
package that builds for an hour against CUDA (prime-rl's `flash-attn` extra is a GitHub-only prebuilt wheel), so this
package has those names and no kernels: each raises if called. The top-level `flash_attn` has nothing else:
prime-rl's guarded `from flash_attn import flash_attn_varlen_func` fails as without flash-attn, and the distribution is
`flash-attn-ring-standin`, not `flash-attn`, so transformers' is_flash_attn_2_available() stays False (runs use sdpa).
"""

__version__ = "0.0.0"
