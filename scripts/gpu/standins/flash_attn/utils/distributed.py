"""flash_attn.utils.distributed in pure torch: all_gather along the first dimension, differentiable (its backward
is a reduce-scatter), as OpenRLHF 0.10.4's ring attention calls it (models/ring_attn_utils.py gather_and_pad_tensor,
only with --ds.ring_attn_size > 1)."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["all_gather", "all_gather_raw", "reduce_scatter", "reduce_scatter_raw"]


def all_gather_raw(input_: torch.Tensor, process_group, async_op: bool = False):
    world = dist.get_world_size(process_group)
    out = torch.empty(world * input_.shape[0], *input_.shape[1:], dtype=input_.dtype, device=input_.device)
    handle = dist.all_gather_into_tensor(out, input_.contiguous(), group=process_group, async_op=async_op)
    return out, handle


def reduce_scatter_raw(input_: torch.Tensor, process_group, async_op: bool = False):
    world = dist.get_world_size(process_group)
    assert input_.shape[0] % world == 0
    out = torch.empty(input_.shape[0] // world, *input_.shape[1:], dtype=input_.dtype, device=input_.device)
    handle = dist.reduce_scatter_tensor(out, input_.contiguous(), group=process_group, async_op=async_op)
    return out, handle


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_: torch.Tensor, process_group) -> torch.Tensor:
        ctx.process_group = process_group
        return all_gather_raw(input_, process_group)[0]

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return reduce_scatter_raw(grad_output, ctx.process_group)[0], None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_: torch.Tensor, process_group) -> torch.Tensor:
        ctx.process_group = process_group
        return reduce_scatter_raw(input_, process_group)[0]

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return all_gather_raw(grad_output, ctx.process_group)[0], None


def all_gather(input_: torch.Tensor, process_group) -> torch.Tensor:
    return _AllGather.apply(input_, process_group)


def reduce_scatter(input_: torch.Tensor, process_group) -> torch.Tensor:
    return _ReduceScatter.apply(input_, process_group)
