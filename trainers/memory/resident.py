"""The process's resident memory: how much it is, and letting freed memory leave it.

glibc's malloc keeps freed blocks in its heap, where they still count as resident; allocations of
`MMAP_THRESHOLD` bytes and more can be mapped and unmapped on their own instead
(`release_freed_memory`), so that a chunk freed under a memory budget leaves the process.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 1 << 20
"""Bytes from which glibc's malloc maps each allocation on its own (returned to the system when freed)."""
M_MMAP_THRESHOLD = -3
"""mallopt's parameter number for the mmap threshold (malloc.h)."""


def release_freed_memory() -> bool:
    """Have glibc's malloc map allocations of `MMAP_THRESHOLD` bytes or more on their own, for the
    whole process, so that freeing one returns its memory to the system; False where the C library
    is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def resident_set_bytes() -> int:
    """The process's resident memory now (Linux /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
