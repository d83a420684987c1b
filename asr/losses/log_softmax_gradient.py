"""The two passes over the (rows, V) joiner output that a fused transducer loss needs.

`row_logsumexp` gives the log-softmax normaliser of each row; `write_gradient` writes
    d loss / d logits[r, v] = softmax[r, v] * node[r] - blank_arc[r] * [v = blank] - label_arc[r] * [v = label[r]]
into `out` (which may be the logits' own storage). Neither forms any other (rows, V) tensor: the
PyTorch path works in chunks of rows, the Triton kernels one row per program.

Precision: what is per row (the normaliser, the occupancies) is float64 (`LATTICE_DTYPE`); what is
per element runs in the logits' working dtype (float32, float64 for float64 logits). The normaliser
is max + log(sum exp(x - max)) with the max and the sum in float32 and their combination in float64.
A softmax entry is exp((x - n_hi) - n_lo) with n_hi + n_lo the float64 normaliser split into two
float32 numbers: the entries that matter, near the row's top, have a small, nearly exact x - n_hi.
The blank and label entries, where softmax x node and the arc occupancy can cancel, are formed
wholly in float64 from one logit each, by the host for both backends ((R,) vectors).
"""

from __future__ import annotations

import torch

from asr.losses.lattice import LATTICE_DTYPE
from zoo.nn.backend import resolve_backend

CHUNK_ELEMENTS = 1 << 22
"""Rows are processed in chunks of about this many elements (16 MiB in float32) on the PyTorch path."""


def _row_chunks(rows: int, width: int):
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def working_dtype(logits: torch.Tensor) -> torch.dtype:
    """dtype of the element-wise work on `logits`: float32, float64 for float64 logits."""
    return torch.promote_types(logits.dtype, torch.float32)


def _finite_max(rows: torch.Tensor) -> torch.Tensor:
    """(R, V) -> (R,) row maxima, 0 for a row of -inf (so that exp(x - max) stays 0, not nan)."""
    top = rows.amax(-1)
    return top.masked_fill_(top == float("-inf"), 0.0)


def row_logsumexp(logits: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """(..., V) -> (...) log sum_v exp(logits[..., v]) in `LATTICE_DTYPE` (float64): max + log(sum
    exp(x - max)) with the max and the sum in the working dtype and their combination in float64."""
    rows = logits.reshape(-1, logits.shape[-1])
    work = working_dtype(logits)
    if resolve_backend(backend, logits) == "triton":
        from asr.losses.kernels import row_max_and_sum

        top, total = row_max_and_sum(rows, work)
    else:
        top = torch.empty(rows.shape[0], dtype=work, device=logits.device)
        total = torch.empty_like(top)
        for chunk in _row_chunks(*rows.shape):
            top[chunk] = _finite_max(rows[chunk])
            # The subtraction promotes a half-precision chunk to `work`: no copy of the logits first.
            total[chunk] = torch.sub(rows[chunk], top[chunk, None]).exp_().sum(-1)
    return (top.to(LATTICE_DTYPE) + total.to(LATTICE_DTYPE).log()).view(logits.shape[:-1])


def _exact_entry(logit: torch.Tensor, normaliser: torch.Tensor | None, node: torch.Tensor, own_arc: torch.Tensor,
                 other_arc: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """The gradient entry of the blank or label column, wholly in float64: softmax x node less its own
    arc occupancy, and the other arc's where both arcs carry the same symbol (`shared`)."""
    softmax = torch.zeros_like(node) if normaliser is None else (logit.to(node.dtype) - normaliser).exp() * node
    return softmax - own_arc - torch.where(shared, other_arc, torch.zeros_like(other_arc))


def write_gradient(logits: torch.Tensor, normaliser: torch.Tensor | None, node: torch.Tensor, blank: int,
                   blank_arc: torch.Tensor, labels: torch.Tensor, label_arc: torch.Tensor, clamp: float | None,
                   out: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Write the loss gradient of every row into `out` and return it.

    logits, out: (R, V) contiguous (`out` may be `logits`); normaliser: (R,) float64 log-softmax
    normaliser, or None when the logits already are log-probabilities (then there is no softmax
    term); node, blank_arc, label_arc: (R,) float64 occupancies; labels: (R,) int64 symbol of each
    row's label arc; clamp: bound on the gradient's magnitude, or None. Precision: see the module
    docstring.
    """
    work = working_dtype(logits)
    # The two exact entries of each row, read before `out` (perhaps the logits) is written.
    shared = labels == blank
    blank_entry = _exact_entry(logits[:, blank], normaliser, node, blank_arc, label_arc, shared)
    label_entry = _exact_entry(logits.gather(1, labels[:, None])[:, 0], normaliser, node, label_arc, blank_arc, shared)
    if clamp is not None:
        blank_entry, label_entry = blank_entry.clamp(-clamp, clamp), label_entry.clamp(-clamp, clamp)
    blank_entry, label_entry = blank_entry.to(work), label_entry.to(work)
    high = low = None
    if normaliser is not None:
        high = normaliser.to(work)
        low = (normaliser - high.to(normaliser.dtype)).to(work)
    node = node.to(work)
    if resolve_backend(backend, logits) == "triton":
        from asr.losses.kernels import write_gradient as kernel

        return kernel(logits, high, low, node, blank, blank_entry, labels, label_entry, clamp, out)
    for chunk in _row_chunks(*logits.shape):
        if normaliser is None:
            rows = torch.zeros(logits[chunk].shape, dtype=work, device=logits.device)
        else:
            rows = torch.sub(logits[chunk], high[chunk, None]).sub_(low[chunk, None])  # promoted to `work`
            rows.exp_().mul_(node[chunk, None])
        if clamp is not None:
            rows.clamp_(-clamp, clamp)
        index = torch.arange(rows.shape[0], device=rows.device)
        rows[index, blank] = blank_entry[chunk]
        rows[index, labels[chunk]] = label_entry[chunk]
        out[chunk] = rows
    return out
