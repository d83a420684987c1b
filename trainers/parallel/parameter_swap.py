"""`ParameterSwap`: modules' forward code sees other tensors in place of some parameters for one call."""

from __future__ import annotations

import torch
from torch import nn


class ParameterSwap:
    """Shows modules' forward code other tensors in place of some parameters for one call.

    The stand-ins go into the instance `__dict__`, which attribute lookup consults before
    `nn.Module.__getattr__` reaches `_parameters`: `module.weight` is the stand-in while
    `named_parameters()` (FSDP2, memory trackers, the optimizer) still sees the parameter."""

    def __init__(self) -> None:
        self.shown: list[tuple[nn.Module, str]] = []

    def put(self, module: nn.Module, name: str, value: torch.Tensor | None) -> None:
        module.__dict__[name] = value
        self.shown.append((module, name))

    def restore(self) -> None:
        while self.shown:
            module, name = self.shown.pop()
            module.__dict__.pop(name, None)
