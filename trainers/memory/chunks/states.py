"""`ChunkedStates`: a model's parameters, gradients and AdamW moments in chunks (`trainers.memory.chunks.layout`)
that move between memory and disk under a memory budget (`trainers.memory.chunks.residency`).

Each parameter is a view into its parameter chunk while the chunk is in memory, and one NaN
broadcast to its shape while it is not (`trainers.memory.chunks.access`). Gradients go into gradient
chunks as autograd accumulates them (the parameter's own `.grad` is freed at once); a gradient
chunk whose tensors have all received the last micro batch's gradients is reduced over the
data-parallel ranks and its norms taken, so the global norm is known when backward ends. The
AdamW update then runs chunk by chunk where the chunks are (parameter, gradient, two moments),
and the gradient chunk is dropped without being written.

On a GPU (or with a device budget; `trainers.memory.chunks.device`) the chunks the model computes with are
on the device, above host memory (pinned) and disk, and the update of each chunk runs where its
parameters are when the step reaches it: on the device (its gradients and moments copied up beside
them) or on the host (its gradients copied down), so that no chunk goes down and up again just for
the update.

ZeRO over chunks (`shard=True`): each chunk has one owning rank (`trainers.memory.chunks.layout.chunk_owners`),
which alone keeps its parameters and moments (in memory or in its files) and updates them. A
completed gradient chunk is reduced to its owner (the others drop theirs); a parameter chunk that
a rank does not own is gathered, broadcast by its owner, when a step or an evaluation uses it and
it is not among the chunks gathered lately, and dropped when it leaves them. Which chunks are
gathered follows only the order in which the model uses its parameters, the same on every rank:
those in use, and the `SPARE_GATHERED` used most recently besides them. With one owner per chunk,
gathering a chunk is a broadcast and reducing it a reduce: the bytes each rank sends and receives
are those of an all-gather and a reduce-scatter of N chunks, without N chunks in memory at once.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.optim.adamw import adamw

from trainers.memory.activations.swap import ActivationSwap, SwappedTensor
from trainers.memory.chunks.access import ParameterAccess, SavedChunkView
from trainers.memory.chunks.checkpoint import ChunkedTensor
from trainers.memory.chunks.device import DeviceChunks
from trainers.memory.chunks.residency import ChunkResidency, resident_set_bytes
from trainers.memory.chunks.store import ChunkKey, ChunkStore
from trainers.memory.chunks.layout import chunk_owners, search_chunk_size
from trainers.config import TrainConfig
from trainers.strategy import Strategy
from trainers.state.optimizer import clean_fqn
from zoo.plan import model_plan

KINDS = ("param", "grad", "exp_avg", "exp_avg_sq")
"""The chunk lists, one layout for all: parameters, gradients, AdamW's two moments."""
SPARE_GATHERED = 2
"""Under ZeRO over chunks: gathered parameter chunks kept besides those in use (the most recently used)."""


def _storage_key(tensor: torch.Tensor) -> tuple[torch.device, int]:
    return tensor.device, tensor.untyped_storage().data_ptr()


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


@dataclass
class _Member:
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


def largest_block_tensor(model: nn.Module) -> int | None:
    """Elements of the largest trainable tensor in the blocks `model`'s plan declares (None
    without blocks): the size chunks are made for (`trainers.memory.chunks.layout`)."""
    names = model_plan(model).block_names(model)
    sizes = [p.numel() for name in names for p in model.get_submodule(name).parameters() if p.requires_grad]
    return max(sizes) if sizes else None


class ChunkedStates(ChunkResidency):
    """The trainable parameters of `model` (fp32, in `named_parameters` order) with their gradients
    and AdamW moments in chunks under `memory_budget` bytes for the process, evicted chunks in files
    under `directory`. `largest`: the largest tensor the shared chunks are sized for (larger ones get
    chunks of their own); `group`: the data-parallel ranks whose gradients are averaged; `shard`:
    each of them owns a share of the chunks (ZeRO over chunks, module docstring); `swap_min_bytes`:
    saved activations of at least this size go to files under `directory`/activations during a
    step (`trainers.memory.activations.swap`; None: they stay in memory). `device`: where the model computes,
    with a device tier of `device_budget` bytes (None: in host memory, no device tier); the model's
    other tensors (buffers, frozen parameters) move there.

    A model built on the meta device is materialised chunk by chunk: its `init_weights()` runs
    once per parameter chunk, with the other parameters on the meta device, so that no more than one
    chunk is ever in memory (the draws differ from one initialisation of the whole model, and do
    not depend on the number of ranks)."""

    def __init__(self, model: nn.Module, config: TrainConfig, directory: str, memory_budget: int,
                 group: dist.ProcessGroup | None = None, largest: int | None = None, shard: bool = False,
                 swap_min_bytes: int | None = None, device: torch.device | None = None,
                 device_budget: int = 0) -> None:
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"model {type(model).__name__} has no trainable parameters")
        dtypes = sorted({str(p.dtype) for _, p in named})
        if dtypes != ["torch.float32"]:
            raise ValueError(f"offload='chunks' keeps fp32 parameters in its chunks; the model's trainable parameters "
                             f"are {', '.join(dtypes)}")
        self.layout = search_chunk_size([p.numel() for _, p in named], largest=largest)
        on_gpu = device is not None and device.type == "cuda"
        super().__init__(ChunkStore(directory, pin_memory=on_gpu), list(self.layout.sizes), memory_budget,
                         DeviceChunks(device) if device is not None else None, device_budget)
        self.compute_device = device or torch.device("cpu")
        """Where the model computes."""
        self.config, self.group = config, group
        self.world = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.sharded = shard and self.world > 1
        """Whether each rank owns a share of the chunks."""
        self.owners = chunk_owners(self.layout.sizes, self.world) if self.sharded else [self.rank] * self.layout.chunks
        """The rank that keeps and updates each chunk."""
        self._gathered: OrderedDict[int, None] = OrderedDict()
        """Under sharding: the parameter chunks gathered lately, least recently used first (the same on every rank)."""
        self._gathering = False
        """Whether every rank runs the same code now, so that chunks can be gathered."""
        self._param_storage: dict[tuple[torch.device, int], ChunkKey] = {}
        """Device and storage address of each parameter chunk the model can compute with."""
        if swap_min_bytes is not None and self.compute_device.type != "cpu":
            raise ValueError(f"Strategy.swap_activations writes activations in host memory to disk; here the step's "
                             f"tensors are on {self.compute_device} (swapping from the device to host memory is not "
                             f"built); got swap_activations={swap_min_bytes:,}")
        self.swap = (ActivationSwap(Path(directory) / "activations", swap_min_bytes, self.store.io)
                     if swap_min_bytes is not None else None)
        """Where saved activations go during a step, when they are swapped."""
        on_meta = any(p.is_meta for _, p in named)
        if on_meta:
            named = self._materialise(model, named)
        else:
            self._move_others(model)
        nan = torch.full((1,), float("nan"), device=self.compute_device)
        self.members = [_Member(name, p, *self.layout.slots[index], p.ndim >= 2, nan.expand(p.shape))
                        for index, (name, p) in enumerate(named)]
        self._index = {id(m.param): index for index, m in enumerate(self.members)}
        self._chunk_members = self.layout.members()
        if on_meta:
            self._initialise_by_chunk(model)
        else:
            self._copy_in()
        self.store.flush()  # a directory that cannot take the chunks fails here
        self.steps = [0] * len(self.members)
        """AdamW steps taken by each parameter."""
        self.updates_on_device = 0
        """Chunk updates run on the device so far (under a device tier)."""
        self.updates_on_host = 0
        """Chunk updates run in host memory so far."""
        self.has_grad = [False] * len(self.members)
        self._received = [0] * self.layout.chunks
        self._last_micro_batch = True
        self._held_gradients: ChunkKey | None = None
        """The gradient chunk accumulated into last, kept pinned until another one is."""
        self._norm_squares: list[torch.Tensor] = []
        self.watch(model)
        for index, member in enumerate(self.members):
            member.param.register_hook(self._before_accumulation(index))
            member.param.register_post_accumulate_grad_hook(self._accumulated)
        process = resident_set_bytes()
        working = len(KINDS) * max(self.layout.sizes) * self.store.dtype.itemsize
        if memory_budget < process + working:
            raise ValueError(f"memory_budget must hold the process ({process:,} bytes now) and one chunk of each of "
                             f"{', '.join(KINDS)} ({working:,} bytes), {process + working:,} bytes in all; "
                             f"got {memory_budget:,}")
        computing = 2 * max(self.layout.sizes) * self.store.dtype.itemsize
        if device is not None and device_budget < computing:
            raise ValueError(f"device_memory_budget must hold the largest chunk's parameters and gradients on the "
                             f"device ({computing:,} bytes); got {device_budget:,}")

    def owns(self, chunk: int) -> bool:
        """Whether this rank keeps and updates chunk `chunk`."""
        return self.owners[chunk] == self.rank

    # ---------------------------------------------------------------- building
    def _materialise(self, model: nn.Module, named: list[tuple[str, nn.Parameter]]) -> list[tuple[str, nn.Parameter]]:
        """Replace every meta parameter by a CPU one holding the absent marker (trainable) or
        uninitialised memory (frozen), and every meta buffer by uninitialised CPU memory."""
        nan, device = torch.full((1,), float("nan"), device=self.compute_device), self.compute_device
        replaced: dict[int, nn.Parameter] = {}
        self._owners: dict[int, list[tuple[nn.Module, str, nn.Parameter]]] = {}
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is None or not param.is_meta:
                    continue
                if id(param) not in replaced:
                    data = nan.expand(param.shape) if param.requires_grad else torch.empty(param.shape, device=device)
                    replaced[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
                new = replaced[id(param)]
                module._parameters[name] = new
                self._owners.setdefault(id(new), []).append((module, name, param))
            for name, buffer in list(module._buffers.items()):
                if buffer is not None and buffer.is_meta:
                    module._buffers[name] = torch.empty_like(buffer, device=device)
        return [(name, replaced.get(id(p), p)) for name, p in named]

    @torch.no_grad()
    def _move_others(self, model: nn.Module) -> None:
        """The model's buffers and frozen parameters to the compute device (the chunks hold the rest)."""
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = buffer.to(self.compute_device)
            for param in module._parameters.values():
                if param is not None and not param.requires_grad:
                    param.data = param.data.to(self.compute_device)

    @torch.no_grad()
    def _initialise_by_chunk(self, model: nn.Module) -> None:
        """Every chunk initialised in turn on every rank (the same draws whatever the number of
        ranks); a rank keeps those it owns."""
        init = getattr(model, "init_weights", None)
        if not callable(init):
            raise ValueError(f"model {type(model).__name__} was built on the meta device but has no init_weights() "
                             "method to initialise its chunks")
        for chunk, indices in enumerate(self._chunk_members):
            key = ("param", chunk)
            buffer = self._load(key)
            if self.device is not None:  # initialised in host memory
                self._bound(key, buffer)
            inside = {id(self.members[i].param) for i in indices}
            shown = [(module, name, meta) for member in self.members if id(member.param) not in inside
                     for module, name, meta in self._owners[id(member.param)]]
            for module, name, meta in shown:  # the other chunks' parameters: meta, which init skips
                module._parameters[name] = meta
            try:
                init()
            finally:
                for member in self.members:
                    for module, name, _ in self._owners[id(member.param)]:
                        module._parameters[name] = member.param
                if self.device is not None:
                    self._unbound(key, buffer)
            if self.owns(chunk):
                self.store.changed(key)
                self._evict(key)
            else:
                self._drop(key)

    @torch.no_grad()
    def _copy_in(self) -> None:
        for chunk, indices in enumerate(self._chunk_members):
            key = ("param", chunk)
            if self.owns(chunk):
                values = [self.members[i].param.detach() for i in indices]  # the old storage, kept alive
                buffer = self._load(key)
                for index, value in zip(indices, values):
                    self.members[index].view(buffer).copy_(value)
                self.store.changed(key)
                self._evict(key)
            for index in indices:  # every tier: absent, on the compute device, until a chunk binds it there
                self.members[index].param.data = self.members[index].absent

    # ---------------------------------------------------------------- residency hooks
    def _bound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        if key[0] == "param":
            for index in self._chunk_members[key[1]]:
                self.members[index].param.data = self.members[index].view(buffer)
            self._param_storage[_storage_key(buffer)] = key

    def _unbound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        if key[0] == "param":
            for index in self._chunk_members[key[1]]:
                self.members[index].param.data = self.members[index].absent
            del self._param_storage[_storage_key(buffer)]

    def _evictable(self, key: ChunkKey) -> bool:
        return self.owns(key[1]) or key[0] != "param"  # a gathered copy leaves with `_release_gathered`

    def _kept(self) -> set[ChunkKey]:
        return {("param", chunk) for chunk in self._gathered if not self.owns(chunk)}

    def _bring(self, key: ChunkKey) -> None:
        chunk = key[1]
        if not self.sharded or key[0] != "param":
            super()._bring(key)
        elif chunk in self._gathered:
            self._gathered.move_to_end(chunk)
            if self.owns(chunk):  # its owner may have evicted it since
                super()._bring(key)
        elif self._gathering:
            self._gather(chunk)
        elif self.owns(chunk):
            super()._bring(key)
        else:
            raise RuntimeError(f"parameter chunk {chunk} belongs to rank {self.owners[chunk]}, not to rank {self.rank}; "
                               "other ranks read it inside a step or an evaluation that every rank runs")

    def _gather(self, chunk: int) -> None:
        """Parameter chunk `chunk` from its owner, on every rank at once."""
        key = ("param", chunk)
        if self.owns(chunk):
            super()._bring(key)
        else:
            self.busy, was_busy = True, self.busy
            try:
                if self.device is None:
                    self._make_room(self._bytes(key))
                    self._bound(key, self.store.receive(key, self.sizes[chunk]))
                else:
                    self._make_device_room(key)
                    self._bound(key, self._device_buffer(key, lambda: self.device.receive(key, self.sizes[chunk])))
            finally:
                self.busy = was_busy
        dist.broadcast(self.compute_memory[key], group=self.group, group_src=self.owners[chunk])
        self._gathered[chunk] = None
        self._trim_gathered()

    def _trim_gathered(self, spare: int = SPARE_GATHERED) -> None:
        """Keep at most `spare` gathered chunks that are not in use (the most recently used)."""
        unused = [chunk for chunk in self._gathered if not self.pinned(("param", chunk))]
        for chunk in unused[:max(len(unused) - spare, 0)]:
            self._release_gathered(chunk)

    def _release_gathered(self, chunk: int) -> None:
        del self._gathered[chunk]
        if not self.owns(chunk):
            self._drop(("param", chunk))

    def _release_all_gathered(self) -> None:
        """Drop every gathered copy (their owners may change the chunks next)."""
        for chunk in list(self._gathered):
            self._release_gathered(chunk)

    def unpin(self, keys: Iterable[ChunkKey]) -> None:
        super().unpin(keys)
        if self._gathered:
            self._trim_gathered()

    @contextmanager
    def _gathering_on(self) -> Iterator[None]:
        """Every rank runs the same code inside: parameter chunks are gathered as used, and the
        gathered copies dropped at the end (the owners may change the chunks next)."""
        self._gathering = True
        try:
            yield
        finally:
            self._gathering = False
            self._release_all_gathered()

    def parameter_access(self) -> ParameterAccess:
        """A torch-function mode that brings the parameters' chunks as operations use them: for code
        that runs where the step's own mode is not active (a block's forward rerun in backward)."""
        return ParameterAccess(self)

    def holds_parameter(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is a chunked parameter or a view of a parameter chunk."""
        return id(tensor) in self._index or _storage_key(tensor) in self._param_storage

    def chunks_of(self, params: Iterable[nn.Parameter]) -> frozenset[ChunkKey]:
        """The parameter chunks of those of `params` that this class holds."""
        index = self._index
        return frozenset(("param", self.members[index[id(p)]].chunk) for p in params if id(p) in index)

    # ---------------------------------------------------------------- a step
    @contextmanager
    def step_region(self) -> Iterator[None]:
        """Forward, backward and optimizer step of one training step run inside (on every rank);
        the first records the step's moments and plans the placement from them."""
        if self.swap is not None:
            self.swap.begin_step()
        try:
            with (self.measured_step(), self._activated(),
                  torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)):
                yield
        finally:
            if self.swap is not None:
                self.swap.end_step()

    @contextmanager
    def access_region(self) -> Iterator[None]:
        """Code that only reads the parameters (evaluation, on every rank) runs inside."""
        self.new_region()
        with self._activated():
            yield

    @contextmanager
    def _activated(self) -> Iterator[None]:
        try:
            with self.scoped(), self._gathering_on(), ParameterAccess(self):
                yield
        finally:
            self._release_gradients()

    def begin_micro_batch(self, last: bool) -> None:
        """A micro batch's backward follows; `last`: the step's last (its gradients complete the chunks)."""
        self._release_gradients()
        self._last_micro_batch = last
        self._received = [0] * self.layout.chunks

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | SavedChunkView | SwappedTensor:
        self.busy, was_busy = True, self.busy
        try:
            index = self._index.get(id(tensor))
            if index is not None:  # a parameter, whether its chunk is in memory or not
                member = self.members[index]
                return SavedChunkView(("param", member.chunk), member.offset, tuple(tensor.shape),
                                      _contiguous_strides(tensor.shape))
            key = self._param_storage.get(_storage_key(tensor))
            if key is None:
                return tensor if self.swap is None else self.swap.pack(tensor)
            return SavedChunkView(key, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        finally:
            self.busy = was_busy

    def _unpack(self, saved: torch.Tensor | SavedChunkView | SwappedTensor) -> torch.Tensor:
        if isinstance(saved, SwappedTensor):
            return self.swap.unpack(saved)
        if not isinstance(saved, SavedChunkView):
            return saved
        with self.holding(frozenset([saved.key])) as chunks:
            return chunks[saved.key].as_strided(saved.shape, saved.stride, saved.offset)

    def _before_accumulation(self, index: int):
        keys = frozenset([("param", self.members[index].chunk)])

        def bring_parameter(grad: torch.Tensor) -> None:  # autograd accumulates into the parameter's shape
            self.pin(keys)
            self.unpin(keys)
        return bring_parameter

    @torch.no_grad()
    def _accumulated(self, param: nn.Parameter) -> None:
        index = self._index[id(param)]
        member = self.members[index]
        self.busy = True
        grad, param.grad = param.grad, None
        self.busy = False
        key = ("grad", member.chunk)
        if key != self._held_gradients:  # backward reaches a chunk's tensors one after another
            self._release_gradients()
            self.pin(frozenset([key]))
            self._held_gradients = key
        self.busy = True
        try:
            member.view(self.compute_memory[key]).add_(grad)
            self.changed(key)
            self.has_grad[index] = True
            if self._last_micro_batch:
                self._received[member.chunk] += 1
                if self._received[member.chunk] == len(self._chunk_members[member.chunk]):
                    self._complete(member.chunk)
        finally:
            self.busy = False

    def _release_gradients(self) -> None:
        """Unpin the gradient chunk that the last accumulation kept in memory."""
        if self._held_gradients is not None:
            self.unpin([self._held_gradients])
            self._held_gradients = None

    def _complete(self, chunk: int) -> None:
        """Chunk `chunk`'s gradients are final: average them over the ranks (on its owner, when
        sharded: the others drop theirs) and take their norms."""
        key = ("grad", chunk)
        buffer = self.compute_memory[key]
        if self.world > 1:
            if self.sharded:
                dist.reduce(buffer, group=self.group, group_dst=self.owners[chunk])
                if not self.owns(chunk):
                    self._drop(key)
                    return
            else:
                dist.all_reduce(buffer, group=self.group)
            buffer.div_(self.world)
        grads = [self.members[i].view(buffer) for i in self._chunk_members[chunk] if self.has_grad[i]]
        self._norm_squares.append(torch.stack(torch._foreach_norm(grads, 2.0)).double().pow(2).sum())

    @torch.no_grad()
    def finish_backward(self) -> float:
        """After the last micro batch's backward: the global gradient norm (chunks with tensors that
        received no gradient are completed here)."""
        self._release_gradients()
        for chunk, members in enumerate(self._chunk_members):
            if self._received[chunk] < len(members) and any(self.has_grad[i] for i in members):
                with self.holding(frozenset([("grad", chunk)])):
                    self._complete(chunk)
        total = (torch.stack(self._norm_squares).sum() if self._norm_squares
                 else torch.zeros((), dtype=torch.float64, device=self.compute_device))
        self._norm_squares = []
        if self.sharded:
            dist.all_reduce(total, group=self.group)
        return math.sqrt(total.item())

    @torch.no_grad()
    def step(self, lr: float, grad_factor: float) -> None:
        """One AdamW update of every chunk this rank owns at learning rate `lr`, the gradients first
        multiplied by `grad_factor` (clipping); the gradients are then dropped."""
        self._release_all_gathered()
        self._gathering, gathering = False, self._gathering
        try:
            for chunk, members in enumerate(self._chunk_members):
                updated = [i for i in members if self.has_grad[i]]
                if updated and self.owns(chunk):
                    self._update(chunk, updated, lr, grad_factor)
        finally:
            self._gathering = gathering
        self.discard_gradients()

    def _update(self, chunk: int, updated: list[int], lr: float, grad_factor: float) -> None:
        """AdamW (fused: one kernel per weight-decay group) on chunk `chunk`'s parameters `updated`,
        where its parameters are: on the device when they are there and the placement leaves room
        for the chunk's gradients and moments beside them (after the first step), in host memory
        otherwise."""
        config = self.config
        keys = frozenset((kind, chunk) for kind in KINDS)
        on_device = (self.device is not None and self.placement.planned and ("param", chunk) in self.device.memory
                     and sum(map(self._bytes, keys)) <= self.placement.current_capacity(device=True))
        if on_device:
            self.updates_on_device += 1
        else:
            self.updates_on_host += 1
        with self.holding(keys, host=not on_device) as chunks:
            param, grad, exp_avg, exp_avg_sq = (chunks[(kind, chunk)] for kind in KINDS)
            if grad_factor != 1.0:
                grad.mul_(grad_factor)
            for decay in (True, False):  # one fused kernel per weight-decay group of the chunk
                group = [index for index in updated if self.members[index].decay == decay]
                if not group:
                    continue
                views = [[self.members[index].view(buffer) for index in group]
                         for buffer in (param, grad, exp_avg, exp_avg_sq)]
                # one copy to the device for the group's steps (a tensor each would be a copy, and a wait, each)
                steps = list(torch.tensor([float(self.steps[index]) for index in group], device=param.device).unbind())
                adamw(*views, [], steps, fused=True, amsgrad=False, beta1=config.betas[0], beta2=config.betas[1],
                      lr=lr, weight_decay=config.weight_decay if decay else 0.0, eps=config.eps, maximize=False)
                for index in group:
                    self.steps[index] += 1
            for kind in ("param", "exp_avg", "exp_avg_sq"):
                self.changed((kind, chunk))

    @torch.no_grad()
    def state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        """A copy of `model.state_dict()` (the module this class was built on), the chunked
        parameters read chunk by chunk; empty where not `keep` (collective when sharded: call on
        every rank, keeping on one)."""
        if not keep and not self.sharded:
            return {}
        chunked = {}
        self.new_region()
        with self._gathering_on():
            for chunk, members in enumerate(self._chunk_members):
                with self.holding(frozenset([("param", chunk)])) as chunks:
                    if keep:
                        chunked.update({index: self.members[index].view(chunks[("param", chunk)]).to("cpu", copy=True)
                                        for index in members})
        if not keep:
            return {}
        return {name: chunked[self._index[id(value)]] if id(value) in self._index else value.detach().to("cpu", copy=True)
                for name, value in model.state_dict(keep_vars=True).items()}

    def checkpoint_state(self, model: nn.Module) -> tuple[dict[str, Any], dict[str, ChunkedTensor]]:
        """What a checkpoint of `model` (the module this class was built on) holds, as every
        strategy saves it ({"model", "optimizer"}; `trainers.state.checkpoint`), chunked tensors as
        stand-ins of their shape; and, by flattened key, how to reach each chunked tensor in its
        chunk (`trainers.memory.chunks.checkpoint`). When sharded, a rank's part names the tensors of the
        chunks it owns (and the model's other tensors)."""
        model_state = get_model_state_dict(model)
        chunked: dict[str, ChunkedTensor] = {}
        for name, value in model.state_dict(keep_vars=True).items():
            index = self._index.get(id(value))
            if index is None:
                continue
            if self.owns(self.members[index].chunk):
                model_state[clean_fqn(name)] = self.members[index].absent
                chunked[f"model.{clean_fqn(name)}"] = self._chunk_view("param", index)
            else:
                model_state.pop(clean_fqn(name), None)
        optimizer_state = {}
        for index, member in enumerate(self.members):
            if not self.owns(member.chunk):
                continue
            name = clean_fqn(member.name)
            optimizer_state[name] = {"step": torch.tensor(float(self.steps[index])), "exp_avg": member.absent,
                                     "exp_avg_sq": member.absent}
            for kind in ("exp_avg", "exp_avg_sq"):
                chunked[f"optimizer.{name}.{kind}"] = self._chunk_view(kind, index)
        return {"model": model_state, "optimizer": optimizer_state}, chunked

    def _chunk_view(self, kind: str, index: int) -> ChunkedTensor:
        member = self.members[index]
        keys = frozenset([(kind, member.chunk)])

        def release(changed: bool) -> None:
            if changed:
                self.store.changed((kind, member.chunk))
            self.unpin(keys)

        def view() -> tuple[torch.Tensor, Callable[[bool], None]]:
            self.pin_on_host(keys)  # until release
            return member.view(self.store.memory[(kind, member.chunk)]), release
        return view

    def restore_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> None:
        """After a checkpoint was loaded into `checkpoint_state`'s dict (its tensors straight into
        the chunks and the model): the AdamW step of each parameter this rank owns."""
        optimizer = state["optimizer"]
        self.steps = [int(optimizer[clean_fqn(member.name)]["step"].item()) if self.owns(member.chunk) else 0
                      for member in self.members]

    def can_rerun_step(self) -> bool:
        """Whether a step whose forward or backward ran out of device memory may run again: under a
        device tier, once the first step has planned the placement, on one rank (the others would be
        waiting in the step's collectives)."""
        return self.device is not None and self.placement.planned and self.world == 1

    def prepare_rerun(self) -> None:
        """Before a step that ran out of device memory runs again: its gradients dropped, the
        allocator's slack widened (`widen_device_slack`)."""
        self.discard_gradients()
        self._norm_squares = []
        self.widen_device_slack()

    def discard_gradients(self) -> None:
        """Drop every gradient chunk (a skipped step, or after the update)."""
        for chunk in range(self.layout.chunks):
            self._drop(("grad", chunk))
        self.has_grad = [False] * len(self.members)


def chunked_states(model: nn.Module, config: TrainConfig, strategy: Strategy, rank: int,
                   group: dist.ProcessGroup, device: torch.device) -> ChunkedStates:
    """The states of `model` in chunks as `strategy` (offload="chunks") sets them, for global rank
    `rank` (its files in `offload_dir/rank{rank}`) and its data-parallel `group`; the device tier on
    a GPU under `device_memory_budget` (None: the device memory free now), off a GPU only when that
    budget is given (a pool of host memory)."""
    budget = strategy.device_memory_budget
    if device.type == "cuda":
        tier = {"device": device, "device_budget": budget if budget is not None else torch.cuda.mem_get_info(device)[0]}
    else:
        tier = {} if budget is None else {"device": device, "device_budget": budget}
    per_block = strategy.activation_memory is not None or strategy.block_activations is not None
    return ChunkedStates(model, config, str(Path(strategy.offload_dir) / f"rank{rank:05d}"), strategy.memory_budget,
                         group, largest_block_tensor(model), shard=strategy.zero == 3,
                         swap_min_bytes=(strategy.swap_activations or 0) if per_block else strategy.swap_activations,
                         **tier)
