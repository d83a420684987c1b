"""The device tier of chunked states: copies of chunks in the compute device's memory, above the
host tier (`trainers.chunk_store`: host memory, pinned on a GPU machine, and disk).

A chunk the model computes with is copied up from host memory (or created on the device when it
was never written: gradients, moments before the first step); a device copy that changed there
(gradients accumulated, an update run on the device) is the only true copy of its chunk until it
is copied down again, which happens when it leaves the device. Which copies stay is decided by
`trainers.chunk_residency`; this class only holds them and moves their bytes.

On a GPU, copies up run on a side CUDA stream, so that a chunk read ahead of its use travels while
the model computes; the compute stream waits for a chunk's copy only when it first uses the chunk.
Copies down run on the compute stream and wait for it (the host copy is read right after, by the
disk thread or the optimizer). On a CPU-only machine the device is host memory itself; a device
tier there is a second pool of host memory under its own budget, which runs every move of the
tiers (synchronously) on any machine.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes

from trainers.chunk_store import ChunkKey


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
        self._ready: dict[ChunkKey, torch.cuda.Event] = {}
        """Copies up still travelling on the side stream, and the events that mark their end."""
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        """The side stream that copies chunks up (None off a GPU: copies are synchronous)."""

    def resident_bytes(self) -> int:
        """Bytes of the chunks on the device."""
        return self._resident

    def _allocate(self, key: ChunkKey, numel: int) -> torch.Tensor:
        with _disable_current_modes():  # not one of the step's tensors (trainers.tensor_peak)
            buffer = torch.empty(numel, dtype=self.dtype, device=self.device)
        self.memory[key] = buffer
        self._resident += buffer.nbytes
        return buffer

    def upload(self, key: ChunkKey, host: torch.Tensor, ahead: bool = False) -> torch.Tensor:
        """Chunk `key` copied up from its host buffer `host` (on the side stream on a GPU; `ahead`:
        before its use); returns the device buffer."""
        buffer = self._allocate(key, host.numel())
        with _disable_current_modes():
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
        with _disable_current_modes():
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
        with _disable_current_modes():
            host.copy_(self.memory[key])
        self.bytes_down += host.nbytes

    def drop(self, key: ChunkKey) -> None:
        """Free chunk `key`'s device copy (a copy up still travelling finishes first)."""
        buffer = self.memory.pop(key, None)
        if buffer is None:
            return
        event = self._ready.pop(key, None)
        if event is not None:
            event.synchronize()  # its host buffer may be written once this returns
        self._resident -= buffer.nbytes
        self.dirty.discard(key)
