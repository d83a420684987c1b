"""Model states in fixed-size chunks (PatrickStar): tensors laid out in creation order, so that one
block's tensors share chunks and a chunk moves between memory tiers as one piece.

A tensor never spans two chunks: a chunk holds the next tensors while they fit, and the next
chunk starts where one does not. The chunk size trades the room left at the chunks' ends (a
size near the largest tensor wastes the most when sizes vary) against the granularity of
placement; `search_chunk_size` picks, among sizes from the largest tensor to twice it, the one whose
chunks hold the tensors in the least memory, as PatrickStar searches its chunk size over the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CHUNK_ALIGNMENT = 1024
"""Chunk sizes the search tries are multiples of this many elements."""


@dataclass(frozen=True)
class ChunkLayout:
    """Where each tensor of a sequence lives in fixed-size chunks."""

    chunk_numel: int
    """Elements per chunk."""
    slots: tuple[tuple[int, int], ...]
    """(chunk index, offset in elements) of each tensor, in the order laid out."""
    numels: tuple[int, ...]
    """Elements of each tensor, in the same order."""
    chunks: int
    """Number of chunks."""

    @property
    def numel(self) -> int:
        """Elements of all the chunks together."""
        return self.chunks * self.chunk_numel

    @property
    def waste(self) -> float:
        """Share of the chunks' elements that hold no tensor."""
        return 1 - sum(self.numels) / self.numel if self.numel else 0.0

    def members(self, chunk: int) -> list[int]:
        """Indices of the tensors in `chunk`, in order."""
        return [index for index, (held_by, _) in enumerate(self.slots) if held_by == chunk]


def lay_out(numels: Sequence[int], chunk_numel: int) -> ChunkLayout:
    """Tensors of `numels` elements in chunks of `chunk_numel`, in order (module docstring)."""
    if not numels:
        raise ValueError("numels must name at least one tensor; got none")
    if chunk_numel < max(numels):
        raise ValueError(f"chunk_numel must be at least the largest tensor's {max(numels)} elements; got {chunk_numel}")
    slots, chunk, offset = [], 0, 0
    for numel in numels:
        if offset + numel > chunk_numel:
            chunk, offset = chunk + 1, 0
        slots.append((chunk, offset))
        offset += numel
    return ChunkLayout(chunk_numel, tuple(slots), tuple(numels), chunk + 1)


def search_chunk_size(numels: Sequence[int], sizes: int = 64, widest: float = 2.0) -> ChunkLayout:
    """The layout of least total memory among `sizes` chunk sizes from the largest tensor to
    `widest` times it (multiples of `CHUNK_ALIGNMENT`, at most the sum of all); ties go to the
    smaller chunk. The bound keeps chunks a unit of placement: without it one chunk holding
    everything would waste the least."""
    if not numels:
        raise ValueError("numels must name at least one tensor; got none")
    smallest = -(-max(numels) // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
    largest = max(smallest, min(int(widest * max(numels)), sum(numels)))
    step = max((largest - smallest) // max(sizes - 1, 1), 1)
    candidates = sorted({-(-size // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT for size in range(smallest, largest + 1, step)})
    return min((lay_out(numels, size) for size in candidates), key=lambda layout: (layout.numel, layout.chunk_numel))
