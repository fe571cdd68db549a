"""flash_attn.bert_padding in pure torch: the padding helpers OpenRLHF 0.10.4 calls (models/ring_attn_utils.py:
unpad_input, index_first_axis, pad_input, rearrange), with flash-attn 2.7+'s signatures (unpad_input returns five
values, the fifth the used lengths). Indexing and index_put are differentiable as they are: no custom backward.
einops (flash-attn's own dependency, on the GPU image) is imported only when its rearrange/repeat are called."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["index_first_axis", "index_put_first_axis", "pad_input", "rearrange", "repeat", "unpad_input",
           "unpad_input_for_concatenated_sequences"]


def rearrange(*args, **kwargs):
    from einops import rearrange as _rearrange

    return _rearrange(*args, **kwargs)


def repeat(*args, **kwargs):
    from einops import repeat as _repeat

    return _repeat(*args, **kwargs)


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:  # noqa: A002 (flash-attn's name)
    """Rows `indices` of a (total, ...) tensor."""
    assert input.ndim >= 2
    return input[indices]


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """A (first_axis_dim, ...) tensor of zeros with `values` at rows `indices`."""
    assert indices.ndim == 1 and values.ndim >= 2
    out = torch.zeros(first_axis_dim, *values.shape[1:], device=values.device, dtype=values.dtype)
    out[indices] = values
    return out


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """(batch, seqlen, ...) -> (tokens kept, indices in the flattened input, cu_seqlens, max length, used lengths).

    attention_mask (and unused_mask: allocated but unused tokens) is 1 where a token is kept."""
    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])  # "b s ... -> (b s) ..."
    return index_first_axis(flat, indices), indices, cu_seqlens, int(seqlens.max().item()), used


def unpad_input_for_concatenated_sequences(hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor):
    """Rows holding several samples: attention_mask_in_length[b] lists their lengths (0 after the last)."""
    length = attention_mask_in_length.sum(dim=-1)
    seqlen = attention_mask_in_length.size(-1)
    mask_2d = torch.arange(seqlen, device=length.device, dtype=length.dtype).expand(len(length), seqlen) \
        < length.unsqueeze(1)
    real = torch.nonzero(attention_mask_in_length.flatten(), as_tuple=False).flatten()
    seqlens = attention_mask_in_length.flatten()[real]
    indices = torch.nonzero(mask_2d.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, int(seqlens.max().item())


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """(tokens kept, ...) -> (batch, seqlen, ...), zeros where nothing was kept."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *out.shape[1:])  # "(b s) ... -> b s ..."
