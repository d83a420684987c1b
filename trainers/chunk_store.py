"""A module's parameters in chunks (`trainers.chunks`), each chunk in one of two tiers: in memory,
where every parameter of the chunk is a view into it, or in a file on disk, where its parameters
hold no storage until the chunk is fetched back.

A chunk file is written next to its final name and renamed, and its BLAKE2b checksum is kept in
memory: a file that is truncated or changed between its eviction and its fetch is refused with an
error, never read into the model. A write that fails (a full or unwritable directory) leaves the
chunk in memory, unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from trainers.chunks import ChunkLayout, search_chunk_size

Tier = Literal["memory", "disk"]


class ParameterChunks:
    """The parameters of `module` (in registration order, one dtype) packed into the chunks of
    `layout` (default: `search_chunk_size` over their sizes), all in memory at first; evicted
    chunks go to files in `directory`."""

    def __init__(self, module: nn.Module, directory: str | Path, layout: ChunkLayout | None = None) -> None:
        self.parameters = list(module.parameters())
        dtypes = {p.dtype for p in self.parameters}
        if len(dtypes) != 1:
            raise ValueError(f"module's parameters must share one dtype to share chunks; got {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop()
        numels = [p.numel() for p in self.parameters]
        self.layout = layout or search_chunk_size(numels)
        if self.layout.numels != tuple(numels):
            raise ValueError(f"layout must lay out the module's {len(numels)} parameters of {sum(numels)} elements; got "
                             f"{len(self.layout.numels)} tensors of {sum(self.layout.numels)}")
        self.directory = Path(directory)
        self.shapes = [p.shape for p in self.parameters]
        self.tiers: list[Tier] = ["memory"] * self.layout.chunks
        self.checksums: list[str | None] = [None] * self.layout.chunks
        self.buffers: list[torch.Tensor | None] = []
        for chunk in range(self.layout.chunks):
            buffer = torch.zeros(self.layout.chunk_numel, dtype=self.dtype)
            for index in self.layout.members(chunk):
                offset = self.layout.slots[index][1]
                buffer[offset:offset + numels[index]].copy_(self.parameters[index].detach().reshape(-1))
            self.buffers.append(buffer)
            self._bind(chunk)

    def path(self, chunk: int) -> Path:
        """The file of `chunk` while it is on disk."""
        return self.directory / f"chunk{chunk:05d}.bin"

    def evict(self, chunk: int) -> None:
        """Write `chunk` to its file and free its memory (its parameters become empty)."""
        if self.tiers[chunk] == "disk":
            return
        buffer = self.buffers[chunk]
        data = buffer.view(torch.uint8).numpy()
        target, partial = self.path(chunk), self.path(chunk).with_suffix(".partial")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as sink:
                sink.write(memoryview(data))
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(partial, target)
        except OSError as error:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            raise OSError(error.errno, f"directory={str(self.directory)!r} cannot take chunk {chunk} ({data.nbytes} "
                                       f"bytes): {error.strerror}; the chunk stays in memory") from error
        self.checksums[chunk] = hashlib.blake2b(memoryview(data), digest_size=16).hexdigest()
        self.tiers[chunk] = "disk"
        self.buffers[chunk] = None
        for index in self.layout.members(chunk):
            self.parameters[index].data = torch.empty(0, dtype=self.dtype)

    def fetch(self, chunk: int) -> None:
        """Read `chunk` back from its file into memory, checked against the checksum written."""
        if self.tiers[chunk] == "memory":
            return
        buffer = torch.empty(self.layout.chunk_numel, dtype=self.dtype)
        data = buffer.view(torch.uint8).numpy()
        path = self.path(chunk)
        with open(path, "rb") as source:
            read = source.readinto(memoryview(data))
            extra = len(source.read(1))
        if read != data.nbytes or extra:
            raise RuntimeError(f"chunk file {path} holds {path.stat().st_size} bytes; {data.nbytes} were written")
        checksum = hashlib.blake2b(memoryview(data), digest_size=16).hexdigest()
        if checksum != self.checksums[chunk]:
            raise RuntimeError(f"chunk file {path} changed on disk since it was written: BLAKE2b {checksum}, "
                               f"{self.checksums[chunk]} written")
        self.buffers[chunk] = buffer
        self.tiers[chunk] = "memory"
        self._bind(chunk)
        path.unlink()

    def resident_bytes(self) -> int:
        """Bytes of the chunks in memory."""
        return sum(buffer.nbytes for buffer in self.buffers if buffer is not None)

    def _bind(self, chunk: int) -> None:
        buffer = self.buffers[chunk]
        for index in self.layout.members(chunk):
            offset, numel = self.layout.slots[index][1], self.layout.numels[index]
            self.parameters[index].data = buffer[offset:offset + numel].view(self.shapes[index])
