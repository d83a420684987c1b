"""Launch shapes shared by the row-wise Triton kernels of memzoo (zoo.nn and the domains' kernels)."""

from __future__ import annotations

ELEMENTS_PER_THREAD = 8
"""Elements of a BLOCK-wide row vector each thread holds: few enough that a kernel keeping several
such vectors live (a norm's backward, say) stays within the registers, with no spills
(`benchmarks/kernel_resources.py` reads registers and spills of every launch)."""

MOST_WARPS = 32
"""1024 threads, the most a CUDA block holds."""


def warps_for(block: int) -> int:
    """Warps for a program that holds rows of `block` elements in registers: `block / 256` (so
    each thread holds ELEMENTS_PER_THREAD elements of a row), at least 4 (Triton's default) and
    at most MOST_WARPS."""
    return min(max(block // (32 * ELEMENTS_PER_THREAD), 4), MOST_WARPS)
