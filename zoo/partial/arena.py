"""The activation arena a sequential executor needs to run a model's operator graph.

`activation_buffers` traces the model with torch.fx and gives every tensor the graph makes (the
input included, weights excluded) its bytes and its lifetime: from the operator that makes it to the
last one that reads it (the graph's output lives to the end). Each operator's output is its own
buffer, a view as well (an executor that runs views in place needs less). `plan_arena` places the
buffers at byte offsets so that no two alive at once overlap, as TensorFlow Lite Micro's greedy
planner does: largest first, each at the lowest offset clear of every placed buffer whose lifetime
meets its own. The arena is the highest end; no placement can go below the most bytes alive at any
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


def activation_buffers(model: nn.Module, example_input: torch.Tensor) -> list[Buffer]:
    """The tensors `model` (a module torch.fx traces, called on one tensor) makes on `example_input`,
    in execution order; ValueError naming the node when one makes no tensor."""
    graph = fx.symbolic_trace(model)
    ShapeProp(graph).propagate(example_input)
    nodes = [node for node in graph.graph.nodes if node.op != "get_attr"]
    index = {node: position for position, node in enumerate(nodes)}
    buffers = []
    for node in nodes:
        if node.op == "output":
            continue
        meta = node.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape"):
            raise ValueError(f"activation_buffers plans tensors; node {node.name!r} ({node.op} {node.target}) makes "
                             f"{type(node.meta.get('tensor_meta')).__name__}")
        nbytes = meta.shape.numel() * torch.empty((), dtype=meta.dtype).element_size()
        last = max((index[user] for user in node.users), default=index[node])
        buffers.append(Buffer(node.name, nbytes, index[node], last))
    return buffers


def plan_arena(buffers: list[Buffer]) -> ArenaPlan:
    """Offsets for `buffers` by the greedy rule of the module docstring."""
    offsets: dict[str, int] = {}
    placed: list[Buffer] = []
    for buffer in sorted(buffers, key=lambda b: (-b.nbytes, b.first)):
        taken = sorted((offsets[other.name], offsets[other.name] + other.nbytes) for other in placed if other.meets(buffer))
        offset = 0
        for start, end in taken:
            if offset + buffer.nbytes <= start:
                break
            offset = max(offset, end)
        offsets[buffer.name] = offset
        placed.append(buffer)
    arena = max((offsets[b.name] + b.nbytes for b in buffers), default=0)
    steps = range(max((b.last for b in buffers), default=-1) + 1)
    lower = max((sum(b.nbytes for b in buffers if b.first <= step <= b.last) for step in steps), default=0)
    return ArenaPlan(tuple(buffers), offsets, arena, lower)
