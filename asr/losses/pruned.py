"""Pruned RNN-T (Kuang et al., 2022): the real joiner evaluated only on a window of S = s_range lattice
columns per frame, chosen from the posterior of the simple (additive joiner) loss.

The window of frame t covers columns starts[b, t] .. starts[b, t] + S - 1. `prune_ranges` picks the
window holding the most posterior occupancy, then bounds it so that a path through the windows always
exists: starts[b, 0] = 0, starts never decrease, consecutive windows stay connected (a step of at
most S - 1 columns per frame in the regular topology, S in the modified one) and the last valid frame
reaches column U_b. That needs U_b <= T_b * step, so when U > T the window must be wide enough.
"""

from __future__ import annotations

from typing import Callable

import torch

from asr.losses.checks import check_transducer_inputs, resolve_blank
from asr.losses.lattice import Occupancies
from asr.losses.rnnt import LossOptions, transducer_loss
from asr.losses.simple import simple_rnnt_loss


def _window_step(s_range: int, topology: str) -> int:
    """How many columns a path can climb between the starts of two consecutive windows."""
    return s_range - 1 if topology == "regular" else s_range


def check_s_range(s_range: int, logit_lengths: torch.Tensor, target_lengths: torch.Tensor, topology: str) -> None:
    """ValueError unless every sample's U_b symbols fit through windows of width s_range."""
    if not isinstance(s_range, int) or s_range < (2 if topology == "regular" else 1):
        raise ValueError(f"s_range must be an int >= {2 if topology == 'regular' else 1} for the {topology} "
                         f"topology; got {s_range!r}")
    reach = logit_lengths.long() * _window_step(s_range, topology)
    short = target_lengths.long() > reach
    if short.any():
        b = int(short.nonzero()[0])
        need = -(-int(target_lengths[b]) // int(logit_lengths[b])) + (1 if topology == "regular" else 0)
        raise ValueError(f"s_range={s_range} is too small: sample {b} has U={int(target_lengths[b])} symbols in "
                         f"T={int(logit_lengths[b])} frames, which needs s_range >= {need}")


def prune_ranges(posterior: Occupancies, logit_lengths: torch.Tensor, target_lengths: torch.Tensor, s_range: int,
                 topology: str = "regular") -> torch.Tensor:
    """(B, T) int64 start column of each frame's window of s_range columns.

    posterior: the simple loss's `Occupancies` ((B, T, U+1) arc occupancies); lengths (B,)."""
    check_s_range(s_range, logit_lengths, target_lengths, topology)
    node = posterior.blank + posterior.label
    batch, frames, width = node.shape
    cumulative = torch.cat([node.new_zeros(batch, frames, 1), node.cumsum(2)], dim=2)
    first = torch.arange(width, device=node.device)
    scores = cumulative.gather(2, (first + s_range).clamp(max=width).expand(batch, frames, -1)) - cumulative[:, :, :width]
    symbols, lengths = target_lengths.long()[:, None], logit_lengths.long()[:, None]
    cap = (symbols - s_range + 1).clamp(min=0)
    scores = scores.masked_fill(first[None, None, :] > cap[:, :, None], float("-inf"))
    starts = scores.argmax(2)
    step = _window_step(s_range, topology)
    t = torch.arange(frames, device=node.device)[None, :]
    highest = torch.minimum(t * step, cap)
    lowest = (symbols - (lengths - t) * step).clamp(min=0)
    starts = torch.maximum(torch.minimum(starts, highest), lowest).clamp(max=cap)
    starts = starts.cummax(1).values
    # Connect each window to the next: starts[t] >= starts[t'] - (t' - t) * step for every t' > t.
    shifted = (starts - t * step).flip(1).cummax(1).values.flip(1)
    return shifted + t * step


def prune_decoder(decoder_out: torch.Tensor, starts: torch.Tensor, s_range: int) -> torch.Tensor:
    """(B, U+1, H) decoder (or its projection) -> (B, T, S, H): the rows of each frame's window
    (columns past U repeat row U; the lattice never reads them)."""
    batch, width, hidden = decoder_out.shape
    columns = (starts[:, :, None] + torch.arange(s_range, device=starts.device)).clamp(max=width - 1)
    index = columns.reshape(batch, -1, 1).expand(-1, -1, hidden)
    return decoder_out.gather(1, index).view(batch, *columns.shape[1:], hidden)


def pruned_rnnt_loss(logits: torch.Tensor, targets: torch.Tensor, starts: torch.Tensor, logit_lengths: torch.Tensor,
                     target_lengths: torch.Tensor, blank: int = 0, reduction: str = "mean", clamp: float | None = None,
                     delay_penalty: float = 0.0, zero_infinity: bool = False, topology: str = "regular",
                     gradient_in_logits: bool = False, backend: str | None = None) -> torch.Tensor:
    """The RNN-T loss restricted to the windows: paths that leave them do not count.

    logits: (B, T, S, V) joiner output at columns starts[b, t] + s; starts: (B, T) int64 from
    `prune_ranges`; the rest as in `rnnt_loss` (fused log-softmax, closed-form gradient). With
    S >= U+1 it equals the full loss."""
    if logits.dim() != 4:
        raise ValueError(f"logits must have shape (B, T, S, V); got {tuple(logits.shape)}")
    batch, frames, s_range, vocab = logits.shape
    if tuple(starts.shape) != (batch, frames) or starts.dtype != torch.int64:
        raise ValueError(f"starts must be int64 of shape {(batch, frames)}; got {starts.dtype} {tuple(starts.shape)}")
    blank = resolve_blank(blank, vocab)
    check_transducer_inputs(logits, frames, targets.shape[1] + 1, vocab, targets, logit_lengths, target_lengths,
                            blank, reduction, topology)
    options = LossOptions(blank, clamp, True, delay_penalty, zero_infinity, topology, gradient_in_logits, backend)
    return transducer_loss(logits, targets, logit_lengths, target_lengths, starts, targets.shape[1] + 1, options,
                           reduction)


Joiner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""joiner(encoder (B, T, 1, J), decoder (B, T, S, J)) -> logits (B, T, S, V), broadcasting over S."""


def pruned_transducer_losses(simple_am: torch.Tensor, simple_lm: torch.Tensor, encoder_proj: torch.Tensor,
                             decoder_proj: torch.Tensor, joiner: Joiner, targets: torch.Tensor,
                             logit_lengths: torch.Tensor, target_lengths: torch.Tensor, s_range: int, blank: int = 0,
                             reduction: str = "mean", delay_penalty: float = 0.0, zero_infinity: bool = False,
                             topology: str = "regular", backend: str | None = None):
    """Simple loss, pruning and pruned loss in one call (icefall's pruned transducer recipe).

    Args:
        simple_am: (B, T, V) encoder's simple projection; simple_lm: (B, U+1, V) decoder's.
        encoder_proj: (B, T, J), decoder_proj: (B, U+1, J): the joiner's input projections.
        joiner: combines the projections of the windows into logits (see `Joiner`).
        s_range: window width S; the other arguments as in `rnnt_loss`.

    Returns:
        (simple_loss, pruned_loss), each reduced as asked; a training loss is a weighted sum of both.
        The largest tensor is the pruned logits (B, T, S, V), which then hold their own gradient.
    """
    simple_loss, posterior = simple_rnnt_loss(simple_am, simple_lm, targets, logit_lengths, target_lengths, blank,
                                              reduction, delay_penalty, zero_infinity, topology, backend,
                                              return_occupancies=True)
    starts = prune_ranges(posterior, logit_lengths, target_lengths, s_range, topology)
    logits = joiner(encoder_proj[:, :, None, :], prune_decoder(decoder_proj, starts, s_range))
    # Nobody else holds these logits, so their storage takes the gradient (a joiner that saved its own
    # output for backward would fail loudly there: the write bumps the tensor's version counter).
    pruned_loss = pruned_rnnt_loss(logits, targets, starts, logit_lengths, target_lengths, blank, reduction,
                                   delay_penalty=delay_penalty, zero_infinity=zero_infinity, topology=topology,
                                   gradient_in_logits=True, backend=backend)
    return simple_loss, pruned_loss
