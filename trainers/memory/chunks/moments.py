"""The moments of a training step over a `ChunkResidency`'s chunks: the first step is recorded (the
chunks each moment uses, the most bytes the step's other tensors hold until the next, the rest of the
process) and the placement planned from it (`trainers.memory.chunks.placement`); later steps follow
the plan and read the chunks of the next `PREFETCH_MOMENTS` moments ahead.

The budget counts the whole process's resident memory: the rest of the process (its resident
memory beyond the chunks and the step's tensors, the most of it seen at any moment of the first
step), the step's other tensors, the chunks, and a margin (`CAPACITY_MARGIN`). Under a device tier
the device copies follow the same moments under the device budget (the chunks on the device, the
step's device tensors, the rest of the device's allocations, the caching allocator's slack, a
margin), and chunks of the next moments already in host memory are copied up ahead of their use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from collections import Counter
from typing import Protocol

import torch

from trainers.memory.chunks.device import DeviceChunks
from trainers.memory.chunks.placement import Moment, Placement
from trainers.memory.chunks.store import ChunkKey, ChunkStore
from trainers.memory.chunks.user import ChunkUser
from trainers.memory.resident import resident_set_bytes
from trainers.memory.tensor_peak import TensorPeak

class HeldChunks(Protocol):
    """What `StepMoments` reads of the chunks it plans for (`trainers.memory.chunks.residency.ChunkResidency`)."""

    store: ChunkStore
    sizes: list[int]
    """Elements of each chunk, by index."""
    budget: int
    """Bytes the process may hold."""
    user: ChunkUser
    device: DeviceChunks | None
    device_budget: int
    """Bytes the chunks and the step's tensors may hold on the device."""
    host_only: bool
    busy: bool
    pins: Counter[ChunkKey]

    def nbytes(self, key: ChunkKey) -> int:
        """Bytes of chunk `key`."""

    def make_device_room(self, key: ChunkKey | None = None) -> None:
        """Chunks off the device until what it holds, and chunk `key`'s copy, fit its budget."""


PREFETCH_MOMENTS = 2
"""Moments ahead whose chunks are read from disk before they are used."""
CAPACITY_MARGIN = 0.03
"""Share of the budget left free for what the measurement cannot see (peaks between moments)."""
CUDA_ALLOCATOR_SLACK = 256 << 20
"""Bytes of a GPU's device budget first left free, beyond the margin, for the caching allocator's reserved
but unallocated blocks, which a cap on the process's GPU memory counts and the measurement (allocated
bytes) does not (BENCHMARKS.md, "The first GPU figures: one H100"); a step that runs out widens it
(`widen_device_slack`)."""
SLACK_WIDENING = 1 / 16
"""Share of the device budget added to the allocator's slack each time a step runs out of device memory."""


class StepMoments:
    """The recorded moments of `residency`'s steps, the placement planned from them, and where the
    current step is among them."""

    def __init__(self, residency: HeldChunks) -> None:
        self.residency = residency
        device = residency.device
        self.placement = Placement()
        self.current: frozenset[ChunkKey] | None = None
        """The chunks of the current moment (None: the next pin begins a new one)."""
        self.allocator_slack = CUDA_ALLOCATOR_SLACK if device is not None and device.device.type == "cuda" else 0
        """Bytes of the device budget left to the caching allocator's reserved but unallocated blocks."""
        self._tracker: TensorPeak | None = None
        self._device_tracker: TensorPeak | None = None
        self._rest = 0
        """While the first step runs: the most resident memory seen besides chunks and its tensors."""
        self._device_rest = 0
        """While the first step runs: the most device memory seen besides chunks and the step's device tensors."""

    def begin(self, keys: frozenset[ChunkKey]) -> None:
        """The step moves to a moment using chunks `keys` (they differ from the last moment's)."""
        self.current = keys
        residency, device = self.residency, self.residency.device
        if self._tracker is not None:
            moments = self.placement.moments
            if moments:
                self._mark(moments[-1])
            self._rest = max(self._rest, resident_set_bytes() - self._host_chunk_bytes() - self._tracker.live)
            if self._device_tracker is not None:
                self._device_rest = max(self._device_rest, torch.cuda.memory_allocated(device.device)
                                        - device.held_bytes() - self._device_tracker.live)
            in_use = set(keys) | {key for key, count in residency.pins.items() if count} | residency.user.kept()
            in_use_bytes = sum(residency.nbytes(key) for key in in_use)
            on_device = device is not None and not residency.host_only
            moments.append(Moment(keys, in_use_bytes, device_in_use_bytes=in_use_bytes if on_device else 0))
        elif self.placement.planned:
            self.placement.advance(keys)
            self._prefetch()
            if device is not None:
                self._prefetch_to_device()

    def _mark(self, moment: Moment) -> None:
        """The step's tensors' most bytes from `moment` on, which ends now (off a GPU the device
        tier's tensors are the host's)."""
        moment.other_bytes = self._tracker.mark()
        moment.device_other_bytes = self._device_tracker.mark() if self._device_tracker else moment.other_bytes

    def _host_chunk_bytes(self) -> int:
        """Bytes of chunks in host memory (off a GPU, the device tier's pool included)."""
        device = self.residency.device
        pool = device.held_bytes() if device is not None and device.device.type == "cpu" else 0
        return self.residency.store.resident_bytes() + pool

    def _ahead(self, capacity: list[int]) -> Iterator[tuple[Moment, int]]:
        """The next `PREFETCH_MOMENTS` moments, nearest first, each with the least of `capacity`
        from now to it (none outside the recorded step)."""
        placement, here = self.placement, self.placement.position
        if not 0 <= here < len(placement.moments):
            return
        room = capacity[here]
        for ahead in range(here + 1, min(here + 1 + PREFETCH_MOMENTS, len(placement.moments))):
            room = min(room, capacity[ahead])
            yield placement.moments[ahead], room

    def _prefetch(self) -> None:
        """Start reading the chunks of the next moments, nearest first, while they fit the capacity
        of every moment from now to their use beside the chunks in memory (a read ahead never
        evicts: on a disk-bound machine an eviction for it costs more reads than the overlap gains;
        BENCHMARKS.md, "Tiered memory")."""
        residency = self.residency
        store, device = residency.store, residency.device
        for moment, room in self._ahead(self.placement.capacity):
            for key in sorted(moment.chunks):
                if not store.readable(key) or (device is not None and key in device.memory):
                    continue
                if store.resident_bytes() + residency.nbytes(key) > room:
                    return
                store.prefetch(key, residency.sizes[key[1]])

    def _prefetch_to_device(self) -> None:
        """Copy up the chunks of the next moments that work on the device and are in host memory,
        nearest first, while they fit the device's capacity from now to their use."""
        residency = self.residency
        store, device = residency.store, residency.device
        for moment, room in self._ahead(self.placement.device_capacity):
            if not moment.device_in_use_bytes:
                continue
            for key in sorted(moment.chunks):
                if key in device.memory or key not in store.memory:
                    continue
                if device.held_bytes() + (0 if device.has_spare(residency.sizes[key[1]]) else residency.nbytes(key)) > room:
                    return
                residency.busy, was_busy = True, residency.busy
                try:
                    residency.user.bound(key, device.upload(key, store.memory[key], ahead=True))
                except torch.OutOfMemoryError:
                    device.out_of_memory_retries += 1
                    return  # a copy ahead is never worth an eviction
                finally:
                    residency.busy = was_busy

    def new_region(self) -> None:
        """What runs next does not continue the last moment (an evaluation, a checkpoint)."""
        self.current = None

    @contextmanager
    def measured_step(self) -> Iterator[None]:
        """One training step runs inside; the first records the step's moments and plans the
        placement from them."""
        recording = not self.placement.planned
        self._rest = resident_set_bytes() - self._host_chunk_bytes()
        device = self.residency.device
        on_gpu = device is not None and device.device.type == "cuda"
        self._tracker = TensorPeak("cpu" if on_gpu else None) if recording else None
        self._device_tracker = TensorPeak("cuda") if recording and on_gpu else None
        self.placement.position, self.current = -1, None
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
        budget = self.residency.budget
        capacity, short, margin = capacities(moments, budget, rest, lambda moment: moment.other_bytes,
                                             lambda moment: moment.in_use_bytes)
        if short is not None:
            moment = moments[short]
            raise MemoryError(
                f"memory_budget={budget:,} bytes is smaller than the step's working set: at moment {short} of "
                f"{len(moments)} it needs chunks in use ({moment.in_use_bytes:,} bytes: {sorted(moment.chunks)} and any "
                f"kept), the step's other tensors ({moment.other_bytes:,}), the rest of the process ({rest:,}) and a margin "
                f"of {CAPACITY_MARGIN:.0%} ({margin:,}); give a larger budget or a smaller micro batch")
        self.placement.plan(capacity, self._device_capacity() if self.residency.device is not None else None)

    def _device_capacity(self) -> list[int]:
        """Bytes the chunks may hold on the device at each recorded moment."""
        moments, slack, budget = self.placement.moments, self.allocator_slack, self.residency.device_budget
        capacity, short, margin = capacities(moments, budget, self._device_rest + slack,
                                             lambda moment: moment.device_other_bytes,
                                             lambda moment: moment.device_in_use_bytes)
        if short is not None:
            moment = moments[short]
            raise MemoryError(
                f"device_memory_budget={budget:,} bytes is smaller than the step's working set on the "
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
        self.allocator_slack += int(SLACK_WIDENING * self.residency.device_budget)
        self.placement.device_capacity = self._device_capacity()
        self.placement.position = len(self.placement.moments)  # outside the step: the smallest capacity
        self.residency.make_device_room()
        device = self.residency.device
        while device.free_spare():
            pass
        if device.device.type == "cuda":
            torch.cuda.empty_cache()  # pages of the freed blocks unmapped, for one contiguous range again


def capacities(moments: list[Moment], budget: int, rest: int, other: Callable[[Moment], int],
               in_use: Callable[[Moment], int]) -> tuple[list[int], int | None, int]:
    """Bytes the chunks may hold at each of `moments` under `budget`, less a margin, `rest` and the
    moment's `other` tensors; the moment whose chunks `in_use` most lack that room (None when every
    moment has it); the margin."""
    margin = int(CAPACITY_MARGIN * budget)
    capacity = [budget - margin - rest - other(moment) for moment in moments]
    short = max(range(len(moments)), key=lambda i: in_use(moments[i]) - capacity[i])
    return capacity, (short if capacity[short] < in_use(moments[short]) else None), margin
