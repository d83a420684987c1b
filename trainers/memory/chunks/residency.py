"""Which chunks are in memory: pinned while code uses them, kept or evicted under a memory budget
for the whole process (PatrickStar's chunk manager, with a disk tier as in ZeRO-Infinity).

Chunks are pinned while an operation uses them (`pin` / `unpin`, `held` until the running module
returns). Placement follows `trainers.memory.chunks.placement`: the first step keeps only the chunks in
use and measures the other tensors; later steps keep what the budget leaves them, evicting the
chunk used again furthest ahead, and start reading the chunks of the next `PREFETCH_MOMENTS`
moments from disk as soon as a moment begins, as far as the room at each moment until then
allows (the store's background thread reads while the model computes).

The budget counts the whole process's resident memory: the rest of the process (its resident
memory beyond the chunks and the step's tensors, the most of it seen at any moment of the first
step), the step's other tensors, the chunks, and a margin (`CAPACITY_MARGIN`). So that freed
memory leaves the process, allocations of `MMAP_THRESHOLD` bytes and more are mapped and unmapped
on their own (glibc's mallopt, for the whole process): the default allocator keeps freed chunks
in its heap, where they still count as resident.

Under a device tier (`trainers.memory.chunks.device`: a GPU's memory above host memory and disk), pins
bring chunks to the device, where the model computes with them; the device copies follow the same
moments and the same rule under the device budget (the chunks on the device, the step's device
tensors, the rest of the device's allocations, a margin), and chunks of the next moments already
in host memory are copied up ahead of their use. A device copy that changed is copied down when it
leaves. Work on host copies (an update where a chunk lives, a checkpoint) pins with `holding(...,
host=True)` or `pin_on_host`, which first bring a chunk's device copy down.
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from trainers.memory.chunks.device import DeviceChunks
from trainers.memory.chunks.placement import Moment, Placement
from trainers.memory.chunks.store import ChunkKey, ChunkStore
from trainers.memory.tensor_peak import TensorPeak

PREFETCH_MOMENTS = 2
"""Moments ahead whose chunks are read from disk before they are used."""
CAPACITY_MARGIN = 0.03
"""Share of the budget left free for what the measurement cannot see (peaks between moments)."""
CUDA_ALLOCATOR_SLACK = 256 << 20
"""Bytes of a GPU's device budget first left free, beyond the margin, for the caching allocator's reserved
but unallocated blocks, which a cap on the process's GPU memory counts and the measurement (allocated
bytes) does not: 128 to 327 MiB on an H100 under a 4 GiB cap with chunks moving, with and without
expandable segments (BENCHMARKS.md, "The first GPU figures: one H100"). A 48-layer GPT on the H200
ran out of memory at step 3 with 424-455 MB of such blocks ("The fourth GPU session", and the
fifth), so a step that runs out widens it (`widen_device_slack`): 48, 64 and 96 layers then trained
under a 4 GiB cap, with 512-768 MiB."""
SLACK_WIDENING = 1 / 16
"""Share of the device budget added to the allocator's slack each time a step runs out of device memory."""
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
    allows under `budget` bytes for the process; with `device`, pinned chunks on the device under
    `device_budget` bytes. Subclasses bind chunks to what uses them (`_bound`, `_unbound`), say
    which chunks may not be evicted (`_evictable`, `_kept`) and how a chunk is brought into memory
    (`_bring`)."""

    def __init__(self, store: ChunkStore, sizes: list[int], budget: int, device: DeviceChunks | None = None,
                 device_budget: int = 0) -> None:
        self.store, self.sizes, self.budget = store, sizes, budget
        self.device, self.device_budget = device, device_budget
        self._host_only = False
        """Pins bring chunks into host memory only (work on host copies)."""
        self._device_tracker: TensorPeak | None = None
        self._device_rest = 0
        """While the first step runs: the most device memory seen besides chunks and the step's device tensors."""
        self.allocator_slack = CUDA_ALLOCATOR_SLACK if device is not None and device.device.type == "cuda" else 0
        """Bytes of the device budget left to the caching allocator's reserved but unallocated blocks."""
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

    @property
    def compute_memory(self) -> dict[ChunkKey, torch.Tensor]:
        """The chunks the model can compute with, by key: on the device under a device tier, else in memory."""
        return self.store.memory if self.device is None else self.device.memory

    # ---------------------------------------------------------------- hooks for subclasses
    def _bound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        """Chunk `key` can be computed with as `buffer` (in `compute_memory`)."""

    def _unbound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        """Chunk `key`'s `buffer` is about to leave `compute_memory`."""

    def _evictable(self, key: ChunkKey) -> bool:
        """Whether the placement may evict chunk `key` when it is not pinned."""
        return True

    def _kept(self) -> set[ChunkKey]:
        """Chunks in memory, not pinned, that the placement may not evict now (counted in use)."""
        return set()

    def _bring(self, key: ChunkKey) -> None:
        """Chunk `key`, just pinned, where pins bring it: on the device or in host memory."""
        if self.device is None or self._host_only:
            self._bring_to_host(key)
        else:
            self._bring_to_device(key)

    def _bring_to_host(self, key: ChunkKey) -> None:
        if key not in self.store.memory:
            self._make_room(0 if self.store.pending(key) else self._bytes(key))  # pending: already counted
            self._load(key)

    def _bring_to_device(self, key: ChunkKey) -> None:
        device = self.device
        if key not in device.memory:
            self._make_device_room(key)
            self.busy, was_busy = True, self.busy
            try:
                if key in self.store.memory or self.store.pending(key) or key in self.store.files:
                    self._bring_to_host(key)
                    buffer = self._device_buffer(key, lambda: device.upload(key, self.store.memory[key]))
                else:  # never written: zeros, made on the device
                    buffer = self._device_buffer(key, lambda: device.zeros(key, self.sizes[key[1]]))
                self._bound(key, buffer)
            finally:
                self.busy = was_busy
        device.wait(key)

    # ---------------------------------------------------------------- chunks in and out of memory
    def _bytes(self, key: ChunkKey) -> int:
        return self.sizes[key[1]] * self.store.dtype.itemsize

    def _load(self, key: ChunkKey) -> torch.Tensor:
        """Chunk `key` in host memory (read back or created), bound when there is no device tier."""
        self.busy, was_busy = True, self.busy
        try:
            loaded = key in self.store.memory
            buffer = self.store.load(key, self.sizes[key[1]])
            if not loaded and self.device is None:
                self._bound(key, buffer)
            return buffer
        finally:
            self.busy = was_busy

    def _evict(self, key: ChunkKey) -> None:
        """Chunk `key` out of host memory, written to its file when it changed."""
        self.busy, was_busy = True, self.busy
        try:
            if self.device is None:
                self._unbound(key, self.store.memory[key])
            self.store.evict(key)
        finally:
            self.busy = was_busy

    def _evict_from_device(self, key: ChunkKey) -> None:
        """Chunk `key`'s device copy freed, first copied down into host memory when it is the only true copy."""
        device = self.device
        self.busy, was_busy = True, self.busy
        try:
            if key in device.dirty:
                self._make_room(self._bytes(key))
                host = self.store.receive(key, self.sizes[key[1]])
                device.download(key, host)
                self.store.changed(key)
            self._unbound(key, device.memory[key])
            device.drop(key)
        finally:
            self.busy = was_busy

    def _drop(self, key: ChunkKey) -> None:
        """Chunk `key` forgotten (its copies and its file)."""
        self.busy, was_busy = True, self.busy
        try:
            memory = self.compute_memory
            if key in memory:
                self._unbound(key, memory[key])
            if self.device is not None:
                self.device.drop(key)
            self.store.drop(key)
        finally:
            self.busy = was_busy

    def changed(self, key: ChunkKey) -> None:
        """Chunk `key` was written to where pins brought it: on the device its copy becomes the only
        true one (the host copy and file are forgotten), in host memory its file no longer holds it."""
        if self.device is None or self._host_only:
            self.store.changed(key)
        elif key not in self.device.dirty:
            self.device.dirty.add(key)
            self.store.drop(key)

    def _furthest(self, keys: list[ChunkKey]) -> ChunkKey:
        """The one of `keys` used again furthest ahead (the least recently used among equals)."""
        return max(keys, key=lambda key: (self.placement.next_use(key) if self.placement.planned else 0,
                                          -self._last_used.get(key, 0)))

    def _make_room(self, needed: int) -> None:
        """Evict unpinned chunks from host memory until those there and `needed` more bytes fit the
        capacity, then let the victims' writes settle where their memory is needed now."""
        capacity = self.placement.current_capacity() if self.placement.planned else 0
        self._evict_down_to(self.store.memory, self.store.resident_bytes(), capacity - needed, self._evict)
        self.store.settle(capacity - needed)

    def _make_device_room(self, key: ChunkKey | None = None) -> None:
        """The same on the device, under its capacity, for its chunks, their spare buffers and chunk
        `key`'s copy coming up (no more bytes when a spare of its size will hold it): spares of other
        sizes freed first, then unpinned chunks evicted (their buffers become spares, freed in turn)."""
        capacity = self.placement.current_capacity(device=True) if self.placement.planned else 0
        device, numel = self.device, None if key is None else self.sizes[key[1]]
        while device.held_bytes() + (0 if numel is None or device.has_spare(numel) else self._bytes(key)) > capacity:
            if device.free_spare(keep=numel):
                continue
            free = self._evictable_now(device.memory)
            if not free:
                return
            self._evict_from_device(self._furthest(free))

    def _device_buffer(self, key: ChunkKey, allocate: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`allocate()`'s device buffer for chunk `key`. When the device runs out of memory, which the
        budget can miss (the allocator's free blocks split too finely for a chunk), spares are freed
        and unpinned chunks evicted, the one used again furthest ahead first, until it succeeds."""
        while True:
            try:
                return allocate()
            except torch.OutOfMemoryError as error:
                device, numel = self.device, self.sizes[key[1]]
                free = self._evictable_now(device.memory)
                if free:
                    self._evict_from_device(self._furthest(free))  # a spare now, which a chunk of its size reuses
                elif not device.free_spare():
                    raise MemoryError(
                        f"the device ran out of memory bringing up chunk {key} with every chunk there in use "
                        f"({device.resident_bytes():,} bytes); give a larger device_memory_budget or a smaller "
                        f"micro batch") from error
                while device.free_spare(keep=numel):
                    pass
                device.out_of_memory_retries += 1

    def _evictable_now(self, memory: dict[ChunkKey, torch.Tensor]) -> list[ChunkKey]:
        """The chunks of `memory` the placement may evict now: not pinned, and evictable."""
        return [key for key in memory if not self._pins[key] and self._evictable(key)]

    def _evict_down_to(self, memory: dict[ChunkKey, torch.Tensor], resident: int, limit: int,
                       evict: Callable[[ChunkKey], None]) -> None:
        """`evict` unpinned chunks of `memory` (`resident` bytes now) until at most `limit` bytes stay:
        the one used again furthest ahead first (the least recently used among equals)."""
        while resident > limit:
            free = self._evictable_now(memory)
            if not free:
                return
            victim = self._furthest(free)
            resident -= memory[victim].nbytes
            evict(victim)

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
        if self.device is not None and not self._host_only:
            self._make_device_room()

    def unpin(self, keys: Iterable[ChunkKey]) -> None:
        self._pins.subtract(keys)

    def pinned(self, key: ChunkKey) -> bool:
        return self._pins[key] > 0

    @contextmanager
    def holding(self, keys: frozenset[ChunkKey], host: bool = False) -> Iterator[dict[ChunkKey, torch.Tensor]]:
        """Chunks `keys` pinned while the chunk code itself works on them (watchers out of the
        way), where the model computes with them or, with `host`, in host memory (their device
        copies brought down first); yields the chunks there by key."""
        with self._on_host(host):
            if host:
                self.pin_on_host(keys)
            else:
                self.pin(keys)
            self.busy, was_busy = True, self.busy
            try:
                yield self.store.memory if host else self.compute_memory
            finally:
                self.busy = was_busy
                self.unpin(keys)

    def pin_on_host(self, keys: frozenset[ChunkKey]) -> None:
        """Pin chunks `keys` in host memory until `unpin`, their device copies brought down first."""
        with self._on_host(True):
            if self.device is not None:
                for key in sorted(keys & self.device.memory.keys()):
                    self._evict_from_device(key)
            self.pin(keys)

    @contextmanager
    def _on_host(self, host: bool) -> Iterator[None]:
        """Inside, with `host`: pins bring chunks into host memory only, and changes are made there."""
        self._host_only, was_host_only = self._host_only or host, self._host_only
        try:
            yield
        finally:
            self._host_only = was_host_only

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
                self._mark(moments[-1])
            self._rest = max(self._rest, resident_set_bytes() - self._host_chunk_bytes() - self._tracker.live)
            if self._device_tracker is not None:
                self._device_rest = max(self._device_rest, torch.cuda.memory_allocated(self.device.device)
                                        - self.device.held_bytes() - self._device_tracker.live)
            in_use = set(keys) | {key for key, count in self._pins.items() if count} | self._kept()
            in_use_bytes = sum(self._bytes(key) for key in in_use)
            on_device = self.device is not None and not self._host_only
            moments.append(Moment(keys, in_use_bytes, device_in_use_bytes=in_use_bytes if on_device else 0))
        elif self.placement.planned:
            self.placement.advance(keys)
            self._prefetch()
            if self.device is not None:
                self._prefetch_to_device()

    def _mark(self, moment: Moment) -> None:
        """The step's tensors' most bytes from `moment` on, which ends now (off a GPU the device
        tier's tensors are the host's)."""
        moment.other_bytes = self._tracker.mark()
        moment.device_other_bytes = self._device_tracker.mark() if self._device_tracker else moment.other_bytes

    def _host_chunk_bytes(self) -> int:
        """Bytes of chunks in host memory (off a GPU, the device tier's pool included)."""
        pool = self.device.held_bytes() if self.device is not None and self.device.device.type == "cpu" else 0
        return self.store.resident_bytes() + pool

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
                if not self.store.readable(key) or (self.device is not None and key in self.device.memory):
                    continue
                if self.store.resident_bytes() + self._bytes(key) > room:
                    return
                self.store.prefetch(key, self.sizes[key[1]])

    def _prefetch_to_device(self) -> None:
        """Copy up the chunks of the next `PREFETCH_MOMENTS` moments that work on the device and
        are in host memory, nearest first, while they fit the device's capacity from now to their use."""
        placement, here, device = self.placement, self.placement.position, self.device
        if not 0 <= here < len(placement.moments):
            return
        room = placement.device_capacity[here]
        for ahead in range(here + 1, min(here + 1 + PREFETCH_MOMENTS, len(placement.moments))):
            room = min(room, placement.device_capacity[ahead])
            moment = placement.moments[ahead]
            if not moment.device_in_use_bytes:
                continue
            for key in sorted(moment.chunks):
                if key in device.memory or key not in self.store.memory:
                    continue
                if device.held_bytes() + (0 if device.has_spare(self.sizes[key[1]]) else self._bytes(key)) > room:
                    return
                self.busy, was_busy = True, self.busy
                try:
                    self._bound(key, device.upload(key, self.store.memory[key], ahead=True))
                except torch.OutOfMemoryError:
                    device.out_of_memory_retries += 1
                    return  # a copy ahead is never worth an eviction
                finally:
                    self.busy = was_busy

    def new_region(self) -> None:
        """What runs next does not continue the last moment (an evaluation, a checkpoint)."""
        self._moment_chunks = None

    @contextmanager
    def measured_step(self) -> Iterator[None]:
        """One training step runs inside; the first records the step's moments and plans the
        placement from them."""
        recording = not self.placement.planned
        self._rest = resident_set_bytes() - self._host_chunk_bytes()
        on_gpu = self.device is not None and self.device.device.type == "cuda"
        self._tracker = TensorPeak("cpu" if on_gpu else None) if recording else None
        self._device_tracker = TensorPeak("cuda") if recording and on_gpu else None
        self.placement.position, self._moment_chunks = -1, None
        with self._tracker or nullcontext(), self._device_tracker or nullcontext():
            yield
        if recording:
            self._mark(self.placement.moments[-1])
            self._tracker = self._device_tracker = None
            self._plan(self._rest)
        self.placement.position = len(self.placement.moments)  # outside the step: the smallest capacity

    def _plan(self, rest: int) -> None:
        """Capacities from the recorded moments, `rest` the most resident memory of the process
        besides chunks and the step's tensors."""
        moments = self.placement.moments
        capacity, short, margin = _capacities(moments, self.budget, rest, lambda moment: moment.other_bytes,
                                              lambda moment: moment.in_use_bytes)
        if short is not None:
            moment = moments[short]
            raise MemoryError(
                f"memory_budget={self.budget:,} bytes is smaller than the step's working set: at moment {short} of "
                f"{len(moments)} it needs chunks in use ({moment.in_use_bytes:,} bytes: {sorted(moment.chunks)} and any "
                f"kept), the step's other tensors ({moment.other_bytes:,}), the rest of the process ({rest:,}) and a margin "
                f"of {CAPACITY_MARGIN:.0%} ({margin:,}); give a larger budget or a smaller micro batch")
        self.placement.plan(capacity, self._device_capacity() if self.device is not None else None)

    def _device_capacity(self) -> list[int]:
        """Bytes the chunks may hold on the device at each recorded moment."""
        moments, slack = self.placement.moments, self.allocator_slack
        capacity, short, margin = _capacities(moments, self.device_budget, self._device_rest + slack,
                                              lambda moment: moment.device_other_bytes,
                                              lambda moment: moment.device_in_use_bytes)
        if short is not None:
            moment = moments[short]
            raise MemoryError(
                f"device_memory_budget={self.device_budget:,} bytes is smaller than the step's working set on the "
                f"device: at moment {short} of {len(moments)} it needs chunks in use ({moment.device_in_use_bytes:,} "
                f"bytes: {sorted(moment.chunks)} and any kept), the step's device tensors "
                f"({moment.device_other_bytes:,}), the device's other allocations ({self._device_rest:,}), the "
                f"allocator's slack ({slack:,}) and a margin of {CAPACITY_MARGIN:.0%} ({margin:,}); give a larger "
                f"budget or a smaller micro batch")
        return capacity

    def widen_device_slack(self) -> None:
        """After a planned step ran out of device memory: `SLACK_WIDENING` of the device budget more for
        the allocator's slack, the device capacities planned again with it (MemoryError when the
        step's working set no longer fits), and the device tier brought down to the smallest of them
        with no spare buffer left, its cached memory returned (on a GPU), for the step to run again."""
        self.allocator_slack += int(SLACK_WIDENING * self.device_budget)
        self.placement.device_capacity = self._device_capacity()
        self.placement.position = len(self.placement.moments)  # outside the step: the smallest capacity
        self._make_device_room()
        while self.device.free_spare():
            pass
        if self.device.device.type == "cuda":
            torch.cuda.empty_cache()  # pages of the freed blocks unmapped, for one contiguous range again


def _capacities(moments: list[Moment], budget: int, rest: int, other: Callable[[Moment], int],
                in_use: Callable[[Moment], int]) -> tuple[list[int], int | None, int]:
    """Bytes the chunks may hold at each of `moments` under `budget`, less a margin, `rest` and the
    moment's `other` tensors; the moment whose chunks `in_use` most lack that room (None when every
    moment has it); the margin."""
    margin = int(CAPACITY_MARGIN * budget)
    capacity = [budget - margin - rest - other(moment) for moment in moments]
    short = max(range(len(moments)), key=lambda i: in_use(moments[i]) - capacity[i])
    return capacity, (short if capacity[short] < in_use(moments[short]) else None), margin
