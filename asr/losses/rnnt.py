"""The full RNN-T loss with its gradient computed in closed form inside the forward pass.

Autograd through the lattice would save every (B, T, U+1) step of the recursion and a log-softmax of
the whole (B, T, U+1, V) joiner output. Here the forward pass computes the per-row normaliser, the
lattice posterior (asr.losses.lattice) and then, row by row, the gradient

    d loss_b / d logits[b, t, u, v] = softmax[b, t, u, v] * node(t, u) - arc(t, u, v)

(node: the posterior occupancy of node (t, u); arc: that of the blank or label arc leaving it with
symbol v). So the memory is the logits plus one buffer of their size, or the logits alone with
`gradient_in_logits=True`, which writes the gradient over them. Backward only scales the buffer.

The same function serves the pruned loss: there the logits hold a window of S lattice columns per
frame, starting at column `starts[b, t]`, instead of all U+1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from asr.losses.checks import check_transducer_inputs, reduce_losses, resolve_blank
from asr.losses.lattice import LATTICE_DTYPE, NEG_INF, add_delay_penalty, occupancies
from asr.losses.log_softmax_gradient import row_logsumexp, working_dtype, write_gradient


@dataclass(frozen=True)
class LossOptions:
    """How a transducer loss treats its lattice (shared by the full, pruned and sample-wise losses)."""

    blank: int = 0
    """Blank symbol id in [0, V)."""
    clamp: float | None = None
    """Clamp each gradient entry to [-clamp, clamp] (torchaudio's `clamp`); None leaves it."""
    fused_log_softmax: bool = True
    """True: the logits are unnormalised and the loss applies log-softmax over V. False: they already
    are log-probabilities (the gradient then has no softmax term)."""
    delay_penalty: float = 0.0
    """Adds delay_penalty * ((T_b - 1) / 2 - t) to each label arc's log-weight at frame t (k2's
    delay penalty): positive values favour paths that emit symbols early."""
    zero_infinity: bool = False
    """Samples with no possible alignment (loss inf) give loss 0 and gradient 0 instead of inf."""
    topology: str = "regular"
    """"regular": any number of symbols per frame; "modified": at most one symbol per frame."""
    gradient_in_logits: bool = False
    """Write the gradient into the logits' storage (they are overwritten) instead of a new buffer."""
    backend: str | None = None
    """"auto" | "torch" | "triton"; None follows MEMZOO_KERNELS (see zoo.nn.backend)."""


def window_columns(starts: torch.Tensor | None, batch: int, frames: int, window: int, device) -> torch.Tensor:
    """(B, T, S) lattice column u of each window position: starts[b, t] + s, or s when starts is None."""
    columns = torch.arange(window, device=device)
    if starts is None:
        return columns.expand(batch, frames, window)
    return starts[:, :, None] + columns


class _TransducerLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, starts, logit_lengths, target_lengths, width, options):
        batch, frames, window, vocab = logits.shape
        rows = logits.reshape(-1, vocab)
        normaliser = row_logsumexp(logits, options.backend) if options.fused_log_softmax else None
        columns = window_columns(starts, batch, frames, window, logits.device)
        # Symbol of each position's label arc (blank past the sample's targets: that arc is masked).
        padded = torch.cat([targets.long(), targets.new_full((batch, 1), options.blank).long()], dim=1)
        labels = padded.gather(1, columns.clamp(max=width - 1).reshape(batch, -1)).view(batch, frames, window)
        blank_weight = logits[..., options.blank].to(LATTICE_DTYPE)
        label_weight = logits.gather(-1, labels[..., None])[..., 0].to(LATTICE_DTYPE)
        if normaliser is not None:
            blank_weight, label_weight = blank_weight - normaliser, label_weight - normaliser
        blank_lattice = blank_weight if starts is None else _to_lattice(blank_weight, columns, width)
        label_lattice = label_weight if starts is None else _to_lattice(label_weight, columns, width)
        label_lattice = add_delay_penalty(label_lattice, logit_lengths, options.delay_penalty)
        posterior = occupancies(blank_lattice, label_lattice, logit_lengths, target_lengths, options.topology,
                                options.backend)
        blank_arc = posterior.blank if starts is None else _from_lattice(posterior.blank, columns)
        label_arc = posterior.label if starts is None else _from_lattice(posterior.label, columns)
        out = rows if options.gradient_in_logits else torch.empty_like(rows)
        write_gradient(rows, None if normaliser is None else normaliser.reshape(-1), (blank_arc + label_arc).reshape(-1),
                       options.blank, blank_arc.reshape(-1), labels.reshape(-1), label_arc.reshape(-1),
                       options.clamp, out, options.backend)
        ctx.gradient = out.view(logits.shape)
        losses = (-posterior.log_likelihood).to(working_dtype(logits))
        if options.zero_infinity:
            losses = torch.where(torch.isinf(losses), torch.zeros_like(losses), losses)
        return losses

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_losses):
        if ctx.gradient is None:
            raise RuntimeError("a transducer loss keeps one gradient buffer and scales it in place: "
                               "backward can run only once per forward")
        gradient, ctx.gradient = ctx.gradient, None
        gradient.view(gradient.shape[0], -1).mul_(grad_losses[:, None].to(gradient.dtype))
        return gradient, None, None, None, None, None, None


def _to_lattice(window_values: torch.Tensor, columns: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T, S) values at window columns -> (B, T, U+1) lattice, -inf off the window."""
    batch, frames, window = window_values.shape
    lattice = window_values.new_full((batch, frames, width + window), NEG_INF)
    lattice.scatter_(2, columns.clamp(max=width + window - 1), window_values)
    return lattice[:, :, :width]


def _from_lattice(lattice: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """(B, T, U+1) lattice -> (B, T, S) values at the window columns (0 past column U)."""
    padded = torch.cat([lattice, lattice.new_zeros(lattice.shape[:2] + (columns.shape[-1],))], dim=2)
    return padded.gather(2, columns)


def transducer_loss(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                    target_lengths: torch.Tensor, starts: torch.Tensor | None, width: int, options: LossOptions,
                    reduction: str) -> torch.Tensor:
    """The loss of `rnnt_loss` on logits (B, T, S, V) covering lattice columns starts[b, t] + s
    (all U+1 columns when starts is None). Inputs are checked by the caller; non-contiguous logits
    are copied once (the row passes read them as (rows, V))."""
    if options.gradient_in_logits and not logits.is_contiguous():
        raise ValueError("gradient_in_logits=True needs contiguous logits (their storage receives the gradient)")
    losses = _TransducerLoss.apply(logits.contiguous(), targets, starts, logit_lengths.long(),
                                   target_lengths.long(), width, options)
    return reduce_losses(losses, reduction)


def rnnt_loss(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor, target_lengths: torch.Tensor,
              blank: int = 0, reduction: str = "mean", clamp: float | None = None, fused_log_softmax: bool = True,
              delay_penalty: float = 0.0, zero_infinity: bool = False, topology: str = "regular",
              gradient_in_logits: bool = False, backend: str | None = None) -> torch.Tensor:
    """The RNN-T loss -log p(y | x) with its gradient computed in closed form.

    Args:
        logits: (B, T, U+1, V) joiner output, any float dtype (the normalisers and the lattice are
            float64, see `LATTICE_DTYPE`); logits[b, t, u] scores the next symbol after frame t and u
            emitted symbols.
        targets: (B, U) int symbol ids; sample b uses targets[b, :target_lengths[b]], which must not
            contain the blank.
        logit_lengths: (B,) int frames of each sample, in [1, T].
        target_lengths: (B,) int symbols of each sample, in [0, U].
        blank: blank id; negative counts from the end (-1 is V - 1, torchaudio's convention).
        reduction: "mean" (over the batch), "sum", or "none" for the (B,) per-sample losses.
        clamp, fused_log_softmax, delay_penalty, zero_infinity, topology, gradient_in_logits, backend:
            see `LossOptions`.

    Returns:
        The loss (scalar, or (B,) with reduction "none"); inf for a sample with no alignment unless
        zero_infinity. Its backward gives d loss / d logits; it may run once per forward.
    """
    if logits.dim() != 4:
        raise ValueError(f"logits must have shape (B, T, U+1, V); got {tuple(logits.shape)}")
    batch, frames, width, vocab = logits.shape
    blank = resolve_blank(blank, vocab)
    check_transducer_inputs(logits, frames, width, vocab, targets, logit_lengths, target_lengths, blank, reduction,
                            topology)
    options = LossOptions(blank, clamp, fused_log_softmax, delay_penalty, zero_infinity, topology,
                          gradient_in_logits, backend)
    return transducer_loss(logits, targets, logit_lengths, target_lengths, None, width, options, reduction)
