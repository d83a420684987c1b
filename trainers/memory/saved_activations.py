"""Saved-activation bytes: what autograd keeps between forward and backward, measured with
`torch.autograd.graph.saved_tensors_hooks`.

Each saved tensor is counted by its storage, once: views of one buffer, or one tensor saved by two
operations (a LayerNorm output that the next linear layer saves as its input), cost one buffer.
Parameters (and anything else passed as `exclude`) are not activations and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from trainers.parallel.mesh import local_tensor


class SavedActivations(AbstractContextManager):
    """Context that records every tensor autograd saves inside it.

    with SavedActivations(exclude=model.parameters()) as saved:
        loss = model(x).sum()
    saved.bytes  # unique storage bytes, parameters excluded
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {local_tensor(t).untyped_storage().data_ptr() for t in exclude}
        self._storages: dict[tuple[torch.device, int], Any] = {}
        """Storage (inside the context) or its bytes (after it) by (device, address)."""
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            storage = local_tensor(tensor).untyped_storage()  # a DTensor's: its local tensor's
        pointer = storage.data_ptr()
        if pointer not in self._excluded and pointer != 0:
            self._storages[(tensor.device, pointer)] = storage
        return tensor

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        # Sizes as the context ends: a storage given back and refilled in backward (a sequence-
        # parallel region's gathered input) counts what it holds between forward and backward.
        self._storages = {key: self._size(value) for key, value in self._storages.items()}

    @staticmethod
    def _size(storage) -> int:
        return storage if isinstance(storage, int) else storage.nbytes()

    @property
    def bytes(self) -> int:
        """Total bytes of the distinct storages saved for backward."""
        return sum(map(self._size, self._storages.values()))

    @property
    def count(self) -> int:
        """Number of distinct storages saved."""
        return len(self._storages)
