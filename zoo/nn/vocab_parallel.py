"""The fused linear + cross-entropy over an output head split by vocabulary rows across a process
group (tensor parallelism), never gathering the logits.

Each rank holds rows [first, first + R) of the weight (R about V/tp) and forms, chunk by chunk,
only its own (C, R) logits. Three all-reduces per chunk make the loss exact: the maximum of each row, then
(in one call) the sum of exponentials, the target's logit (held by one rank) and, with label
smoothing, the sum of logits. The logit gradient (softmax - target) stays local; the hidden
gradient, a sum over vocabulary shards, is all-reduced once at the end.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

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
