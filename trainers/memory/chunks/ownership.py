"""ZeRO over chunks: each chunk has one owning rank (`trainers.memory.chunks.layout.chunk_owners`),
which alone keeps its parameters and moments (in memory or in its files) and updates them.

A parameter chunk that a rank does not own is gathered, broadcast by its owner, when a step or an
evaluation uses it and it is not among the chunks gathered lately, and dropped when it leaves them.
Which chunks are gathered follows only the order in which the model uses its parameters, so every
rank must use the same parameters in the same order (as FSDP asks of its units). Before each gather,
and once at the end of the code every rank runs, the ranks say which chunk they gather next in one
small all-reduce: where the data made them use different parameters (one of several heads chosen
by the micro batch), every rank raises a ValueError naming the parameters, before any of them waits
in a broadcast the others never enter (or pairs two chunks of one owner and size). Those kept are the
ones in use and the `SPARE_GATHERED` used most recently besides them. With one owner per chunk,
gathering a chunk is a broadcast (and reducing its gradients a reduce, `trainers.memory.chunks.gradients`):
the bytes each rank sends and receives are those of an all-gather and a reduce-scatter of N chunks,
without N chunks in memory at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from trainers.memory.chunks.layout import chunk_owners
from trainers.memory.chunks.parameters import ChunkedParameters
from trainers.memory.chunks.residency import ChunkResidency
from trainers.memory.chunks.store import ChunkKey

SPARE_GATHERED = 2
"""Gathered parameter chunks kept besides those in use (the most recently used)."""


class ChunkOwnership:
    """Which rank of `group` owns each chunk of `sizes` (every chunk this rank's when not `shard`ed or
    alone), and the parameter chunks gathered from their owners into `residency`."""

    def __init__(self, sizes: list[int], group: dist.ProcessGroup | None, shard: bool, residency: ChunkResidency,
                 parameters: ChunkedParameters) -> None:
        self.group, self.residency, self.parameters = group, residency, parameters
        self.world = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.sharded = shard and self.world > 1
        """Whether each rank owns a share of the chunks."""
        self.owners = chunk_owners(sizes, self.world) if self.sharded else [self.rank] * len(sizes)
        """The rank that keeps and updates each chunk."""
        self._gathered: OrderedDict[int, None] = OrderedDict()
        """The parameter chunks gathered lately, least recently used first (the same on every rank)."""
        self.gathering = False
        """Whether every rank runs the same code now, so that chunks can be gathered."""

    def owns(self, chunk: int) -> bool:
        """Whether this rank keeps and updates chunk `chunk`."""
        return self.owners[chunk] == self.rank

    # ---------------------------------------------------------------- residency's constraints
    def evictable(self, key: ChunkKey) -> bool:
        return self.owns(key[1]) or key[0] != "param"  # a gathered copy leaves with `_release`

    def kept(self) -> set[ChunkKey]:
        return {("param", chunk) for chunk in self._gathered if not self.owns(chunk)}

    def bring(self, key: ChunkKey) -> None:
        chunk, residency = key[1], self.residency
        if not self.sharded or key[0] != "param":
            residency.bring_here(key)
        elif chunk in self._gathered:
            self._gathered.move_to_end(chunk)
            if self.owns(chunk):  # its owner may have evicted it since
                residency.bring_here(key)
        elif self.gathering:
            self._gather(chunk)
        elif self.owns(chunk):
            residency.bring_here(key)
        else:
            raise RuntimeError(f"parameter chunk {chunk} belongs to rank {self.owners[chunk]}, not to rank {self.rank}; "
                               "other ranks read it inside a step or an evaluation that every rank runs")

    def released(self) -> None:
        if self._gathered:
            self._trim()

    # ---------------------------------------------------------------- gathering
    def _agree(self, chunk: int) -> None:
        """Every rank says which parameter chunk it gathers next (`len(owners)`: none, the shared code
        ends); ValueError on every rank where they differ."""
        said = torch.zeros(len(self.owners) + 1, dtype=torch.int64, device=self.parameters.device)
        said[chunk] = 1
        dist.all_reduce(said, group=self.group)
        if said[chunk] == self.world:
            return
        chunks = [c for c in said.nonzero().flatten().tolist() if c < len(self.owners)]
        names = [self.parameters.members[i].name for c in chunks for i in self.parameters.chunk_members[c]][:6]
        raise ValueError(f"ranks gather different parameter chunks {chunks} at the same point of a step (their data "
                         f"used different parameters: {names}); ZeRO over chunks gathers the parameters as the model "
                         f"uses them, so every rank must use the same ones in the same order: train such a model "
                         f"with Strategy(zero=0) over chunks, or in memory (ZeRO 0-3, which give unused parameters "
                         f"a zero gradient)")

    def _gather(self, chunk: int) -> None:
        """Parameter chunk `chunk` from its owner, on every rank at once (agreed first)."""
        self._agree(chunk)
        key, residency = ("param", chunk), self.residency
        if self.owns(chunk):
            residency.bring_here(key)
        else:
            residency.busy, was_busy = True, residency.busy
            size = residency.sizes[chunk]
            try:
                if residency.device is None:
                    residency.make_room(residency.nbytes(key))
                    self.parameters.bound(key, residency.store.receive(key, size))
                else:
                    residency.make_device_room(key)
                    self.parameters.bound(key, residency.device_buffer(key, lambda: residency.device.receive(key, size)))
            finally:
                residency.busy = was_busy
        dist.broadcast(residency.compute_memory[key], group=self.group, group_src=self.owners[chunk])
        self._gathered[chunk] = None
        self._trim()

    def _trim(self, spare: int = SPARE_GATHERED) -> None:
        """Keep at most `spare` gathered chunks that are not in use (the most recently used)."""
        unused = [chunk for chunk in self._gathered if not self.residency.pinned(("param", chunk))]
        for chunk in unused[:max(len(unused) - spare, 0)]:
            self._release(chunk)

    def _release(self, chunk: int) -> None:
        del self._gathered[chunk]
        if not self.owns(chunk):
            self.residency.drop(("param", chunk))

    def release_all(self) -> None:
        """Drop every gathered copy (their owners may change the chunks next)."""
        for chunk in list(self._gathered):
            self._release(chunk)

    @contextmanager
    def gathering_on(self) -> Iterator[None]:
        """Every rank runs the same code inside: parameter chunks are gathered as used, and the
        gathered copies dropped at the end (the owners may change the chunks next)."""
        self.gathering = True
        try:
            yield
            if self.sharded:
                self._agree(len(self.owners))
        finally:
            self.gathering = False
            self.release_all()

    @contextmanager
    def gathering_off(self) -> Iterator[None]:
        """Inside, no chunk is gathered (ranks run their own code: the owners' updates)."""
        self.release_all()
        self.gathering, was_gathering = False, self.gathering
        try:
            yield
        finally:
            self.gathering = was_gathering
