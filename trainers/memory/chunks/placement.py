"""Which chunks stay in memory at each moment of a training step (PatrickStar's placement from
warm-up statistics, with eviction by next use).

A step is a sequence of moments: each time the chunks in use change (an operation on parameters
of other chunks, a gradient accumulated into a chunk, a chunk's optimizer update) a new moment
begins. The first step (warm-up) keeps no chunk it does not use and records each moment's chunks
and the most bytes the step's other tensors (activations, temporaries) held until the next
moment. A step repeats the same moments, so from then on the chunks may fill, at each moment,
what the budget leaves beside the other tensors, and when one must go, the chunk evicted is the
one used again furthest ahead (Belady's rule, exact on a replayed sequence).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from trainers.memory.chunks.store import ChunkKey

RESYNC_WINDOW = 256
"""Moments ahead of the expected one searched for a moment that did not come in the recorded order
(control flow that depends on the data); past it the placement holds the smallest capacity."""


@dataclass
class Moment:
    """One moment of the recorded step."""

    chunks: frozenset[ChunkKey]
    """Chunks in use."""
    in_use_bytes: int
    """Bytes of those chunks."""
    other_bytes: int = 0
    """The most bytes of other tensors alive from this moment to the next."""
    device_in_use_bytes: int = 0
    """Under a device tier: bytes of the chunks in use on the device (0 when the moment works
    on host copies: an update on the host)."""
    device_other_bytes: int = 0
    """Under a device tier: the most bytes of the step's device tensors alive from this moment to the next."""


@dataclass
class Placement:
    """The recorded moments of a step, the bytes chunks may hold at each, and where the current
    step is among them."""

    moments: list[Moment] = field(default_factory=list)
    capacity: list[int] = field(default_factory=list)
    """Bytes the chunks may hold in host memory at each moment (after `plan`)."""
    device_capacity: list[int] = field(default_factory=list)
    """Under a device tier: bytes the chunks may hold on the device at each moment (after `plan`)."""
    position: int = 0
    """Index of the current moment."""
    uses: dict[ChunkKey, list[int]] = field(default_factory=dict)
    """Moments at which each chunk is used, ascending."""

    @property
    def planned(self) -> bool:
        return bool(self.capacity)

    def plan(self, capacity_of: list[int], device_capacity_of: list[int] | None = None) -> None:
        """Install the capacity of each recorded moment (in host memory, and on the device)."""
        self.capacity, self.device_capacity = capacity_of, device_capacity_of or []
        self.uses = {}
        for index, moment in enumerate(self.moments):
            for key in moment.chunks:
                self.uses.setdefault(key, []).append(index)

    def advance(self, chunks: frozenset[ChunkKey]) -> None:
        """The step moved to a moment using `chunks`: the next recorded moment, or a later one
        that uses the same chunks (within `RESYNC_WINDOW`)."""
        following = self.position + 1
        for index in range(following, min(following + RESYNC_WINDOW, len(self.moments))):
            if self.moments[index].chunks == chunks:
                self.position = index
                return
        self.position = len(self.moments)

    def current_capacity(self, device: bool = False) -> int:
        """Bytes the chunks may hold now in host memory (on the device): the moment's, or the
        smallest outside the record."""
        capacity = self.device_capacity if device else self.capacity
        if 0 <= self.position < len(capacity):
            return capacity[self.position]
        return min(capacity)

    def next_use(self, key: ChunkKey) -> float:
        """The moment at which chunk `key` is used next (inf: not again in this step)."""
        uses = self.uses.get(key, ())
        at = bisect.bisect_right(uses, self.position)
        return uses[at] if at < len(uses) else float("inf")
