"""Chunks in two tiers: in memory, or in a file on disk.

A chunk is a flat tensor named by a key, (kind, index): ("param", 3) is the fourth chunk of
parameters, ("exp_avg", 3) the Adam moments of the same tensors. A chunk never written is
absent, and reads as zeros (gradients at the start of a step, moments before the first).

Chunk files bypass the operating system's page cache once written or read (posix_fadvise
DONTNEED): the machine's memory is not quietly spent as a cache of them, and a chunk read comes
from the disk.

A chunk file is written next to its final name, flushed to the disk and renamed, and its BLAKE2b
checksum is kept in memory: a file that is truncated or changed between its write and a read is
refused with an error, never read into the model. A write that fails (a full or unwritable
directory) leaves the chunk in memory, unchanged. A chunk read back keeps its file: evicting it
again before it changes (a parameter read in forward) writes nothing.

Buffers are allocated outside any dispatch mode, so that a tracker of the step's other tensors
(`trainers.tensor_peak.TensorPeak`) does not count them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import torch
from torch.utils._python_dispatch import _disable_current_modes

ChunkKey = tuple[str, int]


def _checksum(data: memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class ChunkStore:
    """Chunks of `dtype` elements; those evicted go to files in `directory`."""

    def __init__(self, directory: str | Path, dtype: torch.dtype = torch.float32) -> None:
        self.directory, self.dtype = Path(directory), dtype
        self.memory: dict[ChunkKey, torch.Tensor] = {}
        """Chunks in memory."""
        self.files: dict[ChunkKey, str] = {}
        """Chunks with a file on disk, and the file's checksum."""
        self.dirty: set[ChunkKey] = set()
        """Chunks in memory that differ from their file (or have none)."""
        self.bytes_read = 0
        """Bytes read from chunk files so far."""
        self.bytes_written = 0
        """Bytes written to chunk files so far."""

    def path(self, key: ChunkKey) -> Path:
        """The file of chunk `key`."""
        return self.directory / f"{key[0]}{key[1]:05d}.bin"

    def resident_bytes(self) -> int:
        """Bytes of the chunks in memory."""
        return sum(buffer.nbytes for buffer in self.memory.values())

    def load(self, key: ChunkKey, numel: int) -> torch.Tensor:
        """Chunk `key` of `numel` elements in memory: as it is, read from its file, or zeros
        when it was never written."""
        buffer = self.memory.get(key)
        if buffer is not None:
            return buffer
        if key in self.files:
            buffer = self._read(key, numel)
        else:
            with _disable_current_modes():
                buffer = torch.zeros(numel, dtype=self.dtype)
            self.dirty.add(key)
        self.memory[key] = buffer
        return buffer

    def receive(self, key: ChunkKey, numel: int) -> torch.Tensor:
        """An uninitialised chunk `key` of `numel` elements in memory, to be filled from elsewhere
        (another rank); it has no file and is never written to one (`drop` it)."""
        with _disable_current_modes():
            buffer = torch.empty(numel, dtype=self.dtype)
        self.memory[key] = buffer
        return buffer

    def changed(self, key: ChunkKey) -> None:
        """Chunk `key` (in memory) was written to: its file no longer holds it."""
        self.dirty.add(key)

    def evict(self, key: ChunkKey) -> int:
        """Free chunk `key`'s memory, first writing it to its file when the file does not hold it;
        returns the bytes written."""
        buffer = self.memory[key]
        written = 0
        if key in self.dirty:
            self._write(key, buffer)
            written = buffer.nbytes
        del self.memory[key]
        return written

    def drop(self, key: ChunkKey) -> None:
        """Forget chunk `key` (its memory and its file): it reads as zeros again."""
        self.memory.pop(key, None)
        self.dirty.discard(key)
        if self.files.pop(key, None) is not None:
            self.path(key).unlink(missing_ok=True)

    def _write(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        data = memoryview(buffer.view(torch.uint8).numpy())
        target = self.path(key)
        partial = target.with_suffix(".partial")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as sink:
                sink.write(data)
                sink.flush()
                os.fsync(sink.fileno())
                os.posix_fadvise(sink.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            os.replace(partial, target)
        except OSError as error:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            raise OSError(error.errno, f"offload directory {str(self.directory)!r} cannot take chunk {key[0]} {key[1]} "
                                       f"({data.nbytes:,} bytes): {error.strerror}; the chunk stays in memory") from error
        self.files[key] = _checksum(data)
        self.dirty.discard(key)
        self.bytes_written += data.nbytes

    def _read(self, key: ChunkKey, numel: int) -> torch.Tensor:
        with _disable_current_modes():
            buffer = torch.empty(numel, dtype=self.dtype)
        data = memoryview(buffer.view(torch.uint8).numpy())
        path = self.path(key)
        with open(path, "rb") as source:
            read = source.readinto(data)
            extra = len(source.read(1))
            os.posix_fadvise(source.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        if read != data.nbytes or extra:
            raise RuntimeError(f"chunk file {path} holds {path.stat().st_size:,} bytes; {data.nbytes:,} were written")
        checksum = _checksum(data)
        if checksum != self.files[key]:
            raise RuntimeError(f"chunk file {path} changed on disk since it was written: BLAKE2b {checksum}, "
                               f"{self.files[key]} written")
        self.bytes_read += data.nbytes
        return buffer
