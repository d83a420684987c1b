"""Will it fit: the per-rank memory of a training step, estimated without allocating it.

`estimate_memory` runs the trainer's own code for one rank of the job (the strategy applied by
`trainers.parallelize`, the optimizer of `trainers.optim`, the forward and backward of the
step's micro batches, the optimizer step) on fake tensors in a fake process group
(`trainers.fake_trace`), under the same tracker that measures real steps
(`trainers.memory.StepMemoryProbe`). So the estimate covers everything a real step holds at its
peak: parameters, gradients, optimizer state, activations, backward temporaries, gathered ZeRO-3
parameters, reduction buffers, for any model, ZeRO stage, offload, recompute, precision and
tensor-parallel degree. It runs in a fresh process, so the caller's own process group, if any, is
untouched.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.memory import RankMemory, StepMemoryProbe
from trainers.strategy import Strategy

ModelOrBuilder = nn.Module | Callable[[], nn.Module]

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer", "activations", "temporaries", "other")
"""What a rank holds, as the tracker files it: activations are made in forward, temporaries in
backward (gathered ZeRO-3 parameters and gradient buckets among them)."""


@dataclass
class MemoryEstimate:
    """The estimated training-step memory of each traced rank of a job."""

    strategy: Strategy
    world_size: int
    ranks: list[RankMemory]
    """One per traced rank: `peak` is the step's peak of tensor bytes on the rank, `by_device`
    its composition at that moment, by device and category."""
    seconds: float = 0.0
    """Wall time of the estimate, process start included."""
    accumulation: int = 1
    """Micro batches per optimizer step on each data-parallel rank."""

    @property
    def peak(self) -> int:
        """The largest peak among the ranks (bytes): what each device must hold."""
        return max(rank.peak for rank in self.ranks)

    def at_peak(self, rank: int = 0) -> dict[str, int]:
        """Bytes per category, all devices together, at the peak of `rank` (its index in `ranks`)."""
        totals = dict.fromkeys(CATEGORIES, 0)
        for stats in self.ranks[rank].by_device.values():
            for category, nbytes in stats.items():
                if category in totals:
                    totals[category] += nbytes
        return totals


@dataclass(frozen=True)
class _Job:
    model_or_builder: ModelOrBuilder
    example_batch: Mapping[str, Any]
    strategy: Strategy
    world_size: int
    config: TrainConfig
    ranks: list[int] = field(default_factory=list)


def estimate_memory(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any], strategy: Strategy | None = None,
                    world_size: int = 1, config: TrainConfig | None = None) -> MemoryEstimate:
    """Per-rank peak memory of one training step of the model under `strategy` on `world_size`
    ranks, and its breakdown, without allocating the model or its activations.

    model_or_builder: an `nn.Module` (it is sent to the estimating process: for a model too large
        to build here, pass a builder instead), or a picklable callable returning one (a class with
        its config in a `functools.partial`, a module-level function), called on fake tensors.
    example_batch: one micro batch, as the model's forward takes it (`model(**batch)["loss"]`).
    config: the step's batch sizes (`global_batch_size` over `micro_batch_size` times the
        data-parallel ranks gives the micro batches per step) and AdamW's settings; default: one
        micro batch of the example's size per rank.

    Call it from a script's `if __name__ == "__main__":` block: it starts a fresh Python process.
    """
    strategy = Strategy() if strategy is None else strategy
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a trainers.Strategy; got {type(strategy).__name__}")
    if not isinstance(model_or_builder, nn.Module) and not callable(model_or_builder):
        raise TypeError(f"model_or_builder must be a torch.nn.Module or a callable returning one; "
                        f"got {type(model_or_builder).__name__}")
    if not isinstance(example_batch, Mapping) or not example_batch:
        raise TypeError(f"example_batch must be a non-empty mapping of the model's inputs; got {example_batch!r:.80}")
    degree = strategy.tp * strategy.pp
    if not isinstance(world_size, int) or world_size < 1 or world_size % degree:
        raise ValueError(f"world_size must be a positive multiple of Strategy.tp x Strategy.pp = {degree}; "
                         f"got {world_size!r}")
    if strategy.pp > 1:
        raise NotImplementedError("estimate_memory does not trace pipeline-parallel steps yet (Strategy.pp > 1)")
    micro = _batch_size(example_batch)
    dp = world_size // degree
    config = config or TrainConfig(global_batch_size=micro * dp, micro_batch_size=micro)
    job = _Job(model_or_builder, example_batch, strategy, world_size, config, ranks=[0])
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        ranks = pool.apply(_trace, (job,))
    accumulation = config.global_batch_size // (config.micro_batch_size * dp)
    return MemoryEstimate(strategy, world_size, ranks, time.perf_counter() - started, accumulation)


def _batch_size(batch: Mapping[str, Any]) -> int:
    sizes = {value.shape[0] for value in batch.values() if isinstance(value, torch.Tensor) and value.ndim}
    if len(sizes) != 1:
        raise ValueError(f"example_batch's tensors must share their first (batch) dimension; got sizes {sorted(sizes)}")
    return sizes.pop()


def _trace(job: _Job) -> list[RankMemory]:
    """In the estimating process: each rank of `job.ranks` traced in its own fake job."""
    return [_trace_rank(job, rank) for rank in job.ranks]


def _trace_rank(job: _Job, rank: int) -> RankMemory:
    # Imported here: the estimating process needs them, the caller's does not.
    from trainers.data import check_batch_sizes
    from trainers.distributed import setup_distributed
    from trainers.fake_trace import HostFakeMode, fake_copy, fake_process_group
    from trainers.optim import TrainOptimizer
    from trainers.parallelize import parallelize
    from trainers.trainer import accumulate_gradients

    strategy, config = job.strategy, job.config
    with fake_process_group(job.world_size, rank):
        env = setup_distributed(strategy.tp, strategy.pp)
        check_batch_sizes(config.global_batch_size, config.micro_batch_size, env.dp_size)
        accumulation = config.global_batch_size // (config.micro_batch_size * env.dp_size)
        mode = HostFakeMode()
        with mode:
            if isinstance(job.model_or_builder, nn.Module):
                model = fake_copy(job.model_or_builder, mode)
            else:
                model = job.model_or_builder()
            model_class = type(model).__name__
            model, _ = parallelize(model, strategy, env)
            optimizer = TrainOptimizer(model, config, shard_state=strategy.zero == 1,
                                       offload=strategy.offload == "optimizer", group=env.mesh["dp"].get_group())
            # The pattern of a step repeats from its second micro batch (gradients already held).
            traced = min(accumulation, 2)

            def batches() -> Iterator[dict[str, Any]]:
                """Each micro batch made inside the step, as the trainer collates it there."""
                for _ in range(traced):
                    yield {key: value.to(env.device, copy=True) if isinstance(value, torch.Tensor) else value
                           for key, value in job.example_batch.items()}

            def step(probe: StepMemoryProbe | None) -> None:
                accumulate_gradients(model, model_class, batches(), strategy.zero, traced, 1.0)
                if probe is not None:
                    probe.after_backward()
                optimizer.step(config.lr)
                optimizer.zero_grad()

            step(None)  # the first step creates the optimizer state; the trainer measures its second
            masters = [slot.work for slot in optimizer.slots if optimizer.offload and slot.work is not None]
            probe = StepMemoryProbe(model, optimizer.inner, masters, env.device)
            with probe:
                step(probe)
            return probe.report(rank)
