"""Which chunks are in memory: pinned while code uses them, kept or evicted under a memory budget
for the whole process (PatrickStar's chunk manager, with a disk tier as in ZeRO-Infinity).

Chunks are pinned while an operation uses them (`pin` / `unpin`, `held` until the running module
returns). Placement follows `trainers.chunk_placement`: the first step keeps only the chunks in
use and measures the other tensors; later steps keep what the budget leaves them, evicting the
chunk used again furthest ahead, and start reading the chunks of the next `PREFETCH_MOMENTS`
moments from disk as soon as a moment begins, as far as the room at each moment until then
allows (the store's background thread reads while the model computes).

The budget counts the whole process on a CPU machine: the rest of the process (its resident
memory beyond the chunks and the step's tensors, the most of it seen at any moment of the first
step), the step's other tensors, the chunks, and a margin (`CAPACITY_MARGIN`). So that freed
memory leaves the process, allocations of `MMAP_THRESHOLD` bytes and more are mapped and unmapped
on their own (glibc's mallopt, for the whole process): the default allocator keeps freed chunks
in its heap, where they still count as resident.
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from trainers.chunk_placement import Moment, Placement
from trainers.chunk_store import ChunkKey, ChunkStore
from trainers.tensor_peak import TensorPeak

PREFETCH_MOMENTS = 2
"""Moments ahead whose chunks are read from disk before they are used."""
CAPACITY_MARGIN = 0.03
"""Share of the budget left free for what the measurement cannot see (peaks between moments)."""
MMAP_THRESHOLD = 1 << 20
"""Bytes from which glibc's malloc maps each allocation on its own (returned to the system when freed)."""
M_MMAP_THRESHOLD = -3
"""mallopt's parameter number for the mmap threshold (malloc.h)."""


def release_freed_memory() -> bool:
    """Have glibc's malloc map allocations of `MMAP_THRESHOLD` bytes or more on their own, so
    that freeing one returns its memory to the system; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def resident_set_bytes() -> int:
    """The process's resident memory now (Linux /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ChunkResidency:
    """Chunks of `sizes[index]` elements in `store`, in memory while pinned and as the placement
    allows under `budget` bytes for the process. Subclasses bind chunks to what uses them
    (`_bound`, `_unbound`), say which chunks may not be evicted (`_evictable`, `_kept`) and how a
    chunk is brought into memory (`_bring`)."""

    def __init__(self, store: ChunkStore, sizes: list[int], budget: int) -> None:
        self.store, self.sizes, self.budget = store, sizes, budget
        self.placement = Placement()
        self.busy = False
        """True while the chunk code itself runs (code that watches operations then stays out of the way)."""
        self._pins: Counter[ChunkKey] = Counter()
        self._last_used: dict[ChunkKey, int] = {}
        self._clock = 0
        self._moment_chunks: frozenset[ChunkKey] | None = None
        self._tracker: TensorPeak | None = None
        self._rest = 0
        """While the first step runs: the most resident memory seen besides chunks and its tensors."""
        self._active = False
        """Inside a step or access region."""
        self._scopes: list[set[ChunkKey]] = []
        """Chunks used by each running module (innermost last), pinned until it returns."""
        release_freed_memory()

    def watch(self, model: nn.Module) -> None:
        """Keep the chunks an operation of one of `model`'s modules used pinned until that module returns."""
        for module in model.modules():
            module.register_forward_pre_hook(self._enter_module)
            module.register_forward_hook(self._exit_module, always_call=True)

    # ---------------------------------------------------------------- hooks for subclasses
    def _bound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        """Chunk `key` came into memory as `buffer`."""

    def _unbound(self, key: ChunkKey) -> None:
        """Chunk `key` is about to leave memory."""

    def _evictable(self, key: ChunkKey) -> bool:
        """Whether the placement may evict chunk `key` when it is not pinned."""
        return True

    def _kept(self) -> set[ChunkKey]:
        """Chunks in memory, not pinned, that the placement may not evict now (counted in use)."""
        return set()

    def _bring(self, key: ChunkKey) -> None:
        """Chunk `key`, just pinned, into memory."""
        if key not in self.store.memory:
            self._make_room(0 if self.store.pending(key) else self._bytes(key))  # pending: already counted
            self._load(key)

    # ---------------------------------------------------------------- chunks in and out of memory
    def _bytes(self, key: ChunkKey) -> int:
        return self.sizes[key[1]] * self.store.dtype.itemsize

    def _load(self, key: ChunkKey) -> torch.Tensor:
        """Chunk `key` in memory (read back or created), bound."""
        self.busy, was_busy = True, self.busy
        try:
            loaded = key in self.store.memory
            buffer = self.store.load(key, self.sizes[key[1]])
            if not loaded:
                self._bound(key, buffer)
            return buffer
        finally:
            self.busy = was_busy

    def _evict(self, key: ChunkKey) -> None:
        """Chunk `key` out of memory, written to its file when it changed."""
        self.busy, was_busy = True, self.busy
        try:
            self._unbound(key)
            self.store.evict(key)
        finally:
            self.busy = was_busy

    def _drop(self, key: ChunkKey) -> None:
        """Chunk `key` forgotten (its memory and its file)."""
        self.busy, was_busy = True, self.busy
        try:
            if key in self.store.memory:
                self._unbound(key)
            self.store.drop(key)
        finally:
            self.busy = was_busy

    def _make_room(self, needed: int) -> None:
        """Evict unpinned chunks until those in memory and `needed` more bytes fit the capacity:
        the one used again furthest ahead first (the least recently used among equals)."""
        capacity = self.placement.current_capacity() if self.placement.planned else 0
        resident = self.store.resident_bytes()
        while resident + needed > capacity:
            free = [key for key in self.store.memory if not self._pins[key] and self._evictable(key)]
            if not free:
                return
            victim = max(free, key=lambda key: (self.placement.next_use(key) if self.placement.planned else 0,
                                                -self._last_used.get(key, 0)))
            resident -= self.store.memory[victim].nbytes
            self._evict(victim)
        self.store.settle(capacity - needed)  # the victims' writes, where their memory is needed now

    def pin(self, keys: frozenset[ChunkKey]) -> None:
        """Bring chunks `keys` into memory (in sorted order, the same on every rank) and keep them
        there until `unpin`; a new moment of the step when they differ from the last moment's."""
        if keys != self._moment_chunks:
            self._new_moment(keys)
        self._pins.update(keys)
        for key in sorted(keys):
            self._clock += 1
            self._last_used[key] = self._clock
            self._bring(key)
        self._make_room(0)

    def unpin(self, keys: Iterable[ChunkKey]) -> None:
        self._pins.subtract(keys)

    def pinned(self, key: ChunkKey) -> bool:
        return self._pins[key] > 0

    @contextmanager
    def holding(self, keys: frozenset[ChunkKey]) -> Iterator[dict[ChunkKey, torch.Tensor]]:
        """Chunks `keys` pinned in memory while the chunk code itself works on them (watchers out
        of the way); yields the chunks in memory by key."""
        self.pin(keys)
        self.busy, was_busy = True, self.busy
        try:
            yield self.store.memory
        finally:
            self.busy = was_busy
            self.unpin(keys)

    def held(self, keys: frozenset[ChunkKey]) -> None:
        """An operation that pinned `keys` ended: they stay pinned until the innermost running
        module returns (none running: unpinned now)."""
        if not self._scopes:
            self.unpin(keys)
            return
        scope = self._scopes[-1]
        self.unpin(keys & scope)
        scope.update(keys)

    def _enter_module(self, module: nn.Module, args) -> None:
        if self._active:
            self._scopes.append(set())

    def _exit_module(self, module: nn.Module, args, output) -> None:
        if self._active and self._scopes:
            self.unpin(self._scopes.pop())

    @contextmanager
    def scoped(self) -> Iterator[None]:
        """Module scopes followed inside (pins released when the region ends)."""
        self._active, self._scopes = True, []
        try:
            yield
        finally:
            for scope in self._scopes:
                self.unpin(scope)
            self._active, self._scopes = False, []

    # ---------------------------------------------------------------- moments and placement
    def _new_moment(self, keys: frozenset[ChunkKey]) -> None:
        self._moment_chunks = keys
        if self._tracker is not None:
            moments = self.placement.moments
            if moments:
                moments[-1].other_bytes = self._tracker.mark()
            self._rest = max(self._rest, resident_set_bytes() - self.store.resident_bytes() - self._tracker.live)
            in_use = set(keys) | {key for key, count in self._pins.items() if count} | self._kept()
            moments.append(Moment(keys, sum(self._bytes(key) for key in in_use)))
        elif self.placement.planned:
            self.placement.advance(keys)
            self._prefetch()

    def _prefetch(self) -> None:
        """Start reading the chunks of the next `PREFETCH_MOMENTS` moments, nearest first, while
        they fit the capacity of every moment from now to their use beside the chunks in memory
        (a read ahead never evicts: on a disk-bound machine an eviction for it costs more reads
        than the overlap gains; BENCHMARKS.md, "Tiered memory")."""
        placement, here = self.placement, self.placement.position
        if not 0 <= here < len(placement.moments):
            return
        room = placement.capacity[here]
        for ahead in range(here + 1, min(here + 1 + PREFETCH_MOMENTS, len(placement.moments))):
            room = min(room, placement.capacity[ahead])
            for key in sorted(placement.moments[ahead].chunks):
                if not self.store.readable(key):
                    continue
                if self.store.resident_bytes() + self._bytes(key) > room:
                    return
                self.store.prefetch(key, self.sizes[key[1]])

    def new_region(self) -> None:
        """What runs next does not continue the last moment (an evaluation, a checkpoint)."""
        self._moment_chunks = None

    @contextmanager
    def measured_step(self) -> Iterator[None]:
        """One training step runs inside; the first records the step's moments and plans the
        placement from them."""
        recording = not self.placement.planned
        self._rest = resident_set_bytes() - self.store.resident_bytes()
        self._tracker = TensorPeak() if recording else None
        self.placement.position, self._moment_chunks = -1, None
        with self._tracker or nullcontext():
            yield
        if recording:
            self.placement.moments[-1].other_bytes = self._tracker.mark()
            self._tracker = None
            self._plan(self._rest)
        self.placement.position = len(self.placement.moments)  # outside the step: the smallest capacity

    def _plan(self, rest: int) -> None:
        """Capacities from the recorded moments, `rest` the most resident memory of the process
        besides chunks and the step's tensors."""
        moments = self.placement.moments
        margin = int(CAPACITY_MARGIN * self.budget)
        capacity = [self.budget - margin - rest - moment.other_bytes for moment in moments]
        short = max(range(len(moments)), key=lambda i: moments[i].in_use_bytes - capacity[i])
        moment = moments[short]
        if capacity[short] < moment.in_use_bytes:
            raise MemoryError(
                f"memory_budget={self.budget:,} bytes is smaller than the step's working set: at moment {short} of "
                f"{len(moments)} it needs chunks in use ({moment.in_use_bytes:,} bytes: {sorted(moment.chunks)} and any "
                f"kept), the step's other tensors ({moment.other_bytes:,}), the rest of the process ({rest:,}) and a margin "
                f"of {CAPACITY_MARGIN:.0%} ({margin:,}); give a larger budget or a smaller micro batch")
        self.placement.plan(capacity)
