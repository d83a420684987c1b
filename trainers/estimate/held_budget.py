"""A memory budget held at run time (`Strategy.memory_budget` with the model states on FSDP2): the
plan made on rank 0 (`trainers.estimate.budget.fit_budget`) and applied on every rank alike, then the
first measured steps checked against the budget, and the plan tightened
(`trainers.estimate.budget.tighten`) after a step that went over it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainers.config import TrainConfig
from trainers.estimate.budget import BudgetPlan, fit_budget, tighten
from trainers.memory.measure import RankMemory
from trainers.memory.operation_chunks import set_chunk_bytes
from trainers.memory.recompute import RecomputePolicy
from trainers.strategy import Strategy

log = logging.getLogger("trainers")
BUDGET_STEPS_HELD = 2
"""Steps measured until this many have stayed within the budget (the first, and the second, when
optimizer state exists)."""


class HeldBudget:
    """The plan that holds `strategy.memory_budget` for `model` (see `plan_on_rank0`), and the
    steps measured against it so far."""

    def __init__(self, plan: BudgetPlan, budget: int, recompute: RecomputePolicy, model: nn.Module) -> None:
        self.plan, self.budget, self.recompute, self.model = plan, budget, recompute, model
        self.steps_held = 0
        """Measured steps whose peak stayed within the budget."""

    @classmethod
    def plan_on_rank0(cls, model: nn.Module, example_batch: Mapping[str, Any] | None, strategy: Strategy,
                      config: TrainConfig, device: torch.device) -> tuple[HeldBudget, Strategy, TrainConfig]:
        """Plan on rank 0 for `example_batch` (the largest micro batch; only rank 0's is read) and
        apply the plan on every rank (collective): the chunk sizes of `model`'s chunked operations, the
        recompute policy; returned with the strategy to parallelise with and `config` at the plan's
        micro batch size (fewer examples, more accumulated, where the configured size fits no plan)."""
        outcome: list[Any] = [None]
        if dist.get_rank() == 0:
            try:
                outcome[0] = fit_budget(model, example_batch, strategy, dist.get_world_size(), config, device)
            except Exception as error:  # every rank raises it, rather than waiting for rank 0
                outcome[0] = error
        dist.broadcast_object_list(outcome, src=0)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        plan: BudgetPlan = outcome[0]
        if dist.get_rank() == 0:
            log.info("memory budget %s per rank: %s. Candidates traced: %s", f"{strategy.memory_budget / 2**20:,.1f} MiB",
                     plan.describe(), "; ".join(plan.tried))
        set_chunk_bytes(model, plan.chunk_bytes)
        held = cls(plan, strategy.memory_budget, RecomputePolicy(plan.keep), model)
        micro = plan.micro_batch_size
        if micro != config.micro_batch_size and dist.get_rank() == 0:
            dp = dist.get_world_size() // (strategy.tp * strategy.pp)
            log.warning("memory budget: micro batches of %d examples (configured: %d), %d accumulated a step%s", micro,
                        config.micro_batch_size, config.global_batch_size // (micro * dp),
                        _reweighted(example_batch, micro, config.micro_batch_size))
        return held, replace(plan.strategy, memory_budget=strategy.memory_budget), replace(config, micro_batch_size=micro)

    @property
    def measuring(self) -> bool:
        """Whether the next step is measured against the budget."""
        return self.steps_held < BUDGET_STEPS_HELD

    def hold(self, report: RankMemory, step: int, device: torch.device) -> int:
        """After measured step `step` (1-based): when the largest peak over the ranks (returned) went
        over the budget, tighten what the blocks keep or the chunks for the next steps, the same on
        every rank (collective)."""
        measured = report.cuda_max_allocated if report.cuda_max_allocated is not None else report.peak
        peak = torch.tensor(float(measured), device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        peak, budget, main = int(peak.item()), self.budget, dist.get_rank() == 0
        if peak <= budget:
            self.steps_held += 1
            if main:
                log.info("step %d held %s of the %s memory budget", step, f"{peak / 2**20:,.1f} MiB",
                         f"{budget / 2**20:,.1f} MiB")
            return peak
        change = tighten(self.plan, self.recompute, self.model, peak)
        if main:
            log.warning("step %d peaked at %s, over the %s memory budget: %s", step, f"{peak / 2**20:,.1f} MiB",
                        f"{budget / 2**20:,.1f} MiB", change)
        return peak


def _reweighted(batch: Mapping[str, Any] | None, micro: int, configured: int) -> str:
    """What a smaller micro batch changes in the objective, when `batch`'s labels ignore positions
    (-100): each micro batch's loss averages over its own count of the others."""
    labels = None if batch is None else batch.get("labels")
    if not isinstance(labels, torch.Tensor) or not bool((labels == -100).any()):
        return ""
    return (f"; the labels ignore some positions (-100), so a loss averaged over each micro batch's other labels "
            f"weighs them as micro batches of {micro} do, not as one of {configured} (the same objective with and "
            f"without the budget: micro_batch_size={micro})")
