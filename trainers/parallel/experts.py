"""Expert parallelism, and the experts' share of tensor parallelism, applied from a model's
`ModelPlan.experts` on the "ep" and "tp" mesh dimensions through torch's `parallelize_module`
(GShard's and DeepSpeed-MoE's layout, torchtitan's on a DeviceMesh; Megatron's expert tensor
parallelism).

Each routed-experts module (`zoo.nn.moe.RoutedExperts`: matrices stacked along dim 0 by expert)
keeps on rank r of an expert-parallel group of `ep` ranks the experts [r E/ep, (r + 1) E/ep), and
under tensor parallelism 1/tp of each expert's hidden width (`RoutedExperts.HIDDEN_DIMS`): its
parameters become DTensors sharded over "ep" and "tp" (FSDP2 then shards them further over "edp",
the data-parallel ranks that hold the same experts, and distributed checkpoints hold them whole).
Its forward becomes a dispatch around the module's own computation:

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
the experts: `zoo.nn.moe.even_counts`). Without expert parallelism the module computes on its
slices of the hidden width alone.

Under tensor parallelism the experts run inside their mixture-of-experts layer's region
(`trainers.parallel.styles.Region`), whose exit sums the ranks' shares of the output; the ranks of
an expert-parallel group share a tensor-parallel coordinate, so the rows they exchange are whole.

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
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from trainers.parallel.collectives import all_to_all, scaled_gradient
from trainers.parallel.mesh import local_tensor
from trainers.parallel.styles import eager
from zoo.plan import ModelPlan
from zoo.torch_compat import FakeTensor


class ExpertParallelForward:
    """The forward of a routed-experts module holding this rank's share of its `experts` over
    `group` (None: all of them; see the module docstring): (tokens (N, W), weights (A,), token_of
    (A,), counts (E,)) -> (N, W), as the module computes it whole (under tensor parallelism this
    rank's share of it)."""

    def __init__(self, module: nn.Module, experts: int, group: dist.ProcessGroup | None) -> None:
        self.module, self.experts, self.group = module, experts, group
        self.ranks = 1 if group is None else dist.get_world_size(group)

    def _matrices(self) -> dict[str, torch.Tensor]:
        """This rank's slices of the stacked matrices, their gradients scaled by 1/ep (module docstring)."""
        return {name: scaled_gradient(local_tensor(param), 1 / self.ranks) if self.ranks > 1 else local_tensor(param)
                for name, param in self.module.named_parameters(recurse=False)}

    @eager
    def __call__(self, tokens: torch.Tensor, weights: torch.Tensor, token_of: torch.Tensor,
                 counts: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return self.module.compute(tokens, weights, token_of, counts, **self._matrices())
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
        computed = self.module.compute(rows, row_weights[order], order, from_each.sum(0), **self._matrices())
        back = all_to_all(computed, receive, send, self.group)
        return torch.zeros_like(tokens).index_add(0, token_of, back)


class ExpertParallel(ParallelStyle):
    """A routed-experts module sharded over a mesh of dimensions "ep" (by expert; its size must
    divide the experts, which `apply_expert_parallel` checks) and/or "tp" (by hidden width); see
    the module docstring."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        dims = device_mesh.mesh_dim_names
        for name, param in list(module.named_parameters(recurse=False)):
            placements = [Shard(0) if dim == "ep" else Shard(module.HIDDEN_DIMS[name]) for dim in dims]
            sharded = distribute_tensor(param.detach(), device_mesh, placements, src_data_rank=None)
            module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        group = device_mesh["ep"].get_group() if "ep" in dims else None
        module.forward = ExpertParallelForward(module, module.experts, group)
        return module


def apply_expert_parallel(model: nn.Module, plan: ModelPlan, mesh: DeviceMesh) -> list[str]:
    """Shard the experts modules `plan` names over `mesh` (dimensions "ep" and/or "tp") in place;
    returns their names. ValueError when the plan names none under expert parallelism, or a module
    that is not routed experts, or one whose experts "ep" does not divide (a hidden width that "tp"
    does not divide is refused with the tensor-parallel plan: `trainers.parallel.tensor.check_plan`)."""
    names = plan.names(model, "experts")
    dims = mesh.mesh_dim_names
    if not names and "ep" in dims:
        raise ValueError(f"Strategy.ep={mesh['ep'].size()} shards routed experts, but {type(model).__name__} declares "
                         "none (ModelPlan.experts)")
    for name in names:
        module = model.get_submodule(name)
        if not all(hasattr(module, attribute) for attribute in ("compute", "experts", "HIDDEN_DIMS")):
            raise ValueError(f"ModelPlan.experts names {name!r}, a {type(module).__name__}; it must name routed-experts "
                             "modules (zoo.nn.moe.RoutedExperts: `experts`, `HIDDEN_DIMS` and `compute`)")
        if "ep" in dims and module.experts % mesh["ep"].size():
            raise ValueError(f"Strategy.ep={mesh['ep'].size()} must divide the experts of every ModelPlan.experts "
                             f"module; {name!r} has {module.experts}")
    parallelize_module(model, mesh, dict.fromkeys(names, ExpertParallel()))
    return names
