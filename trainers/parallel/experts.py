"""Expert parallelism applied from a model's `ModelPlan.experts` on the "ep" mesh dimension, through
torch's `parallelize_module` (GShard's and DeepSpeed-MoE's layout, torchtitan's on a DeviceMesh).

Each routed-experts module (`zoo.nn.moe.RoutedExperts`: matrices stacked along dim 0 by expert)
keeps on rank r of an expert-parallel group of `ep` ranks the experts [r E/ep, (r + 1) E/ep): its
parameters become DTensors sharded along dim 0 over "ep" (FSDP2 then shards them further over
"edp", the data-parallel ranks that hold the same experts, and distributed checkpoints hold them
whole). Its forward becomes a dispatch around the module's own computation:

1. the assignments, sorted by expert, are already in runs by destination rank: the per-expert
   counts go to every rank (an all-to-all of E integers, read on the host once), then each
   assignment's token row and router weight, in uneven splits (`collectives.all_to_all`);
2. the rows that arrived, in runs by source rank, are ordered by local expert and computed with this
   rank's slices of the matrices (`RoutedExperts.compute`), each row weighted by its router weight;
3. the weighted rows go back the way they came, and each token sums its assignments.

Backward runs the two all-to-alls reversed. Per step the rows travel tokens x top_k x width x
2 directions x 2 passes bytes over the group (beside the weights' and the counts' few bytes).
No token is dropped: a rank computes however many rows its experts receive. The memory
estimator's trace, whose tensors hold no values, takes every rank's load as this one's (even over
the experts: `zoo.nn.moe.even_counts`).

A rank's experts compute on the tokens of the `ep` data-parallel ranks of its group, so their
gradient sums those ranks' losses' gradients: it is scaled by 1/ep on its way to the parameters,
and FSDP2's mean over "edp" then makes it the mean over every data-parallel rank, as the other
parameters' gradients are. (FSDP2's own `set_gradient_divide_factor` cannot serve: torch 2.13
divides twice over a group of one rank, edp = 1.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from trainers.parallel.collectives import all_to_all
from trainers.parallel.mesh import local_tensor
from trainers.parallel.styles import eager, shard_parameter
from zoo.plan import ModelPlan
from zoo.torch_compat import FakeTensor


class _ScaledGradient(torch.autograd.Function):
    """x forward; the gradient times `factor` backward."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class ExpertParallelForward:
    """The forward of a routed-experts module holding this rank's share of its `experts` over
    `group` (see the module docstring): (tokens (N, W), weights (A,), token_of (A,), counts (E,))
    -> (N, W), as the module computes it whole."""

    def __init__(self, module: nn.Module, experts: int, group: dist.ProcessGroup) -> None:
        self.module, self.experts, self.group = module, experts, group
        self.ranks = dist.get_world_size(group)

    @eager
    def __call__(self, tokens: torch.Tensor, weights: torch.Tensor, token_of: torch.Tensor,
                 counts: torch.Tensor) -> torch.Tensor:
        ranks, local = self.ranks, self.experts // self.ranks
        with torch.no_grad():
            to_each = counts.view(ranks, local).contiguous()
            from_each = torch.empty_like(to_each)  # [source rank, local expert]: rows arriving
            dist.all_to_all_single(from_each, to_each, group=self.group)
            if isinstance(counts, FakeTensor) or isinstance(tokens, FakeTensor):
                from_each.copy_(to_each)  # the estimator's trace moves no values: every rank routes as this one
            send, receive = torch.stack([to_each.sum(1), from_each.sum(1)]).tolist()
            expert_of_row = torch.arange(local, device=counts.device).repeat(ranks).repeat_interleave(
                from_each.reshape(-1))
            order = expert_of_row.argsort(stable=True)
        rows = all_to_all(tokens[token_of], send, receive, self.group)
        row_weights = all_to_all(weights, send, receive, self.group)
        matrices = {name: _ScaledGradient.apply(local_tensor(param), 1 / ranks)  # see the module docstring
                    for name, param in self.module.named_parameters(recurse=False)}
        computed = self.module.compute(rows, row_weights[order], order, from_each.sum(0), **matrices)
        back = all_to_all(computed, receive, send, self.group)
        return torch.zeros_like(tokens).index_add(0, token_of, back)


class ExpertParallel(ParallelStyle):
    """A routed-experts module sharded by expert over a one-dimensional mesh (see the module
    docstring); ValueError when the mesh's size does not divide its experts."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        experts, ranks = module.experts, device_mesh.size()
        if experts % ranks:
            raise ValueError(f"Strategy.ep={ranks} must divide the experts of {type(module).__name__}; it has {experts}")
        for name, _ in list(module.named_parameters(recurse=False)):
            shard_parameter(module, name, Shard(0), device_mesh)
        module.forward = ExpertParallelForward(module, experts, device_mesh.get_group())
        return module


def apply_expert_parallel(model: nn.Module, plan: ModelPlan, mesh: DeviceMesh) -> list[str]:
    """Shard the experts modules `plan` names over `mesh` (the "ep" dimension) in place; returns
    their names. ValueError when the plan names none or a module is not routed experts."""
    names = plan.names(model, "experts")
    if not names:
        raise ValueError(f"Strategy.ep={mesh.size()} shards routed experts, but {type(model).__name__} declares none "
                         "(ModelPlan.experts)")
    for name in names:
        module = model.get_submodule(name)
        if not (hasattr(module, "compute") and hasattr(module, "experts")):
            raise ValueError(f"ModelPlan.experts names {name!r}, a {type(module).__name__}; it must name routed-experts "
                             "modules (zoo.nn.moe.RoutedExperts: `experts` and `compute`)")
        if module.experts % mesh.size():
            raise ValueError(f"Strategy.ep={mesh.size()} must divide the experts of every ModelPlan.experts module; "
                             f"{name!r} has {module.experts}")
    parallelize_module(model, mesh, dict.fromkeys(names, ExpertParallel()))
    return names
