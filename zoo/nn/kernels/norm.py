"""Triton kernels: (dropout + residual add +) LayerNorm / RMSNorm, one row per program.

Forward writes y, the residual sum s when asked, and a float32 rstd per row. Backward recovers
x_hat = (y - bias) / weight, so it reads y instead of s; each program also reduces the weight
and bias gradients over a group of rows into one partial row, summed on the host. The dropout
mask of element (row, col) is `tl.rand(seed, row * H + col) >= p`, the same 64-bit offsets as the
element-wise kernels, the seed not specialised either. Programs take `warps_for(BLOCK)` warps, so wide rows do not spill registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoo.nn.kernels.launch import warps_for

ROWS_PER_PROGRAM = 16


@triton.jit(do_not_specialize=["seed"])
def _forward_kernel(x_ptr, residual_ptr, weight_ptr, bias_ptr, y_ptr, sum_ptr, rstd_ptr, width, p, seed, eps,
                    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                    DROP: tl.constexpr, NORM: tl.constexpr, IS_RMS: tl.constexpr, STORE_SUM: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    offsets = row.to(tl.int64) * width + cols
    s = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    if DROP:
        s = tl.where(tl.rand(seed, offsets) >= p, s / (1.0 - p), 0.0)
    if HAS_RESIDUAL:
        s += tl.load(residual_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    if STORE_SUM:
        tl.store(sum_ptr + offsets, s.to(sum_ptr.dtype.element_ty), mask=inside)
    if NORM:
        if IS_RMS:
            centred = s
        else:
            centred = tl.where(inside, s - tl.sum(s, axis=0) / width, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / width + eps)
        y = centred * rstd
        if HAS_WEIGHT:
            y = y * tl.load(weight_ptr + cols, mask=inside, other=1.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=inside)
        tl.store(rstd_ptr + row, rstd)


@triton.jit(do_not_specialize=["seed"])
def _backward_kernel(grad_y_ptr, grad_sum_ptr, y_ptr, rstd_ptr, weight_ptr, bias_ptr, total_ptr, grad_x_ptr,
                     partial_w_ptr, partial_b_ptr, rows, width, p, seed,
                     HAS_GRAD_Y: tl.constexpr, HAS_GRAD_SUM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     HAS_BIAS: tl.constexpr, DROP: tl.constexpr, IS_RMS: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    weight = tl.full((BLOCK,), 1.0, tl.float32)
    bias = tl.zeros((BLOCK,), tl.float32)
    if HAS_WEIGHT:
        weight = tl.load(weight_ptr + cols, mask=inside, other=1.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    acc_w = tl.zeros((BLOCK,), tl.float32)
    acc_b = tl.zeros((BLOCK,), tl.float32)
    for i in range(ROWS):
        row = program * ROWS + i
        valid = inside & ((cols * 0 + row) < rows)
        offsets = row.to(tl.int64) * width + cols
        total = tl.zeros((BLOCK,), tl.float32)
        if HAS_GRAD_Y:
            grad_y = tl.load(grad_y_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
            rstd = tl.load(rstd_ptr + tl.minimum(row, rows - 1))
            x_hat = tl.where(valid, (y - bias) / weight, 0.0)
            scaled = grad_y * weight
            projection = tl.sum(scaled * x_hat, axis=0) / width
            if IS_RMS:
                total = rstd * (scaled - x_hat * projection)
            else:
                total = rstd * (scaled - tl.sum(scaled, axis=0) / width - x_hat * projection)
            acc_w += grad_y * x_hat
            acc_b += grad_y
        if HAS_GRAD_SUM:
            total += tl.load(grad_sum_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
        tl.store(total_ptr + offsets, total, mask=valid)
        grad_x = total
        if DROP:
            grad_x = tl.where(tl.rand(seed, offsets) >= p, total / (1.0 - p), 0.0)
        tl.store(grad_x_ptr + offsets, grad_x, mask=valid)
    partial = program.to(tl.int64) * width + cols
    tl.store(partial_w_ptr + partial, acc_w, mask=inside)
    tl.store(partial_b_ptr + partial, acc_b, mask=inside)


def norm_forward(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                 bias: torch.Tensor | None, p: float, seed: int, eps: float, kind: str | None, return_sum: bool):
    """x, residual (..., H) of N rows -> (y (..., H) or None, s (..., H) or None, rstd (N,) float32 or None)."""
    x = x.contiguous()
    width = x.shape[-1]
    rows = x.numel() // width
    store_sum = return_sum or kind is None
    sum_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    s = torch.empty(x.shape, dtype=sum_dtype, device=x.device) if store_sum else None
    y = torch.empty_like(x) if kind is not None else None
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device) if kind is not None else None
    placeholder = x
    block = triton.next_power_of_2(width)
    _forward_kernel[(rows,)](
        x, placeholder if residual is None else residual.contiguous(), placeholder if weight is None else weight,
        placeholder if bias is None else bias, placeholder if y is None else y, placeholder if s is None else s,
        placeholder if rstd is None else rstd, width, p, seed, eps,
        HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, DROP=p > 0,
        NORM=kind is not None, IS_RMS=kind == "rms", STORE_SUM=store_sum, BLOCK=block, num_warps=warps_for(block))
    return y, s, rstd


def norm_backward(grad_y, grad_sum, y, rstd, weight, bias, p, seed, kind, needs):
    """-> (d s (N, H) float32, d x (N, H) float32, d weight (H,) float32 or None, d bias or None)."""
    reference = grad_y if grad_y is not None else grad_sum
    rows, width = reference.shape
    programs = triton.cdiv(rows, ROWS_PER_PROGRAM)
    total = torch.empty((rows, width), dtype=torch.float32, device=reference.device)
    grad_x = torch.empty_like(total)
    partial_w = torch.zeros((programs, width), dtype=torch.float32, device=reference.device)
    partial_b = torch.zeros_like(partial_w)
    has_grad_y = grad_y is not None and kind is not None
    placeholder = total
    block = triton.next_power_of_2(width)
    _backward_kernel[(programs,)](
        grad_y.contiguous() if has_grad_y else placeholder, grad_sum.contiguous() if grad_sum is not None else placeholder,
        y if has_grad_y else placeholder, rstd if has_grad_y else placeholder,
        weight if weight is not None else placeholder, bias if bias is not None else placeholder,
        total, grad_x, partial_w, partial_b, rows, width, p, seed,
        HAS_GRAD_Y=has_grad_y, HAS_GRAD_SUM=grad_sum is not None, HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None, DROP=p > 0, IS_RMS=kind == "rms", ROWS=ROWS_PER_PROGRAM,
        BLOCK=block, num_warps=warps_for(block))
    grad_w = partial_w.sum(0) if has_grad_y and weight is not None and needs[0] else None
    grad_b = partial_b.sum(0) if has_grad_y and bias is not None and needs[1] else None
    return total, grad_x, grad_w, grad_b
