"""How much memory one chunk of a chunked layer may take: the process-wide setting that the fused
layers (`zoo.nn.attention`'s query chunks, `zoo.nn.cross_entropy`'s token chunks) size their chunks by.

Chunking changes how much of an intermediate (attention scores, logits) is alive at once, never
what is computed: results agree with the unchunked computation up to float summation order. A
trainer holding a memory budget lowers it (`trainers.estimate.budget`); everyone else keeps the default.
"""

from __future__ import annotations

DEFAULT_CHUNK_BYTES = 32 * 2**20
"""Bytes of one chunk's float32 intermediate when nothing else is set."""

_chunk_bytes = DEFAULT_CHUNK_BYTES


def chunk_bytes() -> int:
    """Bytes one chunk's largest intermediate may take now."""
    return _chunk_bytes


def set_chunk_bytes(nbytes: int | None) -> None:
    """Set the bytes one chunk's largest intermediate may take (None: `DEFAULT_CHUNK_BYTES`). A
    process-wide setting, read at each call (backward passes included)."""
    global _chunk_bytes
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1):
        raise ValueError(f"chunk bytes must be a positive integer or None; got {nbytes!r}")
    _chunk_bytes = DEFAULT_CHUNK_BYTES if nbytes is None else nbytes


def rows_per_chunk(bytes_per_row: int) -> int:
    """Rows of `bytes_per_row` bytes each that fit one chunk (at least 1)."""
    return max(1, _chunk_bytes // max(1, bytes_per_row))
