"""Activation swapping (Harmony; ZeRO-Infinity's activation offload): tensors that autograd saves
for backward, of at least `min_bytes`, go to files as forward saves them and come back ahead of
their use in backward, so that a step's activations need not all be in memory at once.

Pack (forward, `saved_tensors_hooks`): a saved tensor of at least `min_bytes` is handed to a
background thread that writes it (checksummed, out of the page cache, as chunk files are:
`trainers.memory.chunks.store`); the tensor stays referenced until its write ends, then is released, so
its memory is freed once nothing else holds it (an activation still used further on in forward
is freed when that use ends). A tensor whose elements fill a region of its storage (contiguous,
or a permutation of that, such as a transpose) is written as that region and comes back with its
strides; any other view (a slice of a larger tensor: attention's q, k, v of one projection) is
written as a contiguous copy, and comes back contiguous. At most `MAX_PENDING` writes wait at
once: forward waits for the oldest beyond that, so that swapping bounds the memory it holds back.

Unpack (backward): the tensor comes back from its file (refused if changed on disk), or as it is
while its write has not ended. Backward unpacks in about the reverse order of forward's packs, so
unpacking one starts reading the nearest swapped before it that backward has not used yet, as long
as fewer than `READ_AHEAD` reads ahead wait for their use. A file is removed when autograd
frees the record that names it (after backward, or with a graph that is never run backward).

The rule for which activations swap is the size: tensors below `min_bytes` stay (their file
traffic would cost more than their memory), tensors above go; what a block keeps at all
(everything, or only its input and recomputed the rest) is `Strategy.recompute`'s.
"""

from __future__ import annotations

import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trainers.memory.chunks.store import read_file, write_file

MAX_PENDING = 4
"""Swapped tensors whose writes may wait at once (forward waits beyond)."""
READ_AHEAD = 2
"""Swapped tensors read ahead of backward's use at most at once."""


@dataclass(eq=False)
class SwappedTensor:
    """A saved tensor in its file."""

    index: int
    """Order of the pack in the step."""
    path: Path
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    """The strides it comes back with."""
    dtype: torch.dtype
    nbytes: int
    tensor: torch.Tensor | None = None
    """The tensor itself while its write has not ended."""
    write: Future | None = None
    checksum: str = ""
    read: tuple[Future, torch.Tensor] | None = field(default=None, repr=False)
    """A read ahead under way: its future and its buffer (bytes)."""
    used: bool = False
    """Whether backward has unpacked it (it is not read ahead again)."""


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def fills_its_region(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s elements fill a region of its storage without gaps or overlaps (a
    permutation of a contiguous layout)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(tensor.stride(), tensor.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


class ActivationSwap:
    """Saved tensors of at least `min_bytes` to files in `directory` and back, the disk transfers on
    `io`'s thread. `begin_step` starts a step's order of packs."""

    def __init__(self, directory: str | Path, min_bytes: int, io: ThreadPoolExecutor) -> None:
        self.directory, self.min_bytes, self.io = Path(directory), min_bytes, io
        self.enabled = True
        """Whether `pack` swaps now (a per-block plan turns it on only inside the blocks that swap;
        `trainers.memory.activations.plan`)."""
        self.bytes_written = 0
        """Bytes of saved tensors written so far."""
        self.bytes_read = 0
        """Bytes of saved tensors read back so far."""
        self._writing: deque[SwappedTensor] = deque()
        self._reading = 0
        """Reads ahead whose tensors backward has not used yet."""
        self._order: list[weakref.ref[SwappedTensor]] = []
        self._count = 0

    def begin_step(self) -> None:
        """A new step's forward begins (read-ahead follows its packs only)."""
        self._order, self._reading = [], 0

    def end_step(self) -> None:
        """The step is over: wait for the writes under way, and hold no saved tensor any longer."""
        while self._writing:
            self._finish_write(self._writing.popleft())

    def pack(self, tensor: torch.Tensor) -> torch.Tensor | SwappedTensor:
        """`tensor` as autograd keeps it: itself, or a record of its file being written."""
        if (not self.enabled or tensor.nbytes < self.min_bytes or tensor.device.type != "cpu"
                or tensor.layout != torch.strided):
            return tensor
        self._collect()
        path = self.directory / f"saved{self._count:08d}.bin"
        self._count += 1
        tensor = tensor.detach()
        if fills_its_region(tensor):
            region, stride = tensor.as_strided((tensor.numel(),), (1,)), tensor.stride()
        else:
            region = tensor.contiguous().view(-1)
            stride = region.view(tensor.shape).stride()
        data = memoryview(region.view(torch.uint8).numpy())
        swapped = SwappedTensor(len(self._order), path, tuple(tensor.shape), stride, tensor.dtype, tensor.nbytes,
                                region, self.io.submit(write_file, self.directory, path, data,
                                                       f"saved activation {path.name}"))
        weakref.finalize(swapped, _remove, path)
        self._order.append(weakref.ref(swapped))
        self._writing.append(swapped)
        self.bytes_written += swapped.nbytes
        while len(self._writing) > MAX_PENDING:
            self._finish_write(self._writing.popleft())
        return swapped

    def unpack(self, saved: torch.Tensor | SwappedTensor) -> torch.Tensor:
        """The tensor that `pack` returned `saved` for."""
        if not isinstance(saved, SwappedTensor):
            return saved
        self._collect()
        saved.used = True
        if saved.tensor is not None:  # its write has not ended: the tensor is still here
            return saved.tensor.as_strided(saved.shape, saved.stride)
        if saved.read is not None:
            future, buffer = saved.read
            saved.read = None
            self._reading -= 1
            future.result()
        else:
            buffer = self._buffer(saved.nbytes)
            read_file(saved.path, memoryview(buffer.numpy()), saved.checksum)
            self.bytes_read += saved.nbytes
        self._read_ahead(saved.index)
        return buffer.view(saved.dtype).as_strided(saved.shape, saved.stride)

    @staticmethod
    def _buffer(nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)  # one of the step's tensors (a tracker counts it)

    def _read_ahead(self, index: int) -> None:
        """Start reading the swapped tensors packed before pack `index`, nearest first, that are on
        disk and not yet used, while fewer than `READ_AHEAD` reads ahead wait for their use."""
        for earlier in range(min(index, len(self._order)) - 1, -1, -1):
            if self._reading >= READ_AHEAD:
                return
            swapped = self._order[earlier]()
            if swapped is None or swapped.used or swapped.read is not None or swapped.tensor is not None:
                continue  # gone, used, on its way, or still in memory
            buffer = self._buffer(swapped.nbytes)
            swapped.read = (self.io.submit(read_file, swapped.path, memoryview(buffer.numpy()), swapped.checksum), buffer)
            self._reading += 1
            self.bytes_read += swapped.nbytes

    def _collect(self) -> None:
        while self._writing and self._writing[0].write.done():
            self._finish_write(self._writing.popleft())

    @staticmethod
    def _finish_write(swapped: SwappedTensor) -> None:
        swapped.checksum = swapped.write.result()
        swapped.tensor, swapped.write = None, None
