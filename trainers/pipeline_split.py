"""Where to cut a model's blocks into pipeline stages: per-block costs and a balanced partition.

The cost of a piece of the model (the `pipeline_enter` modules, each block, the `pipeline_exit`
modules) is its training FLOPs on an example micro batch, counted by `FlopCounterMode` on fake
tensors (no memory is allocated and nothing is computed; a model whose forward has
data-dependent shapes, such as BERT's selection of masked positions, runs one real forward
without gradients instead), plus the optimizer's work on its parameters. A 50k-word head costs what its matrix multiply costs, an embedding lookup almost
nothing. Without an example batch the cost is the parameter count. The stages are then the
contiguous split of the blocks that minimises the largest stage cost (Alpa's inter-operator
dynamic program, over one chain of blocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

TRAINING_FLOPS_PER_FORWARD = 3.0
"""A training step's FLOPs over the forward's: the backward computes input and weight gradients."""
RECOMPUTE_FLOPS_PER_FORWARD = 4.0
"""The same for a recomputed block, whose forward runs twice."""
OPTIMIZER_FLOPS_PER_PARAMETER = 12.0
"""AdamW's element-wise work per parameter and step, spread over the step's micro batches."""


@dataclass(frozen=True)
class PieceCosts:
    """Estimated cost of each piece of a model's training step, per micro batch (FLOPs)."""

    enter: float
    """The `pipeline_enter` modules (first stage)."""
    blocks: list[float]
    """Each block, in order."""
    exit: float
    """The `pipeline_exit` modules (last stage)."""


def _parameter_count(modules: list[nn.Module]) -> int:
    seen = {id(p): p.numel() for module in modules for p in module.parameters()}
    return sum(seen.values())


def estimate_costs(model: nn.Module, blocks: list[nn.Module], pre: list[nn.Module], post: list[nn.Module],
                   example_batch: Mapping[str, Any] | None, recompute: bool, microbatches: int) -> PieceCosts:
    """Costs of `model`'s pipeline pieces. With `example_batch` (one micro batch), FLOPs of its
    forward on fake copies of the batch times the training factor, plus optimizer work; without,
    parameter counts."""
    optimizer = OPTIMIZER_FLOPS_PER_PARAMETER / microbatches
    if example_batch is None:
        return PieceCosts(float(_parameter_count(pre)), [float(_parameter_count([b])) for b in blocks],
                          float(_parameter_count(post)))
    on_meta = any(p.is_meta for p in model.parameters())
    try:
        forward = _forward_flops(model, blocks, example_batch, on_meta, fake=not on_meta)
    except (DynamicOutputShapeException, DataDependentOutputException):
        if on_meta:
            raise ValueError(f"{type(model).__name__}'s forward has data-dependent shapes, which the meta device "
                             "cannot run; estimate the pipeline split without example_batch (by parameter counts) "
                             "or build the model on a real device") from None
        with torch.random.fork_rng():
            forward = _forward_flops(model, blocks, example_batch, on_meta, fake=False)
    block_factor = RECOMPUTE_FLOPS_PER_FORWARD if recompute else TRAINING_FLOPS_PER_FORWARD
    return PieceCosts(
        enter=forward[0] * TRAINING_FLOPS_PER_FORWARD + optimizer * _parameter_count(pre),
        blocks=[f * block_factor + optimizer * _parameter_count([b]) for f, b in zip(forward[1:-1], blocks)],
        exit=forward[-1] * TRAINING_FLOPS_PER_FORWARD + optimizer * _parameter_count(post),
    )


def _forward_flops(model: nn.Module, blocks: list[nn.Module], batch: Mapping[str, Any], on_meta: bool,
                   fake: bool) -> list[float]:
    """[enter, block 0, ..., exit] forward FLOPs on meta tensors (a meta model), fake ones, or
    the real batch."""
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext()
    device = "meta" if on_meta else next(model.parameters()).device
    inputs = {k: (mode.from_tensor(v) if fake else v.to(device)) if isinstance(v, torch.Tensor) else v
              for k, v in batch.items()}
    flops = []

    def count(run):
        counter = FlopCounterMode(display=False)
        with counter:
            result = run()
        flops.append(float(counter.get_total_flops()))
        return result

    with torch.no_grad(), mode:
        carry = count(lambda: model.pipeline_enter(**inputs))
        for block in blocks:
            carry = count(lambda: model.pipeline_block(block, carry))
        count(lambda: model.pipeline_exit(carry, **inputs))
    return flops


def balanced_split(costs: PieceCosts, num_stages: int) -> list[range]:
    """Block ranges of `num_stages` consecutive stages, each with at least one block, minimising
    the largest stage cost (the first stage also pays `costs.enter`, the last `costs.exit`)."""
    n = len(costs.blocks)
    if num_stages > n:
        raise ValueError(f"Strategy.pp * Strategy.stages_per_rank = {num_stages} stages, more than the model's "
                         f"{n} blocks; each stage needs at least one block")
    prefix = [0.0]
    for cost in costs.blocks:
        prefix.append(prefix[-1] + cost)

    def stage_cost(stage: int, start: int, end: int) -> float:
        extra = (costs.enter if stage == 0 else 0.0) + (costs.exit if stage == num_stages - 1 else 0.0)
        return prefix[end] - prefix[start] + extra

    inf = float("inf")
    # best[s][e]: the smallest achievable largest cost of stages 0..s-1 covering blocks 0..e-1.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for end in range(s, n - (num_stages - s) + 1):
            for start in range(s - 1, end):
                value = max(best[s - 1][start], stage_cost(s - 1, start, end))
                if value < best[s][end]:
                    best[s][end], cut[s][end] = value, start
    ranges, end = [], n
    for s in range(num_stages, 0, -1):
        start = cut[s][end]
        ranges.append(range(start, end))
        end = start
    return ranges[::-1]


def stage_costs(costs: PieceCosts, ranges: list[range]) -> list[float]:
    """Estimated cost of each stage of a split."""
    last = len(ranges) - 1
    return [sum(costs.blocks[i] for i in r) + (costs.enter if s == 0 else 0.0) + (costs.exit if s == last else 0.0)
            for s, r in enumerate(ranges)]
