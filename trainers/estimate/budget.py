"""Training under a hard memory budget (`Strategy.memory_budget`): the plan that fits, and how it
tightens at run time.

`fit_budget` plans for the trainer's own model, world and batch by tracing candidate steps with
the estimator (`trainers.estimate.trace`), for each state layout (the given ZeRO stage, then higher
stages when there are several data-parallel ranks, then offload on a GPU):
1. keep every activation, chunks as built;
2. every block keeps only its inputs (full recompute), with chunks of budget / 16
   (`set_chunk_bytes`: attention scores, logits, the model's own chunked operations), which
   also records what each block's operators would cost to keep (`trainers.memory.recompute.OpCost`);
   chunks of budget / 64 if that is still too much;
3. keep every activation with those chunks, when full recompute's peak plus every operator
   output's bytes comes within `KEEP_ALL_SLACK` of the budget (otherwise chunking alone cannot
   hold it, and the trace is skipped);
4. between 2 and 3, the operator outputs to keep chosen by the knapsack of kept bytes against
   recomputed FLOPs (`trainers.memory.recompute.choose_saved_ops`) within the room full recompute
   leaves, checked by one more trace (and the room shrunk by any excess).
The cheapest candidate whose estimated peak fits (with `PLANNING_MARGIN` to spare,
`GPU_PLANNING_MARGIN` on a GPU) is the plan: 1, else 3, else 4, else 2. Recompute and chunking
change what is alive, never what is computed: the losses are those of the unconstrained run.
When no layout fits, the ladder runs again at the next smaller micro batch size that divides each
rank's share of the global batch (`micro_batch_sizes`; the example batch's first rows): the global
batch stays, accumulated over more micro batches, and the losses change only by summation order. On
a GPU every estimated peak adds the cuBLAS workspaces (`trainers.memory.measure.cuda_workspace_bytes`,
measured in the trainer's process): the budget holds `torch.cuda.max_memory_allocated`, which
counts them.

Under pipeline parallelism every pipeline rank is traced and must fit. The stages are cut once,
by the first trace, and the plan keeps that split (`Strategy.pp_split`). The knapsack runs per
pipeline rank, over its own blocks in its own room, a kept output counting once for each micro
batch the schedule holds in flight there (`trainers.pipeline.schedules.in_flight`).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.estimate.fake import without_weights
from trainers.estimate.process import run_fresh
from trainers.estimate.zero import zero_model_states
from trainers.memory.measure import cuda_workspace_bytes
from trainers.parallelize import COMPUTE_DTYPES
from trainers.memory.recompute import Keep, OpCost, RecomputePolicy, choose_saved_ops
from trainers.strategy import Strategy
from trainers.memory.operation_chunks import set_chunk_bytes
from zoo.nn import chunk_memory
from zoo.plan import model_plan

MIN_CHUNK_BYTES = 2**20
"""The smallest chunk a plan or a tightening sets (1 MiB)."""
KEEP_ALL_SLACK = 1.25
"""Keeping everything with chunks is traced only when the knapsack's count of it (full recompute's
peak plus every operator output) is within this multiple of the budget. The count ran 9% and 13%
below the trace for the Evoformer at 6 and 8 blocks (155.1 MiB against 170.6, 196.6 against
224.8; `benchmarks/budget_keep_all_count.py`): a count above the budget by more than its error
tells, without a trace, that chunking alone cannot hold the budget."""
PLANNING_MARGIN = 0.03
"""Share of the budget a plan leaves free for the estimate's error on a CPU (within 2% of the
measured peak in `benchmarks/memory_estimate.py`)."""
GPU_PLANNING_MARGIN = 0.08
"""The same on a GPU, where the estimate ran 0.930 to 1.000 of the tracker's measured peak in the
24 cases of `benchmarks/memory_estimate.py` on the H200, and a GPT planned at 150.6 MiB (65.0 of
them workspaces) peaked at 156.7 in `benchmarks/memory_budget.py --size large`: the estimate of
its tensors, 85.6 MiB, 6.6% below their measured 91.7."""


class MemoryBudgetError(ValueError):
    """The budget cannot be held by any plan the trainer can apply."""


_KEEP_LABELS = {"all": "keep everything", "inputs": "recompute every block", "matmuls": "keep matmul outputs"}


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


@dataclass
class BudgetPlan:
    """What a trainer applies to hold its memory budget."""

    strategy: Strategy
    """The strategy to apply: the given one with the chosen ZeRO stage and offload (its
    `recompute` says whether any block recomputes)."""
    keep: dict[str, Keep]
    """What each block keeps for backward as planned (`trainers.memory.recompute.Keep`); the trainer's
    `RecomputePolicy` starts from it and is what `tighten` changes."""
    chunk_bytes: int | None
    """Bytes per chunk of the chunked operations as planned (`set_chunk_bytes`); None: as built."""
    micro_batch_size: int
    """Examples a micro batch: the configured number, or fewer where no layout fit that many."""
    peak: int
    """The estimated peak of the plan (bytes per rank, on the compute device)."""
    block_ops: dict[str, list[OpCost]] = field(default_factory=dict)
    """Each block's operator costs (from the full-recompute trace), to tighten with at run time."""
    tried: list[str] = field(default_factory=list)
    """One line per traced candidate: what it was and its estimated peak."""

    def describe(self) -> str:
        """What the plan keeps and chunks, in one line."""
        kept = list(self.keep.values())
        if all(keep == "all" for keep in kept):
            recompute = "no recompute"
        elif all(keep == "inputs" for keep in kept):
            recompute = "every block recomputed from its inputs"
        else:
            chosen = sum(len(keep) for keep in kept if isinstance(keep, frozenset))
            total = sum(len(ops) for ops in self.block_ops.values())
            recompute = f"blocks keep {chosen} of {total} operator outputs, recomputing the rest"
        chunks = "chunks as built" if self.chunk_bytes is None else f"chunks of {_mib(self.chunk_bytes)}"
        stages = "" if self.strategy.pp == 1 else f"stages of {self.strategy.pp_split} blocks, "
        return (f"ZeRO {self.strategy.zero}, offload {self.strategy.offload}, {stages}{recompute}, {chunks}, "
                f"micro batches of {self.micro_batch_size}: estimated peak {_mib(self.peak)}")


def micro_batch_sizes(rows: int, config: TrainConfig, dp: int, microbatches: int | None) -> list[int]:
    """The micro batch sizes a plan may use, largest first: `rows` (the configured one), then each
    smaller one that divides a data-parallel rank's share of `config.global_batch_size` and, under a
    pipeline, leaves `microbatches` (Strategy.microbatches) a divisor of a step's micro batches."""
    share = config.global_batch_size // dp
    smaller = [size for size in range(rows - 1, 0, -1)
               if share % size == 0 and (microbatches is None or (share // size) % microbatches == 0)]
    return [rows, *smaller]


def first_rows(batch: Mapping[str, Any], rows: int) -> dict[str, Any]:
    """`batch` with each tensor of a batch dimension cut to its first `rows` rows."""
    return {key: value[:rows] if isinstance(value, torch.Tensor) and value.ndim else value
            for key, value in batch.items()}


def fit_budget(model: nn.Module, example_batch: Mapping[str, Any], strategy: Strategy, world_size: int,
               config: TrainConfig, device: torch.device) -> BudgetPlan:
    """The cheapest plan whose estimated peak per rank stays within strategy.memory_budget (see
    the module docstring), traced in a fresh process; `MemoryBudgetError` naming the smallest
    peak found, and the world size whose ZeRO-3 shards would fit, when none does."""
    workspaces = 0
    if device.type == "cuda":
        workspaces = cuda_workspace_bytes(device, COMPUTE_DTYPES[strategy.precision] or torch.float32)
    outcome = run_fresh(_fit_in_fresh_process, without_weights(model), example_batch, strategy, world_size, config,
                        device.type, workspaces)
    if isinstance(outcome, str):
        raise MemoryBudgetError(outcome)
    return outcome


def _fit_in_fresh_process(model, example_batch, strategy, world_size, config, device_type, workspaces):
    try:
        return _Search(model, example_batch, strategy, world_size, config, device_type, workspaces).run()
    except MemoryBudgetError as error:
        return str(error)
    except Exception as error:
        raise RuntimeError(f"planning for the memory budget failed:\n{traceback.format_exc()}") from error


class _Search:
    """The candidate ladder of `fit_budget`, in the estimating process."""

    def __init__(self, model, example_batch, strategy, world_size, config, device_type, workspaces) -> None:
        from trainers.estimate.trace import batch_rows

        self.model, self.example, self.world = model, example_batch, world_size
        self.given_config = config
        rows = batch_rows(example_batch) if config is None else config.micro_batch_size
        self.micro_sizes = [rows] if config is None else micro_batch_sizes(
            rows, config, world_size // (strategy.tp * strategy.pp), strategy.microbatches if strategy.pp > 1 else None)
        self._use_micro(self.micro_sizes[0])
        self.budget = strategy.memory_budget
        self.on_gpu = device_type == "cuda"
        self.target = int(self.budget * (1 - (GPU_PLANNING_MARGIN if self.on_gpu else PLANNING_MARGIN)))
        self.workspaces = workspaces
        """Device bytes beside the traced tensors (the GPU's cuBLAS workspaces), in every peak."""
        self.base = replace(strategy, recompute="none")
        self.tried: list[str] = []
        self.smallest: tuple[int, str, Any] | None = None

    def _trace(self, strategy: Strategy, keep, chunk: int | None, profile: bool = False):
        from trainers.estimate.trace import batch_rows, layout_job, trace_jobs

        job = replace(layout_job(strategy, self.world, self.config, batch_rows(self.batch)), keep=keep, chunk_bytes=chunk,
                      profile=profile)
        estimate = trace_jobs(self.model, self.batch, [job])[0]
        peak = max(self._peaks(estimate))
        label = _KEEP_LABELS[keep] if isinstance(keep, str) else "keep chosen operators"
        self.tried.append(f"ZeRO {strategy.zero}, offload {strategy.offload}, {label}, "
                          f"{'chunks as built' if chunk is None else 'chunks of ' + _mib(chunk)}"
                          f"{'' if self.micro == self.micro_sizes[0] else f', micro batches of {self.micro}'}: {_mib(peak)}")
        if strategy.pp > 1 and self.base.pp_split is None:  # later traces cut the stages this one did
            self.base = replace(self.base, pp_split=estimate.pp_split)
        if self.smallest is None or peak < self.smallest[0]:
            self.smallest = (peak, self.tried[-1], estimate)
        return peak, estimate

    def _peaks(self, estimate) -> list[int]:
        """Each traced rank's estimated peak on its compute device, workspaces included (bytes)."""
        return [peak + self.workspaces for peak in estimate.rank_peaks(device_only=self.on_gpu)]

    def _layouts(self) -> list[tuple[int, str]]:
        """(ZeRO stage, offload) of each state layout to try, in order."""
        dp = self.world // (self.base.tp * self.base.pp)
        layouts = [(self.base.zero, self.base.offload)]
        if dp > 1:
            layouts += [(zero, self.base.offload) for zero in range(self.base.zero + 1, 4)]
        if self.on_gpu:
            zero, offload = layouts[-1]
            if offload == "none":
                layouts.append((zero, "optimizer"))
            if offload != "params":
                layouts.append((3, "params"))
        return layouts

    def _use_micro(self, rows: int) -> None:
        """Plan for micro batches of `rows` examples from here on."""
        self.micro, self.batch = rows, first_rows(self.example, rows)
        self.config = self.given_config
        if rows != self.micro_sizes[0]:
            self.config = replace(self.config, micro_batch_size=rows)

    def run(self) -> BudgetPlan:
        for rows in self.micro_sizes:
            self._use_micro(rows)
            plan = self._ladder()
            if plan is not None:
                return plan
        raise MemoryBudgetError(self._refusal())

    def _ladder(self) -> BudgetPlan | None:
        """The plan of the candidate ladder at the current micro batch size; None when nothing fits."""
        budget = self.target
        blocks = None
        for zero, offload in self._layouts():
            peak, _ = self._trace(replace(self.base, zero=zero, offload=offload), "all", None)
            layout = replace(self.base, zero=zero, offload=offload)  # with the stages that trace cut
            if peak <= budget:
                return self._plan(layout, "all", None, peak, blocks)
            chunk = max(MIN_CHUNK_BYTES, budget // 16)
            floor, estimate = self._trace(layout, "inputs", chunk, profile=True)
            if floor > budget:  # then keeping everything, chunked or not, cannot fit either
                smaller = max(MIN_CHUNK_BYTES, budget // 64)
                if smaller == chunk:  # both at the smallest chunk: the same trace again
                    continue
                chunk = smaller
                floor, estimate = self._trace(layout, "inputs", chunk, profile=True)
                if floor > budget:
                    continue
            blocks = estimate.block_ops
            if max(self._keeping_everything(estimate, layout)) <= budget * KEEP_ALL_SLACK:
                peak, _ = self._trace(layout, "all", chunk)
                if peak <= budget:
                    return self._plan(layout, "all", chunk, peak, blocks)
            recompute = replace(layout, recompute="blocks")
            rooms = [budget - peak for peak in self._peaks(estimate)]
            for _ in range(3):
                keep = self._choose(estimate, rooms, layout)
                if not any(keep.values()):
                    break
                peak, traced = self._trace(recompute, keep, chunk)
                if peak <= budget:
                    return self._plan(recompute, keep, chunk, peak, blocks)
                rooms = [room - max(0, peak - budget) for room, peak in zip(rooms, self._peaks(traced))]
            return self._plan(recompute, "inputs", chunk, floor, blocks)
        return None

    def _rank_ops(self, estimate, strategy: Strategy) -> list[dict[str, list[OpCost]]]:
        """Per traced rank, its blocks' operator costs, a kept output weighing its bytes times the
        micro batches in flight there (one: without a pipeline)."""
        from trainers.loop.data import pipeline_microbatches
        from trainers.pipeline.schedules import in_flight, schedule_orders

        if len(estimate.ranks) == 1:
            return [estimate.block_ops]
        dp = self.world // (strategy.tp * strategy.pp)
        runs = pipeline_microbatches(self.config.global_batch_size, self.config.micro_batch_size, dp,
                                     strategy.microbatches)
        orders = schedule_orders(strategy.pp_schedule, strategy.pp, strategy.stages_per_rank, runs)
        return [{name: [replace(cost, bytes=cost.bytes * in_flight(orders[index])) for cost in costs]
                 for name, costs in estimate.block_ops.items() if estimate.block_ranks[name] == index}
                for index in range(len(estimate.ranks))]

    def _choose(self, estimate, rooms: list[int], strategy: Strategy) -> dict[str, frozenset]:
        """The operator outputs to keep: the knapsack in `rooms` (per traced rank), each rank over
        its own blocks (`_rank_ops`)."""
        keep: dict[str, frozenset] = {}
        for ops, room in zip(self._rank_ops(estimate, strategy), rooms, strict=True):
            keep.update(choose_saved_ops(ops, max(room, 0)))
        return keep

    def _keeping_everything(self, estimate, strategy: Strategy) -> list[int]:
        """Per traced rank, the peak the knapsack counts for keeping every operator output: the
        full-recompute peak of `estimate` and every output's weighted bytes (`_rank_ops`)."""
        return [floor + sum(cost.bytes for costs in ops.values() for cost in costs)
                for floor, ops in zip(self._peaks(estimate), self._rank_ops(estimate, strategy), strict=True)]

    def _plan(self, strategy: Strategy, keep, chunk, peak, blocks) -> BudgetPlan:
        if isinstance(keep, str):
            names = list(blocks) if blocks else model_plan(self.model).recompute_names(self.model)
            keep = dict.fromkeys(names, keep)
        return BudgetPlan(strategy, keep, chunk, self.micro, peak, blocks or {}, self.tried)

    def _refusal(self) -> str:
        """The error when nothing fits: the smallest peak found and a world size that would fit."""
        peak, what, estimate = self.smallest
        states = estimate.ranks[0].model_states
        numel = sum(p.numel() for p in self.model.parameters())
        whole = zero_model_states(numel, replace(self.base, zero=0, offload="none"), self.base.tp * self.base.pp)
        rest = peak - states
        if rest < self.budget:
            ranks = math.ceil(whole["total"] / (self.budget - rest)) * self.base.tp * self.base.pp
            hint = (f"ZeRO-3 over {ranks} ranks would bring the model states within the "
                    f"{_mib(self.budget - rest)} the rest leaves")
        else:
            rest_is = "activations, temporaries and workspaces" if self.workspaces else "activations and temporaries"
            hint = (f"no number of ranks brings it down: {rest_is} alone take {_mib(rest)} with "
                    f"{self.micro_sizes[-1]} example(s) a micro batch, the fewest tried; use shorter examples or a "
                    f"larger budget")
        workspaces = f" and {_mib(self.workspaces)} cuBLAS workspaces" if self.workspaces else ""
        return (f"Strategy.memory_budget={_mib(self.budget)} per rank is below what this job needs on {self.world} "
                f"rank(s): the smallest peak found is {_mib(peak)} ({what}), of which {_mib(states)} are model "
                f"states{workspaces}; {hint}. Tried: " + "; ".join(self.tried))


def tighten(plan: BudgetPlan, policy: RecomputePolicy, model: nn.Module, peak: int) -> str:
    """After a measured step peaked at `peak` bytes, over the budget of `plan`: change `policy`
    (what the blocks keep) or the chunks for the next steps; returns what changed. In order: keep
    fewer operator outputs (the excess and a quarter more), recompute every block, quarter the
    chunks (down to `MIN_CHUNK_BYTES`). MemoryBudgetError when nothing is left."""
    budget = plan.strategy.memory_budget
    excess = peak - budget
    sizes = {(name, cost.key): cost.bytes for name, costs in plan.block_ops.items() for cost in costs}

    def held(keep: Mapping[str, Keep]) -> int:
        return sum(sizes[name, key] for name, keys in keep.items() if isinstance(keys, frozenset) for key in keys)

    before = held(policy.keep)
    if before:
        choice = choose_saved_ops(plan.block_ops, before - excess - excess // 4)
        policy.keep.update(choice)
        return (f"blocks now keep {sum(map(len, choice.values()))} operator outputs ({_mib(held(choice))}, "
                f"was {_mib(before)})")
    if any(keep != "inputs" for keep in policy.keep.values()):
        policy.keep.update(dict.fromkeys(policy.keep, "inputs"))
        return "every block now recomputes from its inputs"
    current = chunk_memory.chunk_bytes()
    if current > MIN_CHUNK_BYTES:
        set_chunk_bytes(model, max(MIN_CHUNK_BYTES, current // 4))
        return f"chunks now take {_mib(chunk_memory.chunk_bytes())}"
    raise MemoryBudgetError(f"a step peaked at {_mib(peak)}, over Strategy.memory_budget={_mib(budget)}, with every "
                            f"block recomputed and chunks of {_mib(current)}: nothing is left to tighten; plan with a "
                            f"larger budget, more ranks or a smaller micro batch")
