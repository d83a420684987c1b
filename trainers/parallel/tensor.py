"""Tensor and sequence parallelism applied from a model's `ModelPlan` on the "tp" mesh dimension.

Split parameters become DTensors sharded over the "tp" mesh (so FSDP2 shards them further over
"dp", and distributed checkpoints hold them whole); parameters kept whole stay plain tensors. The
model's own code never sees a DTensor: hooks around each region hand its modules this rank's
local shards for the duration of a call and put the collectives at the region's edges
(`trainers.parallel.collectives`). The zoo's fused layers therefore run unchanged on shards: attention
reads its local head count from its projections' widths, the fused feed-forward gets its local fc1
rows and fc2 columns, and the fused linear + cross-entropy recognises a vocabulary-sharded weight.

Random draws (dropout) inside a region, and under sequence parallelism inside a block, come from a
stream of each rank's own (`_RankStream`); outside them every rank draws the same, as computation
there is replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from trainers.parallel import collectives as tpc
from trainers.parallel.axial import apply_axial_parallel
from trainers.parallel.parameter_swap import ParameterSwap
from trainers.strategy import LayoutRefused
from trainers.parallel.vocab import install_vocab_parallel_loss, vocab_first_row
from zoo.plan import ModelPlan

SEQUENCE_DIM = 1
"""Activations are (B, S, ...) everywhere a plan splits them along the sequence."""


def _shard_parameter(module: nn.Module, name: str, dim: int, mesh: DeviceMesh) -> None:
    param = getattr(module, name)
    if param is None:
        return
    # Every rank built the same whole tensor (same seed), so each keeps its slice: no communication.
    sharded = distribute_tensor(param.detach(), mesh, [Shard(dim)], src_data_rank=None)
    module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))


class _RankStream:
    """Gives each tensor-parallel rank its own random stream for one call: dropout on a shard
    (some heads, some feed-forward columns, some positions) must not repeat another rank's mask.

    On entry one seed is drawn from the shared generator (advancing it alike on every rank), and
    the generator is reseeded from it and the rank; on exit the shared state comes back. A recompute
    that replays the shared state replays the rank's draws too."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.saved: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def enter(self) -> None:
        seed = int(torch.randint(0, 1 << 62, ()))
        cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self.saved.append((torch.get_rng_state(), cuda))
        torch.manual_seed((seed + 1_000_003 * (self.rank + 1)) % (1 << 63))

    def leave(self) -> None:
        cpu, cuda = self.saved.pop()
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)


def _local(param: torch.Tensor | None) -> torch.Tensor | None:
    """The autograd-connected local shard of a DTensor parameter (a view of its storage)."""
    return param.to_local() if isinstance(param, DTensor) else param


@dataclass
class _Region:
    """One region's linears and how its edges behave."""

    colwise: list[nn.Linear]
    rowwise: list[nn.Linear]
    replicated: list[nn.Module]
    enter: bool
    """Whether the first argument enters from whole (or sequence-sharded) activations."""
    leave: bool
    """Whether the output is a partial sum to reduce (and the row-parallel bias added after)."""
    swaps: list[ParameterSwap] = field(default_factory=list)
    biases: list[torch.Tensor | None] = field(default_factory=list)
    inputs: list[tpc.GatheredInput | None] = field(default_factory=list)


def check_plan(model: nn.Module, plan: ModelPlan, tp: int, sequence_parallel: bool,
               whole: bool = True) -> dict[str, list[str]]:
    """Resolve the plan's names on `model` and check that `tp` divides every split dimension;
    returns {field: names}. ValueError naming the plan field or `Strategy.tp` otherwise. `whole`:
    False for a pipeline stage (checked whole before the split), which may hold no split layer and
    neither the start nor the end of the sequence-parallel part."""
    if whole and not plan.tensor_parallel:
        raise LayoutRefused(f"Strategy.tp={tp} needs a tensor-parallel plan, but {type(model).__name__} declares no "
                         "colwise, rowwise, vocab_parallel or axial modules (parallel_plan() returning zoo.plan.ModelPlan)")
    names = {name: plan.names(model, name) for name in ("colwise", "rowwise", "replicated", "regions", "vocab_parallel",
                                                         "axial", "sequence_parallel", "sequence_split", "sequence_gather")}
    if whole and sequence_parallel and not (names["sequence_split"] and names["sequence_gather"]):
        raise LayoutRefused(f"Strategy.sequence_parallel needs the plan of {type(model).__name__} to declare where "
                         "activations are split along the sequence and gathered again (ModelPlan.sequence_split "
                         "and sequence_gather); it declares none")
    modules = dict(model.named_modules())

    def divides(name: str, count: int, what: str) -> None:
        if count % tp:
            raise LayoutRefused(f"Strategy.tp={tp} must divide the {count} {what} of {name!r}")

    heads = plan.head_rows(model)
    for name in names["colwise"]:
        if name in heads:
            divides(name, modules[name].out_features // heads[name], "heads")
        divides(name, modules[name].out_features, "output features")
    for name in names["rowwise"]:
        divides(name, modules[name].in_features, "input features")
    for name in names["vocab_parallel"]:
        embedding = modules[name]
        if vocab_first_row(embedding.num_embeddings, tp, tp - 1) >= embedding.num_embeddings:
            raise LayoutRefused(f"Strategy.tp={tp} leaves a rank without rows of the {embedding.num_embeddings} "
                             f"vocabulary rows of {name!r}")
        if embedding.padding_idx is not None or embedding.max_norm is not None:
            raise ValueError(f"ModelPlan.vocab_parallel names {name!r}, an nn.Embedding with padding_idx or "
                             "max_norm, which a vocabulary split does not support")
    both = sorted((set(names["colwise"]) | set(names["rowwise"])) & set(names["replicated"]))
    if both:
        raise ValueError(f"ModelPlan.replicated names linears that colwise or rowwise split: {both}")
    inside: set[str] = set()
    for region in names["regions"]:
        members = _region_members(region, names)
        if len(members["rowwise"]) != 1:
            raise ValueError(f"ModelPlan.regions names {region!r}, which holds {len(members['rowwise'])} row-parallel "
                             f"linears {members['rowwise']}; a region holds exactly one, whose output is its own")
        inside.update(members["replicated"])
    outside = [name for name in names["replicated"] if name not in inside]
    if outside:
        raise ValueError(f"ModelPlan.replicated names {outside} outside every region; a replicated linear only "
                         "makes sense beside the split ones of a region")
    uncovered = _partial_gradients(model, plan, names, sequence_parallel, whole)
    if uncovered:
        raise ValueError(f"the plan of {type(model).__name__} leaves trainable parameters that would get a partial "
                         f"gradient under tensor parallelism, each rank's replica drifting from the others: "
                         f"{'; '.join(f'{where}: {found[:4]}' for where, found in uncovered.items())}; split their "
                         f"modules (ModelPlan.colwise, rowwise), or keep them whole on every rank with their gradients "
                         f"summed (ModelPlan.replicated inside a region, ModelPlan.sequence_parallel on sequence shards)")
    return names


def _partial_gradients(model: nn.Module, plan: ModelPlan, names: dict[str, list[str]], sequence_parallel: bool,
                       whole: bool) -> dict[str, list[str]]:
    """The trainable parameters no plan field covers where each rank computes on its own shard, by
    where they are: inside a region, those of no column-, row-parallel or replicated module of it;
    under sequence parallelism, those in a block (on sequence shards) outside every region and every
    split, `sequence_parallel` or axial module. Axial modules and vocabulary-parallel embeddings
    cover all of their parameters. (A pipeline stage's share, not `whole`, was checked whole.)"""
    if not whole:
        return {}
    split = set(names["colwise"]) | set(names["rowwise"]) | set(names["vocab_parallel"])
    axial = names["axial"]
    blocks = plan.block_names(model) if sequence_parallel else []
    within = lambda name, parents: any(name == p or name.startswith(p + ".") for p in parents)  # noqa: E731
    found: dict[str, list[str]] = {}
    for owner, module in model.named_modules():
        for local, param in module.named_parameters(recurse=False):
            if not param.requires_grad or owner in split or within(owner, axial):
                continue
            name = f"{owner}.{local}" if owner else local
            region = next((r for r in names["regions"] if within(owner, [r])), None)
            if region is not None:
                if owner not in _region_members(region, names)["replicated"]:
                    found.setdefault(f"region {region!r}", []).append(name)
            elif within(owner, blocks) and owner not in names["sequence_parallel"]:
                found.setdefault("sequence shards", []).append(name)
    return found


def _region_members(region: str, names: dict[str, list[str]]) -> dict[str, list[str]]:
    """The column-, row-parallel linears inside `region`, and its replicated modules (itself included)."""
    members = {kind: [n for n in names[kind] if n.startswith(region + ".")] for kind in ("colwise", "rowwise")}
    members["replicated"] = [n for n in names["replicated"] if n == region or n.startswith(region + ".")]
    return members


class TensorParallel:
    """Applies a plan's tensor-parallel part to one model; see the module docstring."""

    def __init__(self, model: nn.Module, plan: ModelPlan, mesh: DeviceMesh, sequence_parallel: bool,
                 whole: bool = True) -> None:
        self.model, self.plan, self.mesh, self.whole = model, plan, mesh, whole
        self.group, self.size = mesh.get_group(), mesh.size()
        self.sequence_parallel = sequence_parallel
        self.modules = dict(model.named_modules())
        self.stream = _RankStream(mesh.get_local_rank())

    # ------------------------------------------------------------------ apply
    def apply(self) -> None:
        """Shard the parameters and install the hooks (before recompute and FSDP wrap the model)."""
        names = check_plan(self.model, self.plan, self.size, self.sequence_parallel, self.whole)
        modules = self.modules
        for name in names["colwise"]:
            _shard_parameter(modules[name], "weight", 0, self.mesh)
            _shard_parameter(modules[name], "bias", 0, self.mesh)
        for name in names["rowwise"]:
            _shard_parameter(modules[name], "weight", 1, self.mesh)
        if names["vocab_parallel"]:
            install_vocab_parallel_loss()
        for name in names["vocab_parallel"]:
            _shard_parameter(modules[name], "weight", 0, self.mesh)
            self._hook_embedding(modules[name])

        inside: set[str] = set()
        for region in names["regions"]:
            members = _region_members(region, names)
            inside.update(*members.values())
            self._hook_region(modules[region], _Region(
                [modules[n] for n in members["colwise"]], [modules[n] for n in members["rowwise"]],
                [modules[n] for n in members["replicated"]], enter=True, leave=True))
        for name in names["colwise"]:
            if name not in inside:
                self._hook_region(modules[name], _Region([modules[name]], [], [], enter=True, leave=False))
        for name in names["rowwise"]:
            if name not in inside:
                self._hook_region(modules[name], _Region([], [modules[name]], [], enter=False, leave=True))

        if names["axial"]:
            apply_axial_parallel(self.model, names["axial"], self.plan.block_names(self.model), self.mesh)
        if self.sequence_parallel:
            for name in self.plan.block_names(self.model):  # blocks run on sequence shards
                self._hook_rank_stream(modules[name])
            for name in names["sequence_parallel"]:
                self._hook_sequence_parallel(modules[name])
            for name in names["sequence_split"]:
                modules[name].register_forward_hook(self._split_output)
            for name in names["sequence_gather"]:
                modules[name].register_forward_hook(self._gather_output)

    def _hook_region(self, module: nn.Module, region: _Region) -> None:
        def before(_module, args, kwargs):
            self.stream.enter()
            swap = ParameterSwap()
            for linear in region.colwise:
                swap.put(linear, "weight", _local(linear._parameters["weight"]))
                if linear.bias is not None:
                    swap.put(linear, "bias", _local(linear._parameters["bias"]))
            for replicated in region.replicated:  # their own parameters, whole on every rank
                for name, param in replicated.named_parameters(recurse=False):
                    swap.put(replicated, name, tpc.sum_gradient(param, self.group))
            bias = None
            for linear in region.rowwise:
                swap.put(linear, "weight", _local(linear._parameters["weight"]))
                bias = linear._parameters["bias"]
                swap.put(linear, "bias", None)
            region.swaps.append(swap)
            region.biases.append(bias)
            gathered = None
            if region.enter and self.sequence_parallel:
                gathered = tpc.GatheredInput(args[0], SEQUENCE_DIM, self.group)
                args = (gathered.full, *args[1:])
            elif region.enter:
                args = (tpc.copy_to_group(args[0], self.group), *args[1:])
            region.inputs.append(gathered)
            return args, kwargs

        def after(_module, args, kwargs, output):
            self.stream.leave()
            region.swaps.pop().restore()
            bias, gathered = region.biases.pop(), region.inputs.pop()
            if not region.leave:
                return output
            if self.sequence_parallel:
                output = tpc.scatter_sum(output, SEQUENCE_DIM, self.group,
                                         None if gathered is None or not torch.is_grad_enabled() else gathered.refill)
                if gathered is not None:
                    gathered.release()
            else:
                output = tpc.sum_over_group(output, self.group)
            if bias is None:
                return output
            if self.sequence_parallel:  # added to this rank's tokens only: its gradient is partial
                bias = tpc.sum_gradient(bias, self.group)
            return output + bias

        module.register_forward_pre_hook(before, with_kwargs=True)
        module.register_forward_hook(after, with_kwargs=True, always_call=True)

    def _hook_rank_stream(self, module: nn.Module) -> None:
        module.register_forward_pre_hook(lambda *_: self.stream.enter())
        module.register_forward_hook(lambda *_: self.stream.leave(), always_call=True)

    def _hook_embedding(self, embedding: nn.Embedding) -> None:
        first = vocab_first_row(embedding.num_embeddings, self.size, self.mesh.get_local_rank())
        rows = _local(embedding.weight).shape[0]
        state: list[tuple[ParameterSwap, torch.Tensor]] = []

        def before(_module, args):
            ids = args[0]
            outside = (ids < first) | (ids >= first + rows)
            swap = ParameterSwap()
            swap.put(embedding, "weight", _local(embedding._parameters["weight"]))
            state.append((swap, outside))
            return ((ids - first).masked_fill(outside, 0), *args[1:])

        def after(_module, args, output):
            swap, outside = state.pop()
            swap.restore()
            return tpc.sum_over_group(output.masked_fill(outside[..., None], 0.0), self.group)

        embedding.register_forward_pre_hook(before)
        embedding.register_forward_hook(after, always_call=True)

    def _hook_sequence_parallel(self, module: nn.Module) -> None:
        swaps: list[ParameterSwap] = []

        def before(_module, args):
            swap = ParameterSwap()
            for name, param in list(module._parameters.items()):
                if param is not None:
                    swap.put(module, name, tpc.sum_gradient(param, self.group))
            swaps.append(swap)

        def after(_module, args, output):
            swaps.pop().restore()

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after, always_call=True)

    def _split_output(self, module, args, output):
        length = output.shape[SEQUENCE_DIM]
        if length % self.size:
            raise ValueError(f"Strategy.sequence_parallel splits the sequence over tp={self.size} ranks; the "
                             f"sequence length must be divisible by it, got {length} (from {type(module).__name__})")
        return tpc.split_to_shards(output, SEQUENCE_DIM, self.group)

    def _gather_output(self, module, args, output):
        return tpc.gather_whole(output, SEQUENCE_DIM, self.group)


def apply_tensor_parallel(model: nn.Module, plan: ModelPlan, mesh: DeviceMesh, sequence_parallel: bool,
                          whole: bool = True) -> None:
    """Split `model` in place over the 1-D tensor-parallel `mesh` as `plan` declares (`whole`:
    False for a pipeline stage's share of the model, whose whole plan was checked before)."""
    TensorParallel(model, plan, mesh, sequence_parallel, whole).apply()
