"""Run real training code on fake tensors: shapes, dtypes and storages without memory or compute.

The memory estimator (`trainers.estimate.trace`) traces one training step of a model as a rank of a
larger job would run it: its parameters and activations are `FakeTensor`s, and the job's process
group is torch's "fake" backend, whose collectives return at once. Three things make the trainer's
own code run unchanged there:

- `HostFakeMode` keeps small results computed from real tensors only (a batch's lengths, a drawn
  seed) real, so code that reads them on the host (`.item()`, `.tolist()`, `int(...)`) runs, as it
  does when validating lengths or ordering samples, and a fake tensor indexed by such a real mask
  gets the mask's shape; everything large, and everything computed from a fake tensor, is fake.
- `fake_process_group` forms the fake job for one rank and builds device meshes on real tensors
  (a mesh's coordinates are data-dependent: `nonzero` of its rank table).
- `fake_copy` gives a real model's fake twin without copying its weights.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from zoo.torch_compat import (DataDependentOutputException, DynamicOutputShapeException, FakeStore, FakeTensor,
                              FakeTensorMode, clear_dtensor_sharding_caches, tree_leaves, unset_fake_temporarily)

HOST_BYTES = 1 << 16
"""Largest result (bytes) of an operation on real tensors only that stays real."""


class HostFakeMode(FakeTensorMode):
    """`FakeTensorMode` in which operations on real tensors only whose results are small (at most
    `HOST_BYTES`), or data-dependent (`.item()`, `nonzero`), run for real; so do small integer
    factories (a drawn seed, positions). New floating-point tensors (parameters, buffers) are fake,
    so that no later operation has to convert them."""

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.ops.aten._pin_memory.default:
            # FSDP2 pins parameters it offloads to a GPU's host; fake tensors have no pinned
            # memory, and a host copy takes the same bytes.
            func, args, kwargs = torch.ops.aten.clone.default, args[:1], {}
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(isinstance(t, FakeTensor) for t in inputs):
            if func in _MASK_INDEXED and any(_is_real_mask(t) for t in args[1]):
                # A fake tensor indexed by a real boolean mask: the mask's positions give the shape.
                indices = [index for t in args[1] for index in (t.nonzero().unbind(1) if _is_real_mask(t) else [t])]
                args = (args[0], indices, *args[2:])
            return super().__torch_dispatch__(func, types, args, kwargs)
        try:
            shaped = super().__torch_dispatch__(func, types, args, kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        results = [t for t in tree_leaves(shaped) if isinstance(t, torch.Tensor)]
        if sum(t.numel() * t.element_size() for t in results) > HOST_BYTES:
            return shaped
        if not inputs and any(t.is_floating_point() for t in results):
            return shaped  # a new float tensor (a parameter, a buffer) is the model's, not host data
        with unset_fake_temporarily():
            return func(*args, **kwargs)


_MASK_INDEXED = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default}
"""Operators whose output shape follows from a boolean mask among their indices."""


def _is_real_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and not isinstance(index, FakeTensor) and index.dtype == torch.bool


def without_weights(model: nn.Module) -> nn.Module:
    """A copy of `model` to send to an estimating process: its parameters and buffers on the meta
    device (shapes, strides, dtypes, `requires_grad`, ties; no values), and by name the devices they
    were on (kept in the copy under `ORIGIN`: torch's pickler for processes drops a tensor's own
    attributes), where `fake_copy` makes their twins. A trace needs no weight, and pickling them
    would copy every byte of the model into the other process. Small integer and boolean buffers (at
    most `HOST_BYTES`: positions, token types) are data, not weights, and stay as they are: a twin
    made on a device would be a real tensor (`HostFakeMode` keeps small integer factories real) of
    arbitrary values, which a forward indexing by them (BERT's positions) would read."""
    memo: dict[int, Any] = {}
    for param in model.parameters():
        memo[id(param)] = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
    for buffer in model.buffers():
        data = not buffer.is_floating_point() and buffer.numel() * buffer.element_size() <= HOST_BYTES
        memo[id(buffer)] = buffer if data else torch.empty_like(buffer, device="meta")
    copied = copy.deepcopy(model, memo)
    copied.__dict__[ORIGIN] = ({name: str(p.device) for name, p in model.named_parameters()},
                               {name: str(b.device) for name, b in model.named_buffers()})
    return copied


ORIGIN = "_memzoo_origin_devices"
"""The attribute of a `without_weights` copy: (parameter devices, buffer devices) by name."""


def fake_copy(model: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """A copy of `model` whose parameters and buffers are fake twins of its own (same shapes,
    dtypes, devices, `requires_grad`); `model` is left as it was and no weight is copied. A
    `without_weights` copy's meta tensors get their twins on the devices they stand for (a model
    built on the meta device keeps them there)."""
    param_devices, buffer_devices = model.__dict__.get(ORIGIN, ({}, {}))

    def twin(tensor: torch.Tensor, device: str | None) -> torch.Tensor:
        if device is None or device == "meta" or not tensor.is_meta:
            return mode.from_tensor(tensor.detach())
        with mode:
            return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=device)

    memo: dict[int, Any] = {}
    for name, param in model.named_parameters():
        memo[id(param)] = nn.Parameter(twin(param, param_devices.get(name)), requires_grad=param.requires_grad)
    for name, buffer in model.named_buffers():
        memo[id(buffer)] = twin(buffer, buffer_devices.get(name))
    copied = copy.deepcopy(model, memo)
    copied.__dict__.pop(ORIGIN, None)
    return copied


def move_fake_states(model: nn.Module, device: torch.device) -> None:
    """Replace `model`'s parameters and buffers that are not on `device` (meta ones aside) by fake
    twins on it, in every module that holds them (a tied parameter stays one): what FSDP2 does
    when it wraps a model for a GPU. FSDP2's own move (`param.data = param.to(device)`) left the
    fake parameters on the CPU, and on the H200 it refused them ("Expects the parameter to already
    be moved to device cuda:0 but got cpu")."""
    moved: dict[int, torch.Tensor] = {}

    def twin(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in moved:
            on_device = tensor.detach().to(device)
            moved[id(tensor)] = (nn.Parameter(on_device, requires_grad=tensor.requires_grad)
                                 if isinstance(tensor, nn.Parameter) else on_device)
        return moved[id(tensor)]

    for module in model.modules():
        for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if not tensor.is_meta and tensor.device != device:
                setattr(module, name, twin(tensor))  # nn.Module's own assignment: a parameter or a buffer again


def _mesh_init_on_real_tensors(init):  # type: ignore[no-untyped-def]
    @functools.wraps(init)
    def wrapped(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with unset_fake_temporarily():
            init(self, *args, **kwargs)

    return wrapped


@contextmanager
def fake_process_group(world_size: int, rank: int) -> Iterator[None]:
    """Be `rank` of a `world_size`-rank job on torch's fake backend inside the context. Needs a
    process without a process group (the estimator runs in its own when the caller has one)."""
    if dist.is_initialized():
        raise RuntimeError("fake_process_group needs a process without a process group; this one has "
                           f"{dist.get_world_size()} ranks")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    original = DeviceMesh.__init__
    DeviceMesh.__init__ = _mesh_init_on_real_tensors(original)
    try:
        yield
    finally:
        DeviceMesh.__init__ = original
        dist.destroy_process_group()
        # DTensor's cached sharding decisions hold the meshes they were made on: a later fake job's
        # equal mesh (the same ranks seen from another rank) would get back one whose groups are gone.
        clear_dtensor_sharding_caches()
