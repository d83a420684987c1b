"""Which chunks are in memory: pinned while code uses them, kept or evicted under a memory budget
for the whole process (PatrickStar's chunk manager, with a disk tier as in ZeRO-Infinity).

Chunks are pinned while an operation uses them (`pin` / `unpin`, `held` until the running module
returns). Where they may stay follows the step's moments (`trainers.memory.chunks.moments`): the
first step keeps only the chunks in use; later steps keep what the budget leaves them at each
moment, evicting the chunk used again furthest ahead, and read the next moments' chunks ahead.
What uses the chunks (`ChunkUser`) binds them to its tensors, says which may not be evicted, and
brings a chunk in its own way where it must (gathered from the rank that owns it).

Under a device tier (`trainers.memory.chunks.device`: a GPU's memory above host memory and disk), pins
bring chunks to the device, where the model computes with them; the device copies follow the same
moments under the device budget. A device copy that changed is copied down when it leaves. Work on
host copies (an update where a chunk lives, a checkpoint) pins with `holding(..., host=True)` or
`pin_on_host`, which first bring a chunk's device copy down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from trainers.memory.chunks.device import DeviceChunks
from trainers.memory.chunks.moments import StepMoments
from trainers.memory.chunks.placement import Placement
from trainers.memory.chunks.store import ChunkKey, ChunkStore
from trainers.memory.chunks.user import ChunkUser
from trainers.memory.resident import release_freed_memory


class ChunkResidency:
    """Chunks of `sizes[index]` elements in `store`, in memory while pinned and as the placement
    allows under `budget` bytes for the process; with `device`, pinned chunks on the device under
    `device_budget` bytes; `user` computes with them."""

    def __init__(self, store: ChunkStore, sizes: list[int], budget: int, user: ChunkUser,
                 device: DeviceChunks | None = None, device_budget: int = 0) -> None:
        self.store, self.sizes, self.budget, self.user = store, sizes, budget, user
        self.device, self.device_budget = device, device_budget
        self.host_only = False
        """Pins bring chunks into host memory only (work on host copies)."""
        self.busy = False
        """True while the chunk code itself runs (code that watches operations then stays out of the way)."""
        self.pins: Counter[ChunkKey] = Counter()
        """How many times each chunk is pinned now."""
        self.moments = StepMoments(self)
        """The step's recorded moments and the placement planned from them."""
        self._last_used: dict[ChunkKey, int] = {}
        self._clock = 0
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
    def placement(self) -> Placement:
        return self.moments.placement

    @property
    def compute_memory(self) -> dict[ChunkKey, torch.Tensor]:
        """The chunks the model can compute with, by key: on the device under a device tier, else in memory."""
        return self.store.memory if self.device is None else self.device.memory

    # ---------------------------------------------------------------- bringing chunks in
    def bring_here(self, key: ChunkKey) -> None:
        """Chunk `key`, just pinned, where pins bring it: on the device or in host memory (read back
        from its file, or created)."""
        if self.device is None or self.host_only:
            self._bring_to_host(key)
        else:
            self._bring_to_device(key)

    def _bring_to_host(self, key: ChunkKey) -> None:
        if key not in self.store.memory:
            self.make_room(0 if self.store.pending(key) else self.nbytes(key))  # pending: already counted
            self.load(key)

    def _bring_to_device(self, key: ChunkKey) -> None:
        device = self.device
        if key not in device.memory:
            self.make_device_room(key)
            self.busy, was_busy = True, self.busy
            try:
                if key in self.store.memory or self.store.pending(key) or key in self.store.files:
                    self._bring_to_host(key)
                    buffer = self.device_buffer(key, lambda: device.upload(key, self.store.memory[key]))
                else:  # never written: zeros, made on the device
                    buffer = self.device_buffer(key, lambda: device.zeros(key, self.sizes[key[1]]))
                self.user.bound(key, buffer)
            finally:
                self.busy = was_busy
        device.wait(key)

    # ---------------------------------------------------------------- chunks in and out of memory
    def nbytes(self, key: ChunkKey) -> int:
        return self.sizes[key[1]] * self.store.dtype.itemsize

    def load(self, key: ChunkKey) -> torch.Tensor:
        """Chunk `key` in host memory (read back or created), bound when there is no device tier."""
        self.busy, was_busy = True, self.busy
        try:
            loaded = key in self.store.memory
            buffer = self.store.load(key, self.sizes[key[1]])
            if not loaded and self.device is None:
                self.user.bound(key, buffer)
            return buffer
        finally:
            self.busy = was_busy

    def evict(self, key: ChunkKey) -> None:
        """Chunk `key` out of host memory, written to its file when it changed."""
        self.busy, was_busy = True, self.busy
        try:
            if self.device is None:
                self.user.unbound(key, self.store.memory[key])
            self.store.evict(key)
        finally:
            self.busy = was_busy

    def _evict_from_device(self, key: ChunkKey) -> None:
        """Chunk `key`'s device copy freed, first copied down into host memory when it is the only true copy."""
        device = self.device
        self.busy, was_busy = True, self.busy
        try:
            if key in device.dirty:
                self.make_room(self.nbytes(key))
                host = self.store.receive(key, self.sizes[key[1]])
                device.download(key, host)
                self.store.changed(key)
            self.user.unbound(key, device.memory[key])
            device.drop(key)
        finally:
            self.busy = was_busy

    def drop(self, key: ChunkKey) -> None:
        """Chunk `key` forgotten (its copies and its file)."""
        self.busy, was_busy = True, self.busy
        try:
            memory = self.compute_memory
            if key in memory:
                self.user.unbound(key, memory[key])
            if self.device is not None:
                self.device.drop(key)
            self.store.drop(key)
        finally:
            self.busy = was_busy

    def changed(self, key: ChunkKey) -> None:
        """Chunk `key` was written to where pins brought it: on the device its copy becomes the only
        true one (the host copy and file are forgotten), in host memory its file no longer holds it."""
        if self.device is None or self.host_only:
            self.store.changed(key)
        elif key not in self.device.dirty:
            self.device.dirty.add(key)
            self.store.drop(key)

    def _furthest(self, keys: list[ChunkKey]) -> ChunkKey:
        """The one of `keys` used again furthest ahead (the least recently used among equals)."""
        return max(keys, key=lambda key: (self.placement.next_use(key) if self.placement.planned else 0,
                                          -self._last_used.get(key, 0)))

    def make_room(self, needed: int) -> None:
        """Evict unpinned chunks from host memory until those there and `needed` more bytes fit the
        capacity, then let the victims' writes settle where their memory is needed now."""
        capacity = self.placement.current_capacity() if self.placement.planned else 0
        self._evict_down_to(self.store.memory, self.store.resident_bytes(), capacity - needed, self.evict)
        self.store.settle(capacity - needed)

    def make_device_room(self, key: ChunkKey | None = None) -> None:
        """The same on the device, under its capacity, for its chunks, their spare buffers and chunk
        `key`'s copy coming up (no more bytes when a spare of its size will hold it): spares of other
        sizes freed first, then unpinned chunks evicted (their buffers become spares, freed in turn)."""
        capacity = self.placement.current_capacity(device=True) if self.placement.planned else 0
        device, numel = self.device, None if key is None else self.sizes[key[1]]
        while device.held_bytes() + (0 if numel is None or device.has_spare(numel) else self.nbytes(key)) > capacity:
            if device.free_spare(keep=numel):
                continue
            free = self._evictable_now(device.memory)
            if not free:
                return
            self._evict_from_device(self._furthest(free))

    def device_buffer(self, key: ChunkKey, allocate: Callable[[], torch.Tensor]) -> torch.Tensor:
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
        return [key for key in memory if not self.pins[key] and self.user.evictable(key)]

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
        if keys != self.moments.current:
            self.moments.begin(keys)
        self.pins.update(keys)
        for key in sorted(keys):
            self._clock += 1
            self._last_used[key] = self._clock
            self.user.bring(key)
        self.make_room(0)
        if self.device is not None and not self.host_only:
            self.make_device_room()

    def unpin(self, keys: Iterable[ChunkKey]) -> None:
        self.pins.subtract(keys)
        self.user.released()

    def pinned(self, key: ChunkKey) -> bool:
        return self.pins[key] > 0

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
        self.host_only, was_host_only = self.host_only or host, self.host_only
        try:
            yield
        finally:
            self.host_only = was_host_only

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
