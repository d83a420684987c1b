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
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from trainers.memory.chunks.ownership import ChunkOwnership
from trainers.memory.chunks.parameters import ChunkedParameters, Member
from trainers.memory.chunks.residency import ChunkResidency
from trainers.memory.recompute import clean_fqn

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


@torch.no_grad()
def chunked_state_dict(model: nn.Module, parameters: ChunkedParameters, residency: ChunkResidency,
                       ownership: ChunkOwnership, keep: bool) -> dict[str, torch.Tensor]:
    """A copy of `model.state_dict()` on the CPU, the chunked parameters read chunk by chunk; empty
    where not `keep` (collective when sharded: call on every rank, keeping on one)."""
    if not keep and not ownership.sharded:
        return {}
    chunked = {}
    residency.moments.new_region()
    with ownership.gathering_on():
        for chunk, members in enumerate(parameters.chunk_members):
            with residency.holding(frozenset([("param", chunk)])) as chunks:
                if keep:
                    chunked.update({index: parameters.members[index].view(chunks[("param", chunk)]).to("cpu", copy=True)
                                    for index in members})
    if not keep:
        return {}
    return {name: chunked[parameters.index[id(value)]] if id(value) in parameters.index
            else value.detach().to("cpu", copy=True) for name, value in model.state_dict(keep_vars=True).items()}


def chunked_checkpoint_state(model: nn.Module, parameters: ChunkedParameters, residency: ChunkResidency,
                             ownership: ChunkOwnership, steps: list[int]) -> tuple[dict[str, Any], dict[str, ChunkedTensor]]:
    """What a checkpoint of `model` holds, as every strategy saves it ({"model", "optimizer"};
    `trainers.state.checkpoint`), chunked tensors as stand-ins of their shape; and, by flattened key,
    how to reach each chunked tensor in its chunk. `steps`: each parameter's AdamW steps. When
    sharded, a rank's part names the tensors of the chunks it owns (and the model's other tensors)."""
    model_state = get_model_state_dict(model)
    chunked: dict[str, ChunkedTensor] = {}
    members = parameters.members
    for name, value in model.state_dict(keep_vars=True).items():
        index = parameters.index.get(id(value))
        if index is None:
            continue
        if ownership.owns(members[index].chunk):
            model_state[clean_fqn(name)] = members[index].absent
            chunked[f"model.{clean_fqn(name)}"] = _chunk_view(residency, members[index], "param")
        else:
            model_state.pop(clean_fqn(name), None)
    optimizer_state = {}
    for index, member in enumerate(members):
        if not ownership.owns(member.chunk):
            continue
        name = clean_fqn(member.name)
        optimizer_state[name] = {"step": torch.tensor(float(steps[index])), "exp_avg": member.absent,
                                 "exp_avg_sq": member.absent}
        for kind in ("exp_avg", "exp_avg_sq"):
            chunked[f"optimizer.{name}.{kind}"] = _chunk_view(residency, member, kind)
    return {"model": model_state, "optimizer": optimizer_state}, chunked


def _chunk_view(residency: ChunkResidency, member: Member, kind: str) -> ChunkedTensor:
    keys = frozenset([(kind, member.chunk)])

    def release(changed: bool) -> None:
        if changed:
            residency.store.changed((kind, member.chunk))
        residency.unpin(keys)

    def view() -> tuple[torch.Tensor, Callable[[bool], None]]:
        residency.pin_on_host(keys)  # until release
        return member.view(residency.store.memory[(kind, member.chunk)]), release
    return view


def restored_steps(state: dict[str, Any], parameters: ChunkedParameters, ownership: ChunkOwnership) -> list[int]:
    """After a checkpoint was loaded into `chunked_checkpoint_state`'s dict: the AdamW step of each
    parameter this rank owns (0 for the others)."""
    optimizer = state["optimizer"]
    return [int(optimizer[clean_fqn(member.name)]["step"].item()) if ownership.owns(member.chunk) else 0
            for member in parameters.members]
