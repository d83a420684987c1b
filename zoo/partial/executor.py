"""Running a chain of modules from one preallocated arena, so that its activation memory is a
measured fact: `ArenaExecutor` allocates one byte tensor of the plan's size (`zoo.partial.arena`),
every activation is a view of it at its planned offset, and each module writes its output into its
view. No kernel allocates: torch's convolution called with out= forms its result elsewhere and copies
it in (measured), so convolutions are written here from in-place operations on strided views: a
pointwise one as one matrix product into the output's view, any other as one multiply-add a tap (and
an input channel, unless depthwise) over the input's window for that tap, clipped at the padding
(asymmetric padding, `zoo.nn.conv.Conv2dSame`'s, included). Slow; for proving memory, not for speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from zoo.nn.conv import Conv2dSame
from zoo.partial.arena import ArenaPlan, plan_arena, traced_buffers

aten = torch.ops.aten

Kernel = Callable[[torch.Tensor, torch.Tensor], None]
"""Writes a module's output for input view `x` into output view `out` (the same view when in place)."""


def _window(size: int, out_size: int, offset: int, stride: int) -> tuple[slice, slice]:
    """(output positions, input positions) along one axis where a tap at `offset` from each
    window's start (padding subtracted) reads inside the input: output i reads input stride i + offset."""
    first = 0 if offset >= 0 else (-offset + stride - 1) // stride
    last = min(out_size - 1, (size - 1 - offset) // stride)
    if last < first:
        return slice(0, 0), slice(0, 0)
    start = stride * first + offset
    return slice(first, last + 1), slice(start, start + stride * (last - first) + 1, stride)


def _conv(conv: nn.Conv2d) -> Kernel:
    weight = conv.weight.detach()
    bias = None if conv.bias is None else conv.bias.detach()
    top, left = (conv.pads[2], conv.pads[0]) if isinstance(conv, Conv2dSame) else conv.padding
    pointwise = conv.kernel_size == (1, 1) and conv.stride == (1, 1) and (top, left) == (0, 0) and conv.groups == 1
    depthwise = conv.groups == conv.in_channels == conv.out_channels
    if not (pointwise or depthwise or conv.groups == 1):
        raise ValueError(f"ArenaExecutor runs full, depthwise and pointwise convolutions; got groups={conv.groups}")
    (stride_h, stride_w), (dilation_h, dilation_w) = conv.stride, conv.dilation

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        for sample, made in zip(x, out):  # (C, H, W) each
            if pointwise:
                aten.mm.out(weight.flatten(1), sample.flatten(1), out=made.flatten(1))
            else:
                made.zero_()
                for a in range(weight.shape[2]):
                    rows, read_rows = _window(sample.shape[1], made.shape[1], a * dilation_h - top, stride_h)
                    for b in range(weight.shape[3]):
                        cols, read_cols = _window(sample.shape[2], made.shape[2], b * dilation_w - left, stride_w)
                        target = made[:, rows, cols]
                        if depthwise:
                            target.addcmul_(sample[:, read_rows, read_cols], weight[:, 0, a, b, None, None])
                        else:
                            for channel in range(sample.shape[0]):
                                target.addcmul_(sample[channel, read_rows, read_cols], weight[:, channel, a, b, None, None])
            if bias is not None:
                made.add_(bias[:, None, None])

    return run


def _batch_norm(norm: nn.BatchNorm2d) -> Kernel:
    if norm.training:
        raise ValueError("ArenaExecutor runs a BatchNorm2d in eval mode (its running statistics); this one trains")
    scale = (norm.running_var + norm.eps).rsqrt()
    if norm.weight is not None:
        scale = scale * norm.weight.detach()
    shift = -norm.running_mean * scale + (0 if norm.bias is None else norm.bias.detach())
    scale, shift = scale[:, None, None], shift[:, None, None]

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


def _linear(linear: nn.Linear) -> Kernel:
    weight = linear.weight.detach().t()

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        if linear.bias is None:
            aten.mm.out(x, weight, out=out)
        else:
            aten.addmm.out(linear.bias.detach(), x, weight, out=out)

    return run


def _kernel(module: nn.Module) -> Kernel:
    """The out= form of `module`; ValueError naming a module it has none for."""
    if isinstance(module, nn.Conv2d):
        return _conv(module)
    if isinstance(module, nn.BatchNorm2d):
        return _batch_norm(module)
    if isinstance(module, (nn.ReLU, nn.ReLU6)):
        return _activation(module)
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
    raise ValueError(f"ArenaExecutor has no out= form of {type(module).__name__}; it runs Conv2d (Conv2dSame), "
                     "BatchNorm2d in eval mode, ReLU, ReLU6, Linear, AvgPool2d, AdaptiveAvgPool2d(1), Flatten, Softmax")


@dataclass
class _Step:
    kernel: Kernel
    source: str
    """The node whose tensor the module reads."""
    target: str
    """The node whose tensor it makes."""


class ArenaExecutor:
    """A chain of modules (`nn.Sequential` or any module torch.fx traces to one module after another)
    run from one arena of `plan.arena_bytes` (see the module docstring), for inputs of
    `example_input`'s shape and dtype."""

    def __init__(self, model: nn.Module, example_input: torch.Tensor) -> None:
        traced = traced_buffers(model, example_input)
        self.plan: ArenaPlan = plan_arena(traced.buffers)
        self.arena = torch.empty(self.plan.arena_bytes, dtype=torch.uint8, device=example_input.device)
        modules = dict(traced.graph.named_modules())
        self.views: dict[str, torch.Tensor] = {}
        self.steps: list[_Step] = []
        self.input_name = self.output_name = ""
        for node in traced.graph.graph.nodes:
            if node.op == "output":
                self.output_name = node.all_input_nodes[0].name
                continue
            meta = node.meta["tensor_meta"]
            holder = next(b for b in self.plan.buffers if b.name == traced.holder[node.name])
            offset = self.plan.offsets[holder.name]
            self.views[node.name] = self.arena[offset : offset + holder.nbytes].view(meta.dtype).view(meta.shape)
            if node.op == "placeholder":
                self.input_name = node.name
            elif node.op == "call_module" and len(node.all_input_nodes) == 1:
                self.steps.append(_Step(_kernel(modules[node.target]), node.all_input_nodes[0].name, node.name))
            else:
                raise ValueError(f"ArenaExecutor runs a chain of modules; node {node.name!r} ({node.op} {node.target}) "
                                 "is not one")

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The model on `x`: a view of the arena, valid until the next run."""
        self.views[self.input_name].copy_(x)
        with torch.no_grad():
            for step in self.steps:
                step.kernel(self.views[step.source], self.views[step.target])
        return self.views[self.output_name]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`run`'s output, copied out of the arena."""
        return self.run(x).clone()
