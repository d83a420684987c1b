"""Dropout whose mask is never stored: it is regenerated from a (seed, element offset) pair.

A seed is drawn from PyTorch's default CPU generator when the forward runs, so `torch.manual_seed`
makes runs reproducible and `torch.utils.checkpoint` (which restores the RNG state before
recomputing) redraws the same seed: recompute and replay are exact. Under torch.compile the draw
and the hash are each one opaque operator of the graph (`zoo::draw_seed`, `zoo::random_words`):
compiled runs draw eager's masks, and a block recomputed inside a compiled graph keeps its seed.
Backward regenerates the mask from the saved seed instead of keeping a (N,) bool tensor alive.

The PyTorch path hashes (seed, element offset) with SplitMix64 and cuts each 64-bit hash into four
16-bit uniforms: a counter-based draw in a few integer tensor ops, cheaper on CPU than
`torch.rand` with a seeded generator (Mersenne Twister, one element at a time). Its p is rounded to
a multiple of 2^-16. The Triton kernels use Philox `tl.rand(seed, offset)`. Each path is
deterministic; the two draw different masks.
"""

from __future__ import annotations

import math

import torch

from zoo.nn.backend import Backend, resolve_backend, tracing_fake_tensors

SEED_BOUND = 2**31 - 1
"""Seeds lie in [0, SEED_BOUND): the range `tl.rand` accepts."""


def check_probability(name: str, p: float) -> None:
    """Raise ValueError unless 0 <= p < 1."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1); got {p}")


def draw_seed(p: float) -> int | torch.Tensor:
    """A fresh mask seed from the default generator, or 0 (nothing drawn) when p == 0. Under
    torch.compile the seed stays a 0-d int64 tensor (reading it into Python would end the graph),
    drawn by an opaque operator (`zoo::draw_seed`) that the compiler keeps for backward rather than
    running again (a recomputed block draws no new mask); the PyTorch path takes either, the
    Triton kernels (eager only) an int."""
    if p == 0:
        return 0
    if torch.compiler.is_compiling():
        return _draw_seed_op(torch.empty(()))
    return int(torch.randint(SEED_BOUND, (), dtype=torch.int64).item())


@torch.library.custom_op("zoo::draw_seed", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def _draw_seed_op(anchor: torch.Tensor) -> torch.Tensor:
    """`anchor`: a CPU tensor, only so that the operator has a device."""
    return torch.randint(SEED_BOUND, (), dtype=torch.int64)


@_draw_seed_op.register_fake
def _(anchor: torch.Tensor) -> torch.Tensor:
    return torch.empty((), dtype=torch.int64)


def _signed(constant: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return constant - (1 << 64) if constant >= 1 << 63 else constant


_GOLDEN_GAMMA = _signed(0x9E3779B97F4A7C15)
_MIX = ((30, _signed(0xBF58476D1CE4E5B9)), (27, _signed(0x94D049BB133111EB)), (31, None))
"""SplitMix64 (Steele et al., 2014): state step, then (shift, multiplier) of each finalizer round."""


def random_words(count: int, seed: int | torch.Tensor, device: torch.device, first: int = 0) -> torch.Tensor:
    """(count,) int64 of uniformly random bits: SplitMix64 of element offsets first + 1 ..
    first + count under `seed`.

    Under fake tensors (the memory estimator's trace) the bits are never read: only the hash's two
    buffers are made, so the trace holds the same bytes in 2 operations instead of 14. Under
    torch.compile the hash is one opaque operator (`zoo::random_words`): its multiplications wrap
    around int64, which Inductor's generated C++ (signed overflow, undefined there) does not
    reproduce."""
    if tracing_fake_tensors():
        words = torch.empty(count, dtype=torch.int64, device=device)
        torch.empty_like(words)  # the shift's scratch buffer, freed when the hash ends
        return words
    if torch.compiler.is_compiling():
        return _random_words_op(count, torch.as_tensor(seed), device, first)
    return _splitmix(count, seed, device, first)


def random_words_at(index: torch.Tensor, seed: int | torch.Tensor) -> torch.Tensor:
    """`random_words`'s words at the int64 offsets `index` (any shape; word i is the word
    `random_words(count, seed, device)[i]`), written over `index` and returned: a mask laid out one
    way can be read in another layout's order without a permuted copy. Eager only (not under
    torch.compile)."""
    if tracing_fake_tensors():
        torch.empty_like(index)  # the hash's scratch buffer, as random_words
        return index
    return _splitmix_from(index.add_(1), seed)


def _splitmix(count: int, seed: int | torch.Tensor, device: torch.device, first: int) -> torch.Tensor:
    return _splitmix_from(torch.arange(first + 1, first + count + 1, dtype=torch.int64, device=device), seed)


def _splitmix_from(z: torch.Tensor, seed: int | torch.Tensor) -> torch.Tensor:
    """SplitMix64 of the 1-based element offsets z (int64, overwritten and returned)."""
    z = z.mul_(_GOLDEN_GAMMA).add_(seed)
    shifted = torch.empty_like(z)
    for shift, multiplier in _MIX:  # z ^= z >>> shift (logical: arithmetic shift, sign bits masked off)
        torch.bitwise_right_shift(z, shift, out=shifted)
        z.bitwise_xor_(shifted.bitwise_and_((1 << (64 - shift)) - 1))
        if multiplier is not None:
            z.mul_(multiplier)
    return z


@torch.library.custom_op("zoo::random_words", mutates_args=())
def _random_words_op(count: int, seed: torch.Tensor, device: torch.device, first: int) -> torch.Tensor:
    return _splitmix(count, seed, device, first)


@_random_words_op.register_fake
def _(count: int, seed: torch.Tensor, device: torch.device, first: int) -> torch.Tensor:
    return torch.empty(count, dtype=torch.int64, device=device)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, seed: int | torch.Tensor, device: torch.device,
              offset: int = 0) -> torch.Tensor:
    """The PyTorch path's mask: a bool tensor of `shape`, True (kept) with probability 1 - p
    (p rounded to a multiple of 2^-16), the same for the same (seed, shape, device). `offset`
    makes it elements offset .. offset + numel of the mask of a larger flat shape, so that a
    mask made in pieces equals the whole one."""
    count = math.prod(shape)
    first, skip = offset // 4, offset % 4  # not divmod: torch.compile takes these on symbolic sizes
    uniforms = random_words(-(-(count + skip) // 4), seed, device, first).view(torch.int16)[skip : skip + count]
    return (uniforms >= drop_threshold(p)).view(shape)


def drop_threshold(p: float) -> int:
    """The int16 uniform below which the PyTorch path drops an element (p rounded to 2^-16)."""
    return round(p * 2**16) - 2**15


def _mask_shape(shape: torch.Size, shared_dims: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` with the shared dimensions set to 1 (one mask value broadcast along each)."""
    shared = {d % len(shape) for d in shared_dims}
    return tuple(1 if d in shared else n for d, n in enumerate(shape))


def apply_dropout(x: torch.Tensor, p: float, seed: int | torch.Tensor, *, inplace: bool = False,
                  shared_dims: tuple[int, ...] = ()) -> torch.Tensor:
    """x * mask / (1 - p) with the mask of (seed, mask shape); x itself when p == 0. The mask has
    x's shape with `shared_dims` set to 1 (broadcast along them). `inplace` overwrites x (for
    buffers the caller owns, such as a gradient it just computed)."""
    if p == 0:
        return x
    scaled = x.mul_(1.0 / (1.0 - p)) if inplace else x.mul(1.0 / (1.0 - p))
    return scaled.mul_(keep_mask(_mask_shape(x.shape, shared_dims), p, seed, x.device))


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, backend, shared_dims):
        ctx.p, ctx.seed, ctx.backend, ctx.shared_dims = p, draw_seed(p), backend, shared_dims
        if backend == "triton":
            from zoo.nn.kernels.elementwise import dropout_forward

            return dropout_forward(x, p, ctx.seed)
        return apply_dropout(x, p, ctx.seed, shared_dims=shared_dims)

    @staticmethod
    def backward(ctx, grad):
        if ctx.backend == "triton":
            from zoo.nn.kernels.elementwise import dropout_forward

            return dropout_forward(grad.contiguous(), ctx.p, ctx.seed), None, None, None
        return apply_dropout(grad, ctx.p, ctx.seed, shared_dims=ctx.shared_dims), None, None, None


def dropout(x: torch.Tensor, p: float, training: bool = True, *, backend: Backend | None = None,
            shared_dims: tuple[int, ...] = ()) -> torch.Tensor:
    """Inverted dropout of x (any shape) that saves no mask for backward (only a seed).
    `shared_dims`: dimensions along which one mask value is shared (AlphaFold's row- and
    column-wise dropout); these take the PyTorch path on every device."""
    check_probability("p", p)
    if not training or p == 0:
        return x
    if any(not -x.ndim <= d < x.ndim for d in shared_dims):
        raise ValueError(f"shared_dims must be dimensions of x {tuple(x.shape)}; got {shared_dims}")
    backend = "torch" if shared_dims else resolve_backend(backend, x)
    return _Dropout.apply(x, p, backend, tuple(shared_dims))
