"""The "simple" transducer loss of an additive joiner (Kuang et al., 2022), with no (B, T, U+1, V) tensor.

With logits[b, t, u, v] = am[b, t, v] + lm[b, u, v], the log-softmax normaliser of every node is
    log sum_v exp(am[t, v] + lm[u, v]) = am_max[t] + lm_max[u] + log (exp(am - am_max) @ exp(lm - lm_max)^T)[t, u],
one batched (T, V) x (V, U+1) matmul; the blank and label log-probabilities of each node follow by
gathering two columns. The lattice posterior of this loss is what `prune_ranges` reads.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from asr.losses.checks import check_transducer_inputs, reduce_losses, resolve_blank
from asr.losses.lattice import LATTICE_DTYPE, Occupancies, add_delay_penalty, occupancies


class _LatticeLoss(torch.autograd.Function):
    """-log p(y | x) of a lattice given by its arc log-weights; the gradients are minus the arc
    occupancies, and the occupancies come back as (non-differentiable) outputs too."""

    @staticmethod
    def forward(ctx, blank, label, logit_lengths, target_lengths, topology, zero_infinity, backend):
        posterior = occupancies(blank, label, logit_lengths, target_lengths, topology, backend)
        ctx.save_for_backward(posterior.blank, posterior.label)
        losses = (-posterior.log_likelihood).to(torch.promote_types(blank.dtype, torch.float32))
        if zero_infinity:
            losses = torch.where(torch.isinf(losses), torch.zeros_like(losses), losses)
        ctx.mark_non_differentiable(posterior.blank, posterior.label)
        ctx.dtypes = blank.dtype, label.dtype
        return losses, posterior.blank, posterior.label

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_losses, _grad_blank, _grad_label):
        blank_occupancy, label_occupancy = ctx.saved_tensors
        scale = -grad_losses[:, None, None]
        return ((blank_occupancy * scale).to(ctx.dtypes[0]), (label_occupancy * scale).to(ctx.dtypes[1]),
                None, None, None, None, None)


def lattice_loss(blank: torch.Tensor, label: torch.Tensor, logit_lengths: torch.Tensor, target_lengths: torch.Tensor,
                 topology: str = "regular", zero_infinity: bool = False,
                 backend: str | None = None) -> tuple[torch.Tensor, Occupancies]:
    """(B,) -log p(y | x) of lattices with arc log-weights blank, label (B, T, U+1) (see
    asr.losses.lattice), differentiable in both, and the detached float64 posterior. The losses come
    in the weights' dtype (float32 at least); the recursion runs in float64."""
    losses, blank_occupancy, label_occupancy = _LatticeLoss.apply(
        blank, label, logit_lengths.long(), target_lengths.long(), topology, zero_infinity, backend)
    return losses, Occupancies(-losses.detach(), blank_occupancy, label_occupancy)


def additive_log_probs(am: torch.Tensor, lm: torch.Tensor, targets: torch.Tensor, blank: int):
    """Blank and label log-probabilities (B, T, U+1) of the joiner logits am[:, :, None] + lm[:, None].

    am: (B, T, V); lm: (B, U+1, V); targets: (B, U). The (B, T, V) and (B, U+1, V) work and the
    (B, T, U+1) sums of products run in float32 (float64 for float64 input); the log of those sums
    and the log-probabilities are `LATTICE_DTYPE` (float64). Column U of the label log-probabilities
    scores the blank and is never read by the lattice."""
    work = torch.promote_types(am.dtype, torch.float32)
    am, lm = am.to(work), lm.to(work)
    am_max = am.detach().amax(-1, keepdim=True)
    lm_max = lm.detach().amax(-1, keepdim=True)
    products = torch.matmul((am - am_max).exp(), (lm - lm_max).exp().transpose(1, 2))
    normaliser = (products.to(LATTICE_DTYPE).log() + am_max.to(LATTICE_DTYPE)
                  + lm_max.to(LATTICE_DTYPE).transpose(1, 2))
    padded = torch.cat([targets.long(), targets.new_full((targets.shape[0], 1), blank).long()], dim=1)
    frames = am.shape[1]
    am_label = am.gather(2, padded[:, None, :].expand(-1, frames, -1))
    lm_label = lm.gather(2, padded[:, :, None]).transpose(1, 2)
    blank_log_probs = (am[:, :, blank, None] + lm[:, None, :, blank]).to(LATTICE_DTYPE) - normaliser
    return blank_log_probs, (am_label + lm_label).to(LATTICE_DTYPE) - normaliser


def simple_rnnt_loss(am: torch.Tensor, lm: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                     target_lengths: torch.Tensor, blank: int = 0, reduction: str = "mean", delay_penalty: float = 0.0,
                     zero_infinity: bool = False, topology: str = "regular", backend: str | None = None,
                     return_occupancies: bool = False):
    """The transducer loss of the additive joiner logits[b, t, u] = am[b, t] + lm[b, u].

    Args:
        am: (B, T, V) acoustic scores (the encoder's simple projection).
        lm: (B, U+1, V) label-context scores (the decoder's simple projection).
        targets, logit_lengths, target_lengths, blank, reduction, delay_penalty, zero_infinity,
            topology, backend: as in `rnnt_loss`.
        return_occupancies: also return the lattice posterior (detached `Occupancies`, (B, T, U+1)),
            which `prune_ranges` turns into pruning bounds.

    Returns:
        The loss (scalar, or (B,) with reduction "none"), or (loss, posterior). Gradients flow to am
        and lm through autograd; only (B, T, V), (B, U+1, V) and (B, T, U+1) tensors are saved.
    """
    if am.dim() != 3 or lm.dim() != 3 or am.shape[0] != lm.shape[0] or am.shape[2] != lm.shape[2]:
        raise ValueError(f"am must be (B, T, V) and lm (B, U+1, V); got {tuple(am.shape)} and {tuple(lm.shape)}")
    batch, frames, vocab = am.shape
    blank = resolve_blank(blank, vocab)
    check_transducer_inputs(am, frames, lm.shape[1], vocab, targets, logit_lengths, target_lengths, blank, reduction,
                            topology, "am", ("lm", lm))
    blank_log_probs, label_log_probs = additive_log_probs(am, lm, targets, blank)
    label_log_probs = add_delay_penalty(label_log_probs, logit_lengths, delay_penalty)
    losses, posterior = lattice_loss(blank_log_probs, label_log_probs, logit_lengths, target_lengths, topology,
                                     zero_infinity, backend)
    loss = reduce_losses(losses.to(torch.promote_types(am.dtype, torch.float32)), reduction)
    return (loss, posterior) if return_occupancies else loss
