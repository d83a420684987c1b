"""Triton kernel: one chunk's cross-entropy and its logit gradient, written over the logits.

One program per token row: an online max / sum-exp pass gives the float32 log-sum-exp and the
row's loss; a second pass overwrites the row with (softmax - (1 - eps) onehot - eps / V) * scale,
zero for ignored rows. Two reads and one write of the (C, V) chunk, where the PyTorch path makes
about five passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 1024


@triton.jit
def _chunk_kernel(logits_ptr, labels_ptr, loss_ptr, scale_ptr, vocab, row_stride, ignore_index, smoothing,
                  SMOOTH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * row_stride
    label = tl.load(labels_ptr + row).to(tl.int32)
    running_max = -float("inf")
    running_sum = 0.0
    logit_total = 0.0
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        running_max = new_max
        if SMOOTH:
            logit_total += tl.sum(tl.where(cols < vocab, x, 0.0), axis=0)
    lse = running_max + tl.log(running_sum)
    valid = label != ignore_index
    target = tl.minimum(tl.maximum(label, 0), vocab - 1)
    loss = lse - tl.load(base + target).to(tl.float32)
    if SMOOTH:
        loss = (1.0 - smoothing) * loss + smoothing * (lse - logit_total / vocab)
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    scale = tl.where(valid, tl.load(scale_ptr), 0.0)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < vocab
        x = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) - smoothing / vocab
        grad = tl.where(cols == target, grad - (1.0 - smoothing), grad) * scale
        tl.store(base + cols, grad, mask=inside)


def chunk_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, label_smoothing: float,
                        scale: torch.Tensor) -> torch.Tensor:
    """logits (C, V) float32, overwritten by d loss / d logits; labels (C,) int; scale: 0-d float32
    tensor (1 / labelled tokens for "mean"). Returns each row's loss (C,), zero where ignored."""
    rows, vocab = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _chunk_kernel[(rows,)](logits, labels, loss, scale, vocab, logits.stride(0), ignore_index, label_smoothing,
                           SMOOTH=label_smoothing > 0, BLOCK=min(BLOCK_V, triton.next_power_of_2(vocab)))
    return loss
