"""The names ring-flash-attn 0.1.8 imports from flash-attn's interface, without kernels (see __init__.py)."""

from __future__ import annotations


def _absent(name: str):
    def call(*args, **kwargs):
        raise NotImplementedError(
            f"flash_attn.flash_attn_interface.{name}: rlctl's GPU kit carries a stand-in for flash-attn without "
            "kernels (ring attention, trainer.model.cp > 1, needs flash-attn itself)")
    call.__name__ = name
    return call


_flash_attn_forward = _absent("_flash_attn_forward")
_flash_attn_backward = _absent("_flash_attn_backward")
_flash_attn_varlen_forward = _absent("_flash_attn_varlen_forward")
_flash_attn_varlen_backward = _absent("_flash_attn_varlen_backward")
