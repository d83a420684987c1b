"""Fused linear + cross-entropy: the loss of `hidden @ weight.T (+ bias)` against labels, and its
gradients, without ever holding the (tokens x vocab) logits.

Tokens are processed in chunks: each chunk's logits are formed, reduced to a float32
log-sum-exp, turned into their gradient (softmax - target distribution) and immediately
contracted with `weight` and `hidden` into the gradients of both, all inside the forward pass.
Backward only scales the stored gradients by the incoming scalar. Peak memory is one chunk of
logits plus the gradient buffers of `hidden` (N, H) and `weight` (V, H) that autograd would
allocate anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from zoo.nn.chunk_memory import rows_per_chunk
from zoo.nn.backend import Backend, resolve_backend
from zoo.nn.loss_gradients import GradientsFromForward

Reduction = Literal["mean", "sum"]

IGNORE_INDEX = -100
"""Label of a position without a target (Hugging Face's and torch's convention)."""

SplitWeightLoss = Callable[..., torch.Tensor]
"""A fused loss for a weight split over ranks: called as `linear_cross_entropy` is, with its keyword
arguments (`ignore_index`, `label_smoothing`, `reduction`, `chunk_size`)."""
_split_weight_losses: dict[type, SplitWeightLoss] = {}


def register_split_weight_loss(weight_type: type, loss: SplitWeightLoss) -> None:
    """Route `linear_cross_entropy` calls whose weight is a `weight_type` (a tensor subclass whose
    rows are split over ranks) to `loss`. The training core installs its vocabulary-parallel loss
    this way (`trainers.parallel.vocab`), so that zoo.nn holds no distributed code."""
    _split_weight_losses[weight_type] = loss


def check_inputs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: torch.Tensor | None,
           reduction: str, label_smoothing: float) -> None:
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be (N, H) and weight (V, H) with the same H; got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels must have shape (N,) = ({hidden.shape[0]},); got {tuple(labels.shape)}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"labels must be int64 or int32; got {labels.dtype}")
    if not hidden.is_floating_point() or hidden.dtype != weight.dtype:
        raise TypeError(f"hidden and weight must share one floating dtype; got {hidden.dtype} and {weight.dtype}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must have shape (V,) = ({weight.shape[0]},); got {tuple(bias.shape)}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum'; got {reduction!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1); got {label_smoothing}")


def _chunk_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor, label_smoothing: float,
                         scale: torch.Tensor) -> torch.Tensor:
    """PyTorch path: each row's loss (C,) (zero where not kept); overwrites the float32 logits
    (C, V) with d loss / d logits = (softmax - (1 - eps) onehot - eps / V) * scale, zero on
    ignored rows."""
    vocab = logits.shape[1]
    lse = torch.logsumexp(logits, dim=-1)
    target = labels.clamp(0, vocab - 1).long()
    token_loss = lse - logits.gather(1, target[:, None]).squeeze(1)
    if label_smoothing:
        token_loss = (1 - label_smoothing) * token_loss + label_smoothing * (lse - logits.mean(dim=-1))
    grad = logits.sub_(lse[:, None]).exp_()
    grad.scatter_add_(1, target[:, None], torch.full_like(lse[:, None], -(1 - label_smoothing)))
    if label_smoothing:
        grad.sub_(label_smoothing / vocab)
    grad.mul_((keep.float() * scale)[:, None])
    return token_loss.masked_fill_(~keep, 0.0)


class _LinearCrossEntropy(GradientsFromForward):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index, label_smoothing, reduction, chunk_size, backend):
        tokens, vocab = hidden.shape[0], weight.shape[0]
        valid = labels != ignore_index
        count = valid.sum()
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_bias = bias is not None and ctx.needs_input_grad[2]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        grad_bias = torch.zeros(vocab, dtype=torch.float32, device=weight.device) if want_bias else None
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        # mean: every token's gradient carries 1 / (number of labelled tokens).
        scale = 1.0 / count.clamp(min=1).float() if reduction == "mean" else torch.ones((), device=hidden.device)
        for start in range(0, tokens, chunk_size):
            h = hidden[start : start + chunk_size]
            y = labels[start : start + chunk_size]
            keep = valid[start : start + chunk_size]
            logits = torch.addmm(bias, h, weight.t()) if bias is not None else h @ weight.t()
            logits = logits.float()
            if backend == "triton":
                from zoo.nn.kernels.cross_entropy import chunk_loss_and_grad

                token_loss = chunk_loss_and_grad(logits, y, ignore_index, label_smoothing, scale)
            else:
                token_loss = _chunk_loss_and_grad(logits, y, keep, label_smoothing, scale)
            loss += token_loss.sum()
            grad = logits
            if want_bias:
                grad_bias += grad.sum(0)
            if want_hidden:  # in the input dtype (a no-op cast for float32)
                torch.mm(grad.to(hidden.dtype), weight, out=grad_hidden[start : start + chunk_size])
            if want_weight:  # accumulated in float32 over chunks
                grad_weight.addmm_(grad.t(), h.float())
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        ctx.other_inputs = 6
        return loss * scale


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: torch.Tensor | None = None,
                         *, ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0, reduction: Reduction = "mean",
                         chunk_size: int | None = None, backend: Backend | None = None) -> torch.Tensor:
    """Cross-entropy of `hidden @ weight.T + bias` against `labels`, fused and chunked.

    hidden: (N, H) float (N tokens; select MLM's masked positions before calling); weight: (V, H)
    of the same dtype (the LM head / tied embedding); bias: (V,) or None; labels: (N,) int with
    `ignore_index` for positions without a target. Logits are reduced in float32.
    reduction "mean" divides by the number of labelled tokens (as `F.cross_entropy`), "sum" does not.
    label_smoothing eps mixes the one-hot target with the uniform distribution, as in PyTorch.
    chunk_size: tokens per chunk (default: the float32 logits of a chunk fit
        `zoo.nn.chunk_memory.chunk_bytes()`, 32 MiB unless set).
    backend: the chunk's loss and logit gradient by a Triton kernel or PyTorch (`zoo.nn.backend`).
    Returns the scalar float32 loss; its backward yields gradients for hidden, weight and bias.

    A weight of a type registered by `register_split_weight_loss` (a DTensor split by vocabulary
    rows over a tensor-parallel group, once `trainers.parallel.vocab` is installed) takes that loss.
    """
    for weight_type, split_loss in _split_weight_losses.items():
        if isinstance(weight, weight_type):
            return split_loss(hidden, weight, labels, bias, ignore_index=ignore_index, label_smoothing=label_smoothing,
                              reduction=reduction, chunk_size=chunk_size)
    check_inputs(hidden, weight, labels, bias, reduction, label_smoothing)
    if chunk_size is None:
        chunk_size = rows_per_chunk(4 * weight.shape[0])  # float32 logits of one token
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    return _LinearCrossEntropy.apply(hidden, weight, bias, labels, ignore_index, label_smoothing, reduction, chunk_size,
                                     resolve_backend(backend, hidden))
