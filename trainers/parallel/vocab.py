"""The fused linear + cross-entropy over an output head split by vocabulary rows across a process
group (tensor parallelism), never gathering the logits; `install_vocab_parallel_loss` makes
`zoo.nn.linear_cross_entropy` take it for a DTensor weight.

Each rank holds rows [first, first + R) of the weight (R about V/tp) and forms, chunk by chunk,
only its own (C, R) logits. Three all-reduces per chunk make the loss exact: the maximum of each row, then
(in one call) the sum of exponentials, the target's logit (held by one rank) and, with label
smoothing, the sum of logits. The logit gradient (softmax - target) stays local; the hidden
gradient, a sum over vocabulary shards, is all-reduced once at the end.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from torch.distributed.tensor import DTensor, Shard

from zoo.nn.chunk_memory import rows_per_chunk
from zoo.nn.cross_entropy import check_inputs, register_split_weight_loss
from zoo.nn.loss_gradients import GradientsFromForward


def vocab_first_row(vocab: int, size: int, rank: int) -> int:
    """First row held by `rank` of a vocabulary split over `size` ranks as DTensor's Shard(0) splits
    it (torch.chunk: ceil(vocab / size) rows each, the last ranks fewer): any vocabulary size
    splits, with no padding rows."""
    return rank * -(-vocab // size)


def _chunk(h, y, keep, weight_local, bias_local, first, vocab, label_smoothing, scale, group):
    """Loss of each row (C,) and the local logit gradient (C, V/tp) of one chunk."""
    logits = (torch.addmm(bias_local, h, weight_local.t()) if bias_local is not None else h @ weight_local.t()).float()
    rows = weight_local.shape[0]
    high = logits.max(dim=-1).values
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    logits.sub_(high[:, None])
    local_target = y - first
    mine = (local_target >= 0) & (local_target < rows) & keep
    target = torch.where(mine, logits.gather(1, local_target.clamp(0, rows - 1)[:, None]).squeeze(1), 0.0)
    smoothing = logits.sum(-1) if label_smoothing else torch.zeros_like(target)
    numerators = logits.exp_()  # exp(logit - max), in place: the softmax's numerators, one pass
    parts = torch.stack([numerators.sum(-1), target, smoothing])
    dist.all_reduce(parts, group=group)
    lse = parts[0].log()
    token_loss = lse - parts[1]
    if label_smoothing:
        token_loss = (1 - label_smoothing) * token_loss + label_smoothing * (lse - parts[2] / vocab)
    grad = numerators.div_(parts[0][:, None])
    grad.scatter_add_(1, local_target.clamp(0, rows - 1)[:, None],
                      torch.where(mine, -(1 - label_smoothing), 0.0)[:, None].to(grad.dtype))
    if label_smoothing:
        grad.sub_(label_smoothing / vocab)
    grad.mul_((keep.float() * scale)[:, None])
    return token_loss.masked_fill_(~keep, 0.0), grad


class VocabParallelLinearCrossEntropy(GradientsFromForward):
    """forward(hidden (N, H), weight_local (R, H), bias_local (R,) or None, labels (N,), first, vocab,
    ignore_index, label_smoothing, reduction, chunk_size, group) -> scalar float32 loss, the same on
    every rank of `group`: this rank holds rows [first, first + R) of the `vocab`; hidden and labels
    are whole and the same on every rank."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, first, vocab, ignore_index, label_smoothing, reduction, chunk_size,
                group):
        rows = weight.shape[0]
        valid = labels != ignore_index
        count = valid.sum()
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_bias = bias is not None and ctx.needs_input_grad[2]
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        grad_bias = torch.zeros(rows, dtype=torch.float32, device=weight.device) if want_bias else None
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        scale = 1.0 / count.clamp(min=1).float() if reduction == "mean" else torch.ones((), device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start : start + chunk_size]
            token_loss, grad = _chunk(h, labels[start : start + chunk_size], valid[start : start + chunk_size],
                                      weight, bias, first, vocab, label_smoothing, scale, group)
            loss += token_loss.sum()
            if want_bias:
                grad_bias += grad.sum(0)
            if want_hidden:
                grad_hidden[start : start + chunk_size] = grad @ weight.float()
            if want_weight:
                grad_weight.addmm_(grad.t(), h.float())
        if want_hidden:
            dist.all_reduce(grad_hidden, group=group)
            grad_hidden = grad_hidden.to(hidden.dtype)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        ctx.other_inputs = 8
        return loss * scale


def vocab_parallel_linear_cross_entropy(hidden: torch.Tensor, weight: DTensor, labels: torch.Tensor,
                                        bias: DTensor | None = None, *, ignore_index: int, label_smoothing: float,
                                        reduction: str, chunk_size: int | None) -> torch.Tensor:
    """`zoo.nn.linear_cross_entropy` of a weight (and bias) split by vocabulary rows: DTensors
    sharded along dim 0 of a 1-D mesh; hidden (N, H) and labels (N,) whole on every rank."""
    for name, tensor in (("weight", weight), ("bias", bias)):
        if tensor is not None and (not isinstance(tensor, DTensor) or tensor.device_mesh.ndim != 1
                                   or tuple(tensor.placements) != (Shard(0),)):
            raise TypeError(f"a vocabulary-parallel {name} must be a DTensor sharded along dim 0 of a 1-D mesh; "
                            f"got {type(tensor).__name__} {getattr(tensor, 'placements', '')}")
    weight_local, bias_local = weight.to_local(), None if bias is None else bias.to_local()
    check_inputs(hidden, weight_local, labels, bias_local, reduction, label_smoothing)
    if chunk_size is None:
        chunk_size = rows_per_chunk(4 * weight_local.shape[0])  # float32 logits of one token
    mesh, vocab = weight.device_mesh, weight.shape[0]
    first = vocab_first_row(vocab, mesh.size(), mesh.get_local_rank())
    return VocabParallelLinearCrossEntropy.apply(hidden, weight_local, bias_local, labels, first, vocab, ignore_index,
                                                 label_smoothing, reduction, chunk_size, mesh.get_group())


def install_vocab_parallel_loss() -> None:
    """Route `zoo.nn.linear_cross_entropy` of a DTensor weight to `vocab_parallel_linear_cross_entropy`
    (idempotent); tensor parallelism installs it before a model with a vocabulary-parallel head runs."""
    register_split_weight_loss(DTensor, vocab_parallel_linear_cross_entropy)
