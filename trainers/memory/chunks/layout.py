"""Model states in chunks (PatrickStar): tensors laid out in creation order, so that one block's
tensors share chunks and a chunk moves between memory tiers as one piece.

A tensor never spans two chunks: a chunk holds the next tensors while they fit, and the next
chunk starts where one does not. The chunk size trades the room left at the chunks' ends (a
size near the largest tensor wastes the most when sizes vary) against the granularity of
placement; `search_chunk_size` picks, among sizes from the largest tensor to twice it, the one whose
chunks hold the tensors in the least memory, as PatrickStar searches its chunk size over the model.

A few tensors can be much larger than the rest (a language model's vocabulary embedding: 50,257
rows against a block's d x 4d). Sizing every chunk for them would make the unit of placement as
large as they are, so the search can be bounded (`largest`: the largest tensor of the model's
repeated blocks), and a tensor above the chunk size gets a chunk of its own, exactly its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CHUNK_ALIGNMENT = 1024
"""Chunk sizes the search tries are multiples of this many elements."""


@dataclass(frozen=True)
class ChunkLayout:
    """Where each tensor of a sequence lives in chunks."""

    chunk_numel: int
    """Elements of a shared chunk; a tensor larger than this has a chunk of its own."""
    slots: tuple[tuple[int, int], ...]
    """(chunk index, offset in elements) of each tensor, in the order laid out."""
    numels: tuple[int, ...]
    """Elements of each tensor, in the same order."""
    sizes: tuple[int, ...]
    """Elements of each chunk: chunk_numel, or the tensor's own for a tensor larger than it."""

    @property
    def chunks(self) -> int:
        """Number of chunks."""
        return len(self.sizes)

    @property
    def numel(self) -> int:
        """Elements of all the chunks together."""
        return sum(self.sizes)

    @property
    def waste(self) -> float:
        """Share of the chunks' elements that hold no tensor."""
        return 1 - sum(self.numels) / self.numel if self.numel else 0.0

    def members(self) -> list[list[int]]:
        """Indices of the tensors of each chunk, in order."""
        members: list[list[int]] = [[] for _ in self.sizes]
        for index, (chunk, _) in enumerate(self.slots):
            members[chunk].append(index)
        return members


def lay_out(numels: Sequence[int], chunk_numel: int) -> ChunkLayout:
    """Tensors of `numels` elements in chunks of `chunk_numel`, in order (module docstring); a
    tensor larger than `chunk_numel` goes into a chunk of its own, and the tensors after it keep
    filling the open chunk."""
    if not numels:
        raise ValueError("numels must name at least one tensor; got none")
    if chunk_numel < 1:
        raise ValueError(f"chunk_numel must be at least 1; got {chunk_numel}")
    slots, sizes, open_chunk, offset = [], [], None, 0
    for numel in numels:
        if numel > chunk_numel:
            slots.append((len(sizes), 0))
            sizes.append(numel)
            continue
        if open_chunk is None or offset + numel > chunk_numel:
            open_chunk, offset = len(sizes), 0
            sizes.append(chunk_numel)
        slots.append((open_chunk, offset))
        offset += numel
    return ChunkLayout(chunk_numel, tuple(slots), tuple(numels), tuple(sizes))


def search_chunk_size(numels: Sequence[int], sizes: int = 64, widest: float = 2.0,
                      largest: int | None = None) -> ChunkLayout:
    """The layout of least total memory among `sizes` chunk sizes from the largest tensor to
    `widest` times it (multiples of `CHUNK_ALIGNMENT`, at most the sum of all); ties go to the
    smaller chunk. The bound keeps chunks a unit of placement: without it one chunk holding
    everything would waste the least. `largest` bounds the tensors the chunks are sized for:
    larger ones get chunks of their own."""
    if not numels:
        raise ValueError("numels must name at least one tensor; got none")
    fitted = [n for n in numels if largest is None or n <= largest] or [min(numels)]
    smallest = -(-max(fitted) // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
    widest_size = max(smallest, min(int(widest * max(fitted)), sum(fitted)))
    step = max((widest_size - smallest) // max(sizes - 1, 1), 1)
    candidates = sorted({-(-size // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
                         for size in range(smallest, widest_size + 1, step)})
    return min((lay_out(numels, size) for size in candidates), key=lambda layout: (layout.numel, layout.chunk_numel))


def chunk_owners(sizes: Sequence[int], ranks: int) -> list[int]:
    """The rank that owns each chunk of `sizes` elements among `ranks` (ZeRO over chunks): the
    largest chunk first, each to the rank owning the fewest elements so far (the lowest rank
    among equals), so that ranks hold nearly equal shares even when a few chunks are large."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1; got {ranks}")
    owned = [0] * ranks
    owners = [0] * len(sizes)
    for chunk in sorted(range(len(sizes)), key=lambda index: (-sizes[index], index)):
        rank = min(range(ranks), key=lambda r: (owned[r], r))
        owners[chunk] = rank
        owned[rank] += sizes[chunk]
    return owners
