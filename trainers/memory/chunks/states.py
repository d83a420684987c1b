"""`ChunkedStates`: a model's parameters, gradients and AdamW moments in chunks (`trainers.memory.chunks.layout`)
that move between memory, disk and the device under memory budgets, composed of one part per job:

    residency   which chunks are in memory, and the step's moments    (`trainers.memory.chunks.residency`)
    parameters  the parameters as views into their chunks           (`trainers.memory.chunks.parameters`)
    ownership   ZeRO over chunks: each chunk's owner, gathered copies (`trainers.memory.chunks.ownership`)
    gradients   gradient chunks, reduced in one order on every rank  (`trainers.memory.chunks.gradients`)
    adamw       the update, where each chunk is                      (`trainers.memory.chunks.update`)
    checkpoint  the states as every strategy's checkpoint holds them (`trainers.memory.chunks.checkpoint`)

This class builds them, binds them together (it is the residency's `ChunkUser`) and gives the
trainer its face: the regions a step or an evaluation runs in, the step's end, the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainers.config import TrainConfig
from trainers.memory.activations.host import HostSwap
from trainers.memory.activations.swap import ActivationSwap
from trainers.memory.chunks.access import ParameterAccess
from trainers.memory.chunks.checkpoint import ChunkedTensor, chunked_checkpoint_state, chunked_state_dict, restored_steps
from trainers.memory.chunks.device import DeviceChunks
from trainers.memory.chunks.gradients import ChunkGradients
from trainers.memory.chunks.layout import search_chunk_size
from trainers.memory.chunks.ownership import ChunkOwnership
from trainers.memory.chunks.parameters import ChunkedParameters, Member, materialise, move_others
from trainers.memory.chunks.placement import Placement
from trainers.memory.chunks.residency import ChunkResidency
from trainers.memory.chunks.store import ChunkKey, ChunkStore
from trainers.memory.chunks.update import KINDS, ChunkAdamW
from trainers.memory.resident import resident_set_bytes
from trainers.strategy import Strategy
from zoo.plan import model_plan


def largest_block_tensor(model: nn.Module) -> int | None:
    """Elements of the largest trainable tensor in the blocks `model`'s plan declares (None
    without blocks): the size chunks are made for (`trainers.memory.chunks.layout`)."""
    names = model_plan(model).block_names(model)
    sizes = [p.numel() for name in names for p in model.get_submodule(name).parameters() if p.requires_grad]
    return max(sizes) if sizes else None


def _check_room_to_move(model: nn.Module, memory_budget: int, chunk_bytes: int) -> None:
    """ValueError naming the smallest budget that holds while `model`, built in memory, moves into its
    chunks: the process as it is now (the model's parameters included, freed chunk by chunk as they
    are copied) plus one chunk buffer."""
    process = resident_set_bytes()
    if memory_budget < process + chunk_bytes:
        raise ValueError(
            f"memory_budget={memory_budget:,} bytes is below what this process holds now, {process:,} bytes with "
            f"{type(model).__name__}'s parameters built in memory, plus one {chunk_bytes:,}-byte chunk to move them "
            f"into: the smallest budget that holds while they move is {process + chunk_bytes:,} bytes. A model built "
            "on the meta device (with an init_weights() method) is materialised chunk by chunk instead, and needs "
            "only the process without it")


class ChunkedStates:
    """The trainable parameters of `model` (fp32, in `named_parameters` order) with their gradients
    and AdamW moments in chunks under `memory_budget` bytes for the process, evicted chunks in files
    under `directory`. `largest`: the largest tensor the shared chunks are sized for (larger ones get
    chunks of their own); `group`: the data-parallel ranks whose gradients are averaged; `shard`:
    each of them owns a share of the chunks (`trainers.memory.chunks.ownership`); `swap_min_bytes`:
    saved activations of at least this size are swapped during a step (None: they stay where they
    are): from the device to host memory under a device tier (`trainers.memory.activations.host`),
    else to files under `directory`/activations (`trainers.memory.activations.swap`). `device`:
    where the model computes, with a device tier of `device_budget` bytes (None: in host memory, no
    device tier); the model's other tensors (buffers, frozen parameters) move there. A model built
    on the meta device is materialised chunk by chunk (`trainers.memory.chunks.parameters`)."""

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
        self.compute_device = device or torch.device("cpu")
        """Where the model computes."""
        self.layout = search_chunk_size([p.numel() for _, p in named], largest=largest)
        on_gpu = device is not None and device.type == "cuda"
        self.residency = ChunkResidency(ChunkStore(directory, pin_memory=on_gpu), list(self.layout.sizes),
                                        memory_budget, self, DeviceChunks(device) if device is not None else None,
                                        device_budget)
        self.swap: HostSwap | ActivationSwap | None = None
        """Where saved activations go during a step, when they are swapped."""
        if swap_min_bytes is not None:
            self.swap = (HostSwap(self.compute_device, swap_min_bytes) if device is not None else
                         ActivationSwap(Path(directory) / "activations", swap_min_bytes, self.store.io))
        metas = None
        if any(p.is_meta for _, p in named):
            named, metas = materialise(model, named, self.compute_device)
        else:
            _check_room_to_move(model, memory_budget, max(self.layout.sizes) * self.store.dtype.itemsize)
            move_others(model, self.compute_device)
        self.parameters = ChunkedParameters(named, self.layout, self.residency, self.compute_device)
        self.ownership = ChunkOwnership(list(self.layout.sizes), group, shard, self.residency, self.parameters)
        if metas is not None:
            self.parameters.initialise_by_chunk(model, metas, self.ownership.owns)
        else:
            self.parameters.copy_in(self.ownership.owns)
        self.store.flush()  # a directory that cannot take the chunks fails here
        self.residency.watch(model)
        self.gradients = ChunkGradients(self.parameters, self.residency, self.ownership)
        self.adamw = ChunkAdamW(config, self.parameters, self.residency, self.ownership, self.gradients)
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

    # ---------------------------------------------------------------- the parts, as the trainer reads them
    @property
    def store(self) -> ChunkStore:
        return self.residency.store

    @property
    def device(self) -> DeviceChunks | None:
        return self.residency.device

    @property
    def placement(self) -> Placement:
        return self.residency.placement

    @property
    def allocator_slack(self) -> int:
        return self.residency.moments.allocator_slack

    @property
    def members(self) -> list[Member]:
        return self.parameters.members

    @property
    def updates_on_device(self) -> int:
        return self.adamw.updates_on_device

    @property
    def updates_on_host(self) -> int:
        return self.adamw.updates_on_host

    # ---------------------------------------------------------------- the residency's user
    def bound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        self.parameters.bound(key, buffer)

    def unbound(self, key: ChunkKey, buffer: torch.Tensor) -> None:
        self.parameters.unbound(key, buffer)

    def evictable(self, key: ChunkKey) -> bool:
        return self.ownership.evictable(key)

    def kept(self) -> set[ChunkKey]:
        return self.ownership.kept()

    def bring(self, key: ChunkKey) -> None:
        self.ownership.bring(key)

    def released(self) -> None:
        self.ownership.released()

    # ---------------------------------------------------------------- regions
    def parameter_access(self) -> ParameterAccess:
        """A torch-function mode that brings the parameters' chunks as operations use them: for code
        that runs where the step's own mode is not active (a block's forward rerun in backward)."""
        return ParameterAccess(self.residency, self.parameters.chunks_of)

    def holds_parameter(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is a chunked parameter or a view of a parameter chunk."""
        return self.parameters.holds(tensor)

    @contextmanager
    def step_region(self) -> Iterator[None]:
        """Forward, backward and optimizer step of one training step run inside (on every rank);
        the first records the step's moments and plans the placement from them."""
        if self.swap is not None:
            self.swap.begin_step()
        try:
            with (self.residency.moments.measured_step(), self._activated(),
                  torch.autograd.graph.saved_tensors_hooks(lambda t: self.parameters.pack(t, self.swap),
                                                           lambda saved: self.parameters.unpack(saved, self.swap))):
                yield
        finally:
            if self.swap is not None:
                self.swap.end_step()

    @contextmanager
    def access_region(self) -> Iterator[None]:
        """Code that only reads the parameters (evaluation, on every rank) runs inside."""
        self.residency.moments.new_region()
        with self._activated():
            yield

    @contextmanager
    def _activated(self) -> Iterator[None]:
        try:
            with self.residency.scoped(), self.ownership.gathering_on(), self.parameter_access():
                yield
        finally:
            self.gradients.release()

    # ---------------------------------------------------------------- a step
    def begin_micro_batch(self, last: bool) -> None:
        """A micro batch's backward follows; `last`: the step's last (its gradients complete the chunks)."""
        self.gradients.begin_micro_batch(last)

    def finish_backward(self) -> float:
        """After the last micro batch's backward: the global gradient norm (`trainers.memory.chunks.gradients`)."""
        return self.gradients.finish_backward()

    def step(self, lr: float, grad_factor: float) -> None:
        """One AdamW update of every chunk this rank owns at learning rate `lr`, the gradients first
        multiplied by `grad_factor` (clipping); the gradients are then dropped."""
        self.adamw.step(lr, grad_factor)
        self.gradients.discard()

    def discard_gradients(self) -> None:
        """Drop every gradient chunk (a skipped step)."""
        self.gradients.discard()

    def can_rerun_step(self) -> bool:
        """Whether a step whose forward or backward ran out of device memory may run again: under a
        device tier, once the first step has planned the placement, on one rank (the others would be
        waiting in the step's collectives)."""
        return self.device is not None and self.placement.planned and self.ownership.world == 1

    def prepare_rerun(self) -> None:
        """Before a step that ran out of device memory runs again: its gradients dropped, the
        allocator's slack widened (`StepMoments.widen_device_slack`)."""
        self.gradients.discard()
        self.residency.moments.widen_device_slack()

    def close(self) -> None:
        """Stop the chunk files' thread after its transfers and remove the files (`ChunkStore.close`,
        which also runs at exit); the states cannot be read after."""
        self.store.close()

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        """A copy of `model.state_dict()` (the module this class was built on), the chunked
        parameters read chunk by chunk; empty where not `keep` (collective when sharded)."""
        return chunked_state_dict(model, self.parameters, self.residency, self.ownership, keep)

    def checkpoint_state(self, model: nn.Module) -> tuple[dict[str, Any], dict[str, ChunkedTensor]]:
        """What a checkpoint of `model` holds (`trainers.memory.chunks.checkpoint.chunked_checkpoint_state`)."""
        return chunked_checkpoint_state(model, self.parameters, self.residency, self.ownership, self.adamw.steps)

    def restore_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> None:
        """After a checkpoint was loaded into `checkpoint_state`'s dict: each parameter's AdamW step."""
        self.adamw.steps = restored_steps(state, self.parameters, self.ownership)


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
    swap = strategy.swap_activations
    if per_block:  # the blocks that choose to swap do, from any size
        swap = swap or 0
    return ChunkedStates(model, config, str(Path(strategy.offload_dir) / f"rank{rank:05d}"), strategy.memory_budget,
                         group, largest_block_tensor(model), shard=strategy.zero == 3, swap_min_bytes=swap, **tier)
