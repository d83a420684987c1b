"""The autograd-aware collectives at the edges of tensor-parallel regions (Megatron's f, g and their
sequence-parallel twins), over one process group, along one activation dimension, and the
all-to-all of expert parallelism.

Each pairs a forward collective with the backward one that makes the gradient exact:

    copy_to_group        identity          | all-reduce      region entry, whole activations
    sum_over_group       all-reduce        | identity        region exit, whole activations
    GatheredInput        all-gather        | reduce-scatter  region entry, sequence shards (its
                                                             storage freed between the passes)
    gather_parts         all-gather        | reduce-scatter  axial parallelism's whole tensors
    scatter_sum          reduce-scatter    | all-gather      region exit, sequence shards
    split_to_shards      keep own shard    | all-gather      entering the sequence-sharded stretch
    gather_whole         all-gather        | keep own shard  leaving it (the consumer's gradient is
                                                             the same on every rank)
    all_to_all           all-to-all        | all-to-all      expert parallelism's tokens, there
                                                             and back (uneven splits)

and `scaled_gradient`, x itself whose gradient is scaled (a value every rank computes whole, whose
gradients the group sums).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zoo.torch_compat import unsafe_preserve_version_counter


def _gathered_view(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The parts along `dim` gathered, as a (not contiguous unless dim is 0) view of the buffer the
    collective filled."""
    size = dist.get_world_size(group)
    moved = x.movedim(dim, 0).contiguous()
    out = moved.new_empty((size * moved.shape[0], *moved.shape[1:]))
    dist.all_gather_into_tensor(out, moved, group=group)
    return out.movedim(0, dim)


def _all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    return _gathered_view(x, dim, group).contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    size = dist.get_world_size(group)
    moved = x.movedim(dim, 0).contiguous()
    out = moved.new_empty((moved.shape[0] // size, *moved.shape[1:]))
    dist.reduce_scatter_tensor(out, moved, group=group)
    return out.movedim(0, dim)


def _all_reduce(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


def _own_shard(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    return x.chunk(dist.get_world_size(group), dim)[dist.get_rank(group)].contiguous()


def _identity(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    return x.view_as(x)


class _Paired(torch.autograd.Function):
    """forward_op(x, dim, group) forward and backward_op(grad, dim, group) backward, after the
    optional `before_backward()` (a `GatheredInput.refill`)."""

    @staticmethod
    def forward(ctx, x, dim, group, forward_op, backward_op, before_backward):
        ctx.dim, ctx.group, ctx.backward_op, ctx.before_backward = dim, group, backward_op, before_backward
        return forward_op(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        if ctx.before_backward is not None:
            ctx.before_backward()
        return ctx.backward_op(grad, ctx.dim, ctx.group), None, None, None, None, None


def _paired(x, dim, group, forward_op, backward_op, before_backward=None) -> torch.Tensor:
    return _Paired.apply(x, dim, group, forward_op, backward_op, before_backward)


def copy_to_group(x: torch.Tensor, group) -> torch.Tensor:
    """x, whole on every rank, entering a region whose ranks each use part of it."""
    return _paired(x, 0, group, _identity, _all_reduce)


def gather_parts(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's part of x along `dim` concatenated, for computation on this rank's share: the
    backward sums every rank's gradient of the whole and keeps this rank's part."""
    return _paired(x, dim, group, _all_gather, _reduce_scatter)


def sum_over_group(x: torch.Tensor, group) -> torch.Tensor:
    """The sum over the group of each rank's partial x."""
    return _paired(x, 0, group, _all_reduce, _identity)


def scatter_sum(x: torch.Tensor, dim: int, group, refill=None) -> torch.Tensor:
    """This rank's shard along `dim` of the sum over the group of each rank's partial x; `refill`
    (a `GatheredInput.refill`) runs first in backward."""
    return _paired(x, dim, group, _reduce_scatter, _all_gather, refill)


def split_to_shards(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's shard along `dim` of x, whole and the same on every rank."""
    return _paired(x, dim, group, _own_shard, _all_gather)


def gather_whole(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Shards along `dim` concatenated, leaving the sharded stretch for computation that is the
    same on every rank."""
    return _paired(x, dim, group, _all_gather, _own_shard)


class GatheredInput:
    """A region's all-gathered input whose storage is given back after the region's forward and
    gathered again from this rank's shard when its backward starts (Megatron-LM's sequence
    parallelism does the same): the region's layers save the whole input (B, S, W), but between
    forward and backward each rank keeps only its shard (B, S/tp, W)."""

    def __init__(self, shard: torch.Tensor, dim: int, group) -> None:
        self.shard, self.dim, self.group = shard.detach(), dim, group
        self.full = gather_parts(shard, dim, group)
        self.nbytes = self.full.untyped_storage().nbytes()

    def release(self) -> None:
        """Free the storage (the tensor and the views the region saved keep their shapes)."""
        self.full.untyped_storage().resize_(0)

    def refill(self) -> None:
        """Gather the shards into the storage again."""
        if self.full.untyped_storage().nbytes():
            return
        gathered = _gathered_view(self.shard, self.dim, self.group)  # copied into place once, below
        self.full.untyped_storage().resize_(self.nbytes)
        with torch.no_grad(), unsafe_preserve_version_counter(self.full):
            self.full.copy_(gathered)


class _AllToAll(torch.autograd.Function):
    """Rows of x (R, ...) sent in runs of `send` rows to each rank of the group, `receive` rows
    arriving from each; backward sends the gradients back the same way reversed."""

    @staticmethod
    def forward(ctx, x, send, receive, group):
        ctx.send, ctx.receive, ctx.group = send, receive, group
        return _all_to_all(x, send, receive, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.receive, ctx.send, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, send: list[int], receive: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(receive), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)
    return out


def all_to_all(x: torch.Tensor, send: list[int], receive: list[int], group) -> torch.Tensor:
    """x's rows (dim 0) in consecutive runs of send[r] rows to rank r of `group`, receive[r] rows
    arriving from rank r, in rank order (uneven splits); the gradient goes back the same way."""
    return _AllToAll.apply(x, send, receive, group)


class _ScaledGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def scaled_gradient(x: torch.Tensor, factor: float) -> torch.Tensor:
    """x forward; its gradient times `factor` backward."""
    return _ScaledGradient.apply(x, factor)
