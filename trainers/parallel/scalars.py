"""Scalar (0-dim) parameters beside FSDP2, which refuses them: `fully_shard` and `replicate` raise
"doesn't support scalar parameters" for one (a learned temperature or gain), so that a model holding
one could not train under any ZeRO stage (tests/trainers/test_training.py shows the refusal).

Such a parameter stays whole on every rank, outside FSDP's units (their `ignored_params`), and its
gradient is averaged over the data-parallel ranks as each backward computes it (a gradient hook:
one all-reduce of one element per backward), so every rank takes the same update. Under a compute
dtype it stays float32: a 0-dim tensor does not promote the dtype of the tensors it meets in
floating-point arithmetic, so the activations keep the compute dtype.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def scalar_parameters(module: nn.Module) -> set[nn.Parameter]:
    """The trainable 0-dim parameters of `module` and its children."""
    return {param for param in module.parameters() if param.ndim == 0 and param.requires_grad}


def average_scalar_gradients(module: nn.Module, group: dist.ProcessGroup) -> set[nn.Parameter]:
    """Average each backward's gradient of `module`'s scalar parameters over `group` (every rank
    runs the same backwards, so the all-reduces meet); returns them, for FSDP to leave alone."""
    scalars = scalar_parameters(module)
    if dist.get_world_size(group) > 1:
        for param in scalars:
            param.register_hook(lambda grad: _averaged(grad, group))
    return scalars


def _averaged(grad: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    averaged = grad.clone()
    dist.all_reduce(averaged, op=dist.ReduceOp.AVG, group=group)
    return averaged
