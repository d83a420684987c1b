"""Will it fit: the per-rank memory of a training step, estimated without allocating it.

`estimate_memory` runs the trainer's own code for one rank of the job (the strategy applied by
`trainers.parallelize`, the optimizer of `trainers.state.optimizer`, the forward and backward of the
step's micro batches, the optimizer step) on fake tensors in a fake process group
(`trainers.estimate.fake`), under the same tracker that measures real steps
(`trainers.memory.measure.StepMemoryProbe`). So the estimate covers everything a real step holds at its
peak: parameters, gradients, optimizer state, activations, backward temporaries, gathered ZeRO-3
parameters, reduction buffers, for any model, ZeRO stage, offload, recompute, precision and
tensor-parallel degree. The same trace counts the step's work (matrix-multiply FLOPs, the other
operators' memory traffic and calls) and collective traffic, which the planner's cost model
(`trainers.estimate.planner`) turns into time. It runs in a fresh process, so the caller's own process
group, if any, is untouched.

A pipelined job (Strategy.pp > 1) is traced on each pipeline rank, which runs its stages through
the schedule with the carries of its peers made up from their shapes (`trainers.estimate.fake_pipeline`):
so the activations of the micro batches a schedule keeps in flight, and the stage boundaries'
buffers, are counted where they are held.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.estimate.fake import without_weights
from trainers.estimate.process import run_fresh
from trainers.memory.measure import RankMemory, StepMemoryProbe
from trainers.memory.recompute import Keep, OpCost
from trainers.estimate.counters import Work
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
    work: list[Work]
    """Per traced rank: the step's matrix-multiply FLOPs, other operators' memory traffic and
    operator calls (recomputed forwards included; `trainers.estimate.counters.WorkCount`)."""
    traffic: list[dict[tuple[str, tuple[int, ...]], tuple[int, int]]]
    """Per traced rank: (payload bytes, calls) of the step's collectives by (kind, the group's
    global ranks)."""
    accumulation: int
    """Micro batches per optimizer step on each data-parallel rank."""
    seconds: float
    """Wall time of tracing this layout (the estimating process's start not included)."""
    block_ops: dict[str, list[OpCost]] = field(default_factory=dict)
    """For a job traced with `TraceJob.profile`: per block, the costs of the operator calls that
    recompute could skip (`trainers.memory.recompute.OpCost`), each block's from the traced rank that
    holds it."""
    pp_split: tuple[int, ...] | None = None
    """Under pipeline parallelism, the blocks of each stage traced (`Strategy.pp_split`)."""
    block_ranks: dict[str, int] = field(default_factory=dict)
    """For a profiled job: the index in `ranks` of the traced rank that holds each block."""

    @property
    def peak(self) -> int:
        """The largest peak among the ranks (bytes), device and host memory together."""
        return max(rank.peak for rank in self.ranks)

    @property
    def device_peak(self) -> int:
        """The largest share of the compute device (a GPU; on a CPU-only job, all of it) among the
        ranks, at their peaks (bytes): what each device must hold when state is offloaded."""
        return max(self.rank_peaks(device_only=True))

    def rank_peaks(self, device_only: bool) -> list[int]:
        """Each traced rank's peak (bytes): all of it, or (`device_only`) the compute device's share."""
        if not device_only:
            return [rank.peak for rank in self.ranks]
        shares = []
        for rank in self.ranks:
            on_device = [stats for device, stats in rank.by_device.items() if not device.startswith("cpu")]
            shares.append(sum(sum(stats.values()) for stats in on_device or rank.by_device.values()))
        return shares

    def at_peak(self, rank: int = 0) -> dict[str, int]:
        """Bytes per category, all devices together, at the peak of `rank` (its index in `ranks`)."""
        totals = dict.fromkeys(CATEGORIES, 0)
        for stats in self.ranks[rank].by_device.values():
            for category, nbytes in stats.items():
                if category in totals:
                    totals[category] += nbytes
        return totals


Layout = tuple[Strategy, int, "TrainConfig | None"]
"""(strategy, world size, config or None) of one job to estimate."""


def estimate_memory(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any], strategy: Strategy | None = None,
                    world_size: int = 1, config: TrainConfig | None = None) -> MemoryEstimate:
    """Per-rank peak memory of one training step of the model under `strategy` on `world_size`
    ranks, and its breakdown, without allocating the model or its activations.

    model_or_builder: an `nn.Module` (its structure and shapes go to the estimating process, not its
        weights: `trainers.estimate.fake.without_weights`; for a model too large to build here,
        pass a builder instead), or a picklable callable returning one (a class with its config in a
        `functools.partial`, a module-level function), called on fake tensors.
    example_batch: one micro batch, as the model's forward takes it (`model(**batch)["loss"]`);
        a smaller config.micro_batch_size takes its first rows. Where activations depend on the
        data (padded lengths, masked tokens), give the largest.
    config: the step's batch sizes (`global_batch_size` over `micro_batch_size` times the
        data-parallel ranks gives the micro batches per step) and AdamW's settings; default: one
        micro batch of the example's size per rank, or pp of them per pipeline.

    Call it from a script's `if __name__ == "__main__":` block: it starts a fresh Python process.
    """
    return estimate_layouts(model_or_builder, example_batch, [(Strategy() if strategy is None else strategy,
                                                               world_size, config)])[0]


def estimate_layouts(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any],
                     layouts: Sequence[Layout]) -> list[MemoryEstimate]:
    """`estimate_memory` of each (strategy, world size, config) in `layouts`, all in one process."""
    if not isinstance(model_or_builder, nn.Module) and not callable(model_or_builder):
        raise TypeError(f"model_or_builder must be a torch.nn.Module or a callable returning one; "
                        f"got {type(model_or_builder).__name__}")
    if not isinstance(example_batch, Mapping) or not example_batch:
        raise TypeError(f"example_batch must be a non-empty mapping of the model's inputs; got {example_batch!r:.80}")
    micro = batch_rows(example_batch)
    jobs = [layout_job(strategy, world_size, config, micro) for strategy, world_size, config in layouts]
    sent = without_weights(model_or_builder) if isinstance(model_or_builder, nn.Module) else model_or_builder
    return run_fresh(_trace, sent, example_batch, jobs)


@dataclass(frozen=True)
class TraceJob:
    """One layout to trace."""

    strategy: Strategy
    world_size: int
    config: TrainConfig
    ranks: tuple[int, ...]
    """The ranks to trace."""
    keep: Keep | Mapping[str, Keep] | None = None
    """What each block keeps for backward (`trainers.memory.recompute.Keep`; one for every block, or one
    per block name); None: as strategy.recompute says."""
    chunk_bytes: int | None = None
    """Bytes one chunk of the chunked operations may take (`trainers.memory.operation_chunks.set_chunk_bytes`);
    None: as built."""
    profile: bool = False
    """Record the costs of the operators each block that keeps only its inputs reruns
    (`MemoryEstimate.block_ops`)."""

    @property
    def accumulation(self) -> int:
        """Micro batches per optimizer step on each data-parallel rank."""
        dp = self.world_size // (self.strategy.tp * self.strategy.pp)
        return self.config.global_batch_size // (self.config.micro_batch_size * dp)


def layout_job(strategy: Strategy, world_size: int, config: TrainConfig | None, micro: int) -> TraceJob:
    """The `TraceJob` of one layout, checked, for an example batch of `micro` rows; `config` None:
    one micro batch of the example's size per rank, or pp of them per pipeline."""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a trainers.Strategy; got {type(strategy).__name__}")
    if strategy.offload == "chunks":
        raise ValueError("the estimator traces steps on FSDP2's layouts; Strategy(offload='chunks') holds the "
                         "memory_budget it is given instead (trainers.memory.chunks), so it has nothing to estimate: "
                         "give one of offload='none', 'optimizer' or 'params'")
    degree = strategy.tp * strategy.pp
    if not isinstance(world_size, int) or world_size < 1 or world_size % degree:
        raise ValueError(f"world_size must be a positive multiple of Strategy.tp x Strategy.pp = {degree}; "
                         f"got {world_size!r}")
    dp = world_size // degree
    config = config or TrainConfig(global_batch_size=micro * dp * strategy.pp, micro_batch_size=micro)
    if config.micro_batch_size > micro:
        raise ValueError(f"config.micro_batch_size={config.micro_batch_size} needs an example_batch of at least as many "
                         f"rows; got {micro}")
    return TraceJob(strategy, world_size, config, ranks=pipeline_ranks(strategy, world_size))


def pipeline_ranks(strategy: Strategy, world_size: int) -> tuple[int, ...]:
    """The ranks to trace: the first of each pipeline rank's (data, tensor)-parallel group (their
    stages differ; the ranks of one group hold the same)."""
    return tuple(range(0, world_size, world_size // strategy.pp))


def batch_rows(batch: Mapping[str, Any]) -> int:
    """The first (batch) dimension all of `batch`'s tensors share; ValueError if they differ."""
    sizes = {value.shape[0] for value in batch.values() if isinstance(value, torch.Tensor) and value.ndim}
    if len(sizes) != 1:
        raise ValueError(f"example_batch's tensors must share their first (batch) dimension; got sizes {sorted(sizes)}")
    return sizes.pop()


def _trace(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any], jobs: list[TraceJob]) -> list[MemoryEstimate]:
    """In the estimating process: each job's ranks, each traced in its own fake job. An error
    comes back as a RuntimeError holding its traceback (what torch raises does not always pickle)."""
    try:
        return trace_jobs(model_or_builder, example_batch, jobs)
    except Exception as error:
        raise RuntimeError(f"estimating the step failed:\n{traceback.format_exc()}") from error


def trace_jobs(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any],
               jobs: list[TraceJob]) -> list[MemoryEstimate]:
    """`MemoryEstimate` of each job, traced in this process (which must not be in a process group)."""
    estimates = []
    for job in jobs:
        started = time.perf_counter()
        traces = [_trace_rank(model_or_builder, example_batch, job, rank) for rank in job.ranks]
        block_ops = {name: ops for trace in traces for name, ops in trace.block_ops.items()}
        block_ranks = {name: index for index, trace in enumerate(traces) for name in trace.block_ops}
        estimates.append(MemoryEstimate(job.strategy, job.world_size, [t.memory for t in traces],
                                        [t.work for t in traces], [t.traffic for t in traces], job.accumulation,
                                        time.perf_counter() - started, block_ops, traces[0].pp_split, block_ranks))
    return estimates


@dataclass
class _RankTrace:
    """What tracing one rank's step gives."""

    memory: RankMemory
    work: Work
    traffic: dict[tuple[str, tuple[int, ...]], tuple[int, int]]
    block_ops: dict[str, list[OpCost]]
    pp_split: tuple[int, ...] | None


def _trace_rank(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any], job: TraceJob,
                rank: int) -> _RankTrace:
    """The memory, work, collective bytes and calls, and block operator costs of `rank`'s second
    training step: its first two micro batches (pipelined: its first two runs of the schedule) and
    the optimizer step are traced, the work and traffic of those between counted as the first's."""
    # Imported here: the estimating process needs them, the caller's does not.
    from trainers.loop.data import check_batch_sizes, pipeline_microbatches
    from trainers.memory.operation_chunks import set_chunk_bytes
    from trainers.parallel.mesh import setup_distributed
    from trainers.estimate.fake_pipeline import TracedLink, carry_specs
    from trainers.estimate.fake import HostFakeMode, fake_copy, fake_process_group, move_fake_states
    from trainers.state.optimizer import TrainOptimizer
    from trainers.parallelize import parallelize
    from trainers.pipeline.schedules import check_schedule
    from trainers.pipeline.step import build_pipeline, pipeline_passes
    from trainers.memory.recompute import RecomputePolicy
    from zoo.nn.cross_entropy import loss_gradients
    from zoo.adapters import adapted_modules, attach_lora
    from zoo.plan import model_plan
    from trainers.estimate.counters import CollectiveLog, WorkCount
    from trainers.step import accumulate_gradients, gradient_sync

    strategy, config = job.strategy, job.config
    micro_batch = {key: value[: config.micro_batch_size] if isinstance(value, torch.Tensor) and value.ndim else value
                   for key, value in example_batch.items()}
    with fake_process_group(job.world_size, rank):
        env = setup_distributed(strategy.tp, strategy.pp, strategy.ep)
        check_batch_sizes(config.global_batch_size, config.micro_batch_size, env.dp_size)
        accumulation = job.accumulation
        # Micro batches per pass: one, or a pipeline run of them.
        per_pass = pipeline_microbatches(config.global_batch_size, config.micro_batch_size, env.dp_size,
                                         strategy.microbatches) if strategy.pp > 1 else 1
        if strategy.pp > 1:
            check_schedule(strategy.pp_schedule, strategy.pp, strategy.stages_per_rank, per_pass)
        mode = HostFakeMode()
        with mode:
            if isinstance(model_or_builder, nn.Module):
                model = fake_copy(model_or_builder, mode)
            else:
                model = model_or_builder()
            if config.adapter is not None and not adapted_modules(model):  # a model the trainer has not adapted yet
                attach_lora(model, config.adapter)
            move_fake_states(model, env.device)
            model_class = type(model).__name__
            set_chunk_bytes(model, job.chunk_bytes)
            policy = None
            if job.keep is not None or job.profile:
                blocks = model_plan(model).recompute_names(model)
                keep = job.keep if isinstance(job.keep, Mapping) else dict.fromkeys(blocks, job.keep or "inputs")
                policy = RecomputePolicy(keep, profile=job.profile)
            specs = carry_specs(model, micro_batch) if strategy.pp > 1 else None
            model, parts, partial = parallelize(model, strategy, env, micro_batch, per_pass, recompute=policy,
                                                  checks=False)
            pipeline = None if parts is None else build_pipeline(
                parts, strategy, env, per_pass, TracedLink(env.mesh["pp"].get_group(), parts.layout.ranges, env.device,
                                                           specs))
            optimizer = TrainOptimizer(model, config, offload=strategy.offload == "optimizer")
            # The pattern of a step repeats from its second pass (gradients already held).
            passes = accumulation // per_pass
            traced = min(passes, 2)

            first_pass: list[tuple[Work, dict]] = []
            """The counters after the first pass (work, traffic)."""

            def batches(counters: tuple[WorkCount, CollectiveLog]) -> Iterator[dict[str, Any]]:
                """Each micro batch made inside the step, as the trainer collates it there."""
                for index in range(traced * per_pass):
                    if index == per_pass:
                        work, traffic = counters
                        first_pass.append((work.work, traffic.counts()))
                    yield {key: value.to(env.device, copy=True) if isinstance(value, torch.Tensor) and value.ndim
                           else value for key, value in micro_batch.items()}

            # The trainer measures its second step, when the optimizer state exists: made here by
            # one update from zero gradients, which the forward and backward would not change.
            for param in optimizer.params:
                param.grad = torch.zeros_like(param)
            optimizer.step(config.lr)
            optimizer.zero_grad()
            probe = StepMemoryProbe(model, optimizer.inner, optimizer.kept_tensors(), env.device)
            with probe, WorkCount() as work, CollectiveLog() as traffic, loss_gradients(strategy.loss_gradients):
                if pipeline is None:
                    accumulate_gradients(model, model_class, batches((work, traffic)), gradient_sync(model, strategy),
                                         traced, 1.0)
                else:
                    pipeline_passes(pipeline, parts, batches((work, traffic)), traced * per_pass, per_pass, 1.0,
                                    env.device)
                partial.sum()
                probe.after_backward()
                optimizer.step(config.lr)
                optimizer.zero_grad()
            total_work, total_traffic = work.work, traffic.counts()
            if first_pass:  # the step's middle passes repeat its first (no gradient sync under ZeRO 0-1) ...
                pass_work, pass_traffic = first_pass[0]
                if strategy.zero == 1 and pipeline is None:  # ... but for ZeRO-1's gathering, done once a step
                    pass_traffic = {}
                repeats = passes - traced
                total_work += pass_work * repeats
                for key, (nbytes, calls) in pass_traffic.items():
                    step_bytes, step_calls = total_traffic[key]
                    total_traffic[key] = (step_bytes + repeats * nbytes, step_calls + repeats * calls)
            return _RankTrace(probe.report(rank), total_work, total_traffic, {} if policy is None else policy.profiles,
                              None if parts is None else tuple(len(r) for r in parts.layout.ranges))
