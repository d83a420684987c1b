"""The peak of tensor bytes alive at once inside a region of code, on any device.

torch's MemTracker does this with per-module categories but refuses a module that runs more than once
in one region (as a joiner does when a loss calls it sample by sample). This tracker keeps only the
total: a dispatch mode sees every tensor an operation creates, counts its storage once, and a weak
reference takes the bytes off when the storage dies. Outputs that share an input's storage (views,
in-place results) allocate nothing and are not counted.
"""

from __future__ import annotations

import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils.weak import WeakIdKeyDictionary

from zoo.torch_compat import TorchDispatchMode, tree_flatten


class TensorPeak(TorchDispatchMode):
    """with TensorPeak() as tracked: ...; tracked.peak is the most bytes alive at once among the
    storages created inside (tensors that existed before, such as inputs and parameters, are not
    counted; gradients created inside are). `device_type`: count only tensors on devices of
    that type ("cpu", "cuda"; None: all)."""

    def __init__(self, device_type: str | None = None) -> None:
        super().__init__()
        self.device_type = device_type
        self.live = 0
        self.peak = 0
        self.interval_peak = 0
        """The most bytes alive at once since the last `mark()`."""
        self._storages: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def mark(self) -> int:
        """The most bytes alive at once since the previous mark (or the start); a new interval starts."""
        peak, self.interval_peak = self.interval_peak, self.live
        return peak

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage in self._storages:
            return
        nbytes = storage.nbytes()
        self._storages[storage] = weakref.finalize(storage, self._release, nbytes)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self.interval_peak = max(self.interval_peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if DTensor in types:  # DTensor runs its local operations, which come back here
            return NotImplemented
        kwargs = kwargs or {}
        # Views and in-place results share an input's storage: nothing new was allocated (and a view
        # of a tensor from before the region must not bring that tensor's storage into the count).
        inputs = {_storage_key(t) for t in tree_flatten((args, kwargs))[0] if _countable(t)}
        out = func(*args, **kwargs)
        for value in tree_flatten(out)[0]:
            if (_countable(value) and _storage_key(value) not in inputs
                    and self.device_type in (None, value.device.type)):
                self._track(value)
        return out


def _countable(value) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_meta and value.layout == torch.strided


def _storage_key(tensor: torch.Tensor) -> tuple[torch.device, int]:
    return tensor.device, tensor.untyped_storage().data_ptr()
