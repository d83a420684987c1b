"""Checkpoints of chunked model states in the format every other strategy writes and reads.

A checkpoint holds {"model": the model's state dict, "optimizer": {parameter name: {"step",
"exp_avg", "exp_avg_sq"}}} in torch.distributed.checkpoint's format (`trainers.state.checkpoint`).
Chunked states enter it without ever being all in memory: the state dict given to DCP holds, for
each chunked tensor, a stand-in of the right shape, and these planners read the real values from
the chunks one tensor at a time when DCP writes them, and write loaded values straight into the
chunks (parameters, Adam moments), each chunk pinned in memory only while a tensor of it is copied.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import ReadItem

ChunkedTensor = Callable[[], tuple[torch.Tensor, Callable[[bool], None]]]
"""Pins a chunk and returns (the tensor's view into it, `release(changed)`, which unpins it, the
chunk marked as changed when `changed`)."""


class ChunkedSavePlanner(DefaultSavePlanner):
    """Resolves the tensors named in `chunked` (flattened keys: "model.blocks.0.attn.q.weight",
    "optimizer.blocks.0.attn.q.weight.exp_avg") from their chunks as DCP writes them."""

    def __init__(self, chunked: dict[str, ChunkedTensor]) -> None:
        super().__init__()
        self.chunked = chunked

    def lookup_object(self, index: MetadataIndex):
        view = self.chunked.get(index.fqn)
        if view is None:
            return super().lookup_object(index)
        tensor, release = view()
        try:
            return tensor.clone()
        finally:
            release(False)


class ChunkedLoadPlanner(DefaultLoadPlanner):
    """Gives DCP the chunk views of the tensors named in `chunked` to load into."""

    def __init__(self, chunked: dict[str, ChunkedTensor]) -> None:
        super().__init__()
        self.chunked = chunked
        self._pinned: dict[int, Callable[[bool], None]] = {}

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        view = self.chunked.get(read_item.dest_index.fqn)
        if view is None:
            return super().resolve_tensor(read_item)
        tensor, release = view()
        target = self.transform_tensor(read_item, tensor)
        self._pinned[id(read_item)] = release
        return target

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        release = self._pinned.pop(id(read_item), None)
        if release is not None:
            release(True)
