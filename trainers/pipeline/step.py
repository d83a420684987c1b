"""A training step's forward and backward through a pipeline: the runtime built for this rank's
stages, and the step's micro batches run through it in runs of `Strategy.microbatches`.

The trainer and the memory estimator (`trainers.estimate.trace`) both step through these, the
estimator with a link whose received carries are fake (`trainers.estimate.fake_pipeline`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainers.parallel.mesh import DistEnv
from trainers.pipeline.comm import PipelineLink
from trainers.pipeline.runtime import GeneratorState, Pipeline
from trainers.pipeline.schedules import schedule_orders
from trainers.pipeline.sharding import StageSharding
from trainers.strategy import Strategy

if TYPE_CHECKING:
    from trainers.parallelize import PipelineParts


def build_pipeline(parts: PipelineParts, strategy: Strategy, env: DistEnv, microbatches: int,
                   link: PipelineLink | None = None) -> Pipeline:
    """This rank's `Pipeline` for `strategy`'s schedule over runs of `microbatches`; `link`
    default: point-to-point over the mesh's "pp" group."""
    link = link or PipelineLink(env.mesh["pp"].get_group(), parts.layout.num_stages, env.device)
    orders = schedule_orders(strategy.pp_schedule, strategy.pp, strategy.stages_per_rank, microbatches)
    return Pipeline(parts.stages, orders, env.pp_rank, strategy.pp, link,
                    StageSharding(orders[env.pp_rank], strategy.zero, strategy.pp_schedule))


def pipeline_passes(pipeline: Pipeline, parts: PipelineParts, batches: Iterable[Mapping[str, Any]], count: int,
                    microbatches: int, scale: float, device: torch.device) -> tuple[torch.Tensor, int]:
    """Forward and backward of the step's `count` micro batches through the pipeline, in runs of
    `microbatches`, each loss times `scale / count`; returns the sum of their losses (on every
    rank) and the input_ids they held. `batches` (on `device`) are taken one run at a time, each
    right after it was collated: its first stage starts from the generator state then."""
    batches = iter(batches)
    runs = count // microbatches
    losses: list[torch.Tensor] = []
    units = 0
    for run in range(runs):
        collated, generators = [], []
        for batch in itertools.islice(batches, microbatches):
            collated.append(batch)
            generators.append(GeneratorState.capture(device))
        losses += pipeline.train(collated, generators, scale / count, last_run=run == runs - 1)
        units += sum(b["input_ids"].numel() for b in collated if isinstance(b.get("input_ids"), torch.Tensor))
    loss_sum = torch.stack(losses).float().sum() if losses else torch.zeros((), device=device)
    pipeline.from_last_stage(loss_sum)
    parts.tied.sum_gradients()
    return loss_sum, units


def pipeline_parameter_count(parts: PipelineParts, params: list[torch.Tensor], env: DistEnv) -> int:
    """Elements of the trainable `params` of every stage of the pipeline, a tied pair's copies
    counted once (collective over the "pp" group)."""
    count = torch.tensor(sum(p.numel() for p in parts.tied.counted(params)))
    dist.all_reduce(count, group=env.mesh["pp"].get_group())
    return int(count)
