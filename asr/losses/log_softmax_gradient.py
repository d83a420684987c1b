"""The two passes over the (rows, V) joiner output that a fused transducer loss needs.

`row_logsumexp` gives the log-softmax normaliser of each row; `write_gradient` writes
    d loss / d logits[r, v] = softmax[r, v] * node[r] - blank_arc[r] * [v = blank] - label_arc[r] * [v = label[r]]
into `out` (which may be the logits' own storage). Neither forms any other (rows, V) tensor: the
PyTorch path works in chunks of rows, the Triton kernels one row per program.
"""

from __future__ import annotations

import torch

from zoo.nn.backend import resolve_backend

CHUNK_ELEMENTS = 1 << 22
"""Rows are processed in chunks of about this many elements (16 MiB in float32) on the PyTorch path."""


def _row_chunks(rows: int, width: int):
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def row_logsumexp(logits: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """(..., V) -> (...) float32 (float64 for float64 input) log sum_v exp(logits[..., v])."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    rows = logits.reshape(-1, logits.shape[-1])
    if resolve_backend(backend, logits) == "triton":
        from asr.losses.kernels import row_logsumexp as kernel

        return kernel(rows, dtype).view(logits.shape[:-1])
    out = torch.empty(rows.shape[0], dtype=dtype, device=logits.device)
    for chunk in _row_chunks(*rows.shape):
        out[chunk] = torch.logsumexp(rows[chunk].to(dtype), dim=-1)
    return out.view(logits.shape[:-1])


def write_gradient(logits: torch.Tensor, normaliser: torch.Tensor | None, node: torch.Tensor, blank: int,
                   blank_arc: torch.Tensor, labels: torch.Tensor, label_arc: torch.Tensor, clamp: float | None,
                   out: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Write the loss gradient of every row into `out` and return it.

    logits, out: (R, V) contiguous (`out` may be `logits`); normaliser: (R,) log-softmax normaliser, or
    None when the logits already are log-probabilities (then there is no softmax term); node, blank_arc,
    label_arc: (R,) occupancies; labels: (R,) int64 symbol of each row's label arc; clamp: bound on the
    gradient's magnitude, or None.
    """
    if resolve_backend(backend, logits) == "triton":
        from asr.losses.kernels import write_gradient as kernel

        return kernel(logits, normaliser, node, blank, blank_arc, labels, label_arc, clamp, out)
    dtype = node.dtype
    for chunk in _row_chunks(*logits.shape):
        if normaliser is None:
            rows = torch.zeros(logits[chunk].shape, dtype=dtype, device=logits.device)
        else:
            rows = torch.sub(logits[chunk], normaliser[chunk, None]).exp_().mul_(node[chunk, None])
        index = torch.arange(rows.shape[0], device=rows.device)
        rows[index, blank] -= blank_arc[chunk]
        rows.index_put_((index, labels[chunk]), -label_arc[chunk], accumulate=True)
        if clamp is not None:
            rows.clamp_(-clamp, clamp)
        out[chunk] = rows
    return out
