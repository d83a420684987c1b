"""Convolutions padded as TensorFlow pads them, and a convolution's product on some of its channels.

TensorFlow's "SAME" padding makes ceil(size / stride) outputs and pads the missing rows and columns
half before and half after the input, the odd one after: a stride-2 convolution of an even size
pads 0 before and 1 after, which torch's symmetric `padding` cannot say. `Conv2dSame` pads so
inside its forward (the padded copy is the kernel's scratch, as an interpreter's is).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """(before, after) TensorFlow's "SAME" pads an input of `size` along one axis."""
    reach = (kernel - 1) * dilation + 1
    total = max((math.ceil(size / stride) - 1) * stride + reach - size, 0)
    return total // 2, total - total // 2


class Conv2dSame(nn.Conv2d):
    """`nn.Conv2d` whose input is padded by `pads` = (left, right, top, bottom) zeros first (an
    asymmetric "SAME"); `padding` is 0. State names are nn.Conv2d's."""

    def __init__(self, *args, pads: tuple[int, int, int, int], **kwargs) -> None:
        super().__init__(*args, padding=0, **kwargs)
        self.pads = tuple(pads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv2d_on(self, x, self.weight, self.bias, self.groups)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pads={self.pads}"


def conv2d_on(module: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              groups: int) -> torch.Tensor:
    """`module`'s convolution (stride, padding, dilation; a `Conv2dSame`'s pads) of x (N, C, H, W)
    with `weight` and `bias` in place of its own: some of its output channels, or a grouped part."""
    if isinstance(module, Conv2dSame):
        return F.conv2d(F.pad(x, module.pads), weight, bias, module.stride, 0, module.dilation, groups)
    return F.conv2d(x, weight, bias, module.stride, module.padding, module.dilation, groups)
