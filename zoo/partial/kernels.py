"""Allocation-free forms of the modules a small model's chain holds: each writes its output into a
view it is given (in place where the module is), so that an executor running from one arena
allocates nothing. Torch's convolution called with out= forms its result elsewhere and copies it in
(measured), so convolutions are written here from in-place operations on strided views: a pointwise
one as one matrix product into the output's view, any other as one multiply-add a tap (and an input
channel, unless depthwise) over the input's window for that tap, clipped at the padding (asymmetric
padding, `zoo.nn.conv.Conv2dSame`'s, included). Slow; for proving memory, not for speed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.partial.chain import conv_padding, pointwise

aten = torch.ops.aten

Kernel = Callable[[torch.Tensor, torch.Tensor], None]
"""Writes a module's output for input view `x` into output view `out` (the same view when in place)."""


def tap_window(size: int, out_size: int, offset: int, stride: int) -> tuple[slice, slice]:
    """(output positions, input positions) along one axis where a tap at `offset` from each
    window's start (padding subtracted) reads inside the input: output i reads input stride i + offset."""
    first = 0 if offset >= 0 else (-offset + stride - 1) // stride
    last = min(out_size - 1, (size - 1 - offset) // stride)
    if last < first:
        return slice(0, 0), slice(0, 0)
    start = stride * first + offset
    return slice(first, last + 1), slice(start, start + stride * (last - first) + 1, stride)


def _conv(conv: nn.Conv2d, channels: slice) -> Kernel:
    weight = conv.weight.detach()[channels]
    bias = None if conv.bias is None else conv.bias.detach()[channels]
    top, left = conv_padding(conv)
    one_by_one = pointwise(conv)
    depthwise = conv.groups == conv.in_channels == conv.out_channels
    if not (one_by_one or depthwise or conv.groups == 1):
        raise ValueError(f"zoo.partial runs full, depthwise and pointwise convolutions; got groups={conv.groups}")
    (stride_h, stride_w), (dilation_h, dilation_w) = conv.stride, conv.dilation

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        for sample, made in zip(x, out):  # (C, H, W) each
            if one_by_one:
                aten.mm.out(weight.flatten(1), sample.flatten(1), out=made.flatten(1))
            else:
                made.zero_()
                for a in range(weight.shape[2]):
                    rows, read_rows = tap_window(sample.shape[1], made.shape[1], a * dilation_h - top, stride_h)
                    for b in range(weight.shape[3]):
                        cols, read_cols = tap_window(sample.shape[2], made.shape[2], b * dilation_w - left, stride_w)
                        target = made[:, rows, cols]
                        if depthwise:
                            target.addcmul_(sample[:, read_rows, read_cols], weight[:, 0, a, b, None, None])
                        else:
                            for channel in range(sample.shape[0]):
                                target.addcmul_(sample[channel, read_rows, read_cols], weight[:, channel, a, b, None, None])
            if bias is not None:
                made.add_(bias[:, None, None])

    return run


def _batch_norm(norm: nn.BatchNorm2d, channels: slice) -> Kernel:
    if norm.training:
        raise ValueError("zoo.partial runs a BatchNorm2d in eval mode (its running statistics); this one trains")
    scale = (norm.running_var + norm.eps).rsqrt()
    if norm.weight is not None:
        scale = scale * norm.weight.detach()
    shift = -norm.running_mean * scale + (0 if norm.bias is None else norm.bias.detach())
    scale, shift = scale[channels, None, None].contiguous(), shift[channels, None, None].contiguous()

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        aten.mul.out(x, scale, out=out)
        out.add_(shift)

    return run


def _activation(module: nn.Module) -> Kernel:
    low, high = (0.0, 6.0) if isinstance(module, nn.ReLU6) else (0.0, float("inf"))

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        if out.data_ptr() == x.data_ptr():  # in place: the module's output is its input's buffer
            x.clamp_(low, high)
        else:
            aten.clamp.out(x, low, high, out=out)

    return run


def _identity(x: torch.Tensor, out: torch.Tensor) -> None:
    if out.data_ptr() != x.data_ptr():
        out.copy_(x)


def _linear(linear: nn.Linear) -> Kernel:
    weight = linear.weight.detach().t()

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        if linear.bias is None:
            aten.mm.out(x, weight, out=out)
        else:
            aten.addmm.out(linear.bias.detach(), x, weight, out=out)

    return run


def kernel(module: nn.Module, channels: slice = slice(None)) -> Kernel:
    """The allocation-free form of `module`, making output `channels` only (a convolution's or a batch
    norm's: the slice of them a partial execution runs; an element-wise module's output is its
    input's channels); ValueError naming a module it has none for."""
    if isinstance(module, nn.Conv2d):
        return _conv(module, channels)
    if isinstance(module, nn.BatchNorm2d):
        return _batch_norm(module, channels)
    if isinstance(module, (nn.ReLU, nn.ReLU6)):
        return _activation(module)
    if isinstance(module, nn.Dropout) and not module.training:
        return _identity
    if isinstance(module, nn.Linear):
        return _linear(module)
    if isinstance(module, nn.AvgPool2d):
        return lambda x, out: aten.avg_pool2d.out(x, list(module.kernel_size), list(module.stride),
                                                  [module.padding] * 2 if isinstance(module.padding, int) else list(module.padding),
                                                  module.ceil_mode, module.count_include_pad, module.divisor_override,
                                                  out=out)
    if isinstance(module, nn.AdaptiveAvgPool2d) and module.output_size in (1, (1, 1)):
        return lambda x, out: aten.avg_pool2d.out(x, list(x.shape[2:]), list(x.shape[2:]), [0, 0], False, True, None,
                                                  out=out)
    if isinstance(module, nn.Flatten):
        return lambda x, out: out.copy_(x.flatten(module.start_dim, module.end_dim))
    if isinstance(module, nn.Softmax):
        return lambda x, out: aten._softmax.out(x, module.dim, False, out=out)
    raise ValueError(f"zoo.partial has no allocation-free form of {type(module).__name__}; it runs Conv2d (Conv2dSame), "
                     "BatchNorm2d and Dropout in eval mode, ReLU, ReLU6, Linear, AvgPool2d, AdaptiveAvgPool2d(1), Flatten, Softmax")


def accumulating_kernel(conv: nn.Conv2d, channels: slice) -> Kernel:
    """A pointwise convolution's product of input `channels` (x (N, c, H, W)) added into its whole
    output `out` (N, C_out, H, W), in place; its bias is not added."""
    weight = conv.weight.detach()[:, channels].flatten(1).contiguous()

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        for sample, made in zip(x, out):
            made.flatten(1).addmm_(weight, sample.flatten(1))

    return run
