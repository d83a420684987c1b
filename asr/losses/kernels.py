"""Triton kernels of the transducer losses (CUDA, or the interpreter under TRITON_INTERPRET=1).

- Lattice recursions: one program per sample walks the anti-diagonals (regular topology) or frames
  (modified) in order, holding the current diagonal of alpha or beta in registers, one lane per
  lattice column u. The neighbour in column u - 1 (or u + 1) is read back from the previous step's
  row in global memory after a block barrier.
- Row passes over the (rows, V) joiner output: an online max and sum of exp per row, and the fused
  log-softmax gradient written row by row (in place when `out` is the logits).
Each recursion computes in the dtype of its buffers (float64, `asr.losses.lattice.LATTICE_DTYPE`); the
row passes in float32 (float64 for float64 logits), their per-row float64 parts done by the host
(asr.losses.log_softmax_gradient). Hosts initialise alpha and beta to -inf except their start nodes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoo.nn.kernels.launch import warps_for

MAX_WIDTH = 16384
"""Widest lattice (U+1 columns) a recursion program holds in registers."""

ROW_BLOCK = 1024
"""Columns of a (rows, V) row that the row passes read per step (4 warps: 8 a thread)."""


@triton.jit
def _log_add(a, b):
    top = tl.maximum(a, b)
    safe = tl.where(top == float("-inf"), 0.0, top)
    return safe + tl.log(tl.exp(a - safe) + tl.exp(b - safe))


@triton.jit
def _regular_alpha_kernel(blank_ptr, label_ptr, alpha_ptr, diagonals, width, BLOCK: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * diagonals * width
    u = tl.arange(0, BLOCK)
    inside = u < width
    shifted = inside & (u > 0)
    previous = tl.load(alpha_ptr + base + u, mask=inside, other=float("-inf"))
    for n in range(1, diagonals):
        row = base + (n - 1) * width
        stay = previous + tl.load(blank_ptr + row + u, mask=inside, other=float("-inf"))
        up = (tl.load(alpha_ptr + row + u - 1, mask=shifted, other=float("-inf"))
              + tl.load(label_ptr + row + u - 1, mask=shifted, other=float("-inf")))
        current = _log_add(stay, up)
        tl.store(alpha_ptr + row + width + u, current, mask=inside)
        tl.debug_barrier()
        previous = current


@triton.jit
def _regular_beta_kernel(blank_ptr, exit_ptr, label_ptr, beta_ptr, diagonals, width, BLOCK: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * diagonals * width
    u = tl.arange(0, BLOCK)
    inside = u < width
    shifted = (u + 1) < width
    last = base + (diagonals - 1) * width
    following = tl.load(exit_ptr + last + u, mask=inside, other=float("-inf"))
    tl.store(beta_ptr + last + u, following, mask=inside)
    tl.debug_barrier()
    for step in range(1, diagonals):
        row = base + (diagonals - 1 - step) * width
        stay = following + tl.load(blank_ptr + row + u, mask=inside, other=float("-inf"))
        up = (tl.load(beta_ptr + row + width + u + 1, mask=shifted, other=float("-inf"))
              + tl.load(label_ptr + row + u, mask=inside, other=float("-inf")))
        current = _log_add(tl.load(exit_ptr + row + u, mask=inside, other=float("-inf")), _log_add(stay, up))
        tl.store(beta_ptr + row + u, current, mask=inside)
        tl.debug_barrier()
        following = current


@triton.jit
def _modified_alpha_kernel(blank_ptr, label_ptr, alpha_ptr, frames, width, BLOCK: tl.constexpr):
    program = tl.program_id(0).to(tl.int64)
    weights, nodes = program * frames * width, program * (frames + 1) * width
    u = tl.arange(0, BLOCK)
    inside = u < width
    shifted = inside & (u > 0)
    previous = tl.load(alpha_ptr + nodes + u, mask=inside, other=float("-inf"))
    for t in range(0, frames):
        stay = previous + tl.load(blank_ptr + weights + t * width + u, mask=inside, other=float("-inf"))
        up = (tl.load(alpha_ptr + nodes + t * width + u - 1, mask=shifted, other=float("-inf"))
              + tl.load(label_ptr + weights + t * width + u - 1, mask=shifted, other=float("-inf")))
        current = _log_add(stay, up)
        tl.store(alpha_ptr + nodes + (t + 1) * width + u, current, mask=inside)
        tl.debug_barrier()
        previous = current


@triton.jit
def _modified_beta_kernel(blank_ptr, label_ptr, beta_ptr, frames, width, BLOCK: tl.constexpr):
    program = tl.program_id(0).to(tl.int64)
    weights, nodes = program * frames * width, program * (frames + 1) * width
    u = tl.arange(0, BLOCK)
    inside = u < width
    shifted = (u + 1) < width
    following = tl.load(beta_ptr + nodes + frames * width + u, mask=inside, other=float("-inf"))
    for step in range(1, frames + 1):
        t = frames - step
        stay = following + tl.load(blank_ptr + weights + t * width + u, mask=inside, other=float("-inf"))
        up = (tl.load(beta_ptr + nodes + (t + 1) * width + u + 1, mask=shifted, other=float("-inf"))
              + tl.load(label_ptr + weights + t * width + u, mask=inside, other=float("-inf")))
        # The host's initial value holds the end node (T_b, U_b); every other node starts at -inf.
        current = _log_add(tl.load(beta_ptr + nodes + t * width + u, mask=inside, other=float("-inf")),
                           _log_add(stay, up))
        tl.store(beta_ptr + nodes + t * width + u, current, mask=inside)
        tl.debug_barrier()
        following = current


def _lattice_block(width: int) -> int:
    if width > MAX_WIDTH:
        raise ValueError(f"the Triton lattice kernels take at most {MAX_WIDTH} columns (U+1); got {width}")
    return triton.next_power_of_2(width)


def regular_alpha_beta(inner_blank: torch.Tensor, exit_weight: torch.Tensor, label: torch.Tensor):
    """Skewed (B, T+U, U+1) alpha and beta of the regular topology (see lattice.regular_alpha_beta)."""
    inner_blank, exit_weight, label = inner_blank.contiguous(), exit_weight.contiguous(), label.contiguous()
    batch, diagonals, width = inner_blank.shape
    alpha = torch.full_like(inner_blank, float("-inf"))
    alpha[:, 0, 0] = 0.0
    beta = torch.full_like(inner_blank, float("-inf"))
    block = _lattice_block(width)
    warps = warps_for(block)
    _regular_alpha_kernel[(batch,)](inner_blank, label, alpha, diagonals, width, BLOCK=block, num_warps=warps)
    _regular_beta_kernel[(batch,)](inner_blank, exit_weight, label, beta, diagonals, width, BLOCK=block,
                                   num_warps=warps)
    return alpha, beta


def modified_alpha_beta(blank: torch.Tensor, label: torch.Tensor, logit_lengths: torch.Tensor,
                        target_lengths: torch.Tensor):
    """(B, T+1, U+1) alpha and beta of the modified topology (see lattice.modified_alpha_beta)."""
    blank, label = blank.contiguous(), label.contiguous()
    batch, frames, width = blank.shape
    alpha = blank.new_full((batch, frames + 1, width), float("-inf"))
    alpha[:, 0, 0] = 0.0
    beta = torch.full_like(alpha, float("-inf"))
    beta[torch.arange(batch, device=blank.device), logit_lengths, target_lengths] = 0.0
    block = _lattice_block(width)
    warps = warps_for(block)
    _modified_alpha_kernel[(batch,)](blank, label, alpha, frames, width, BLOCK=block, num_warps=warps)
    _modified_beta_kernel[(batch,)](blank, label, beta, frames, width, BLOCK=block, num_warps=warps)
    return alpha, beta


@triton.jit
def _row_max_and_sum_kernel(x_ptr, top_ptr, total_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    kind = top_ptr.dtype.element_ty
    top = tl.full((BLOCK,), float("-inf"), kind)
    total = tl.zeros((BLOCK,), kind)
    for start in range(0, vocab, BLOCK):
        x = tl.load(x_ptr + row * vocab + start + cols, mask=start + cols < vocab, other=float("-inf")).to(kind)
        new_top = tl.maximum(top, x)
        safe = tl.where(new_top == float("-inf"), 0.0, new_top)
        total = total * tl.exp(top - safe) + tl.exp(x - safe)
        top = new_top
    best = tl.max(top, axis=0)
    safe_best = tl.where(best == float("-inf"), 0.0, best)
    tl.store(top_ptr + row, safe_best)
    tl.store(total_ptr + row, tl.sum(total * tl.exp(top - safe_best), axis=0))


@triton.jit
def _gradient_kernel(x_ptr, high_ptr, low_ptr, node_ptr, blank_entry_ptr, labels_ptr, label_entry_ptr, out_ptr, vocab,
                     blank, clamp, HAS_NORMALISER: tl.constexpr, HAS_CLAMP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    kind = node_ptr.dtype.element_ty
    node = tl.load(node_ptr + row)
    label = tl.load(labels_ptr + row)
    if HAS_NORMALISER:
        high = tl.load(high_ptr + row)
        low = tl.load(low_ptr + row)
    for start in range(0, vocab, BLOCK):
        v = start + cols
        inside = v < vocab
        if HAS_NORMALISER:
            x = tl.load(x_ptr + row * vocab + v, mask=inside, other=float("-inf")).to(kind)
            grad = tl.exp((x - high) - low) * node
        else:
            grad = tl.zeros((BLOCK,), kind)
        if HAS_CLAMP:
            grad = tl.minimum(tl.maximum(grad, -clamp), clamp)
        # The blank and label columns take the host's exact entries below; no lane writes them here.
        tl.store(out_ptr + row * vocab + v, grad.to(out_ptr.dtype.element_ty),
                 mask=inside & (v != blank) & (v != label))
    out_kind = out_ptr.dtype.element_ty
    tl.store(out_ptr + row * vocab + blank, tl.load(blank_entry_ptr + row).to(out_kind))
    tl.store(out_ptr + row * vocab + label, tl.load(label_entry_ptr + row).to(out_kind))


def _row_block(vocab: int) -> int:
    return min(triton.next_power_of_2(vocab), ROW_BLOCK)


def row_max_and_sum(rows: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, V) -> the (R,) row maxima (0 for a row of -inf) and sums of exp(x - max), in `dtype`."""
    rows = rows.contiguous()
    top = torch.empty(rows.shape[0], dtype=dtype, device=rows.device)
    total = torch.empty_like(top)
    if rows.shape[0]:
        _row_max_and_sum_kernel[(rows.shape[0],)](rows, top, total, rows.shape[1], BLOCK=_row_block(rows.shape[1]))
    return top, total


def write_gradient(logits, high, low, node, blank, blank_entry, labels, label_entry, clamp, out):
    """See asr.losses.log_softmax_gradient.write_gradient: high + low is the normaliser (None without
    one), node and the blank / label entries are (R,) in the working dtype."""
    count, vocab = logits.shape
    if count:
        _gradient_kernel[(count,)](logits, high if high is not None else node, low if low is not None else node,
                                   node.contiguous(), blank_entry.contiguous(), labels.contiguous(),
                                   label_entry.contiguous(), out, vocab, blank, float(clamp or 0.0),
                                   HAS_NORMALISER=high is not None, HAS_CLAMP=clamp is not None,
                                   BLOCK=_row_block(vocab))
    return out
