"""A model as a chain of modules, each reading the one before (what zoo.partial's passes run), and
what they need to know of its modules: which act on each channel alone, and how many
multiply-accumulates the chain's convolutions and linear layers make."""

from __future__ import annotations

import torch
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from zoo.nn.conv import Conv2dSame
from zoo.partial.arena import node_bytes, trace

CHANNEL_WISE = (nn.BatchNorm2d, nn.ReLU, nn.ReLU6, nn.Hardswish, nn.SiLU, nn.Sigmoid, nn.Identity)
"""Modules that act on each channel alone (batch norm in eval mode; so does a dropout in eval
mode, the identity)."""


def channel_wise(module: nn.Module) -> bool:
    """Whether `module` acts on each channel alone: a depthwise convolution, a batch norm or a dropout
    in eval mode, an element-wise activation."""
    if isinstance(module, nn.Conv2d):
        return module.groups == module.in_channels == module.out_channels
    if isinstance(module, (nn.BatchNorm2d, nn.Dropout)):  # in eval mode: per-channel affine, the identity
        return not module.training
    return isinstance(module, CHANNEL_WISE)


def conv_padding(conv: nn.Conv2d) -> tuple[int, int]:
    """(top, left) padding of a convolution (`zoo.nn.conv.Conv2dSame`'s asymmetric "SAME" included)."""
    return (conv.pads[2], conv.pads[0]) if isinstance(conv, Conv2dSame) else conv.padding


def pointwise(module: nn.Module) -> bool:
    """Whether `module` is a pointwise convolution: 1 x 1, stride 1, no padding, one group."""
    return (isinstance(module, nn.Conv2d) and module.groups == 1 and module.kernel_size == (1, 1)
            and module.stride == (1, 1) and conv_padding(module) == (0, 0))


def chain_of(model: nn.Module, example_input: torch.Tensor) -> tuple[list[nn.Module], list[int], list[torch.Size]]:
    """The modules of the chain in order, the bytes of its input and of each module's output, and
    each output's shape; ValueError when the traced graph is not one module after another."""
    graph = trace(model)
    ShapeProp(graph).propagate(example_input)
    nodes = [node for node in graph.graph.nodes if node.op not in ("placeholder", "output")]
    modules = dict(graph.named_modules())
    chain = []
    for previous, node in zip([None, *nodes], nodes):
        reads = node.all_input_nodes
        if node.op != "call_module" or len(reads) != 1 or (previous is not None and reads[0] is not previous):
            raise ValueError(f"zoo.partial runs a chain of modules, each reading the one before; node {node.name!r} "
                             f"({node.op} {node.target}) is not one")
        chain.append(modules[node.target])
    sizes = [example_input.numel() * example_input.element_size()]
    sizes += [node_bytes(node) for node in nodes]
    return chain, sizes, [node.meta["tensor_meta"].shape for node in nodes]


def chain_macs(chain: list[nn.Module], shapes: list[torch.Size]) -> int:
    """Multiply-accumulates of the chain's convolutions and linear layers."""
    total = 0
    for module, shape in zip(chain, shapes):
        if isinstance(module, nn.Conv2d):
            total += shape.numel() * module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        elif isinstance(module, nn.Linear):
            total += shape.numel() * module.in_features
    return total
