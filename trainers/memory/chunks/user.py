"""`ChunkUser`: what computes with the chunks a `trainers.memory.chunks.residency.ChunkResidency`
holds, told as they come and go (`trainers.memory.chunks.states.ChunkedStates` is one)."""

from __future__ import annotations

from typing import Protocol

import torch

from trainers.memory.chunks.store import ChunkKey


class ChunkUser(Protocol):
    """What computes with a `ChunkResidency`'s chunks."""

    def bound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        """Chunk `key` can be computed with as `buffer` (in `compute_memory`)."""

    def unbound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        """Chunk `key`'s `buffer` is about to leave `compute_memory`."""

    def evictable(self, key: ChunkKey) -> bool:
        """Whether the placement may evict chunk `key` when it is not pinned."""

    def kept(self) -> set[ChunkKey]:
        """Chunks in memory, not pinned, that the placement may not evict now (counted in use)."""

    def bring(self, key: ChunkKey) -> None:
        """Chunk `key`, just pinned, into memory: `ChunkResidency.bring_here`, or another way."""

    def released(self) -> None:
        """Chunks were unpinned."""
