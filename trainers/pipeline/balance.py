"""Where to cut a model's blocks into pipeline stages: per-block costs and a balanced partition.

The cost of a piece of the model (the `pipeline_enter` modules, each block, the `pipeline_exit`
modules) comes from an example micro batch:
- measured, for a model on a real device: the piece's forward and backward time on the batch (the
  fastest of a few runs, each piece from its own detached input). Norms, softmax and a fused
  loss (which makes its gradients in forward) count as they run, which FLOPs times a training
  factor miss: on GPT with an 8k-word head that estimate weighs the head at 6 blocks where it
  trains like 4;
- estimated, for a model on the meta device or of fake tensors (the memory estimator's), or on request: its training FLOPs, counted by
  `trainers.estimate.counters.WorkCount` on meta or fake tensors (no memory allocated, nothing computed), plus the
  optimizer's work on its parameters. A 50k-word head costs what its matrix multiply costs, an
  embedding lookup almost nothing.
Without an example batch the cost is the parameter count. The stages are then the contiguous
split of the blocks that minimises the largest stage cost (Alpa's inter-operator dynamic program,
over one chain of blocks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from trainers.estimate.counters import WorkCount
from trainers.strategy import LayoutRefused
from zoo.torch_compat import DataDependentOutputException, DynamicOutputShapeException, FakeTensor, FakeTensorMode

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
                   example_batch: Mapping[str, Any] | None, recompute: bool, microbatches: int,
                   measure: bool | None = None) -> PieceCosts:
    """Costs of `model`'s pipeline pieces on `example_batch` (one micro batch): measured forward +
    backward seconds (`measure`, the default for a model on a real device; recompute counted as
    one more forward of each block), or FLOPs times the training factor plus optimizer work (the
    default on the meta device); without a batch, parameter counts. Measured costs differ from
    rank to rank: agree on them before splitting."""
    if example_batch is None:
        return PieceCosts(float(_parameter_count(pre)), [float(_parameter_count([b])) for b in blocks],
                          float(_parameter_count(post)))
    on_meta = any(p.is_meta for p in model.parameters())
    traced = any(isinstance(p, FakeTensor) for p in model.parameters())  # the memory estimator's fake model
    measure = not (on_meta or traced) if measure is None else measure
    block_factor = RECOMPUTE_FLOPS_PER_FORWARD if recompute else TRAINING_FLOPS_PER_FORWARD
    if measure:
        with torch.random.fork_rng():
            trained = _per_piece(model, blocks, example_batch, "real", _training_seconds)
            forward = _per_piece(model, blocks, example_batch, "real", _seconds) if recompute else None
        for param in model.parameters():
            param.grad = None
        extra = forward[1:-1] if forward is not None else [0.0] * len(blocks)
        return PieceCosts(trained[0], [t + f for t, f in zip(trained[1:-1], extra)], trained[-1])
    try:
        forward = _per_piece(model, blocks, example_batch, "meta" if on_meta else "ambient" if traced else "fake",
                             _flops)
    except (DynamicOutputShapeException, DataDependentOutputException):
        raise ValueError(f"{type(model).__name__}'s forward has data-dependent shapes, which FLOP counting on "
                         f"{'meta' if on_meta else 'fake'} tensors cannot run; measure the pieces on a real device "
                         "or split by parameter counts (no example batch)") from None
    optimizer = OPTIMIZER_FLOPS_PER_PARAMETER / microbatches
    return PieceCosts(
        enter=forward[0] * TRAINING_FLOPS_PER_FORWARD + optimizer * _parameter_count(pre),
        blocks=[f * block_factor + optimizer * _parameter_count([b]) for f, b in zip(forward[1:-1], blocks)],
        exit=forward[-1] * TRAINING_FLOPS_PER_FORWARD + optimizer * _parameter_count(post),
    )


MEASURED_RUNS = 3
"""Timed forwards of each piece (after one warm-up); the fastest counts."""


def _seconds(run: Callable[[], Any]) -> tuple[Any, float]:
    result, best = run(), float("inf")
    for _ in range(MEASURED_RUNS):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return result, best


def _training_seconds(run: Callable[[], Any]) -> tuple[Any, float]:
    """The fastest forward + backward of the piece `run` (gradients of ones for its outputs)."""

    def step() -> Any:
        output = run()
        outputs = [output] if isinstance(output, torch.Tensor) else [v for v in output.values() if v.requires_grad]
        torch.autograd.backward(outputs, [torch.ones_like(o) for o in outputs])
        return output

    with torch.enable_grad():
        return _seconds(step)


def _flops(run: Callable[[], Any]) -> tuple[Any, float]:
    with WorkCount() as counter:
        result = run()
    return result, float(counter.flops)


def _per_piece(model: nn.Module, blocks: list[nn.Module], batch: Mapping[str, Any], tensors: str,
               meter: Callable[[Callable[[], Any]], tuple[Any, float]]) -> list[float]:
    """[enter, block 0, ..., exit]: `meter` of each piece's forward (run without gradients unless
    the meter enables them) on `tensors` "real" (the batch on the model's device), "fake" or
    "meta" copies of the batch, or "ambient" (the batch as given, under the fake mode the
    model's fake parameters come from)."""
    fake = FakeTensorMode(allow_non_fake_inputs=True) if tensors == "fake" else None
    device = "meta" if tensors == "meta" else next(model.parameters()).device

    def place(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if tensors == "ambient":
            return value
        return fake.from_tensor(value) if fake is not None else value.to(device)

    inputs = {k: place(v) for k, v in batch.items()}
    values: list[float] = []

    def piece(run: Callable[[], Any]) -> Any:
        result, value = meter(run)
        values.append(value)
        if not isinstance(result, dict):
            return result
        # The next piece starts from its own leaves: its backward stops at its input.
        return {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in result.items()}

    with torch.no_grad(), fake if fake is not None else nullcontext():
        carry = piece(lambda: model.pipeline_enter(**inputs))
        for block in blocks:
            carry = piece(lambda: model.pipeline_block(block, carry))
        piece(lambda: model.pipeline_exit(carry, **inputs))
    return values


def balanced_split(costs: PieceCosts, num_stages: int) -> list[range]:
    """Block ranges of `num_stages` consecutive stages, each with at least one block, minimising
    the largest stage cost (the first stage also pays `costs.enter`, the last `costs.exit`)."""
    n = len(costs.blocks)
    if num_stages > n:
        raise LayoutRefused(f"Strategy.pp * Strategy.stages_per_rank = {num_stages} stages, more than the model's "
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
