"""Layout annotations for axial parallelism (FastFold's dynamic axial parallelism).

A module run with axial parallelism (`zoo.plan.ModelPlan.axial`) receives its tensor inputs split
along dim 1 over the tensor-parallel ranks: an MSA (B, S, L, C) by rows, a pair representation
(B, L, L, C) by its first residue. Most of its work is local to such a shard; where a computation
needs another layout, its code says so with these functions:

    gather(x, dim)            the whole of x along `dim` (x split along `dim`)
    own_part(x, dim)          this rank's part of x along `dim` (x whole)
    reshard(x, source, target)  x split along `target` instead of `source` (an all-to-all)

On one device, and whenever no trainer applied axial parallelism, each returns x unchanged, so the
model stays single-device code with a few sharding annotations (GSPMD's idea); `trainers` installs
the collectives (`trainers.parallel.axial`). The model holds no distributed code.

The active layout is a module-level stack, not a `ContextVar`: torch.compile reads (and guards
on) a module's globals but cannot trace `ContextVar.get`, and the scopes nest within one forward.
"""

from __future__ import annotations

from typing import Protocol

import torch


class AxialLayout(Protocol):
    """What a trainer installs: the three redistributions over its tensor-parallel group."""

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor: ...

    def own_part(self, x: torch.Tensor, dim: int) -> torch.Tensor: ...

    def reshard(self, x: torch.Tensor, source: int, target: int) -> torch.Tensor: ...


_ACTIVE: list[AxialLayout] = []
"""The layouts of the scopes entered and not yet left, innermost last."""


def activate(layout: AxialLayout) -> None:
    """Make `layout` the one the annotations use until the matching `deactivate()`."""
    _ACTIVE.append(layout)


def deactivate() -> None:
    """Restore the layout from before the last `activate`."""
    _ACTIVE.pop()


def _layout() -> AxialLayout | None:
    return _ACTIVE[-1] if _ACTIVE else None


def gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x whole along `dim`, from this rank's part."""
    layout = _layout()
    return x if layout is None else layout.gather(x, dim)


def own_part(x: torch.Tensor, dim: int) -> torch.Tensor:
    """This rank's part along `dim` of x, whole."""
    layout = _layout()
    return x if layout is None else layout.own_part(x, dim)


def reshard(x: torch.Tensor, source: int, target: int) -> torch.Tensor:
    """x split along `target`, from x split along `source`."""
    layout = _layout()
    return x if layout is None else layout.reshard(x, source, target)
