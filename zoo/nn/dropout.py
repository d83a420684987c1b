"""Dropout whose mask is never stored: it is regenerated from a (seed, element offset) pair.

A seed is drawn from PyTorch's default CPU generator when the forward runs, so `torch.manual_seed`
makes runs reproducible and `torch.utils.checkpoint` (which restores the RNG state before
recomputing) redraws the same seed: recompute and replay are exact. Backward regenerates the mask
from the saved seed instead of keeping a (N,) bool tensor alive.

The PyTorch path draws the mask with a `torch.Generator` seeded with the seed; the Triton kernels
use Philox `tl.rand(seed, offset)`. Each path is deterministic; the two draw different masks.
"""

from __future__ import annotations

import torch

from zoo.nn.backend import Backend, resolve_backend

SEED_BOUND = 2**31 - 1
"""Seeds lie in [0, SEED_BOUND): the range `tl.rand` accepts."""


def check_probability(name: str, p: float) -> None:
    """Raise ValueError unless 0 <= p < 1."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1); got {p}")


def draw_seed(p: float) -> int:
    """A fresh mask seed from the default generator, or 0 (nothing drawn) when p == 0."""
    return int(torch.randint(SEED_BOUND, (1,)).item()) if p > 0 else 0


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, seed: int, device: torch.device) -> torch.Tensor:
    """The PyTorch path's mask: a bool tensor of `shape`, True (kept) with probability 1 - p,
    the same for the same (seed, shape, device)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    # uniform draws compared with p: about twice as fast on CPU as bernoulli_
    return torch.rand(shape, generator=generator, device=device) >= p


def apply_dropout(x: torch.Tensor, p: float, seed: int, *, inplace: bool = False) -> torch.Tensor:
    """x * mask / (1 - p) with the mask of (seed, x.shape); x itself when p == 0. `inplace`
    overwrites x (for buffers the caller owns, such as a gradient it just computed)."""
    if p == 0:
        return x
    scaled = x.mul_(1.0 / (1.0 - p)) if inplace else x.mul(1.0 / (1.0 - p))
    return scaled.mul_(keep_mask(x.shape, p, seed, x.device))


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, backend):
        ctx.p, ctx.seed, ctx.backend = p, draw_seed(p), backend
        if backend == "triton":
            from zoo.nn.kernels.elementwise import dropout_forward

            return dropout_forward(x, p, ctx.seed)
        return apply_dropout(x, p, ctx.seed)

    @staticmethod
    def backward(ctx, grad):
        if ctx.backend == "triton":
            from zoo.nn.kernels.elementwise import dropout_forward

            return dropout_forward(grad.contiguous(), ctx.p, ctx.seed), None, None
        return apply_dropout(grad, ctx.p, ctx.seed), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True, *, backend: Backend | None = None) -> torch.Tensor:
    """Inverted dropout of x (any shape) that saves no mask for backward (only a seed)."""
    check_probability("p", p)
    if not training or p == 0:
        return x
    return _Dropout.apply(x, p, resolve_backend(backend, x))
