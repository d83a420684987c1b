"""The device tier of chunked states: copies of chunks in the compute device's memory, above the
host tier (`trainers.memory.chunks.store`: host memory, pinned on a GPU machine, and disk).

A chunk the model computes with is copied up from host memory (or created on the device when it
was never written: gradients, moments before the first step); a device copy that changed there
(gradients accumulated, an update run on the device) is the only true copy of its chunk until it
is copied down again, which happens when it leaves the device. Which copies stay is decided by
`trainers.memory.chunks.residency`; this class only holds them and moves their bytes.

A chunk that leaves the device leaves its buffer behind as a spare, which the next chunk of that
size comes up into: chunk memory passes from chunk to chunk without going back to the caching
allocator, where the step's other tensors would split it into pieces no chunk fits (a 48-layer GPT
under a 4 GiB cap on the H200 ran out of memory with 402 MiB reserved but unallocated: BENCHMARKS.md,
"The fourth GPU session"). The residency frees spares when the budget needs their room. A spare
that tensors outside still view (a weight unpacked for a backward formula while the next one's
chunk came up) is not reused until they are gone.

On a GPU, copies up run on a side CUDA stream, so that a chunk read ahead of its use travels while
the model computes; the compute stream waits for a chunk's copy only when it first uses the chunk.
Copies down run on the compute stream and wait for it (the host copy is read right after, by the
disk thread or the optimizer). On a CPU-only machine the device is host memory itself; a device
tier there is a second pool of host memory under its own budget, which runs every move of the
tiers (synchronously) on any machine.
"""

from __future__ import annotations

import torch

from trainers.memory.chunks.store import ChunkKey
from zoo.torch_compat import disable_current_modes, storage_use_count


def _viewed(buffer: torch.Tensor) -> bool:
    """Whether tensors besides `buffer` still use its memory (the check torch's CUDA graph trees make
    before reusing an output's memory)."""
    return storage_use_count(buffer) > 2  # `buffer` and the storage object here


class DeviceChunks:
    """Chunks of `dtype` elements held on `device`."""

    def __init__(self, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
        self.device, self.dtype = device, dtype
        self.memory: dict[ChunkKey, torch.Tensor] = {}
        """Chunks on the device."""
        self.dirty: set[ChunkKey] = set()
        """Chunks whose device copy is their only true copy (changed on the device)."""
        self.bytes_up = 0
        """Bytes copied from host memory to the device so far."""
        self.bytes_down = 0
        """Bytes copied from the device to host memory so far."""
        self.bytes_ahead = 0
        """Bytes of `bytes_up` copied ahead of their use."""
        self._resident = 0
        self._spares: dict[int, list[torch.Tensor]] = {}
        """Buffers no chunk holds, by element count, for the next chunk of that size."""
        self._spare_bytes = 0
        self.allocations = 0
        """Buffers allocated from the device's allocator so far (the rest came from spares)."""
        self.out_of_memory_retries = 0
        """Allocations that ran out of device memory and were retried after evictions (or given up, for
        a copy ahead of its use)."""
        self._ready: dict[ChunkKey, torch.cuda.Event] = {}
        """Copies up still travelling on the side stream, and the events that mark their end."""
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        """The side stream that copies chunks up (None off a GPU: copies are synchronous)."""

    def resident_bytes(self) -> int:
        """Bytes of the chunks on the device."""
        return self._resident

    def held_bytes(self) -> int:
        """Bytes of device memory this tier holds: its chunks and its spare buffers."""
        return self._resident + self._spare_bytes

    def has_spare(self, numel: int) -> bool:
        """Whether a chunk of `numel` elements would come up into a spare buffer."""
        return any(not _viewed(spare) for spare in self._spares.get(numel, ()))

    def free_spare(self, keep: int | None = None) -> bool:
        """Free one spare buffer, but not the last one of `keep` elements; False when there is none to free."""
        for numel, spares in self._spares.items():
            if spares and (numel != keep or len(spares) > 1):
                self._spare_bytes -= spares.pop().nbytes
                return True
        return False

    def _allocate(self, key: ChunkKey, numel: int) -> torch.Tensor:
        spares = self._spares.get(numel, [])
        free = next((index for index, spare in enumerate(spares) if not _viewed(spare)), None)
        if free is not None:
            buffer = spares.pop(free)
            self._spare_bytes -= buffer.nbytes
        else:
            with disable_current_modes():  # not one of the step's tensors (trainers.memory.tensor_peak)
                buffer = torch.empty(numel, dtype=self.dtype, device=self.device)
            self.allocations += 1
        self.memory[key] = buffer
        self._resident += buffer.nbytes
        return buffer

    def upload(self, key: ChunkKey, host: torch.Tensor, ahead: bool = False) -> torch.Tensor:
        """Chunk `key` copied up from its host buffer `host` (on the side stream on a GPU; `ahead`:
        before its use); returns the device buffer."""
        buffer = self._allocate(key, host.numel())
        with disable_current_modes():
            if self.stream is None:
                buffer.copy_(host)
            else:
                self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the memory's last users
                with torch.cuda.stream(self.stream):
                    buffer.copy_(host, non_blocking=True)
                buffer.record_stream(self.stream)
                event = torch.cuda.Event()
                event.record(self.stream)
                self._ready[key] = event
        self.bytes_up += buffer.nbytes
        if ahead:
            self.bytes_ahead += buffer.nbytes
        return buffer

    def zeros(self, key: ChunkKey, numel: int) -> torch.Tensor:
        """Chunk `key`, never written anywhere, created as zeros on the device (changed there)."""
        buffer = self._allocate(key, numel)
        with disable_current_modes():
            buffer.zero_()
        self.dirty.add(key)
        return buffer

    def receive(self, key: ChunkKey, numel: int) -> torch.Tensor:
        """An uninitialised chunk `key` on the device, to be filled from another rank."""
        return self._allocate(key, numel)

    def wait(self, key: ChunkKey) -> None:
        """Make the compute stream wait for chunk `key`'s copy up (the event is kept until the
        copy is dropped: the host may change its source only after that)."""
        event = self._ready.get(key)
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def download(self, key: ChunkKey, host: torch.Tensor) -> None:
        """Chunk `key`'s device copy into its host buffer `host`, complete when this returns."""
        self.wait(key)
        with disable_current_modes():
            host.copy_(self.memory[key])
        self.bytes_down += host.nbytes

    def drop(self, key: ChunkKey) -> None:
        """Chunk `key`'s device copy forgotten, its buffer kept as a spare (a copy up still travelling
        finishes first). The buffer's last uses need no wait: a copy up into it waits for the compute
        stream, and the compute stream's own work is in order."""
        buffer = self.memory.pop(key, None)
        if buffer is None:
            return
        event = self._ready.pop(key, None)
        if event is not None:
            event.synchronize()  # its host buffer may be written once this returns
        self._resident -= buffer.nbytes
        self.dirty.discard(key)
        self._spares.setdefault(buffer.numel(), []).append(buffer)
        self._spare_bytes += buffer.nbytes
