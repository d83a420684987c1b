"""Will it fit, and how fast: the layouts of a model on `world_size` devices that fit a memory
budget, ranked by estimated step time.

`plan` enumerates the strategies of a `SearchSpace` (ZeRO stage, offload, recompute, tensor,
pipeline and expert parallelism, pipeline schedule, micro-batch size; the global batch stays fixed), and
orders them by a first guess of their step time (the work per example and the tensor-parallel
collectives per micro batch from one trace at the largest tensor-parallel degree; the ZeRO paper's
data-parallel traffic; the schedule's textbook bubble). It then traces up to `max_traces` of those
whose model states alone fit, in that order, with the estimator (`trainers.estimate.trace`: the layout's
own step on fake tensors, giving its peak memory, work and collectives), and keeps those whose
traced peak fits. The plans come back ranked by `step_time`, the cost model on the traced numbers:

    compute        the step's matrix-multiply FLOPs over the device's throughput, plus the other
                   operators' bytes read and written over its memory bandwidth, plus a dispatch
                   cost per operator call (recompute's extra forward included)
    tensor-parallel collectives over the link of their group (within a node or across nodes):
                   a latency per call, and ring costs: 2(g-1)/g of the payload for an
                   all-reduce, (g-1)/g for an all-gather or reduce-scatter
    data-parallel  the same, hidden behind compute where the device overlaps them
    expert-parallel the all-to-alls of the experts' tokens over their group, in the critical path
    offload        optimizer: gradients to the host and parameters back each step; params: the
                   parameters to the device for forward and backward and gradients back
    pipeline       the schedule's bubble: the busiest pipeline rank's compute times the idle
                   share of the schedule run with unit pass costs (`pipeline_schedules.simulate`),
                   and the point-to-point sends of the busiest rank over their link

These are Alpa's two levels: the stages of a pipelined layout are cut by the dynamic program of
`trainers.pipeline.balance` (on FLOPs, in the trace), and each stage's intra-operator layout (ZeRO,
tensor parallelism, recompute) is chosen by the search; a plan fixes its split in
`Strategy.pp_split`, so the run is the one traced. A pipelined layout is traced on its first and
last pipeline ranks: the first holds the most micro batches in flight, the last the loss head.
"""

from __future__ import annotations

import itertools
import math
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.estimate.devices import DeviceSpec, device_spec, parse_bytes
from trainers.estimate.fake import without_weights
from trainers.estimate.process import run_fresh
from trainers.estimate.trace import MemoryEstimate, ModelOrBuilder, TraceJob, batch_rows, trace_jobs
from trainers.estimate.zero import zero_model_states
from trainers.pipeline.schedules import analytic_bubble, schedule_orders, simulate
from trainers.estimate.counters import Work
from trainers.strategy import LayoutRefused, Strategy
from zoo.plan import model_plan

RING_FACTORS = {"all_reduce": lambda g: 2 * (g - 1) / g, "all_gather": lambda g: (g - 1) / g,
                "reduce_scatter": lambda g: (g - 1) / g, "all_to_all": lambda g: (g - 1) / g,
                "broadcast": lambda g: 1.0, "send": lambda g: 1.0}
"""Bytes each rank moves per payload byte in a ring (or pipelined tree) collective of g ranks."""


def collective_seconds(kind: str, group: int, nbytes: float, calls: float, bandwidth: float, latency: float) -> float:
    """Seconds of `calls` collectives of `kind` over `group` ranks moving `nbytes` of payload in
    all: a latency per call and the ring's bytes over the link (a kind not in `RING_FACTORS`
    moves its payload once)."""
    return calls * latency + nbytes * RING_FACTORS.get(kind, lambda g: 1.0)(group) / bandwidth


@dataclass(frozen=True)
class SearchSpace:
    """The strategies `plan` tries; None derives a dimension from the job."""

    zero: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages."""
    offload: tuple[str, ...] = ("none", "optimizer", "params")
    """Offload modes ("params" only with ZeRO 3)."""
    recompute: tuple[str, ...] = ("none", "blocks")
    """Recompute policies."""
    tp: tuple[int, ...] | None = None
    """Tensor-parallel degrees; None: 1 and each power of two that divides world_size and fits
    in a node."""
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees (without tensor parallelism); None: 1 and, for a model whose plan
    declares routed experts, each power of two that divides its data-parallel ranks and every
    experts module's count."""
    pp: tuple[int, ...] | None = None
    """Pipeline-parallel degrees; None: 1 and each power of two that divides world_size (a model
    without pipeline split points, or with fewer blocks than stages, is not pipelined)."""
    pp_schedules: tuple[str, ...] = ("1f1b", "zero_bubble", "gpipe")
    """Pipeline schedules of pipelined layouts (one stage per rank; a step's micro batches in one
    run)."""
    micro_batch_sizes: tuple[int, ...] | None = None
    """Micro-batch sizes; None: the example batch's rows, halved down to 1."""
    precision: str | None = None
    """Compute precision; None: bf16 on a GPU preset, fp32 on "cpu"."""


@dataclass(frozen=True)
class StepTime:
    """Estimated seconds of one optimizer step, by part."""

    compute: float
    tensor_parallel: float
    data_parallel: float
    """The data-parallel collectives' seconds not hidden behind compute."""
    offload: float
    pipeline: float = 0.0
    """The pipeline's bubble and point-to-point transfers."""
    expert_parallel: float = 0.0
    """The all-to-alls that carry the experts' tokens."""

    @property
    def total(self) -> float:
        return (self.compute + self.tensor_parallel + self.data_parallel + self.offload + self.pipeline
                + self.expert_parallel)


@dataclass(frozen=True)
class Plan:
    """A layout that fits, with its traced memory and estimated step time."""

    strategy: Strategy
    micro_batch_size: int
    accumulation: int
    """Micro batches per step on each data-parallel rank."""
    estimate: MemoryEstimate
    time: StepTime

    @property
    def peak(self) -> int:
        """Traced peak bytes per rank on the compute device (offloaded state not counted)."""
        return self.estimate.device_peak

    def train_flags(self) -> str:
        """The `zoo train` flags that run this plan (with --nproc world_size)."""
        s = self.strategy
        flags = [f"--nproc {self.estimate.world_size}"] + ([f"--tp {s.tp}"] if s.tp > 1 else [])
        flags += [f"--ep {s.ep}"] if s.ep > 1 else []
        if s.pp > 1:
            split = ",".join(map(str, self.estimate.pp_split or s.pp_split))
            flags += [f"--pp {s.pp}", f"--pp-schedule {s.pp_schedule}", f"--strategy.pp_split {split}"]
        flags += [f"--strategy.zero {s.zero}", f"--strategy.offload {s.offload}", f"--strategy.recompute {s.recompute}",
                  f"--strategy.precision {s.precision}", f"--train.micro_batch_size {self.micro_batch_size}"]
        return " ".join(flags)


def plan(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any], world_size: int,
         memory_budget: int | str, device: str | DeviceSpec = "cpu", global_batch_size: int | None = None,
         space: SearchSpace | None = None, top: int = 5, max_traces: int = 24) -> list[Plan]:
    """The `top` fastest layouts of the model on `world_size` devices whose traced peak per rank
    fits `memory_budget` (bytes or "6GiB"), fastest first.

    example_batch: the largest micro batch to consider (smaller ones are its first rows).
    global_batch_size: examples per optimizer step, fixed across plans (default: the example's rows
    times world_size).
    max_traces: layouts traced at most, in the order of their first guess of step time (each trace
    runs the layout's step on fake tensors: about a second for a small model, several for 7B).
    ValueError if no layout fits, naming the smallest peak found and its plan.
    Call it from a script's `if __name__ == "__main__":` block: it starts a fresh Python process.
    """
    budget = parse_bytes(memory_budget)
    spec = device_spec(device, world_size)
    space = space or SearchSpace()
    rows = batch_rows(example_batch)
    global_batch_size = global_batch_size or rows * world_size
    candidates = _candidates(space, spec, world_size, rows, global_batch_size, _experts(model_or_builder))
    if not candidates:
        raise ValueError(f"no strategy of the search space splits global_batch_size={global_batch_size} over "
                         f"world_size={world_size}")
    sent = without_weights(model_or_builder) if isinstance(model_or_builder, nn.Module) else model_or_builder
    found, smallest, states = run_fresh(_search, sent, example_batch, candidates, world_size, budget, spec, max_traces)
    if not found:
        if smallest is None:
            raise ValueError(f"memory_budget={_size(budget)} per rank is below the model states alone of every layout on "
                             f"world_size={world_size}: at least {_size(states)} per rank (ZeRO-3); more ranks shard "
                             "them further")
        raise ValueError(f"memory_budget={_size(budget)} per rank fits no layout on world_size={world_size}; the "
                         f"smallest traced peak is {_size(smallest.peak)} ({smallest.train_flags()})")
    return sorted(found, key=lambda p: (p.time.total, p.accumulation))[:top]  # ties: fewer, larger micro batches


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def step_time(estimate: MemoryEstimate, spec: DeviceSpec) -> StepTime:
    """The cost model (module docstring) on the traced step: each part is the largest over the
    traced ranks."""
    strategy = estimate.strategy
    compute = max(compute_seconds(work, strategy, spec) for work in estimate.work)
    tensor_parallel = data_parallel = point_to_point = expert_parallel = 0.0
    for traffic in estimate.traffic:
        rank_tp = rank_dp = rank_p2p = rank_ep = 0.0
        for (kind, ranks), (nbytes, calls) in traffic.items():
            if len(ranks) <= 1 or kind == "c10d::recv_":  # a transfer is the sender's
                continue
            kind = "send" if kind == "c10d::send" else kind
            nodes = {rank // spec.devices_per_node for rank in ranks}
            bandwidth = spec.node_bandwidth if len(nodes) == 1 else spec.network_bandwidth
            seconds = collective_seconds(kind, len(ranks), nbytes, calls, bandwidth, spec.latency)
            if kind == "send":
                rank_p2p += seconds
            elif kind == "all_to_all":
                rank_ep += seconds
            elif _is_tensor_parallel(ranks, strategy.tp):
                rank_tp += seconds
            else:
                rank_dp += seconds
        tensor_parallel, data_parallel = max(tensor_parallel, rank_tp), max(data_parallel, rank_dp)
        point_to_point, expert_parallel = max(point_to_point, rank_p2p), max(expert_parallel, rank_ep)
    if spec.overlap:
        data_parallel = max(0.0, data_parallel - compute)
    memory = max(estimate.ranks, key=lambda rank: rank.parameters + rank.gradients)
    state_bytes = memory.parameters + memory.gradients
    offload = {"none": 0.0, "optimizer": 2 * state_bytes, "params": 3 * state_bytes}[strategy.offload] / spec.host_bandwidth
    bubble = 0.0
    if strategy.pp > 1:
        microbatches = estimate.accumulation if strategy.microbatches is None else strategy.microbatches
        bubble = compute * idle_share(strategy, microbatches)
    return StepTime(compute, tensor_parallel, data_parallel, offload, bubble + point_to_point, expert_parallel)


def compute_seconds(work: Work, strategy: Strategy, spec: DeviceSpec) -> float:
    """Seconds of a rank's `work` on `spec`, its operators run one after another."""
    throughput = spec.fp32_flops if strategy.precision == "fp32" else spec.flops
    return work.flops / throughput + work.memory_bytes / spec.memory_bandwidth + work.calls * spec.op_seconds


def idle_share(strategy: Strategy, microbatches: int) -> float:
    """Idle time over busy time of a pipeline rank when `strategy`'s schedule runs `microbatches`
    with unit pass costs (`trainers.pipeline.schedules.simulate`)."""
    orders = schedule_orders(strategy.pp_schedule, strategy.pp, strategy.stages_per_rank, microbatches)
    timeline = simulate(orders, strategy.stages_per_rank)
    busy = max(sum(end - start for _, start, end in rank) for rank in timeline.spans)
    return timeline.makespan / busy - 1


def _candidates(space: SearchSpace, spec: DeviceSpec, world_size: int, rows: int,
                global_batch_size: int, experts: int) -> list[tuple[Strategy, TrainConfig]]:
    """The strategies and batch sizes of `space` on `world_size` ranks; `experts`: the count every
    experts module's divides (0: a model without experts)."""
    precision = space.precision or ("fp32" if spec.name == "cpu" else "bf16")
    tps = space.tp or tuple(t for t in (1, 2, 4, 8, 16) if world_size % t == 0 and t <= spec.devices_per_node)
    pps = space.pp or tuple(1 << k for k in range(world_size.bit_length()) if world_size % (1 << k) == 0)
    micros = space.micro_batch_sizes or tuple(sorted({max(rows >> k, 1) for k in range(rows.bit_length())}, reverse=True))
    candidates = []
    for tp, pp in itertools.product(tps, pps):
        if world_size % (tp * pp):
            continue
        dp = world_size // (tp * pp)
        eps = space.ep or (1, *(e for e in (2, 4, 8, 16, 32, 64) if experts and dp % e == 0 and experts % e == 0))
        for micro, ep in itertools.product(micros, eps if tp == 1 else (1,)):
            if micro > rows or global_batch_size % (micro * dp):
                continue
            config = TrainConfig(global_batch_size=global_batch_size, micro_batch_size=micro, max_steps=2,
                                 warmup_steps=1, progress=False)
            for zero in space.zero if dp > 1 else space.zero[:1]:  # one data-parallel rank: the stages coincide
                for offload in space.offload:
                    if offload == "params" and zero != 3:
                        continue
                    for recompute in space.recompute:
                        for schedule in space.pp_schedules if pp > 1 else ("1f1b",):
                            candidates.append((Strategy(zero=zero, offload=offload, recompute=recompute, tp=tp, pp=pp,
                                                        ep=ep, pp_schedule=schedule, precision=precision), config))
    return candidates


def _search(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any],
            candidates: list[tuple[Strategy, TrainConfig]], world_size: int, budget: int, spec: DeviceSpec,
            max_traces: int) -> tuple[list[Plan], Plan | None, float]:
    """In the estimating process: screen, order and trace the candidates (module docstring);
    returns the plans that fit, the traced plan of smallest peak, and the smallest model states
    of a candidate (bytes per rank on the device)."""
    try:
        numel, expert_numel = _parameter_counts(model_or_builder)
        rows = batch_rows(example_batch)
        first = _first_trace(model_or_builder, example_batch, candidates, world_size, rows)
        states = {id(s): _model_states(s, numel, expert_numel, world_size) for s, _ in candidates}
        kept = [(s, c) for s, c in candidates if states[id(s)] < budget]
        kept.sort(key=lambda sc: _first_guess(sc[0], sc[1], numel, first, rows, world_size, spec))
        found: list[Plan] = []
        smallest: Plan | None = None
        for strategy, config in kept[:max_traces]:
            ends = (0, world_size - world_size // strategy.pp) if strategy.pp > 1 else (0,)
            try:
                estimate = trace_jobs(model_or_builder, example_batch, [TraceJob(strategy, world_size, config, ends)])[0]
            except LayoutRefused:  # a layout the model cannot take (tp not dividing its heads, no pipeline split)
                continue
            strategy = replace(strategy, pp_split=estimate.pp_split)  # the run cuts the stages traced
            estimate = replace(estimate, strategy=strategy)
            traced = Plan(strategy, config.micro_batch_size, estimate.accumulation, estimate, step_time(estimate, spec))
            if smallest is None or traced.peak < smallest.peak:
                smallest = traced
            if traced.peak <= budget:
                found.append(traced)
        return found, smallest, min(states.values())
    except Exception as error:
        raise RuntimeError(f"planning failed:\n{traceback.format_exc()}") from error


def _built(model_or_builder: ModelOrBuilder) -> nn.Module:
    """The model, or the builder's on the meta device."""
    if isinstance(model_or_builder, nn.Module):
        return model_or_builder
    with torch.device("meta"):
        return model_or_builder()


def _experts_modules(model: nn.Module) -> list[nn.Module]:
    return [model.get_submodule(name) for name in model_plan(model).names(model, "experts")]


def _parameter_counts(model_or_builder: ModelOrBuilder) -> tuple[int, int]:
    """(the model's parameters, those of its routed experts)."""
    model = _built(model_or_builder)
    return (sum(p.numel() for p in model.parameters()),
            sum(p.numel() for module in _experts_modules(model) for p in module.parameters()))


def _experts(model_or_builder: ModelOrBuilder) -> int:
    """The expert count that every experts module of the model's plan divides (0: none)."""
    return math.gcd(*(module.experts for module in _experts_modules(_built(model_or_builder))))


def _model_states(strategy: Strategy, numel: int, expert_numel: int, world_size: int) -> float:
    """Model-state bytes per rank on the device (the ZeRO paper's closed form): the routed experts'
    1/ep share sharded over the world_size / ep ranks that hold it, the rest over all."""
    degree = strategy.tp * strategy.pp
    dense = zero_model_states((numel - expert_numel) // degree, strategy, world_size)["device"]
    return dense + zero_model_states(expert_numel // (degree * strategy.ep), strategy, world_size // strategy.ep)["device"]


def _is_tensor_parallel(ranks: tuple[int, ...], tp: int) -> bool:
    """Whether a collective over the global `ranks` runs in a tensor-parallel group of degree `tp`
    (the mesh's innermost dimension: consecutive ranks)."""
    return tp > 1 and len(ranks) == tp and ranks[-1] - ranks[0] == tp - 1


def _first_trace(model_or_builder: ModelOrBuilder, example_batch: Mapping[str, Any],
                 candidates: list[tuple[Strategy, TrainConfig]], world_size: int, rows: int) -> MemoryEstimate:
    """The step of whole example micro batches under ZeRO 3 at the largest tensor-parallel degree
    of the candidates that the model accepts, for `_first_guess` to scale: its work, and the
    calls and payload of its tensor-parallel collectives."""
    strategy, config = candidates[0]
    degrees = sorted({s.tp for s, _ in candidates}, reverse=True)

    def trace(tp: int) -> MemoryEstimate:
        job = TraceJob(Strategy(zero=3, tp=tp, precision=strategy.precision), world_size,
                       replace(config, micro_batch_size=rows), (0,))
        return trace_jobs(model_or_builder, example_batch, [job])[0]

    for tp in degrees[:-1]:
        try:
            return trace(tp)
        except LayoutRefused:  # a degree the model cannot take
            continue
    return trace(degrees[-1])


def _first_guess(strategy: Strategy, config: TrainConfig, numel: int, first: MemoryEstimate, rows: int,
                 world_size: int, spec: DeviceSpec) -> float:
    """Seconds of a step before tracing it, scaled from the `first` trace (`_first_trace`, micro
    batches of `rows`): its work per example and operator calls per micro batch, to this layout's
    share of the batch and the model (a third more under recompute; a pipeline's bubble by its
    textbook fraction); its tensor-parallel collectives' calls per micro batch and payload per
    example, over the ring of this layout's degree; the ZeRO paper's data-parallel volume (2 P for ZeRO 0-2, 3 P for ZeRO 3,
    P the parameter bytes of a tensor- and pipeline-parallel rank); offload traffic."""
    degree = strategy.tp * strategy.pp
    dp = world_size // degree
    microbatches = config.global_batch_size // (config.micro_batch_size * dp)
    traced_examples = rows * first.accumulation
    share = config.global_batch_size / dp / degree * first.strategy.tp / traced_examples
    traced = first.work[0]
    work = Work(int(traced.flops * share), int(traced.memory_bytes * share),
                traced.calls * microbatches // (first.accumulation * strategy.pp))
    compute = compute_seconds(work, strategy, spec) * (4 / 3 if strategy.recompute == "blocks" else 1.0)
    if strategy.pp > 1:
        compute /= 1 - analytic_bubble(strategy.pp_schedule, strategy.pp, strategy.stages_per_rank, microbatches)
    bandwidth = spec.node_bandwidth if world_size <= spec.devices_per_node else spec.network_bandwidth
    tensor_parallel = 0.0
    if strategy.tp > 1:
        stage_share = config.global_batch_size / dp / strategy.pp / traced_examples  # a stage holds 1/pp of the blocks
        for (kind, ranks), (nbytes, calls) in first.traffic[0].items():
            if _is_tensor_parallel(ranks, first.strategy.tp):
                tensor_parallel += collective_seconds(kind, strategy.tp, nbytes * stage_share,
                                                      calls * microbatches / (first.accumulation * strategy.pp),
                                                      spec.node_bandwidth, spec.latency)
    parameter_bytes = 4 * numel / degree
    volume = (3 if strategy.zero == 3 else 2) * parameter_bytes * (dp - 1) / dp
    communication = volume / bandwidth
    offload = {"none": 0.0, "optimizer": 2 * parameter_bytes, "params": 3 * parameter_bytes}[strategy.offload]
    return (compute + tensor_parallel + (max(0.0, communication - compute) if spec.overlap else communication)
            + offload / spec.host_bandwidth)
