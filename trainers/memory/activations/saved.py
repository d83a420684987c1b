"""What the two activation swaps share: which saved tensors go, how a tensor's elements travel, the
order of a step's packs and the reads ahead of backward that follow it. The swaps: to files
(`trainers.memory.activations.swap`, activations in host memory) and to host memory
(`trainers.memory.activations.host`, activations on the device).

Backward unpacks in about the reverse order of forward's packs, so unpacking one starts bringing
back the nearest swapped before it that backward has not used yet, as long as fewer than
`READ_AHEAD` reads ahead wait for their use.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

READ_AHEAD = 2
"""Swapped tensors brought back ahead of backward's use at most at once."""


@dataclass(eq=False, kw_only=True)
class Swapped:
    """A saved tensor away from where autograd keeps it."""

    index: int
    """Order of the pack in the step."""
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    """The strides it comes back with."""
    dtype: torch.dtype
    nbytes: int
    used: bool = False
    """Whether backward has unpacked it (it is not read ahead again)."""


def fills_its_region(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s elements fill a region of its storage without gaps or overlaps (a
    permutation of a contiguous layout)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(tensor.stride(), tensor.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def travelling_region(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The one-dimensional tensor whose elements travel for `tensor`, and the strides `tensor` comes
    back with: the region of its storage it fills (a permutation of a contiguous layout comes
    back with its strides), else a contiguous copy (a slice of a larger tensor, such as attention's
    q, k, v of one projection, comes back contiguous)."""
    if fills_its_region(tensor):
        return tensor.as_strided((tensor.numel(),), (1,)), tuple(tensor.stride())
    region = tensor.contiguous().view(-1)
    return region, tuple(region.view(tensor.shape).stride())


class SavedTensorSwap(ABC):
    """Saved tensors on devices of `device_type`, of at least `min_bytes`, swapped away and back.
    Subclasses move the bytes (`pack`, `unpack`, and the abstract `_start_read`, `_can_read`) and
    measure what a byte costs (`seconds_per_byte`); `begin_step` starts a step's order of packs."""

    def __init__(self, min_bytes: int, device_type: str) -> None:
        self.min_bytes, self.device_type = min_bytes, device_type
        self.enabled = True
        """Whether `pack` swaps now (a per-block plan turns it on only inside the blocks that swap;
        `trainers.memory.activations.plan`)."""
        self.bytes_written = 0
        """Bytes of saved tensors swapped away so far."""
        self.bytes_read = 0
        """Bytes of saved tensors brought back so far."""
        self._order: list[weakref.ref[Swapped]] = []
        self._reading = 0
        """Reads ahead whose tensors backward has not used yet."""

    def begin_step(self) -> None:
        """A new step's forward begins (reads ahead follow its packs only)."""
        self._order, self._reading = [], 0

    def end_step(self) -> None:
        """The step is over (a subclass finishes what is under way)."""

    @abstractmethod
    def seconds_per_byte(self) -> float:
        """Seconds per byte to swap a tensor away and bring it back, measured here."""

    def swaps(self, tensor: torch.Tensor) -> bool:
        """Whether `pack` swaps `tensor` away now."""
        return (self.enabled and tensor.nbytes >= self.min_bytes and tensor.device.type == self.device_type
                and tensor.layout == torch.strided)

    def _next_index(self) -> int:
        return len(self._order)

    def _packed(self, swapped: Swapped) -> None:
        """`swapped` joins the step's order (its index is `_next_index()`'s)."""
        self._order.append(weakref.ref(swapped))
        self.bytes_written += swapped.nbytes

    def _used(self, swapped: Swapped, ahead: bool) -> None:
        """Backward unpacks `swapped` (`ahead`: brought back by a read ahead); reads ahead of the
        swapped tensors before it start."""
        swapped.used = True
        if ahead:
            self._reading -= 1
        else:
            self.bytes_read += swapped.nbytes
        self._read_ahead(swapped.index)

    def _read_ahead(self, index: int) -> None:
        """Start bringing back the swapped tensors packed before pack `index`, nearest first, that
        `_can_read` and backward has not used, while fewer than `READ_AHEAD` wait for their use."""
        for earlier in range(min(index, len(self._order)) - 1, -1, -1):
            if self._reading >= READ_AHEAD:
                return
            swapped = self._order[earlier]()
            if swapped is None or swapped.used or not self._can_read(swapped):
                continue
            self._start_read(swapped)
            self._reading += 1
            self.bytes_read += swapped.nbytes

    @abstractmethod
    def _can_read(self, swapped: Swapped) -> bool:
        """Whether `swapped` is away and no read of it is under way."""

    @abstractmethod
    def _start_read(self, swapped: Swapped) -> None:
        """Start bringing `swapped` back, for `unpack` to take."""
