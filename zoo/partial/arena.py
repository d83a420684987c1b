"""The activation arena a sequential executor needs to run a model's operator graph.

`activation_buffers` traces the model with torch.fx and gives every tensor the graph makes (the
input included, weights excluded) its bytes and its lifetime: from the operator that makes it to the
last one that reads it (the graph's output lives to the end). Each operator's output is its own
buffer, a view as well (an executor that runs views in place needs less), except a module's that
runs in place (`inplace=True`, as an interpreter runs a fused activation): it writes its input's
buffer, whose lifetime grows to its own readers. `plan_arena` places the
buffers at byte offsets so that no two alive at once overlap, as TensorFlow Lite Micro's greedy
planner does: largest first, each at the lowest offset clear of every placed buffer whose lifetime
meets its own; and again in execution order, keeping the smaller arena. The arena is the highest end; no placement can go below the most bytes alive at any
one operator (`ArenaPlan.lower_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp


@dataclass(frozen=True)
class Buffer:
    """One tensor of the graph."""

    name: str
    """The fx node that makes it."""
    nbytes: int
    """Its size in bytes."""
    first: int
    """Index of the operator that makes it (0: the input)."""
    last: int
    """Index of the last operator that reads it."""

    def meets(self, other: Buffer) -> bool:
        """Whether the two are alive at one operator."""
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class ArenaPlan:
    """Where each buffer lives in one arena."""

    buffers: tuple[Buffer, ...]
    offsets: dict[str, int]
    """Byte offset of each buffer, by name."""
    arena_bytes: int
    """The arena's size: the highest end of a placed buffer."""
    lower_bound: int
    """The most bytes alive at any one operator."""


class OperatorTracer(fx.Tracer):
    """torch.fx's tracer with every convolution one operator, `zoo.nn.conv.Conv2dSame` too (torch.nn's
    modules already are): an executor's kernel pads inside, with no buffer of its own."""

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return isinstance(module, nn.Conv2d) or super().is_leaf_module(module, qualified_name)


def trace(model: nn.Module) -> fx.GraphModule:
    """`model`'s graph of operators (`OperatorTracer`)."""
    return fx.GraphModule(model, OperatorTracer().trace(model))


def in_place(module: nn.Module) -> bool:
    """A module that writes its input's buffer (`inplace=True`), or a dropout in eval mode (the
    identity): its output is no buffer of its own."""
    return getattr(module, "inplace", False) is True or (isinstance(module, nn.Dropout) and not module.training)


def runs_in_place(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether `node` calls a module that writes its one input's buffer."""
    return node.op == "call_module" and in_place(modules[node.target]) and len(node.all_input_nodes) == 1


@dataclass(frozen=True)
class TracedBuffers:
    """A model's operator graph with its tensors' buffers."""

    graph: fx.GraphModule
    """The graph (`trace`), each node's `tensor_meta` filled in."""
    buffers: list[Buffer]
    """The buffers, in the order the operators make them."""
    holder: dict[str, str]
    """The buffer (by name) that holds each node's tensor, by node name."""


def traced_buffers(model: nn.Module, example_input: torch.Tensor) -> TracedBuffers:
    """The tensors `model` (a module torch.fx traces, called on one tensor) makes on `example_input`
    and where they live (see the module docstring); ValueError naming the node when one makes no tensor."""
    graph = trace(model)
    ShapeProp(graph).propagate(example_input)
    modules = dict(graph.named_modules())
    nodes = [node for node in graph.graph.nodes if node.op != "get_attr"]
    index = {node: position for position, node in enumerate(nodes)}
    owner: dict[fx.Node, fx.Node] = {}
    """The node whose buffer holds each node's tensor."""
    last: dict[fx.Node, int] = {}
    for node in nodes:
        if node.op == "output":
            continue
        meta = node.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape"):
            raise ValueError(f"activation_buffers plans tensors; node {node.name!r} ({node.op} {node.target}) makes "
                             f"{type(node.meta.get('tensor_meta')).__name__}")
        owner[node] = owner[node.all_input_nodes[0]] if runs_in_place(node, modules) else node
        root = owner[node]
        last[root] = max(last.get(root, index[node]), *(index[user] for user in node.users), index[node])
    buffers = [Buffer(node.name, node_bytes(node), index[node], last[node]) for node in last]
    return TracedBuffers(graph, buffers, {node.name: root.name for node, root in owner.items()})


def activation_buffers(model: nn.Module, example_input: torch.Tensor) -> list[Buffer]:
    """The buffers of `traced_buffers`: each tensor's bytes and lifetime, in execution order, named
    by the node that makes it."""
    return traced_buffers(model, example_input).buffers


def node_bytes(node: fx.Node) -> int:
    """Bytes of the tensor a traced node makes (its `tensor_meta`)."""
    meta = node.meta["tensor_meta"]
    return meta.shape.numel() * torch.empty((), dtype=meta.dtype).element_size()


PLACEMENT_ORDERS = {"largest first": lambda b: (-b.nbytes, b.first), "execution order": lambda b: (b.first, -b.nbytes)}
"""The orders `plan_arena` places buffers in: TensorFlow Lite Micro's (largest first), and the order
the operators make them (which packs a chain's neighbours against each other)."""


def _place(buffers: list[Buffer], order) -> dict[str, int]:
    """Offsets of `buffers` placed in `order`, each at the lowest offset clear of every placed buffer
    alive with it."""
    offsets: dict[str, int] = {}
    placed: list[Buffer] = []
    for buffer in sorted(buffers, key=order):
        taken = sorted((offsets[other.name], offsets[other.name] + other.nbytes) for other in placed if other.meets(buffer))
        offset = 0
        for start, end in taken:
            if offset + buffer.nbytes <= start:
                break
            offset = max(offset, end)
        offsets[buffer.name] = offset
        placed.append(buffer)
    return offsets


def plan_arena(buffers: list[Buffer]) -> ArenaPlan:
    """Offsets for `buffers` by the greedy rule of the module docstring, in each of the
    `PLACEMENT_ORDERS`; the smaller arena is kept (TensorFlow Lite Micro's on a tie)."""
    arena, offsets = None, {}
    for order in PLACEMENT_ORDERS.values():
        found = _place(buffers, order)
        end = max((found[b.name] + b.nbytes for b in buffers), default=0)
        if arena is None or end < arena:
            arena, offsets = end, found
    steps = range(max((b.last for b in buffers), default=-1) + 1)
    lower = max((sum(b.nbytes for b in buffers if b.first <= step <= b.last) for step in steps), default=0)
    return ArenaPlan(tuple(buffers), offsets, arena, lower)
