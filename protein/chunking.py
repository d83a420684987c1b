"""One chunking utility for every module that needs it (attention, triangle updates, transitions,
outer product mean): run a function on slices of its inputs along one dimension and concatenate,
so the function's intermediate tensors exist for one slice at a time.

The chunk size is given, or derived from a memory budget in bytes and the bytes one slice needs
(each module states that estimate). None (no chunk size, no budget) runs the whole input at once.
`per_chunk` moves a position-wise first step (a LayerNorm) into the chunks, so that its output
is not kept whole for backward either.

When autograd records, each chunk runs under `torch.utils.checkpoint`: backward recomputes the
chunk's intermediates one chunk at a time instead of keeping every chunk's (the attention
probabilities of all rows at once would be as large as without chunking). So chunking bounds
training memory too, at the price of one more forward of the chunked function.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint


def chunk_size_for(budget_bytes: int | None, bytes_per_slice: int) -> int | None:
    """Slices that fit in `budget_bytes` (at least 1), or None (no limit) when there is no budget."""
    if budget_bytes is None:
        return None
    if budget_bytes <= 0 or bytes_per_slice <= 0:
        raise ValueError(f"budget_bytes and bytes_per_slice must be > 0; got {budget_bytes} and {bytes_per_slice}")
    return max(1, budget_bytes // bytes_per_slice)


def chunked(function: Callable[..., torch.Tensor], sliced: tuple[torch.Tensor, ...], dim: int,
            chunk_size: int | None, out_dim: int | None = None, whole: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """function(*sliced, *whole), computed on slices of every tensor of `sliced` along `dim`
    (chunk_size at a time; `whole` passed entire to every chunk) and concatenated along `out_dim`
    (default `dim`) of the output. The function must treat positions along `dim` independently (a
    batch-like dimension), and its output must hold them along `out_dim`. A sliced tensor of size 1
    along `dim` is broadcast (passed whole).

    Hand the function every tensor it reads through `sliced` or `whole`, never by closure: a
    checkpoint keeps its arguments as saved tensors, which an enclosing recompute (of an Evoformer
    block) releases, but a captured tensor lives as long as the autograd graph."""
    size = max(t.shape[dim] for t in sliced)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None; got {chunk_size}")
    if chunk_size is None or chunk_size >= size:
        return function(*sliced, *whole)
    outputs = []
    recording = torch.is_grad_enabled()
    for start in range(0, size, chunk_size):
        pieces = tuple(t if t.shape[dim] == 1 else t.narrow(dim, start, min(chunk_size, size - start)) for t in sliced)
        outputs.append(checkpoint(function, *pieces, *whole, use_reentrant=False) if recording
                       else function(*pieces, *whole))
    return torch.cat(outputs, dim=dim if out_dim is None else out_dim)


def per_chunk(first: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, chunk_size: int | None
              ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """(source, step) for a module that would chunk first(x), where `first` treats positions
    independently (a LayerNorm): with a chunk size, (x, first): each chunk applies `first` to its
    own slice of x (one more cheap pass, and first(x) is never kept whole); without, (first(x),
    identity): computed once, as an unchunked model does."""
    if chunk_size is None:
        return first(x), _identity
    return x, first


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x
