"""Tensor and sequence parallelism applied from a model's `ModelPlan` on the "tp" mesh dimension,
through torch's `parallelize_module`.

Each module the plan names gets its parallel style: torch's `ColwiseParallel` and `RowwiseParallel`
for the linears outside every region (under sequence parallelism taking and giving sequence shards)
and for the vocabulary-parallel embeddings; `trainers.parallel.styles` for the regions and their
linears, a fused feed-forward's kernel (`zoo.nn.mlp` routes its DTensor weights to
`sharded_fused_mlp`), the blocks' random streams and the sequence's split and gather. Split
parameters become DTensors sharded over "tp" (so FSDP2 shards them further over "dp", and
distributed checkpoints hold them whole); the model's own code sees plain local activations.

Routed experts inside a region (`ModelPlan.experts`, a mixture of experts) split by hidden width
(`trainers.parallel.experts`, which also shards them by expert under expert parallelism).

A parameter kept whole on every rank but used on this rank's part of the work (`ModelPlan.replicated`,
`sequence_parallel` modules under sequence parallelism, axial modules) stays a plain tensor; its
gradient, each rank's part, is summed over the group once a step (`PartialGradients`).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from trainers.parallel.axial import apply_axial_parallel
from trainers.parallel.mesh import local_tensor
from trainers.parallel.styles import (SEQUENCE_DIM, OwnStream, RankStream, Region, RegionColwise, RegionRowwise,
                                      SequenceGather, SequenceSplit, SequenceSplitInput, sharded_fused_mlp)
from trainers.parallel.vocab import install_vocab_parallel_loss, vocab_first_row
from trainers.strategy import LayoutRefused
from zoo.nn.mlp import register_split_weight_mlp
from zoo.module_patterns import within
from zoo.plan import ModelPlan

log = logging.getLogger("trainers")

class PartialGradients:
    """Parameters whole on every tensor-parallel rank whose gradient each rank computes in part
    (see the module docstring): `sum()` adds their gradients up over the group after a step's
    backward passes, one all-reduce per dtype, as Megatron-LM does for its sequence-parallel norms.
    The parameters are looked up on their modules at each call (FSDP2 replaces them)."""

    def __init__(self, owners: list[tuple[nn.Module, str]], group: dist.ProcessGroup | None) -> None:
        self.owners, self.group = owners, group

    @torch.no_grad()
    def sum(self) -> None:
        """Sum the gradients over the group (collective; nothing without such parameters)."""
        grads = [local_tensor(param.grad) for module, name in self.owners
                 if (param := getattr(module, name)).grad is not None]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in grads:
            by_dtype.setdefault(grad.dtype, []).append(grad)
        for same in by_dtype.values():
            flat = torch.cat([grad.reshape(-1) for grad in same])
            dist.all_reduce(flat, group=self.group)
            for grad, piece in zip(same, flat.split([grad.numel() for grad in same])):
                grad.copy_(piece.view_as(grad))


def check_plan(model: nn.Module, plan: ModelPlan, tp: int, sequence_parallel: bool,
               whole: bool = True) -> dict[str, list[str]]:
    """Resolve the plan's names on `model` and check that `tp` divides every split dimension;
    returns {field: names}. ValueError naming the plan field or `Strategy.tp` otherwise. `whole`:
    False for a pipeline stage (checked whole before the split), which may hold no split layer and
    neither the start nor the end of the sequence-parallel part."""
    if plan.tensor_parallel_refusals:
        raise LayoutRefused(f"Strategy.tp={tp} cannot split {type(model).__name__}: "
                            + "; ".join(plan.tensor_parallel_refusals))
    if whole and not plan.tensor_parallel:
        raise LayoutRefused(f"Strategy.tp={tp} needs a tensor-parallel plan, but {type(model).__name__} declares no "
                            "colwise, rowwise, vocab_parallel or axial modules (parallel_plan() returning "
                            "zoo.plan.ModelPlan), nor does its library ship one (transformers' tp_plan)")
    names = {name: plan.names(model, name) for name in ("colwise", "rowwise", "colwise_gathered", "replicated", "regions",
                                                         "vocab_parallel", "axial", "sequence_parallel", "sequence_split",
                                                         "sequence_split_input", "sequence_gather", "experts")}
    if whole and sequence_parallel and not ((names["sequence_split"] or names["sequence_split_input"])
                                            and names["sequence_gather"]):
        raise LayoutRefused(f"Strategy.sequence_parallel needs the plan of {type(model).__name__} to declare where "
                         "activations are split along the sequence and gathered again (ModelPlan.sequence_split "
                         "and sequence_gather); it declares none")
    modules = dict(model.named_modules())

    def divides(name: str, count: int, what: str) -> None:
        if count % tp:
            raise LayoutRefused(f"Strategy.tp={tp} must divide the {count} {what} of {name!r}")

    _check_split_parameters(modules, names)
    heads = plan.head_rows(model)
    for name in names["colwise"] + names["colwise_gathered"]:
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
    both = sorted((set(names["colwise"]) | set(names["rowwise"]) | set(names["colwise_gathered"]))
                  & set(names["replicated"]))
    if both:
        raise ValueError(f"ModelPlan.replicated names linears that colwise or rowwise split: {both}")
    inside: set[str] = set()
    for region in names["regions"]:
        members = _region_members(region, names)
        if len(members["rowwise"]) != 1 and not (members["experts"] and len(members["rowwise"]) <= 1):
            raise ValueError(f"ModelPlan.regions names {region!r}, which holds {len(members['rowwise'])} row-parallel "
                             f"linears {members['rowwise']}; a region holds exactly one, whose output is its own (or "
                             f"routed experts, ModelPlan.experts, beside at most one)")
        inside.update(members["replicated"], members["experts"])
    for name in names["experts"]:
        if name not in inside:
            raise ValueError(f"ModelPlan.experts names {name!r}, outside every region; under tensor parallelism each "
                             "rank computes a share of the experts' output, which the region around them sums")
        divides(name, modules[name].hidden, "hidden width of the experts")
    uncovered = _partial_gradients(model, plan, names, sequence_parallel, whole)
    if uncovered:
        raise ValueError(f"the plan of {type(model).__name__} leaves trainable parameters that would get a partial "
                         f"gradient under tensor parallelism, each rank's replica drifting from the others: "
                         f"{'; '.join(f'{where}: {found[:4]}' for where, found in uncovered.items())}; split their "
                         f"modules (ModelPlan.colwise, rowwise), or keep them whole on every rank with their gradients "
                         f"summed (ModelPlan.replicated inside a region, ModelPlan.sequence_parallel on sequence shards)")
    return names


SPLIT_PARAMETERS = {"colwise": ("weight", "bias"), "rowwise": ("weight", "bias"),
                    "colwise_gathered": ("weight", "bias"), "vocab_parallel": ("weight",)}
"""The parameters each kind of split module splits; a module of that kind holding others is refused."""


def _check_split_parameters(modules: dict[str, nn.Module], names: dict[str, list[str]]) -> None:
    """ValueError naming any parameter of a split linear or embedding that its split does not cover
    (a subclass's extra gain): the split would leave it a plain tensor on shards of the rest."""
    for field, covered in SPLIT_PARAMETERS.items():
        for name in names[field]:
            extra = [local for local, _ in modules[name].named_parameters() if local not in covered]
            if extra:
                raise ValueError(f"ModelPlan.{field} names {name!r}, a {type(modules[name]).__name__} holding "
                                 f"parameters its split does not cover: {[f'{name}.{local}' for local in extra]} "
                                 f"(it splits only {', '.join(covered)}); move them to a module of their own")


def _partial_gradients(model: nn.Module, plan: ModelPlan, names: dict[str, list[str]], sequence_parallel: bool,
                       whole: bool) -> dict[str, list[str]]:
    """The trainable parameters no plan field covers where each rank computes on its own shard, by
    where they are: inside a region, those of no column-, row-parallel or replicated module of it;
    under sequence parallelism, those in a block (on sequence shards) outside every region and every
    split, `sequence_parallel` or axial module. Axial modules and vocabulary-parallel embeddings
    cover all of their parameters. (A pipeline stage's share, not `whole`, was checked whole.)"""
    if not whole:
        return {}
    split = (set(names["colwise"]) | set(names["rowwise"]) | set(names["colwise_gathered"]) | set(names["vocab_parallel"])
             | set(names["experts"]))
    axial = names["axial"]
    blocks = plan.block_names(model) if sequence_parallel else []
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
            elif within(owner, blocks) and owner not in names["sequence_parallel"] and owner not in names["replicated"]:
                found.setdefault("sequence shards", []).append(name)
    return found


def _region_members(region: str, names: dict[str, list[str]]) -> dict[str, list[str]]:
    """The column-, row-parallel linears and routed experts inside `region`, and its replicated
    modules (itself included)."""
    members = {kind: [n for n in names[kind] if n.startswith(region + ".")] for kind in ("colwise", "rowwise", "experts")}
    members["replicated"] = [n for n in names["replicated"] if within(n, [region])]
    return members


def _styles(model: nn.Module, plan: ModelPlan, names: dict[str, list[str]], sequence_parallel: bool,
            stream: RankStream) -> dict[str, list[ParallelStyle]]:
    """The parallel styles of each module the plan names, in the order they apply."""
    styles: dict[str, list[ParallelStyle]] = {}
    add = lambda name, style: styles.setdefault(name, []).append(style)  # noqa: E731
    inside: set[str] = set()
    for region in names["regions"]:
        members = _region_members(region, names)
        inside.update(members["colwise"], members["rowwise"])
        add(region, Region(sequence_parallel, stream))
        for name in members["colwise"]:
            add(name, RegionColwise())
        for name in members["rowwise"]:
            add(name, RegionRowwise())
    shards = Shard(SEQUENCE_DIM) if sequence_parallel else Replicate()
    for name in names["colwise"]:  # a region of its own, as the plan has it
        if name not in inside:
            add(name, ColwiseParallel(input_layouts=shards))
            add(name, OwnStream(stream))
    for name in names["rowwise"]:
        if name not in inside:
            add(name, RowwiseParallel(output_layouts=shards))
            add(name, OwnStream(stream))
    for name in names["colwise_gathered"]:  # a head after the sequence is gathered whole
        add(name, ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
    for name in names["vocab_parallel"]:
        add(name, RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
    if sequence_parallel:
        for name in plan.block_names(model):  # blocks run on sequence shards
            add(name, OwnStream(stream))
        for name in names["sequence_split"]:
            add(name, SequenceSplit())
        for name in names["sequence_split_input"]:
            add(name, SequenceSplitInput())
        for name in names["sequence_gather"]:
            add(name, SequenceGather())
    return styles


def _partial_gradient_owners(model: nn.Module, names: dict[str, list[str]],
                             sequence_parallel: bool) -> list[tuple[nn.Module, str]]:
    """(module, parameter name) of each trainable parameter whole on every rank whose gradient each
    rank computes in part: the replicated modules' own, under sequence parallelism the
    `sequence_parallel` modules' own, and every parameter of the axial modules."""
    modules = dict(model.named_modules())
    owners = [modules[name] for name in names["replicated"]]
    if sequence_parallel:
        owners += [modules[name] for name in names["sequence_parallel"]]
    owners += [inner for name in names["axial"] for inner in modules[name].modules()]
    found, seen = [], set()
    for module in owners:
        for local, param in module.named_parameters(recurse=False):
            if param.requires_grad and (id(module), local) not in seen:
                seen.add((id(module), local))
                found.append((module, local))
    return found


def apply_tensor_parallel(model: nn.Module, plan: ModelPlan, mesh: DeviceMesh, sequence_parallel: bool,
                          whole: bool = True) -> PartialGradients:
    """Split `model` in place over the 1-D tensor-parallel `mesh` as `plan` declares, through
    `parallelize_module` (`whole`: False for a pipeline stage's share of the model, whose whole plan
    was checked before). Returns the parameters whose gradients the trainer sums over the group
    after each step's backward passes."""
    names = check_plan(model, plan, mesh.size(), sequence_parallel, whole)
    if plan.kept_whole and dist.get_rank() == 0:
        log.info("tensor parallelism keeps whole on every rank what %s's plan splits: %s", type(model).__name__,
                 "; ".join(f"{pattern} ({why})" for pattern, why in plan.kept_whole))
    if names["vocab_parallel"]:
        install_vocab_parallel_loss()
    if names["regions"]:
        register_split_weight_mlp(DTensor, sharded_fused_mlp)
    stream = RankStream(mesh.get_local_rank())
    styles = _styles(model, plan, names, sequence_parallel, stream)
    for turn in range(max(map(len, styles.values()), default=0)):  # a module's styles apply in turn
        parallelize_module(model, mesh, {name: found[turn] for name, found in styles.items() if turn < len(found)})
    if names["axial"]:
        apply_axial_parallel(model, names["axial"], plan.block_names(model), mesh)
    return PartialGradients(_partial_gradient_owners(model, names, sequence_parallel), mesh.get_group())
