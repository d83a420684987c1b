"""The global gradient norm and clipping over parameters split in different ways.

Gradients may be plain tensors (whole on every rank), DTensors sharded over "dp" (ZeRO 2-3), over
"tp" (tensor-parallel layers), or over both. Each rank squares and sums its local pieces, grouped
by the mesh dimensions they are sharded over; one all-reduce per group over exactly those
dimensions counts every element once (replicated copies are never added twice).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainers.parallel.mesh import local_tensor


def _sharded_groups(grad: torch.Tensor) -> tuple:
    """The process groups of the mesh dimensions `grad` is sharded over (empty when whole)."""
    if not isinstance(grad, DTensor):
        return ()
    mesh = grad.device_mesh
    # Not `is_shard()`: FSDP2 under tensor parallelism shards along "dp" with a _StridedShard,
    # which that test does not count.
    return tuple(mesh.get_group(dim) for dim, placement in enumerate(grad.placements) if not placement.is_replicate())


def total_norm(grads: list[torch.Tensor], across: dist.ProcessGroup | None = None) -> float:
    """The 2-norm of all of `grads` together, as if each were one whole tensor (collective; one
    host sync). `across`: ranks holding other parameters (pipeline ranks), whose `grads` are
    added in."""
    by_groups: dict[tuple, list[torch.Tensor]] = {}
    for grad in grads:
        by_groups.setdefault(_sharded_groups(grad), []).append(local_tensor(grad))
    squares = []
    for groups, locals_ in by_groups.items():
        value = torch.stack(torch._foreach_norm(locals_, 2.0)).double().pow(2).sum()
        for group in groups:
            dist.all_reduce(value, group=group)
        squares.append(value)
    total = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)
    if across is not None:
        total = total.to(grads[0].device if grads else "cpu")
        dist.all_reduce(total, group=across)
    return math.sqrt(total.item())


def clip_factor(norm: float, clip: float) -> float:
    """What gradients of global norm `norm` are multiplied by to clip them to `clip` (0: no clipping)."""
    return clip / (norm + 1e-6) if 0 < clip < norm else 1.0


@torch.no_grad()
def scale_gradients(grads: list[torch.Tensor], factor: float) -> None:
    """Multiply every gradient in place by `factor` (their local pieces)."""
    if factor != 1.0:
        torch._foreach_mul_([local_tensor(g) for g in grads], factor)
