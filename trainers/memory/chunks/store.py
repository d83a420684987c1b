"""Chunks in two tiers: in memory, or in a file on disk.

A chunk is a flat tensor named by a key, (kind, index): ("param", 3) is the fourth chunk of
parameters, ("exp_avg", 3) the Adam moments of the same tensors. A chunk never written is
absent, and reads as zeros (gradients at the start of a step, moments before the first).

Files are read and written by one background thread, so that disk transfers overlap the
computation: `prefetch` starts reading a chunk ahead of its use, and `evict` hands a changed chunk
to the thread to write while the caller goes on. A buffer being read or written still counts as
resident until the transfer ends (`resident_bytes`); `settle` waits for writes when the memory must
be free now. `load` of a chunk on its way out takes the buffer back once its write ends (no read).

Chunk files bypass the operating system's page cache once written or read (posix_fadvise
DONTNEED): the machine's memory is not quietly spent as a cache of them, and a chunk read comes
from the disk.

A chunk file is written next to its final name, flushed to the disk and renamed, and its CRC-32
(zlib's: 7.2 GB/s on the laptop against BLAKE2b's 1.45, `benchmarks/checksum_speed.py`; BLAKE2b
took 19.7 s of a 67.7 s first step on an H100 machine, BENCHMARKS.md) is kept in memory: a file
that is truncated or changed between its write and a read is refused with an error, never read into the model. A write that fails (a full or unwritable
directory) puts the chunk back in memory, unchanged, and its error is raised by the next call to
the store. A chunk read back keeps its file: evicting it again before it changes (a parameter read
in forward) writes nothing.

Buffers are allocated outside any dispatch mode, so that a tracker of the step's other tensors
(`trainers.memory.tensor_peak.TensorPeak`) does not count them.

The files are scratch, never a checkpoint: `close` (or, for a store never closed, the interpreter's
exit) lets the thread finish its transfers, stops it, and removes the store's files and then its
directory when nothing else is left there.
"""

from __future__ import annotations

import contextlib
import os
import weakref
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from trainers.parallel.mesh import at_exit_process
from zoo.torch_compat import disable_current_modes

ChunkKey = tuple[str, int]


def _checksum(data: memoryview) -> str:
    return f"{zlib.crc32(data):08x}"


def _bytes_of(buffer: torch.Tensor) -> memoryview:
    return memoryview(buffer.view(torch.uint8).numpy())


def write_file(directory: Path, target: Path, data: memoryview, what: str) -> str:
    """`data` into file `target` (written beside it, flushed, renamed; out of the page cache);
    returns its CRC-32. OSError naming `what` when `directory` cannot take it."""
    partial = target.with_suffix(".partial")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as sink:
            sink.write(data)
            sink.flush()
            os.fsync(sink.fileno())
            os.posix_fadvise(sink.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        os.replace(partial, target)
    except OSError as error:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise OSError(error.errno, f"offload directory {str(directory)!r} cannot take {what} ({data.nbytes:,} bytes): "
                                   f"{error.strerror}") from error
    return _checksum(data)


def read_file(path: Path, data: memoryview, checksum: str) -> None:
    """File `path` into `data`, refused when its size or its CRC-32 is not `checksum`."""
    with open(path, "rb") as source:
        read = source.readinto(data)
        extra = len(source.read(1))
        os.posix_fadvise(source.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if read != data.nbytes or extra:
        raise RuntimeError(f"chunk file {path} holds {path.stat().st_size:,} bytes; {data.nbytes:,} were written")
    found = _checksum(data)
    if found != checksum:
        raise RuntimeError(f"chunk file {path} changed on disk since it was written: CRC-32 {found}, {checksum} written")


class ChunkStore:
    """Chunks of `dtype` elements; those evicted go to files in `directory`, read and written by
    a background thread. `pin_memory`: buffers in page-locked memory (a GPU copies them up and down
    without staging)."""

    def __init__(self, directory: str | Path, dtype: torch.dtype = torch.float32, pin_memory: bool = False) -> None:
        self.directory, self.dtype, self.pin_memory = Path(directory), dtype, pin_memory
        self.memory: dict[ChunkKey, torch.Tensor] = {}
        """Chunks in memory."""
        self.files: dict[ChunkKey, str] = {}
        """Chunks with a file on disk, and the file's checksum."""
        self.dirty: set[ChunkKey] = set()
        """Chunks in memory that differ from their file (or have none)."""
        self.reading: dict[ChunkKey, tuple[Future, torch.Tensor]] = {}
        """Chunks being read ahead of their use, and their buffers."""
        self.writing: dict[ChunkKey, tuple[Future, torch.Tensor]] = {}
        """Chunks evicted and being written, and their buffers (oldest first)."""
        self.bytes_read = 0
        """Bytes read from chunk files so far."""
        self.bytes_written = 0
        """Bytes written to chunk files so far."""
        self.bytes_prefetched = 0
        """Bytes of `bytes_read` read ahead of their use."""
        self._resident = 0
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-io")
        """The thread that reads and writes the files."""
        self.close = weakref.finalize(self, _shut_down, self.io, self.directory)
        """Stop the thread after its transfers and remove the store's files (at most once; at exit
        for a store never closed, `exit_process`'s included). The store cannot be used after."""
        at_exit_process(self.close)

    def path(self, key: ChunkKey) -> Path:
        """The file of chunk `key`."""
        return self.directory / f"{key[0]}{key[1]:05d}.bin"

    def resident_bytes(self) -> int:
        """Bytes of the chunks in memory, being read, or being written."""
        return self._resident

    def _allocate(self, numel: int) -> torch.Tensor:
        with disable_current_modes():
            buffer = torch.empty(numel, dtype=self.dtype, pin_memory=self.pin_memory)
        self._resident += buffer.nbytes
        return buffer

    def _free(self, buffer: torch.Tensor) -> None:
        self._resident -= buffer.nbytes

    def load(self, key: ChunkKey, numel: int) -> torch.Tensor:
        """Chunk `key` of `numel` elements in memory: as it is, back from a write or a read ahead,
        read from its file, or zeros when it was never written."""
        self.collect()
        buffer = self.memory.get(key)
        if buffer is not None:
            return buffer
        if key in self.writing:
            buffer = self._finish_write(key, keep=True)  # back in memory, and its file holds it
        elif key in self.reading:
            buffer = self._finish_read(key)
        elif key in self.files:
            buffer = self._allocate(numel)
            try:
                read_file(self.path(key), _bytes_of(buffer), self.files[key])
            except BaseException:
                self._free(buffer)
                raise
            self.bytes_read += buffer.nbytes
        else:
            buffer = self._allocate(numel)
            buffer.zero_()
            self.dirty.add(key)
        self.memory[key] = buffer
        return buffer

    def readable(self, key: ChunkKey) -> bool:
        """Whether chunk `key` would come from its file: it has one, and is neither in memory nor on its way."""
        return key in self.files and key not in self.memory and not self.pending(key)

    def pending(self, key: ChunkKey) -> bool:
        """Whether chunk `key` is being read ahead or written (its buffer counted as resident)."""
        return key in self.reading or key in self.writing

    def prefetch(self, key: ChunkKey, numel: int) -> bool:
        """Start reading chunk `key` from its file in the background; False when there is nothing
        to read (in memory, on its way, or without a file)."""
        if not self.readable(key):
            return False
        buffer = self._allocate(numel)
        self.reading[key] = (self.io.submit(read_file, self.path(key), _bytes_of(buffer), self.files[key]), buffer)
        self.bytes_read += buffer.nbytes
        self.bytes_prefetched += buffer.nbytes
        return True

    def receive(self, key: ChunkKey, numel: int) -> torch.Tensor:
        """An uninitialised chunk `key` of `numel` elements in memory, to be filled from elsewhere
        (another rank, the device); it has no file, and is written to one only once `changed`."""
        buffer = self._allocate(numel)
        self.memory[key] = buffer
        return buffer

    def changed(self, key: ChunkKey) -> None:
        """Chunk `key` (in memory) was written to: its file no longer holds it."""
        self.dirty.add(key)

    def evict(self, key: ChunkKey) -> int:
        """Free chunk `key`'s memory, first writing it to its file (in the background) when the file
        does not hold it; returns the bytes to write."""
        self.collect()
        buffer = self.memory.pop(key)
        if key not in self.dirty:
            self._free(buffer)
            return 0
        self.dirty.discard(key)
        self.files.pop(key, None)  # the file is being replaced
        what = f"chunk {key[0]} {key[1]}"
        future = self.io.submit(write_file, self.directory, self.path(key), _bytes_of(buffer), what)
        self.writing[key] = (future, buffer)
        self.bytes_written += buffer.nbytes
        return buffer.nbytes

    def drop(self, key: ChunkKey) -> None:
        """Forget chunk `key` (its memory and its file): it reads as zeros again."""
        if key in self.writing:
            self._finish_write(key, check=False)
        if key in self.reading:
            future, buffer = self.reading.pop(key)
            with contextlib.suppress(Exception):
                future.result()
            self._free(buffer)
        buffer = self.memory.pop(key, None)
        if buffer is not None:
            self._free(buffer)
        self.dirty.discard(key)
        if self.files.pop(key, None) is not None:
            self.path(key).unlink(missing_ok=True)

    def settle(self, limit: int) -> None:
        """Wait for writes, oldest first, until at most `limit` bytes are resident (or none is left)."""
        while self._resident > limit and self.writing:
            self._finish_write(next(iter(self.writing)))

    def flush(self) -> None:
        """Wait for every write and read ahead (those stay on their way until `load`); raise the first error."""
        for key in list(self.writing):
            self._finish_write(key)
        for future, _ in self.reading.values():
            future.result()

    def collect(self) -> None:
        """Account the writes that ended (raising a failed one's error, its chunk back in memory)."""
        for key in [key for key, (future, _) in self.writing.items() if future.done()]:
            self._finish_write(key)

    def _finish_write(self, key: ChunkKey, check: bool = True, keep: bool = False) -> torch.Tensor | None:
        """Wait for chunk `key`'s write; its buffer freed, or returned (still counted) when `keep`.
        A failed write puts the chunk back in memory, changed, and raises its error (`check`)."""
        future, buffer = self.writing.pop(key)
        try:
            self.files[key] = future.result()
        except OSError as error:
            if not check:
                self._free(buffer)
                return None
            self.memory[key] = buffer  # still resident
            self.dirty.add(key)
            raise OSError(error.errno, f"{error.strerror}; the chunk stays in memory") from error
        if keep:
            return buffer
        self._free(buffer)
        return None

    def _finish_read(self, key: ChunkKey) -> torch.Tensor:
        future, buffer = self.reading.pop(key)
        try:
            future.result()
        except BaseException:
            self._free(buffer)
            raise
        return buffer


def _shut_down(io: ThreadPoolExecutor, directory: Path) -> None:
    """`io`'s transfers finished and its thread stopped; the files it wrote under `directory` (chunks,
    swapped activations, what a failed write left) removed, then the folders left empty."""
    io.shutdown(wait=True)
    for leftover in [*directory.rglob("*.bin"), *directory.rglob("*.partial")]:
        leftover.unlink(missing_ok=True)
    for folder in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [directory]:
        with contextlib.suppress(OSError):
            folder.rmdir()
