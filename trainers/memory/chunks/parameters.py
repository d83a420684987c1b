"""A model's trainable parameters as views into parameter chunks (`trainers.memory.chunks.layout`).

Each parameter is a view into its parameter chunk while the chunk is in memory, and one NaN
broadcast to its shape while it is not (its `absent` marker: its shape stays right, and any use
that was missed shows as NaN rather than as stale numbers). Tensors autograd saves for backward
that are parameters or views of parameter chunks are saved as where they lie in their chunk
(`trainers.memory.chunks.access.SavedChunkView`) and read back from it in backward.

A model built on the meta device is materialised chunk by chunk: its `init_weights()` runs once
per parameter chunk, with the other parameters on the meta device, so that no more than one chunk
is ever in memory (the draws differ from one initialisation of the whole model, and do not depend
on the number of ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from trainers.memory.activations.saved import SavedTensorSwap, Swapped
from trainers.memory.chunks.access import SavedChunkView
from trainers.memory.chunks.layout import ChunkLayout
from trainers.memory.chunks.residency import ChunkResidency
from trainers.memory.chunks.store import ChunkKey


def storage_key(tensor: torch.Tensor) -> tuple[torch.device, int]:
    """Where `tensor`'s storage lies: its device and address."""
    return tensor.device, tensor.untyped_storage().data_ptr()


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


@dataclass
class Member:
    """A trainable parameter in its chunk."""

    name: str
    param: nn.Parameter
    chunk: int
    offset: int
    decay: bool
    """Whether AdamW decays it (matrices; not biases and norms)."""
    absent: torch.Tensor
    """What the parameter holds while its chunk is not in memory: one NaN broadcast to its shape."""

    def view(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer[self.offset:self.offset + self.param.numel()].view(self.param.shape)


class ChunkedParameters:
    """The trainable parameters `named` (fp32, in `named_parameters` order) of `layout`, bound to
    `residency`'s parameter chunks as they come and go; `device` is where the model computes."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], layout: ChunkLayout, residency: ChunkResidency,
                 device: torch.device) -> None:
        self.residency, self.device = residency, device
        nan = torch.tensor(float("nan"), device=device)  # 0-dim: it broadcasts to any shape, () included
        self.members = [Member(name, p, *layout.slots[index], p.ndim >= 2, nan.expand(p.shape))
                        for index, (name, p) in enumerate(named)]
        self.index = {id(m.param): index for index, m in enumerate(self.members)}
        """Each parameter's place in `members`, by id."""
        self.chunk_members = layout.members()
        """The members of each chunk."""
        self._storage: dict[tuple[torch.device, int], ChunkKey] = {}
        """Device and storage address of each parameter chunk the model can compute with."""

    # ---------------------------------------------------------------- residency's binding
    def bound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        if key[0] == "param":
            for index in self.chunk_members[key[1]]:
                self.members[index].param.data = self.members[index].view(buffer)
            self._storage[storage_key(buffer)] = key

    def unbound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        if key[0] == "param":
            for index in self.chunk_members[key[1]]:
                self.members[index].param.data = self.members[index].absent
            del self._storage[storage_key(buffer)]

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is a chunked parameter or a view of a parameter chunk."""
        return id(tensor) in self.index or storage_key(tensor) in self._storage

    def chunks_of(self, params: Iterable[nn.Parameter]) -> frozenset[ChunkKey]:
        """The parameter chunks of those of `params` that are chunked."""
        index = self.index
        return frozenset(("param", self.members[index[id(p)]].chunk) for p in params if id(p) in index)

    # ---------------------------------------------------------------- saved tensors
    def pack(self, tensor: torch.Tensor, swap: SavedTensorSwap | None) -> torch.Tensor | SavedChunkView | Swapped:
        """What autograd keeps of `tensor`: where it lies in its parameter chunk, else the tensor
        (or, with `swap`, what the swap keeps of it)."""
        residency = self.residency
        residency.busy, was_busy = True, residency.busy
        try:
            index = self.index.get(id(tensor))
            if index is not None:  # a parameter, whether its chunk is in memory or not
                member = self.members[index]
                return SavedChunkView(("param", member.chunk), member.offset, tuple(tensor.shape),
                                      _contiguous_strides(tensor.shape))
            key = self._storage.get(storage_key(tensor))
            if key is None:
                return tensor if swap is None else swap.pack(tensor)
            return SavedChunkView(key, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        finally:
            residency.busy = was_busy

    def unpack(self, saved: torch.Tensor | SavedChunkView | Swapped, swap: SavedTensorSwap | None) -> torch.Tensor:
        if isinstance(saved, Swapped):
            return swap.unpack(saved)
        if not isinstance(saved, SavedChunkView):
            return saved
        with self.residency.holding(frozenset([saved.key])) as chunks:
            return chunks[saved.key].as_strided(saved.shape, saved.stride, saved.offset)

    # ---------------------------------------------------------------- building
    @torch.no_grad()
    def copy_in(self, owns: Callable[[int], bool]) -> None:
        """The parameters' values into the chunks this rank `owns` (written to their files as the
        budget needs), every parameter then absent until its chunk is bound."""
        residency = self.residency
        for chunk, indices in enumerate(self.chunk_members):
            key = ("param", chunk)
            if owns(chunk):
                values = [self.members[i].param.detach() for i in indices]  # the old storage, kept alive
                buffer = residency.load(key)
                for index, value in zip(indices, values):
                    self.members[index].view(buffer).copy_(value)
                residency.store.changed(key)
                residency.evict(key)
            for index in indices:  # every tier: absent, on the compute device, until a chunk binds it there
                self.members[index].param.data = self.members[index].absent

    @torch.no_grad()
    def initialise_by_chunk(self, model: nn.Module, metas: dict[int, list[tuple[nn.Module, str, nn.Parameter]]],
                            owns: Callable[[int], bool]) -> None:
        """Every chunk initialised in turn by `model.init_weights()` on every rank (the same draws
        whatever the number of ranks), the other chunks' parameters shown as their meta originals
        (`metas`, by the id of the parameter that replaced them: the modules and names that hold
        it); a rank keeps the chunks it `owns`."""
        init = getattr(model, "init_weights", None)
        if not callable(init):
            raise ValueError(f"model {type(model).__name__} was built on the meta device but has no init_weights() "
                             "method to initialise its chunks")
        residency = self.residency
        for chunk, indices in enumerate(self.chunk_members):
            key = ("param", chunk)
            buffer = residency.load(key)
            if residency.device is not None:  # initialised in host memory
                self.bound(key, buffer)
            inside = {id(self.members[i].param) for i in indices}
            shown = [(module, name, meta) for member in self.members if id(member.param) not in inside
                     for module, name, meta in metas[id(member.param)]]
            for module, name, meta in shown:  # the other chunks' parameters: meta, which init skips
                setattr(module, name, meta)
            try:
                init()
            finally:
                for member in self.members:
                    for module, name, _ in metas[id(member.param)]:
                        setattr(module, name, member.param)
                if residency.device is not None:
                    self.unbound(key, buffer)
            if owns(chunk):
                residency.store.changed(key)
                residency.evict(key)
            else:
                residency.drop(key)


def materialise(model: nn.Module, named: list[tuple[str, nn.Parameter]], device: torch.device
                ) -> tuple[list[tuple[str, nn.Parameter]], dict[int, list[tuple[nn.Module, str, nn.Parameter]]]]:
    """Replace every meta parameter of `model` by one on `device` holding the absent marker
    (trainable) or uninitialised memory (frozen), and every meta buffer by uninitialised memory.
    Returns `named` with the new parameters, and by each new parameter's id the modules, names and
    meta originals it replaced."""
    nan = torch.tensor(float("nan"), device=device)  # 0-dim: it broadcasts to any shape, () included
    replaced: dict[int, nn.Parameter] = {}
    metas: dict[int, list[tuple[nn.Module, str, nn.Parameter]]] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if not param.is_meta:
                continue
            if id(param) not in replaced:
                data = nan.expand(param.shape) if param.requires_grad else torch.empty(param.shape, device=device)
                replaced[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
            new = replaced[id(param)]
            setattr(module, name, new)
            metas.setdefault(id(new), []).append((module, name, param))
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_meta:
                setattr(module, name, torch.empty_like(buffer, device=device))
    return [(name, replaced.get(id(p), p)) for name, p in named], metas


@torch.no_grad()
def move_others(model: nn.Module, device: torch.device) -> None:
    """`model`'s buffers and frozen parameters to `device` (the chunks hold the rest)."""
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, buffer.to(device))
        for param in module.parameters(recurse=False):
            if not param.requires_grad:
                param.data = param.data.to(device)
