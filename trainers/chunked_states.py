"""`ChunkedStates`: a model's parameters, gradients and AdamW moments in chunks (`trainers.chunks`)
that move between memory and disk under a memory budget (PatrickStar's chunk manager, with a
disk tier as in ZeRO-Infinity).

Each parameter is a view into its parameter chunk while the chunk is in memory, and one NaN
broadcast to its shape while it is not (`trainers.chunk_access`). Gradients go into gradient
chunks as autograd accumulates them (the parameter's own `.grad` is freed at once); a gradient
chunk whose tensors have all received the last micro batch's gradients is all-reduced over the
data-parallel ranks and its norms taken, so the global norm is known when backward ends. The
AdamW update then runs chunk by chunk where the chunks are (parameter, gradient, two moments),
and the gradient chunk is dropped without being written.

Placement follows `trainers.chunk_placement`: the first step keeps only the chunks in use and
measures the other tensors; later steps keep what the budget leaves them, evicting the chunk used
again furthest ahead. The budget counts the whole process on a CPU machine: the rest of the
process (its resident memory beyond the chunks and the step's tensors, the most of it seen at any
moment of the first step), the step's other tensors, the chunks, and a margin (`CAPACITY_MARGIN`).
So that freed memory leaves the process, allocations of `MMAP_THRESHOLD` bytes and more are
mapped and unmapped on their own (glibc's mallopt, for the whole process): the default allocator
keeps freed chunks in its heap, where they still count as resident.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.optim.adamw import adamw

from trainers.chunk_access import ParameterAccess, SavedChunkView
from trainers.chunk_checkpoint import ChunkedTensor
from trainers.chunk_placement import Moment, Placement
from trainers.chunk_store import ChunkKey, ChunkStore
from trainers.chunks import search_chunk_size
from trainers.config import TrainConfig
from trainers.optim import clean_fqn
from trainers.tensor_peak import TensorPeak

KINDS = ("param", "grad", "exp_avg", "exp_avg_sq")
"""The chunk lists, one layout for all: parameters, gradients, AdamW's two moments."""
CAPACITY_MARGIN = 0.03
"""Share of the budget left free for what the measurement cannot see (peaks between moments)."""
MMAP_THRESHOLD = 1 << 20
"""Bytes from which glibc's malloc maps each allocation on its own (returned to the system when freed)."""
M_MMAP_THRESHOLD = -3
"""mallopt's parameter number for the mmap threshold (malloc.h)."""


def release_freed_memory() -> bool:
    """Have glibc's malloc map allocations of `MMAP_THRESHOLD` bytes or more on their own, so
    that freeing one returns its memory to the system; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def resident_set_bytes() -> int:
    """The process's resident memory now (Linux /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


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


class ChunkedStates:
    """The trainable parameters of `model` (fp32, in `named_parameters` order) with their gradients
    and AdamW moments in chunks under `memory_budget` bytes for the process, evicted chunks in files
    under `directory`. `largest`: the largest tensor the shared chunks are sized for (larger ones get
    chunks of their own); `group`: the data-parallel ranks whose gradients are averaged.

    A model built on the meta device is materialised chunk by chunk: its `init_weights()` runs
    once per parameter chunk, with the other parameters on the meta device, so that no more than one
    chunk is ever in memory (the draws differ from one initialisation of the whole model)."""

    def __init__(self, model: nn.Module, config: TrainConfig, directory: str, memory_budget: int,
                 group: dist.ProcessGroup | None = None, largest: int | None = None) -> None:
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"model {type(model).__name__} has no trainable parameters")
        dtypes = sorted({str(p.dtype) for _, p in named})
        if dtypes != ["torch.float32"]:
            raise ValueError(f"offload='chunks' keeps fp32 parameters in its chunks; the model's trainable parameters "
                             f"are {', '.join(dtypes)}")
        self.config, self.budget, self.group = config, memory_budget, group
        self.world = dist.get_world_size(group) if group is not None else 1
        self.layout = search_chunk_size([p.numel() for _, p in named], largest=largest)
        self.store = ChunkStore(directory)
        self.placement = Placement()
        self.busy = False
        """True while this class's own code runs (the access mode then stays out of the way)."""
        self._pins: Counter[ChunkKey] = Counter()
        self._last_used: dict[ChunkKey, int] = {}
        self._clock = 0
        self._moment_chunks: frozenset[ChunkKey] | None = None
        self._tracker: TensorPeak | None = None
        self._rest = 0
        """While the first step runs: the most resident memory seen besides chunks and its tensors."""
        self._param_storage: dict[int, ChunkKey] = {}
        """Storage address of each parameter chunk in memory."""
        release_freed_memory()
        on_meta = any(p.is_meta for _, p in named)
        if on_meta:
            named = self._materialise(model, named)
        nan = torch.full((1,), float("nan"))
        self.members = [_Member(name, p, *self.layout.slots[index], p.ndim >= 2, nan.expand(p.shape))
                        for index, (name, p) in enumerate(named)]
        self._index = {id(m.param): index for index, m in enumerate(self.members)}
        self._chunk_members = self.layout.members()
        if on_meta:
            self._initialise_by_chunk(model)
        else:
            self._copy_in()
        self.steps = [0] * len(self.members)
        """AdamW steps taken by each parameter."""
        self.has_grad = [False] * len(self.members)
        self._received = [0] * self.layout.chunks
        self._last_micro_batch = True
        self._held_gradients: ChunkKey | None = None
        """The gradient chunk accumulated into last, kept pinned until another one is."""
        self._norm_squares: list[torch.Tensor] = []
        self._active = False
        """Inside a step or access region."""
        self._scopes: list[set[ChunkKey]] = []
        """Chunks used by each running module (innermost last), pinned until it returns."""
        for module in model.modules():
            module.register_forward_pre_hook(self._enter_module)
            module.register_forward_hook(self._exit_module, always_call=True)
        for index, member in enumerate(self.members):
            member.param.register_hook(self._before_accumulation(index))
            member.param.register_post_accumulate_grad_hook(self._accumulated)
        process, working = resident_set_bytes(), len(KINDS) * max(self.layout.sizes) * self.store.dtype.itemsize
        if memory_budget < process + working:
            raise ValueError(f"memory_budget must hold the process ({process:,} bytes now) and one chunk of each of "
                             f"{', '.join(KINDS)} ({working:,} bytes), {process + working:,} bytes in all; got "
                             f"{memory_budget:,}")

    # ---------------------------------------------------------------- building
    def _materialise(self, model: nn.Module, named: list[tuple[str, nn.Parameter]]) -> list[tuple[str, nn.Parameter]]:
        """Replace every meta parameter by a CPU one holding the absent marker (trainable) or
        uninitialised memory (frozen), and every meta buffer by uninitialised CPU memory."""
        nan = torch.full((1,), float("nan"))
        replaced: dict[int, nn.Parameter] = {}
        self._owners: dict[int, list[tuple[nn.Module, str, nn.Parameter]]] = {}
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is None or not param.is_meta:
                    continue
                if id(param) not in replaced:
                    data = nan.expand(param.shape) if param.requires_grad else torch.empty(param.shape)
                    replaced[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
                new = replaced[id(param)]
                module._parameters[name] = new
                self._owners.setdefault(id(new), []).append((module, name, param))
            for name, buffer in list(module._buffers.items()):
                if buffer is not None and buffer.is_meta:
                    module._buffers[name] = torch.empty_like(buffer, device="cpu")
        return [(name, replaced.get(id(p), p)) for name, p in named]

    @torch.no_grad()
    def _initialise_by_chunk(self, model: nn.Module) -> None:
        init = getattr(model, "init_weights", None)
        if not callable(init):
            raise ValueError(f"model {type(model).__name__} was built on the meta device but has no init_weights() "
                             "method to initialise its chunks")
        for chunk, indices in enumerate(self._chunk_members):
            key = ("param", chunk)
            self._load(key)
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
            self.store.changed(key)
            self._evict(key)

    @torch.no_grad()
    def _copy_in(self) -> None:
        for chunk, indices in enumerate(self._chunk_members):
            key = ("param", chunk)
            values = [self.members[i].param.detach() for i in indices]  # the old storage, kept alive
            buffer = self._load(key)
            for index, value in zip(indices, values):
                self.members[index].view(buffer).copy_(value)
            self.store.changed(key)
            self._evict(key)

    # ---------------------------------------------------------------- chunks in and out of memory
    def _size(self, key: ChunkKey) -> int:
        return self.layout.sizes[key[1]]

    def _bytes(self, key: ChunkKey) -> int:
        return self._size(key) * self.store.dtype.itemsize

    def _load(self, key: ChunkKey) -> torch.Tensor:
        """Chunk `key` in memory (read back or created); parameters bound to their views."""
        self.busy, was_busy = True, self.busy
        try:
            loaded = key in self.store.memory
            buffer = self.store.load(key, self._size(key))
            if key[0] == "param" and not loaded:
                for index in self._chunk_members[key[1]]:
                    self.members[index].param.data = self.members[index].view(buffer)
                self._param_storage[buffer.untyped_storage().data_ptr()] = key
            return buffer
        finally:
            self.busy = was_busy

    def _evict(self, key: ChunkKey) -> None:
        self.busy, was_busy = True, self.busy
        try:
            if key[0] == "param":
                for index in self._chunk_members[key[1]]:
                    self.members[index].param.data = self.members[index].absent
                del self._param_storage[self.store.memory[key].untyped_storage().data_ptr()]
            self.store.evict(key)
        finally:
            self.busy = was_busy

    def _capacity(self) -> int:
        return self.placement.current_capacity() if self.placement.planned else 0

    def _make_room(self, needed: int) -> None:
        """Evict unpinned chunks until those in memory and `needed` more bytes fit the capacity:
        the one used again furthest ahead first (the least recently used among equals)."""
        capacity = self._capacity()
        resident = self.store.resident_bytes()
        while resident + needed > capacity:
            free = [key for key in self.store.memory if not self._pins[key]]
            if not free:
                return
            victim = max(free, key=lambda key: (self.placement.next_use(key) if self.placement.planned else 0,
                                                -self._last_used.get(key, 0)))
            resident -= self.store.memory[victim].nbytes
            self._evict(victim)

    def pin(self, keys: frozenset[ChunkKey]) -> None:
        """Bring chunks `keys` into memory and keep them there until `unpin`; a new moment of the
        step when they differ from the last moment's."""
        if keys != self._moment_chunks:
            self._new_moment(keys)
        self._pins.update(keys)
        for key in keys:
            self._clock += 1
            self._last_used[key] = self._clock
            if key not in self.store.memory:
                self._make_room(self._bytes(key))
                self._load(key)
        self._make_room(0)

    def unpin(self, keys: Iterable[ChunkKey]) -> None:
        self._pins.subtract(keys)

    @contextmanager
    def _holding(self, keys: frozenset[ChunkKey]) -> Iterator[dict[ChunkKey, torch.Tensor]]:
        """Chunks `keys` pinned in memory while this class's own code works on them (the access
        mode out of the way); yields the chunks in memory by key."""
        self.pin(keys)
        self.busy, was_busy = True, self.busy
        try:
            yield self.store.memory
        finally:
            self.busy = was_busy
            self.unpin(keys)

    def held(self, keys: frozenset[ChunkKey]) -> None:
        """An operation that pinned `keys` ended: they stay pinned until the innermost running
        module returns (none running: unpinned now)."""
        if not self._scopes:
            self.unpin(keys)
            return
        scope = self._scopes[-1]
        self.unpin(keys & scope)
        scope.update(keys)

    def _enter_module(self, module: nn.Module, args) -> None:
        if self._active:
            self._scopes.append(set())

    def _exit_module(self, module: nn.Module, args, output) -> None:
        if self._active and self._scopes:
            self.unpin(self._scopes.pop())

    def chunks_of(self, params: Iterable[nn.Parameter]) -> frozenset[ChunkKey]:
        """The parameter chunks of those of `params` that this class holds."""
        index = self._index
        return frozenset(("param", self.members[index[id(p)]].chunk) for p in params if id(p) in index)

    def _new_moment(self, keys: frozenset[ChunkKey]) -> None:
        self._moment_chunks = keys
        if self._tracker is not None:
            moments = self.placement.moments
            if moments:
                moments[-1].other_bytes = self._tracker.mark()
            self._rest = max(self._rest, resident_set_bytes() - self.store.resident_bytes() - self._tracker.live)
            in_use = set(keys) | {key for key, count in self._pins.items() if count}
            moments.append(Moment(keys, sum(self._bytes(key) for key in in_use)))
        elif self.placement.planned:
            self.placement.advance(keys)

    # ---------------------------------------------------------------- a step
    @contextmanager
    def step_region(self) -> Iterator[None]:
        """Forward, backward and optimizer step of one training step run inside; the first
        records the step's moments and plans the placement from them."""
        recording = not self.placement.planned
        self._rest = resident_set_bytes() - self.store.resident_bytes()
        self._tracker = TensorPeak() if recording else None
        self.placement.position, self._moment_chunks = -1, None
        with (self._activated(), torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack),
              self._tracker or nullcontext()):
            yield
        if recording:
            self.placement.moments[-1].other_bytes = self._tracker.mark()
            self._tracker = None
            self._plan(self._rest)
        self.placement.position = len(self.placement.moments)  # outside the step: the smallest capacity

    @contextmanager
    def access_region(self) -> Iterator[None]:
        """Code that only reads the parameters (evaluation) runs inside."""
        self._moment_chunks = None
        with self._activated():
            yield

    @contextmanager
    def _activated(self) -> Iterator[None]:
        self._active, self._scopes = True, []
        try:
            with ParameterAccess(self):
                yield
        finally:
            for scope in self._scopes:
                self.unpin(scope)
            self._release_gradients()
            self._active, self._scopes = False, []

    def _plan(self, rest: int) -> None:
        """Capacities from the recorded moments, `rest` the most resident memory of the process
        besides chunks and the step's tensors."""
        moments = self.placement.moments
        margin = int(CAPACITY_MARGIN * self.budget)
        capacity = [self.budget - margin - rest - moment.other_bytes for moment in moments]
        short = max(range(len(moments)), key=lambda i: moments[i].in_use_bytes - capacity[i])
        moment = moments[short]
        if capacity[short] < moment.in_use_bytes:
            raise MemoryError(
                f"memory_budget={self.budget:,} bytes is smaller than the step's working set: at moment {short} of "
                f"{len(moments)} it needs chunks in use ({moment.in_use_bytes:,} bytes: {sorted(moment.chunks)}), the "
                f"step's other tensors ({moment.other_bytes:,}), the rest of the process ({rest:,}) and a margin "
                f"of {CAPACITY_MARGIN:.0%} ({margin:,}); give a larger budget or a smaller micro batch")
        self.placement.plan(capacity)

    def begin_micro_batch(self, last: bool) -> None:
        """A micro batch's backward follows; `last`: the step's last (its gradients complete the chunks)."""
        self._release_gradients()
        self._last_micro_batch = last
        self._received = [0] * self.layout.chunks

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | SavedChunkView:
        self.busy, was_busy = True, self.busy
        try:
            index = self._index.get(id(tensor))
            if index is not None:  # a parameter, whether its chunk is in memory or not
                member = self.members[index]
                return SavedChunkView(("param", member.chunk), member.offset, tuple(tensor.shape),
                                      _contiguous_strides(tensor.shape))
            key = self._param_storage.get(tensor.untyped_storage().data_ptr())
            if key is None:
                return tensor
            return SavedChunkView(key, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        finally:
            self.busy = was_busy

    def _unpack(self, saved: torch.Tensor | SavedChunkView) -> torch.Tensor:
        if not isinstance(saved, SavedChunkView):
            return saved
        with self._holding(frozenset([saved.key])) as chunks:
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
            member.view(self.store.memory[key]).add_(grad)
            self.store.changed(key)
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
        """Chunk `chunk`'s gradients are final: average them over the ranks and take their norms."""
        buffer = self.store.memory[("grad", chunk)]
        if self.world > 1:
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
                with self._holding(frozenset([("grad", chunk)])):
                    self._complete(chunk)
        total = torch.stack(self._norm_squares).sum() if self._norm_squares else torch.zeros((), dtype=torch.float64)
        self._norm_squares = []
        return math.sqrt(total.item())

    @torch.no_grad()
    def step(self, lr: float, grad_factor: float) -> None:
        """One AdamW update of every chunk at learning rate `lr`, the gradients first multiplied by
        `grad_factor` (clipping); the gradients are then dropped."""
        config = self.config
        for chunk, members in enumerate(self._chunk_members):
            updated = [i for i in members if self.has_grad[i]]
            if not updated:
                continue
            with self._holding(frozenset((kind, chunk) for kind in KINDS)) as chunks:
                param, grad, exp_avg, exp_avg_sq = (chunks[(kind, chunk)] for kind in KINDS)
                if grad_factor != 1.0:
                    grad.mul_(grad_factor)
                for index in updated:
                    member = self.members[index]
                    step = torch.tensor(float(self.steps[index]))
                    adamw([member.view(param)], [member.view(grad)], [member.view(exp_avg)], [member.view(exp_avg_sq)],
                          [], [step], foreach=False, amsgrad=False, beta1=config.betas[0], beta2=config.betas[1],
                          lr=lr, weight_decay=config.weight_decay if member.decay else 0.0, eps=config.eps,
                          maximize=False)
                    self.steps[index] += 1
                for kind in ("param", "exp_avg", "exp_avg_sq"):
                    self.store.changed((kind, chunk))
        self.discard_gradients()

    @torch.no_grad()
    def state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """A copy of `model.state_dict()` (the module this class was built on), the chunked
        parameters read chunk by chunk."""
        chunked = {}
        for chunk, members in enumerate(self._chunk_members):
            with self._holding(frozenset([("param", chunk)])) as chunks:
                chunked.update({index: self.members[index].view(chunks[("param", chunk)]).clone() for index in members})
        return {name: chunked[self._index[id(value)]] if id(value) in self._index else value.detach().clone()
                for name, value in model.state_dict(keep_vars=True).items()}

    def checkpoint_state(self, model: nn.Module) -> tuple[dict[str, Any], dict[str, ChunkedTensor]]:
        """What a checkpoint of `model` (the module this class was built on) holds, as every
        strategy saves it ({"model", "optimizer"}; `trainers.checkpoint`), chunked tensors as
        stand-ins of their shape; and, by flattened key, how to reach each chunked tensor in its
        chunk (`trainers.chunk_checkpoint`)."""
        model_state = get_model_state_dict(model)
        chunked: dict[str, ChunkedTensor] = {}
        for name, value in model.state_dict(keep_vars=True).items():
            index = self._index.get(id(value))
            if index is not None:
                model_state[clean_fqn(name)] = self.members[index].absent
                chunked[f"model.{clean_fqn(name)}"] = self._chunk_view("param", index)
        optimizer_state = {}
        for index, member in enumerate(self.members):
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
            self.pin(keys)  # until release
            return member.view(self.store.memory[(kind, member.chunk)]), release
        return view

    def restore_steps(self, optimizer_state: dict[str, dict[str, torch.Tensor]]) -> None:
        """After a checkpoint was loaded into `checkpoint_state`'s dict: each parameter's AdamW step."""
        self.steps = [int(optimizer_state[clean_fqn(member.name)]["step"].item()) for member in self.members]

    def discard_gradients(self) -> None:
        """Drop every gradient chunk (a skipped step, or after the update)."""
        for chunk in range(self.layout.chunks):
            self.store.drop(("grad", chunk))
        self.has_grad = [False] * len(self.members)
