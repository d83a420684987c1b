"""Dynamic axial parallelism (FastFold, Cheng et al. 2022) applied from a model's `ModelPlan.axial`.

An axial module's tensor inputs are split along dim 1 over the tensor-parallel group on entry (an
MSA by rows, a pair representation by its first residue) and its outputs gathered whole on exit;
inside, the model's `zoo.axial` annotations run the collectives of `AxialGroup`. Parameters stay
whole on every rank, each rank's gradient covers its shard, so the gradients are summed over the
group once a step (`trainers.parallel.tensor.PartialGradients`). The annotations are installed
again by each recompute block inside, so a block recomputed in backward runs the same collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainers.parallel import collectives as tpc
from trainers.strategy import LayoutRefused
from zoo import axial

SPLIT_DIM = 1
"""The dimension an axial module's inputs are split along (MSA rows, the pair's first residue)."""


def _all_to_all(x: torch.Tensor, source: int, target: int, group) -> torch.Tensor:
    """x split along `source` -> split along `target`: chunk r of `target` goes to rank r."""
    size = dist.get_world_size(group)
    sent = torch.stack(x.chunk(size, dim=target)).contiguous()
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)
    return torch.cat(received.unbind(0), dim=source)


class _Reshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, source, target, group):
        ctx.source, ctx.target, ctx.group = source, target, group
        return _all_to_all(x, source, target, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad.contiguous(), ctx.target, ctx.source, ctx.group), None, None, None


class AxialGroup:
    """`zoo.axial.AxialLayout` over one process group: the ranks hold equal parts, in rank order."""

    def __init__(self, group) -> None:
        self.group, self.size, self.rank = group, dist.get_world_size(group), dist.get_rank(group)

    def _check(self, x: torch.Tensor, dim: int, what: str) -> None:
        if x.shape[dim] % self.size:
            raise LayoutRefused(f"axial parallelism over tp={self.size} ranks {what} dim {dim} of a {tuple(x.shape)} "
                             f"tensor, which must be divisible by {self.size}")

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """All-gather forward; backward sums every rank's gradient of the whole and keeps this part."""
        return tpc.gather_parts(x, dim % x.ndim, self.group)

    def own_part(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        self._check(x, dim, "takes parts of")
        part = x.shape[dim] // self.size
        return x.narrow(dim, self.rank * part, part)

    def reshard(self, x: torch.Tensor, source: int, target: int) -> torch.Tensor:
        self._check(x, target, "splits")
        return _Reshard.apply(x, source % x.ndim, target % x.ndim, self.group)


def apply_axial_parallel(model: nn.Module, names: list[str], blocks: list[str], mesh: DeviceMesh) -> None:
    """Run the modules `names` of `model` with axial parallelism over the 1-D `mesh`; `blocks` are
    the plan's recompute units (those inside an axial module re-install the annotations). The
    modules' parameters, whole on every rank, get each rank's part of their gradient: the trainer
    sums them (`trainers.parallel.tensor.PartialGradients`)."""
    layout = AxialGroup(mesh.get_group())
    modules = dict(model.named_modules())
    for name in names:
        _hook_axial_module(modules[name], layout)
        for block in (b for b in blocks if b.startswith(name + ".")):
            _hook_scope(modules[block], layout)


def _hook_scope(module: nn.Module, layout: AxialGroup) -> None:
    """While `module` runs, the annotations use `layout`."""
    module.register_forward_pre_hook(lambda *_: axial.activate(layout))
    module.register_forward_hook(lambda *_: axial.deactivate(), always_call=True)


def _hook_axial_module(module: nn.Module, layout: AxialGroup) -> None:
    _hook_scope(module, layout)  # registered first: runs inside the split and gather below

    def split(value):
        if not isinstance(value, torch.Tensor):
            return value
        layout._check(value, SPLIT_DIM, f"splits the inputs of {type(module).__name__} along")
        return tpc.split_to_shards(value, SPLIT_DIM, layout.group)

    def before(_module, args, kwargs):
        return tuple(map(split, args)), {key: split(value) for key, value in kwargs.items()}

    def after(_module, args, kwargs, output):
        whole = lambda value: tpc.gather_whole(value, SPLIT_DIM, layout.group) if isinstance(value, torch.Tensor) else value  # noqa: E731
        return tuple(map(whole, output)) if isinstance(output, tuple) else whole(output)

    module.register_forward_pre_hook(before, with_kwargs=True, prepend=True)
    module.register_forward_hook(after, with_kwargs=True)
