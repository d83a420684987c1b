"""`KVCache`: the keys and values of past positions, for incremental (token by token) decoding.

One preallocated buffer per layer of shape (B, Hkv, max_length, D) for keys and one for values;
each step writes its new positions in place, so decoding n tokens allocates nothing per step and
attends to views of the filled prefix.
"""

from __future__ import annotations

import torch


class LayerKVCache:
    """One layer's view of a `KVCache`: `append(k, v)` stores the step's keys and values."""

    def __init__(self, cache: "KVCache", layer: int) -> None:
        self.cache, self.layer = cache, layer

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: (B, Hkv, S, D) of the positions after the cached ones. Returns the keys and values of
        every position so far, (B, Hkv, length + S, D), as views of the buffers."""
        cache = self.cache
        start, end = cache.length, cache.length + k.shape[2]
        expected = (cache.keys.shape[1], cache.keys.shape[2], k.shape[2], cache.keys.shape[4])
        if k.shape != expected or v.shape != expected:
            raise ValueError(f"k and v must be (B, Hkv, S, D) = {expected}; got {tuple(k.shape)} and {tuple(v.shape)}")
        if end > cache.max_length:
            raise ValueError(f"KVCache holds {cache.max_length} positions; {cache.length} cached + {k.shape[2]} new exceed it")
        keys, values = cache.keys[self.layer], cache.values[self.layer]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]


class KVCache:
    """Past keys and values of `layers` attention layers for `batch` sequences of at most
    `max_length` positions. Call `layer(i)` for each layer's view during a forward pass over the new
    positions, then `advance(S)` with their number."""

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, max_length: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        for name, value in (("layers", layers), ("batch", batch), ("kv_heads", kv_heads), ("head_dim", head_dim),
                            ("max_length", max_length)):
            if value < 1:
                raise ValueError(f"KVCache {name} must be >= 1; got {value}")
        shape = (layers, batch, kv_heads, max_length, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.max_length = max_length
        self.length = 0
        """Number of positions cached."""

    def layer(self, index: int) -> LayerKVCache:
        """The view layer `index` appends to."""
        if not 0 <= index < self.keys.shape[0]:
            raise IndexError(f"layer {index} out of range for a KVCache of {self.keys.shape[0]} layers")
        return LayerKVCache(self, index)

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i of the batch becomes the old row rows[i] (B,) (beam search keeps its surviving
        hypotheses)."""
        self.keys, self.values = self.keys[:, rows], self.values[:, rows]

    def advance(self, count: int) -> None:
        """Mark `count` more positions as cached (after every layer appended them)."""
        if not 0 <= self.length + count <= self.max_length:
            raise ValueError(f"cannot advance a KVCache of {self.length}/{self.max_length} positions by {count}")
        self.length += count
