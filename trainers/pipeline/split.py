"""Cut a model into pipeline stages from its `ModelPlan.pipeline` and keep this rank's share.

`split_for_pipeline` runs first, before tensor parallelism, recompute and data parallelism: it
estimates each piece's cost on an example micro batch (`trainers.pipeline.balance`), cuts the blocks
into pp * stages_per_rank balanced stages, places stage s on pipeline rank s % pp, and prunes the
model to this rank's modules (a model built on the meta device never allocates the others).
`build_stages` then wraps the (by then parallelised) modules in `StageModule`s.

A model that runs its own forward (`PipelineSplit.through_forward`: transformers' decoders) keeps
its structure instead, the pieces of other stages replaced by stand-ins
(`trainers.pipeline.through_forward`); its pieces cannot run apart from that forward, so its stages
balance parameter counts (or follow `Strategy.pp_split`), one stage per rank.

Modules named by both `pre` and `post` (GPT's word embedding, also its output head), or holding the
same parameter (transformers' tied embedding and head), are held by the first and the last stage.
`TiedCopies` keeps the two copies equal, as Megatron's embedding group does: their gradients are summed between the two ranks before each step, and a model materialised
from the meta device takes the first stage's initial values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainers.parallel.mesh import DistEnv
from trainers.memory.recompute import clean_fqn
from trainers.parallel.mesh import local_tensor
from trainers.pipeline.balance import PieceCosts, balanced_split, estimate_costs
from trainers.pipeline.stage import StageModule, prune
from trainers.pipeline.through_forward import StageRun, ThroughForward, check_covered, stand_in
from trainers.strategy import LayoutRefused, Strategy
from zoo.plan import ModelPlan, PipelineSplit, resolve

PIPELINE_METHODS = ("pipeline_enter", "pipeline_block", "pipeline_exit")


@dataclass(frozen=True)
class PipelineLayout:
    """Which blocks each stage runs and which stages this rank holds."""

    ranges: list[range]
    """Block indices of each stage, in stage order."""
    block_names: list[str]
    """Every block's module name, in order (ModelPlan.blocks)."""
    pre: list[str]
    """Module names of `pipeline_enter` (first stage)."""
    post: list[str]
    """Module names of `pipeline_exit` (last stage)."""
    pp: int
    """Pipeline ranks."""
    pp_rank: int
    """This rank's pipeline coordinate."""
    costs: PieceCosts | None
    """The estimated costs the split balanced (None for a split given by Strategy.pp_split)."""
    tied: list[tuple[str, str]]
    """(name under the first stage's module, name under the last stage's) of each parameter both
    stages hold; the two names are one where a module is named in both `pre` and `post`."""
    attached: dict[str, list[str]]
    """Module names held with a block, by block name (PipelineSplit.attached)."""
    run: StageRun | None = None
    """The state shared by the stand-ins and the stages, when each stage runs the model's own
    forward (`PipelineSplit.through_forward`)."""

    @property
    def num_stages(self) -> int:
        return len(self.ranges)

    @property
    def local_stages(self) -> list[int]:
        """Indices of the stages on this rank, ascending."""
        return [s for s in range(self.num_stages) if s % self.pp == self.pp_rank]

    def stage_modules(self, stage: int) -> tuple[list[str], list[str]]:
        """(block names, held module names) of `stage`."""
        blocks = [self.block_names[i] for i in self.ranges[stage]]
        held = (self.pre if stage == 0 else []) + [name for block in blocks for name in self.attached.get(block, [])]
        return blocks, held + (self.post if stage == self.num_stages - 1 else [])


def check_pipeline_plan(model: nn.Module, plan: ModelPlan) -> PipelineSplit:
    """The model's `PipelineSplit`; `LayoutRefused` naming what is missing when it cannot be pipelined."""
    name = type(model).__name__
    if plan.pipeline is None:
        raise LayoutRefused(f"Strategy.pp > 1 needs split points, but {name} declares none: its parallel_plan() must "
                         "return a zoo.plan.ModelPlan with pipeline=PipelineSplit(pre=..., post=...) and blocks "
                         "(or its library ship a pipeline plan of one module list, as transformers' decoders do)")
    if not plan.blocks:
        raise LayoutRefused(f"Strategy.pp > 1 cuts the model's blocks into stages, but {name}'s ModelPlan.blocks is empty")
    if plan.pipeline.through_forward:
        return plan.pipeline
    missing = [m for m in PIPELINE_METHODS if not callable(getattr(model, m, None))]
    if missing:
        raise LayoutRefused(f"Strategy.pp > 1 runs {name} through {', '.join(PIPELINE_METHODS)}, but it lacks "
                         f"{', '.join(missing)} (see zoo.plan.PipelineSplit)")
    return plan.pipeline


def resolve_pieces(model: nn.Module, patterns: tuple[str, ...], field: str) -> tuple[list[str], list[str]]:
    """(module names, buffer names) that `patterns` of PipelineSplit.`field` name: module patterns
    (`zoo.plan.resolve`), or the names of buffers held directly by a module (feature statistics).
    ValueError naming the field for a parameter held outside a module of its own (a stage's data
    parallelism shards modules) and for a pattern that matches nothing."""
    buffers = dict(model.named_buffers())
    parameters = dict(model.named_parameters())
    module_patterns = tuple(p for p in patterns if p not in buffers)
    for pattern in module_patterns:
        if pattern in parameters:
            raise ValueError(f"PipelineSplit.{field} names the parameter {pattern!r}; name the module that holds it "
                             "(or put it in a module of its own), which a stage can hold and shard")
    modules = resolve(model, module_patterns, f"pipeline.{field}") if module_patterns else []
    return modules, [p for p in patterns if p in buffers]


def attached_modules(model: nn.Module, split: PipelineSplit, block_names: list[str]) -> dict[str, list[str]]:
    """PipelineSplit.attached resolved: module names by the block they go with; ValueError naming
    the field for a name that is not a module or not a block."""
    attached: dict[str, list[str]] = {}
    for module, block in split.attached:
        if block not in block_names:
            raise ValueError(f"PipelineSplit.attached pairs {module!r} with {block!r}, which is not one of the "
                             f"model's blocks (ModelPlan.blocks)")
        attached.setdefault(block, []).extend(resolve(model, (module,), "pipeline.attached"))
    return attached


def tied_parameters(model: nn.Module, pre: list[str], post: list[str]) -> list[tuple[str, str]]:
    """(name under `pre`, name under `post`) of each parameter both hold, in `pre`'s order."""
    held_after = {id(p): f"{name}.{leaf}" for name in post for leaf, p in model.get_submodule(name).named_parameters()}
    return [(f"{name}.{leaf}", held_after[id(p)]) for name in pre
            for leaf, p in model.get_submodule(name).named_parameters() if id(p) in held_after]


def agreed(costs: PieceCosts) -> PieceCosts:
    """The mean of every rank's `costs` (measured times differ), so that all ranks cut the same
    stages (collective)."""
    values = torch.tensor([costs.enter, *costs.blocks, costs.exit], dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.AVG)
    return PieceCosts(values[0].item(), values[1:-1].tolist(), values[-1].item())


def given_split(counts: tuple[int, ...], blocks: int) -> list[range]:
    """Block ranges of consecutive stages of `counts` blocks each (Strategy.pp_split); ValueError
    unless they cover the model's `blocks`."""
    if sum(counts) != blocks:
        raise ValueError(f"Strategy.pp_split={counts} covers {sum(counts)} blocks; the model has {blocks}")
    ends = [sum(counts[: i + 1]) for i in range(len(counts))]
    return [range(end - count, end) for end, count in zip(ends, counts)]


def split_for_pipeline(model: nn.Module, plan: ModelPlan, strategy: Strategy, env: DistEnv,
                       example_batch: Mapping[str, Any] | None, microbatches: int) -> PipelineLayout:
    """Cut `model` into strategy.pp * strategy.stages_per_rank stages and prune it to this rank's."""
    split = check_pipeline_plan(model, plan)
    block_names = plan.block_names(model)
    pre, pre_buffers = resolve_pieces(model, split.pre, "pre")
    post, post_buffers = resolve_pieces(model, split.post, "post")
    modules = model.get_submodule
    if split.through_forward:
        if strategy.stages_per_rank > 1:
            raise LayoutRefused(f"Strategy.stages_per_rank={strategy.stages_per_rank}: {type(model).__name__}'s stages "
                                "each run the model's whole forward, which would run this rank's other stages' blocks too; "
                                "use one stage per rank")
        check_covered(model, pre + block_names + post)
        example_batch = None  # its pieces run only inside its forward: balance parameter counts
    if strategy.pp_split is not None:
        costs, ranges = None, given_split(strategy.pp_split, len(block_names))
    else:
        costs = agreed(estimate_costs(model, [modules(n) for n in block_names], [modules(n) for n in pre],
                                      [modules(n) for n in post], example_batch, strategy.recompute != "none",
                                      microbatches))
        ranges = balanced_split(costs, strategy.pp * strategy.stages_per_rank)
    layout = PipelineLayout(
        ranges=ranges, block_names=block_names, pre=pre, post=post, pp=env.pp_size, pp_rank=env.pp_rank, costs=costs,
        tied=tied_parameters(model, pre, post), attached=attached_modules(model, split, block_names))
    keep: set[str] = set()
    for stage in layout.local_stages:
        blocks, held = layout.stage_modules(stage)
        keep.update(blocks, held)
    if split.through_forward:
        return replace(layout, run=stand_in(model, pre + block_names + post, keep))
    if 0 in layout.local_stages:
        keep.update(pre_buffers)
    if layout.num_stages - 1 in layout.local_stages:
        keep.update(post_buffers)
    prune(model, keep)
    for name in keep.intersection(pre_buffers + post_buffers):  # outside every stage's data parallelism
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        buffer = module.get_buffer(leaf)
        if not buffer.is_meta:
            setattr(module, leaf, buffer.to(env.device))
    return layout


def build_stages(model: nn.Module, layout: PipelineLayout) -> list[StageModule]:
    """This rank's `StageModule`s over the (parallelised) modules of the pruned `model`."""
    stages = []
    for stage in layout.local_stages:
        names, held = layout.stage_modules(stage)
        blocks = [model.get_submodule(n) for n in names]
        through = None if layout.run is None else ThroughForward(layout.run, stage, blocks[0], blocks[-1])
        stages.append(StageModule(model, stage, layout.num_stages, blocks, [model.get_submodule(n) for n in held], through))
    return stages


class TiedCopies:
    """The parameters held by both the first and the last stage, and the two-rank group (per
    data- and tensor-parallel coordinate) that keeps them equal."""

    def __init__(self, model: nn.Module, layout: PipelineLayout, env: DistEnv) -> None:
        self.group: dist.ProcessGroup | None = None
        ranks = env.mesh.mesh  # (pp, dp, tp) global ranks
        last = layout.num_stages - 1
        first_rank, last_rank = 0, last % layout.pp
        for dp in range(ranks.shape[1]):
            for tp in range(ranks.shape[2]):
                pair = [int(ranks[first_rank, dp, tp]), int(ranks[last_rank, dp, tp])]
                group = dist.new_group(pair) if layout.tied else None  # every rank joins every creation
                if env.rank in pair:
                    self.group = group
        holds = {clean_fqn(name): p for name, p in model.named_parameters()}
        self.params = [holds.get(first, holds.get(last)) for first, last in layout.tied if first in holds or last in holds]
        self.source = int(ranks[first_rank, env.mesh["dp"].get_local_rank(), env.mesh["tp"].get_local_rank()])
        self._counted_here = env.pp_rank == first_rank  # the first stage's copies count, once

    def counted(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """`params` without this rank's copies when the other rank's count for both (gradient
        norm, parameter count)."""
        if self._counted_here:
            return params
        copies = {id(p) for p in self.params}
        return [p for p in params if id(p) not in copies]

    @torch.no_grad()
    def sync_values(self) -> None:
        """Give the last stage's copies the first stage's values (after initialisation)."""
        for param in self.params:
            dist.broadcast(local_tensor(param), self.source, group=self.group)

    @torch.no_grad()
    def sum_gradients(self) -> None:
        """Sum the two copies' gradients, so both take the whole model's gradient (a copy its
        stage did not use counts as zero)."""
        for param in self.params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(local_tensor(param.grad), group=self.group)
