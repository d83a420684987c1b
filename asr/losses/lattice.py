"""The transducer lattice: forward (alpha) and backward (beta) scores and arc occupancies.

A lattice is given by two (B, T, U+1) tensors of arc log-weights:
- `blank[b, t, u]`: log p(blank | frame t, u symbols emitted), the arc (t, u) -> (t+1, u);
- `label[b, t, u]`: log p(y_{u+1} | frame t, u symbols emitted), the arc (t, u) -> (t, u+1) in the
  "regular" topology (any number of symbols per frame) or (t, u) -> (t+1, u+1) in the "modified"
  topology (at most one symbol per frame). Column u = U of `label` is never read.
Sample b uses frames t < T_b = logit_lengths[b] and u <= U_b = target_lengths[b]; everything outside
is ignored (it may hold any finite value or -inf). A path starts at (0, 0); in the regular topology it
ends with the blank arc leaving (T_b - 1, U_b), in the modified one at the node (T_b, U_b).

`occupancies` returns log p(y | x) and the posterior occupancy of every arc: the gradient of
log p(y | x) with respect to that arc's log-weight, which is all a transducer loss needs for its
closed-form gradient. The recursion runs over anti-diagonals t + u = n (regular) or over frames
(modified), each step vectorised over the batch and u; on CUDA a Triton kernel runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from zoo.nn.backend import resolve_backend

Topology = Literal["regular", "modified"]
TOPOLOGIES = ("regular", "modified")
NEG_INF = float("-inf")
LATTICE_DTYPE = torch.float64
"""dtype of every lattice tensor (arc weights, alpha, beta, occupancies), whatever the logits' dtype. An
occupancy is exp(alpha + weight + beta - log p) with alpha, beta and log p in the thousands: in float32
each term carries its own rounding of ~1e-4 relative, which the gradient inherits. The (B, T, U+1)
lattice is ~V times smaller than the full loss's (B, T, U+1, V) logits; beside a pruned loss's (B, T, S, V)
logits it is not, and float64 costs the pruned step 1-7% of its peak (BENCHMARKS.md)."""


@dataclass
class Occupancies:
    """The posterior of a lattice; every tensor is `LATTICE_DTYPE` (float64)."""

    log_likelihood: torch.Tensor
    """(B,) log p(y | x); -inf where no path exists."""
    blank: torch.Tensor
    """(B, T, U+1) posterior occupancy of each blank arc (0 outside the sample's lattice)."""
    label: torch.Tensor
    """(B, T, U+1) posterior occupancy of each label arc (column U is 0)."""


def log_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(exp(a) + exp(b)) that is -inf (not nan) where both are -inf; three buffers of a's size."""
    top = torch.maximum(a, b)
    top.masked_fill_(top == NEG_INF, 0.0)
    total = torch.sub(a, top).exp_()
    total.add_(torch.sub(b, top).exp_())
    return total.log_().add_(top)


def lattice_mask(shape: torch.Size, logit_lengths: torch.Tensor, target_lengths: torch.Tensor):
    """Boolean (B, T, U+1) masks of the blank and the label arcs that belong to each sample."""
    _, frames, width = shape
    t = torch.arange(frames, device=logit_lengths.device)[None, :, None]
    u = torch.arange(width, device=logit_lengths.device)[None, None, :]
    in_time = t < logit_lengths[:, None, None]
    return in_time & (u <= target_lengths[:, None, None]), in_time & (u < target_lengths[:, None, None])


def add_delay_penalty(label: torch.Tensor, logit_lengths: torch.Tensor, penalty: float) -> torch.Tensor:
    """label (B, T, U+1) + penalty * ((T_b - 1) / 2 - t): k2's delay penalty; a positive penalty favours
    paths that emit their symbols early (it is zero on average over a sample's frames)."""
    if not penalty:
        return label
    t = torch.arange(label.shape[1], device=label.device, dtype=label.dtype)[None, :, None]
    middle = (logit_lengths[:, None, None].to(label.dtype) - 1) / 2
    return label + penalty * (middle - t)


def occupancies(blank: torch.Tensor, label: torch.Tensor, logit_lengths: torch.Tensor, target_lengths: torch.Tensor,
                topology: Topology = "regular", backend: str | None = None) -> Occupancies:
    """Log-likelihood and arc occupancies of the lattices in a batch (see the module docstring).

    blank, label: (B, T, U+1) float log-weights; logit_lengths, target_lengths: (B,) int64 on the
    same device. The recursion runs in `LATTICE_DTYPE` (float64) whatever the weights' dtype.
    """
    dtype = LATTICE_DTYPE
    blank_mask, label_mask = lattice_mask(blank.shape, logit_lengths, target_lengths)
    blank = blank.to(dtype, copy=True).masked_fill_(~blank_mask, NEG_INF)
    label = label.to(dtype, copy=True).masked_fill_(~label_mask, NEG_INF)
    run = _regular if topology == "regular" else _modified
    alpha_beta = _alpha_beta_routine(topology, resolve_backend(backend, blank))
    weights = [blank, label]  # handed over, so that the regular topology can free them once skewed
    del blank, label, blank_mask, label_mask
    log_likelihood, blank_occupancy, label_occupancy = run(weights, logit_lengths, target_lengths, alpha_beta)
    lost = ~torch.isfinite(log_likelihood)
    blank_occupancy = blank_occupancy.masked_fill(lost[:, None, None], 0.0)
    label_occupancy = label_occupancy.masked_fill(lost[:, None, None], 0.0)
    return Occupancies(log_likelihood, blank_occupancy, label_occupancy)


def _alpha_beta_routine(topology: Topology, backend: str):
    """The topology's alpha/beta recursion: this module's custom op (PyTorch) or the Triton kernel of
    the same name and signature (`asr.losses.kernels`)."""
    if backend == "triton":
        from asr.losses import kernels

        return kernels.regular_alpha_beta if topology == "regular" else kernels.modified_alpha_beta
    return regular_alpha_beta if topology == "regular" else modified_alpha_beta


# ---- regular topology: anti-diagonals n = t + u, stored "skewed" as (B, T+U, U+1) ----

def _skew(x: torch.Tensor) -> torch.Tensor:
    """(B, T, U+1) -> (B, T+U, U+1) with out[b, n, u] = x[b, n-u, u] (-inf where n-u is off the lattice)."""
    batch, frames, width = x.shape
    n = torch.arange(frames + width - 1, device=x.device)[:, None]
    t = n - torch.arange(width, device=x.device)[None, :]
    inside = (t >= 0) & (t < frames)
    skewed = x.gather(1, t.clamp(0, frames - 1).expand(batch, -1, -1))
    return skewed.masked_fill_(~inside, NEG_INF)


def _unskew(x: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, T+U, U+1) -> (B, T, U+1), the inverse of `_skew`."""
    batch, _, width = x.shape
    n = torch.arange(frames, device=x.device)[:, None] + torch.arange(width, device=x.device)[None, :]
    return x.gather(1, n.expand(batch, -1, -1))


def _regular_weights(weights, logit_lengths, target_lengths):
    """Skewed arc weights from [blank, label] (emptied: the unskewed ones are freed); the final blank
    leaves the lattice, so inside the recursion it becomes the "exit" weight of the last node
    (T_b - 1, U_b), at skewed position (T_b - 1 + U_b, U_b)."""
    inner_blank = _skew(weights.pop(0))
    skewed_label = _skew(weights.pop(0))
    rows = torch.arange(inner_blank.shape[0], device=inner_blank.device)
    end_n = logit_lengths - 1 + target_lengths
    exit_weight = torch.full_like(inner_blank, NEG_INF)
    exit_weight[rows, end_n, target_lengths] = inner_blank[rows, end_n, target_lengths]
    inner_blank[rows, end_n, target_lengths] = NEG_INF
    return inner_blank, exit_weight, skewed_label


def _regular(weights, logit_lengths, target_lengths, alpha_beta):
    """log p and occupancies of the regular topology, with `alpha_beta` this module's
    `regular_alpha_beta` or the Triton kernel of the same name (`asr.losses.kernels`)."""
    frames = weights[0].shape[1]
    inner_blank, exit_weight, skewed_label = _regular_weights(weights, logit_lengths, target_lengths)
    alpha, beta = alpha_beta(inner_blank, exit_weight, skewed_label)
    return _regular_posterior(alpha, beta, inner_blank, exit_weight, skewed_label, frames)


@torch.library.custom_op("memzoo_asr::regular_alpha_beta", mutates_args=())
def regular_alpha_beta(inner_blank: torch.Tensor, exit_weight: torch.Tensor,
                       skewed_label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Skewed alpha and beta, each (B, T+U, U+1), of the regular topology from its skewed (B, T+U, U+1)
    weights: one diagonal after another. One operator, so that a traced step (fake tensors, the
    memory estimate's dispatch modes) sees one call instead of ~20 small ops per diagonal."""
    batch, diagonals, _ = inner_blank.shape
    no_label = inner_blank.new_full((batch, 1), NEG_INF)
    alpha = torch.full_like(inner_blank, NEG_INF)
    alpha[:, 0, 0] = 0.0
    for n in range(1, diagonals):
        stay = alpha[:, n - 1] + inner_blank[:, n - 1]
        up = torch.cat([no_label, (alpha[:, n - 1] + skewed_label[:, n - 1])[:, :-1]], dim=1)
        alpha[:, n] = log_add(stay, up)
    beta = torch.full_like(inner_blank, NEG_INF)
    beta[:, diagonals - 1] = exit_weight[:, diagonals - 1]
    for n in range(diagonals - 2, -1, -1):
        stay = beta[:, n + 1] + inner_blank[:, n]
        up = torch.cat([beta[:, n + 1, 1:], no_label], dim=1) + skewed_label[:, n]
        beta[:, n] = log_add(exit_weight[:, n], log_add(stay, up))
    return alpha, beta


@regular_alpha_beta.register_fake
def _regular_alpha_beta_shapes(inner_blank, exit_weight, skewed_label):
    return torch.empty_like(inner_blank), torch.empty_like(inner_blank)


def _regular_posterior(alpha, beta, inner_blank, exit_weight, skewed_label, frames):
    """Arc occupancies from skewed alpha/beta: exp(alpha(src) + weight + beta(dst) - log p)."""
    log_likelihood = beta[:, 0, 0].clone()
    total = log_likelihood[:, None, None]
    safe_total = torch.where(torch.isfinite(total), total, torch.zeros_like(total))
    beta_next_diagonal = torch.cat([beta[:, 1:], torch.full_like(beta[:, :1], NEG_INF)], dim=1)
    # Each occupancy is formed in place in one buffer: the lattice may be large beside a pruned joiner.
    label_occupancy = torch.cat([beta_next_diagonal[:, :, 1:], torch.full_like(beta[:, :, :1], NEG_INF)], dim=2)
    label_occupancy.add_(alpha).add_(skewed_label).sub_(safe_total).exp_()
    label_occupancy = _unskew(label_occupancy, frames)
    # The blank arc's target: beta of the next diagonal, or the exit. log_add of the two is their
    # maximum, since every cell has one of them -inf (the exit cell's inner blank weight is -inf).
    blank_occupancy = beta_next_diagonal.add_(inner_blank)
    torch.maximum(blank_occupancy, exit_weight, out=blank_occupancy)
    blank_occupancy.add_(alpha).sub_(safe_total).exp_()
    return log_likelihood, _unskew(blank_occupancy, frames), label_occupancy


# ---- modified topology: frames, node rows t = 0..T ----

def _modified(weights, logit_lengths, target_lengths, alpha_beta):
    """log p and occupancies of the modified topology (`alpha_beta` as in `_regular`)."""
    blank, label = weights
    alpha, beta = alpha_beta(blank, label, logit_lengths, target_lengths)
    return _modified_posterior(alpha, beta, blank, label)


@torch.library.custom_op("memzoo_asr::modified_alpha_beta", mutates_args=())
def modified_alpha_beta(blank: torch.Tensor, label: torch.Tensor, logit_lengths: torch.Tensor,
                        target_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Alpha and beta, each (B, T+1, U+1) over node rows t = 0..T, of the modified topology from its
    (B, T, U+1) weights: one frame after another, as one operator (see `regular_alpha_beta`)."""
    batch, frames, width = blank.shape
    rows = torch.arange(batch, device=blank.device)
    no_label = blank.new_full((batch, 1), NEG_INF)
    alpha = torch.full((batch, frames + 1, width), NEG_INF, dtype=blank.dtype, device=blank.device)
    alpha[:, 0, 0] = 0.0
    for t in range(frames):
        up = torch.cat([no_label, (alpha[:, t] + label[:, t])[:, :-1]], dim=1)
        alpha[:, t + 1] = log_add(alpha[:, t] + blank[:, t], up)
    beta = torch.full_like(alpha, NEG_INF)
    beta[rows, logit_lengths, target_lengths] = 0.0
    for t in range(frames - 1, -1, -1):
        up = torch.cat([beta[:, t + 1, 1:], no_label], dim=1)
        step = log_add(beta[:, t + 1] + blank[:, t], up + label[:, t])
        beta[:, t] = torch.where((logit_lengths == t)[:, None], beta[:, t], step)
    return alpha, beta


@modified_alpha_beta.register_fake
def _modified_alpha_beta_shapes(blank, label, logit_lengths, target_lengths):
    batch, frames, width = blank.shape
    return blank.new_empty(batch, frames + 1, width), blank.new_empty(batch, frames + 1, width)


def _modified_posterior(alpha, beta, blank, label):
    log_likelihood = beta[:, 0, 0].clone()
    total = log_likelihood[:, None, None]
    safe_total = torch.where(torch.isfinite(total), total, torch.zeros_like(total))
    after = beta[:, 1:]
    blank_occupancy = torch.add(alpha[:, :-1], blank).add_(after).sub_(safe_total).exp_()
    label_occupancy = torch.cat([after[:, :, 1:], torch.full_like(after[:, :, :1], NEG_INF)], dim=2)
    label_occupancy.add_(alpha[:, :-1]).add_(label).sub_(safe_total).exp_()
    return log_likelihood, blank_occupancy, label_occupancy

