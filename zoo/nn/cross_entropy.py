"""Fused linear + cross-entropy: the loss of `hidden @ weight.T (+ bias)` against labels, and its
gradients, without ever holding the (tokens x vocab) logits.

Tokens are processed in chunks: each chunk's logits are formed, reduced to a float32 log-sum-exp
and turned into their gradient (softmax - target distribution), which is contracted with `weight`
and `hidden` into the gradients of both. When that happens is the caller's choice
(`LossGradients`: the `gradients` argument, else `current_loss_gradients()`, which the
`loss_gradients()` context sets):

- "forward": inside the forward pass, three head products a step; backward only scales the
  stored gradients by the incoming scalar, and the (V, H) float32 weight gradient is held from
  forward to backward.
- "backward": forward forms the logits once for the loss and keeps one float32 log-sum-exp per
  token (and `hidden`, which the layer before usually keeps anyway); backward forms them again,
  four head products a step, and nothing vocabulary-sized is held between the passes.

Either way the peak is one chunk of logits plus the gradient buffers of `hidden` (N, H) and `weight`
(V, H) that autograd would allocate anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

import logging

import torch

from zoo.nn.chunk_memory import rows_per_chunk
from zoo.nn.backend import Backend, resolve_backend
from zoo.nn.loss_gradients import GradientsFromForward

log = logging.getLogger(__name__)

Reduction = Literal["mean", "sum"]

LossGradients = Literal["forward", "backward"]
"""When a fused loss forms its gradients (see the module's docstring)."""
LOSS_GRADIENTS = ("forward", "backward")
_LOSS_GRADIENTS: ContextVar[str] = ContextVar("memzoo_loss_gradients", default="forward")


@contextmanager
def loss_gradients(when: LossGradients) -> Iterator[None]:
    """Fused losses called inside (without their own `gradients=`) form their gradients `when`:
    the trainer enters it with `Strategy.loss_gradients`; a model's code never needs to."""
    if when not in LOSS_GRADIENTS:
        raise ValueError(f"loss gradients must be formed in one of {LOSS_GRADIENTS}; got {when!r}")
    token = _LOSS_GRADIENTS.set(when)
    try:
        yield
    finally:
        _LOSS_GRADIENTS.reset(token)


def current_loss_gradients() -> LossGradients:
    """The `loss_gradients()` in force: "forward" outside any."""
    return _LOSS_GRADIENTS.get()


IGNORE_INDEX = -100
"""Label of a position without a target (Hugging Face's and torch's convention)."""

SplitWeightLoss = Callable[..., torch.Tensor]
"""A fused loss for a weight split over ranks: called as `linear_cross_entropy` is, with its keyword
arguments (`ignore_index`, `label_smoothing`, `reduction`, `chunk_size`)."""
_split_weight_losses: dict[type, SplitWeightLoss] = {}
_warned_forward_only: set[type] = set()
"""Split-weight types whose loss was asked for gradients in backward (logged once each)."""


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


def _token_loss(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor,
                label_smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch path: (each row's loss (C,), zero where not kept; its log-sum-exp (C,)) of float32
    logits (C, V)."""
    lse = torch.logsumexp(logits, dim=-1)
    target = labels.clamp(0, logits.shape[1] - 1).long()
    token_loss = lse - logits.gather(1, target[:, None]).squeeze(1)
    if label_smoothing:
        token_loss = (1 - label_smoothing) * token_loss + label_smoothing * (lse - logits.mean(dim=-1))
    return token_loss.masked_fill_(~keep, 0.0), lse


def _logit_gradient_(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor,
                     label_smoothing: float, scale: torch.Tensor) -> torch.Tensor:
    """PyTorch path: overwrites the float32 logits (C, V) of log-sum-exps `lse` (C,) with
    d loss / d logits = (softmax - (1 - eps) onehot - eps / V) * scale, zero on rows not kept."""
    vocab = logits.shape[1]
    grad = logits.sub_(lse[:, None]).exp_()
    target = labels.clamp(0, vocab - 1).long()
    grad.scatter_add_(1, target[:, None], torch.full_like(lse[:, None], -(1 - label_smoothing)))
    if label_smoothing:
        grad.sub_(label_smoothing / vocab)
    return grad.mul_((keep.float() * scale)[:, None])


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float32 logits (C, V) of one chunk of hidden rows (C, H)."""
    return (torch.addmm(bias, h, weight.t()) if bias is not None else h @ weight.t()).float()


def _chunk_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor, ignore_index: int,
                         label_smoothing: float, scale: torch.Tensor, backend: str) -> torch.Tensor:
    """Each row's loss (C,); overwrites the float32 logits (C, V) with their gradient (`_logit_gradient_`)."""
    if backend == "triton":
        from zoo.nn.kernels.cross_entropy import chunk_loss_and_grad

        return chunk_loss_and_grad(logits, labels, ignore_index, label_smoothing, scale)
    token_loss, lse = _token_loss(logits, labels, keep, label_smoothing)
    _logit_gradient_(logits, lse, labels, keep, label_smoothing, scale)
    return token_loss


class _Gradients:
    """The gradients of (hidden, weight, bias) a fused loss fills chunk by chunk from logit gradients:
    hidden's in its dtype, weight's and bias's accumulated in float32; None where not wanted."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 wanted: tuple[bool, bool, bool]) -> None:
        self.hidden = torch.empty_like(hidden) if wanted[0] else None
        self.weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if wanted[1] else None
        self.bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if (
            bias is not None and wanted[2]) else None

    def add(self, start: int, grad: torch.Tensor, h: torch.Tensor, weight: torch.Tensor) -> None:
        """Contracts the logit gradient `grad` (C, V) of hidden rows h = hidden[start : start + C]."""
        if self.bias is not None:
            self.bias += grad.sum(0)
        if self.hidden is not None:  # in the input dtype (a no-op cast for float32)
            torch.mm(grad.to(h.dtype), weight, out=self.hidden[start : start + grad.shape[0]])
        if self.weight is not None:  # accumulated in float32 over chunks
            self.weight.addmm_(grad.t(), h.float())


def _mean_scale(valid: torch.Tensor, reduction: str) -> torch.Tensor:
    """The factor of every token's loss: 1 / (number of labelled tokens) for "mean", 1 for "sum"."""
    if reduction == "mean":
        return 1.0 / valid.sum().clamp(min=1).float()
    return torch.ones((), device=valid.device)


class _LinearCrossEntropy(GradientsFromForward):
    """Gradients formed in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index, label_smoothing, reduction, chunk_size, backend):
        valid = labels != ignore_index
        gradients = _Gradients(hidden, weight, bias, ctx.needs_input_grad[:3])
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        scale = _mean_scale(valid, reduction)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start : start + chunk_size]
            logits = _chunk_logits(h, weight, bias)
            loss += _chunk_loss_and_grad(logits, labels[start : start + chunk_size], valid[start : start + chunk_size],
                                         ignore_index, label_smoothing, scale, backend).sum()
            gradients.add(start, logits, h, weight)
        ctx.save_for_backward(gradients.hidden, gradients.weight, gradients.bias)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        ctx.other_inputs = 6
        return loss * scale


class _LinearCrossEntropyGradientsInBackward(torch.autograd.Function):
    """Gradients formed in backward from the logits formed again; forward keeps one float32
    log-sum-exp per token besides its inputs."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index, label_smoothing, reduction, chunk_size, backend):
        valid = labels != ignore_index
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            logits = _chunk_logits(hidden[start : start + chunk_size], weight, bias)
            token_loss, lse[start : start + chunk_size] = _token_loss(
                logits, labels[start : start + chunk_size], valid[start : start + chunk_size], label_smoothing)
            loss += token_loss.sum()
        scale = _mean_scale(valid, reduction)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, scale)
        ctx.config = (ignore_index, label_smoothing, chunk_size, backend)
        return loss * scale

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, bias, labels, lse, scale = ctx.saved_tensors
        ignore_index, label_smoothing, chunk_size, backend = ctx.config
        factor = scale * grad_loss.float()
        valid = labels != ignore_index
        gradients = _Gradients(hidden, weight, bias, ctx.needs_input_grad[:3])
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start : start + chunk_size]
            logits = _chunk_logits(h, weight, bias)
            y, keep = labels[start : start + chunk_size], valid[start : start + chunk_size]
            if backend == "triton":  # the kernel forms the log-sum-exp again, and a loss not needed here
                _chunk_loss_and_grad(logits, y, keep, ignore_index, label_smoothing, factor, backend)
            else:
                _logit_gradient_(logits, lse[start : start + chunk_size], y, keep, label_smoothing, factor)
            gradients.add(start, logits, h, weight)
        return (gradients.hidden, None if gradients.weight is None else gradients.weight.to(weight.dtype),
                None if gradients.bias is None else gradients.bias.to(bias.dtype), *(None,) * 6)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: torch.Tensor | None = None,
                         *, ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0, reduction: Reduction = "mean",
                         chunk_size: int | None = None, backend: Backend | None = None,
                         gradients: LossGradients | None = None) -> torch.Tensor:
    """Cross-entropy of `hidden @ weight.T + bias` against `labels`, fused and chunked.

    hidden: (N, H) float (N tokens; select MLM's masked positions before calling); weight: (V, H)
    of the same dtype (the LM head / tied embedding); bias: (V,) or None; labels: (N,) int with
    `ignore_index` for positions without a target. Logits are reduced in float32.
    reduction "mean" divides by the number of labelled tokens (as `F.cross_entropy`), "sum" does not.
    label_smoothing eps mixes the one-hot target with the uniform distribution, as in PyTorch.
    chunk_size: tokens per chunk (default: the float32 logits of a chunk fit
        `zoo.nn.chunk_memory.chunk_bytes()`, 32 MiB unless set).
    backend: the chunk's loss and logit gradient by a Triton kernel or PyTorch (`zoo.nn.backend`).
    gradients: when the gradients are formed, "forward" or "backward" (the module's docstring);
        default `current_loss_gradients()`.
    Returns the scalar float32 loss; its backward yields gradients for hidden, weight and bias.

    A weight of a type registered by `register_split_weight_loss` (a DTensor split by vocabulary
    rows over a tensor-parallel group, once `trainers.parallel.vocab` is installed) takes that loss.
    """
    gradients = current_loss_gradients() if gradients is None else gradients
    if gradients not in LOSS_GRADIENTS:
        raise ValueError(f"gradients must be one of {LOSS_GRADIENTS}; got {gradients!r}")
    for weight_type, split_loss in _split_weight_losses.items():
        if isinstance(weight, weight_type):
            if gradients == "backward" and weight_type not in _warned_forward_only:
                _warned_forward_only.add(weight_type)
                log.warning("a vocabulary-split fused loss forms its gradients in forward; gradients='backward' "
                            "is not available for a %s weight", weight_type.__name__)
            return split_loss(hidden, weight, labels, bias, ignore_index=ignore_index, label_smoothing=label_smoothing,
                              reduction=reduction, chunk_size=chunk_size)
    check_inputs(hidden, weight, labels, bias, reduction, label_smoothing)
    if chunk_size is None:
        chunk_size = rows_per_chunk(4 * weight.shape[0])  # float32 logits of one token
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    loss = _LinearCrossEntropy if gradients == "forward" else _LinearCrossEntropyGradientsInBackward
    return loss.apply(hidden, weight, bias, labels, ignore_index, label_smoothing, reduction, chunk_size,
                      resolve_backend(backend, hidden))
