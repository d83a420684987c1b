"""Activation swapping to files (Harmony; ZeRO-Infinity's activation offload): tensors in host
memory that autograd saves for backward, of at least `min_bytes`, go to files as forward saves them
and come back ahead of their use in backward, so that a step's activations need not all be in
memory at once.

Pack (forward, `saved_tensors_hooks`): a saved tensor of at least `min_bytes` is handed to a
background thread that writes it (checksummed, out of the page cache, as chunk files are:
`trainers.memory.chunks.store`); the tensor stays referenced until its write ends, then is released, so
its memory is freed once nothing else holds it (an activation still used further on in forward
is freed when that use ends). What is written is the region of its storage the tensor fills, or a
contiguous copy (`trainers.memory.activations.saved.travelling_region`). At most `MAX_PENDING`
writes wait at once: forward waits for the oldest beyond that, so that swapping bounds the memory
it holds back.

Unpack (backward): the tensor comes back from its file (refused if changed on disk), or as it is
while its write has not ended; reads ahead of backward follow the step's order of packs
(`trainers.memory.activations.saved`). A file is removed when autograd frees the record that names
it (after backward, or with a graph that is never run backward).

The rule for which activations swap is the size: tensors below `min_bytes` stay (their file
traffic would cost more than their memory), tensors above go; what a block keeps at all
(everything, or only its input and recomputed the rest) is `Strategy.recompute`'s.
"""

from __future__ import annotations

import os
import time
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trainers.memory.activations.saved import SavedTensorSwap, Swapped, travelling_region
from trainers.memory.chunks.store import read_file, write_file

MAX_PENDING = 4
"""Swapped tensors whose writes may wait at once (forward waits beyond)."""
PROBE_FILE_BYTES = 16 << 20
"""Bytes of the file that measures the disk."""


@dataclass(eq=False, kw_only=True)
class SwappedTensor(Swapped):
    """A saved tensor in its file."""

    path: Path
    tensor: torch.Tensor | None = None
    """The tensor itself while its write has not ended."""
    write: Future | None = None
    checksum: str = ""
    read: tuple[Future, torch.Tensor] | None = field(default=None, repr=False)
    """A read ahead under way: its future and its buffer (bytes)."""


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


class ActivationSwap(SavedTensorSwap):
    """Saved tensors in host memory, of at least `min_bytes`, to files in `directory` and back, the
    disk transfers on `io`'s thread."""

    def __init__(self, directory: str | Path, min_bytes: int, io: ThreadPoolExecutor) -> None:
        super().__init__(min_bytes, "cpu")
        self.directory, self.io = Path(directory), io
        self._writing: deque[SwappedTensor] = deque()
        self._count = 0

    def end_step(self) -> None:
        """The step is over: wait for the writes under way, and hold no saved tensor any longer."""
        while self._writing:
            self._finish_write(self._writing.popleft())

    def seconds_per_byte(self) -> float:
        """The disk's seconds per byte written and read back (`disk_seconds_per_byte`)."""
        return disk_seconds_per_byte(self.directory)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor | SwappedTensor:
        """`tensor` as autograd keeps it: itself, or a record of its file being written."""
        if not self.swaps(tensor):
            return tensor
        self._collect()
        path = self.directory / f"saved{self._count:08d}.bin"
        self._count += 1
        tensor = tensor.detach()
        region, stride = travelling_region(tensor)
        data = memoryview(region.view(torch.uint8).numpy())
        swapped = SwappedTensor(index=self._next_index(), path=path, shape=tuple(tensor.shape), stride=stride,
                                dtype=tensor.dtype, nbytes=tensor.nbytes, tensor=region,
                                write=self.io.submit(write_file, self.directory, path, data,
                                                     f"saved activation {path.name}"))
        weakref.finalize(swapped, _remove, path)
        self._packed(swapped)
        self._writing.append(swapped)
        while len(self._writing) > MAX_PENDING:
            self._finish_write(self._writing.popleft())
        return swapped

    def unpack(self, saved: torch.Tensor | SwappedTensor) -> torch.Tensor:
        """The tensor that `pack` returned `saved` for."""
        if not isinstance(saved, SwappedTensor):
            return saved
        self._collect()
        if saved.tensor is not None:  # its write has not ended: the tensor is still here
            saved.used = True
            return saved.tensor.as_strided(saved.shape, saved.stride)
        ahead = saved.read is not None
        if ahead:
            future, buffer = saved.read
            saved.read = None
            future.result()
        else:
            buffer = self._buffer(saved.nbytes)
            read_file(saved.path, memoryview(buffer.numpy()), saved.checksum)
        self._used(saved, ahead)
        return buffer.view(saved.dtype).as_strided(saved.shape, saved.stride)

    @staticmethod
    def _buffer(nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)  # one of the step's tensors (a tracker counts it)

    def _can_read(self, swapped: SwappedTensor) -> bool:
        return swapped.read is None and swapped.tensor is None  # not on its way, not still in memory

    def _start_read(self, swapped: SwappedTensor) -> None:
        buffer = self._buffer(swapped.nbytes)
        swapped.read = (self.io.submit(read_file, swapped.path, memoryview(buffer.numpy()), swapped.checksum), buffer)

    def _collect(self) -> None:
        while self._writing and self._writing[0].write.done():
            self._finish_write(self._writing.popleft())

    @staticmethod
    def _finish_write(swapped: SwappedTensor) -> None:
        swapped.checksum = swapped.write.result()
        swapped.tensor, swapped.write = None, None


def disk_seconds_per_byte(directory: str | Path) -> float:
    """Seconds per byte to write a file in `directory` (flushed to the disk) and read it back
    (past the page cache), as the swap does, measured on `PROBE_FILE_BYTES`."""
    directory = Path(directory)
    path = directory / "disk_probe.bin"
    data = torch.ones(PROBE_FILE_BYTES, dtype=torch.uint8).numpy()
    started = time.perf_counter()
    checksum = write_file(directory, path, memoryview(data), "the disk probe")
    read_file(path, memoryview(data), checksum)
    elapsed = time.perf_counter() - started
    os.unlink(path)
    return elapsed / PROBE_FILE_BYTES
