"""How chunked parameters are found when code uses them.

A parameter whose chunk is not in memory holds one NaN, broadcast to its shape (so its shape
stays right and any use that was missed shows as NaN rather than as stale numbers). Three paths
bring its chunk back before the numbers are read:
- forward (and recomputed forward): a torch-function mode sees every operation and the
  parameters among its arguments, wherever the model's code uses them (a tied head used through
  `F.linear` outside the module that owns the weight included). The chunks an operation uses stay
  in memory until the module running it returns: a custom autograd function runs its inner
  operations out of the mode's sight and saves its parameters at its end;
- backward: autograd saves parameters (and their views) for the backward formulas; a
  saved-tensors hook packs those as (chunk, offset, shape, stride) and unpacks them from the
  chunk, read back when needed;
- gradient accumulation: a hook before a parameter's gradient is accumulated brings its chunk
  back (autograd checks the gradient against the parameter's storage).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch import nn
from torch.overrides import TorchFunctionMode

from trainers.memory.chunks.residency import ChunkResidency
from trainers.memory.chunks.store import ChunkKey

DATA_ATTRIBUTES = frozenset({"data", "T", "mT", "H", "mH", "real", "imag"})
"""Tensor attributes that hand out the parameter's numbers (the others are metadata)."""
METADATA_METHODS = frozenset({"size", "dim", "numel", "__len__", "is_floating_point", "is_complex", "element_size",
                              "register_hook", "register_post_accumulate_grad_hook", "requires_grad_"})


def uses_numbers(func: Callable) -> bool:
    """Whether `func` (as a torch-function mode receives it) reads or writes a tensor's numbers."""
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", "") in ("__get__", "__set__", "__delete__") and hasattr(owner, "__name__"):
        return func.__name__ == "__get__" and owner.__name__ in DATA_ATTRIBUTES
    return getattr(func, "__name__", "") not in METADATA_METHODS


def parameters_in(values: Iterable) -> Iterable[nn.Parameter]:
    """The parameters among `values` and the lists and tuples in them (one level down)."""
    for value in values:
        if isinstance(value, nn.Parameter):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (item for item in value if isinstance(item, nn.Parameter))


class ParameterAccess(TorchFunctionMode):
    """Runs each operation with the chunks `chunks_of(parameters)` names for the parameters it uses
    pinned in `residency` (`pin`); afterwards `residency.held(keys)` decides how long they stay
    pinned. Inactive while `residency.busy`."""

    def __init__(self, residency: ChunkResidency, chunks_of: Callable[[Iterable[nn.Parameter]], frozenset[ChunkKey]]
                 ) -> None:
        super().__init__()
        self.residency, self.chunks_of = residency, chunks_of

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        residency = self.residency
        if residency.busy or not uses_numbers(func):
            return func(*args, **kwargs)
        keys = self.chunks_of(parameters_in(itertools.chain(args, kwargs.values())))
        if not keys:
            return func(*args, **kwargs)
        residency.pin(keys)
        try:
            return func(*args, **kwargs)
        finally:
            residency.held(keys)


@dataclass(frozen=True)
class SavedChunkView:
    """A saved tensor that is a view of a chunk, kept as where it lies instead of its storage."""

    key: ChunkKey
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
