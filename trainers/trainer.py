"""`Trainer`: runs any model whose `forward(**batch)` returns {"loss": scalar, ...} under a `Strategy`."""

from __future__ import annotations

import itertools
import logging
import math
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import default_collate

from trainers.memory.activations.plan import (CHOICES, BlockCost, Choice, apply_block_activations, block_activation_policy,
                                     choose_block_activations, disk_seconds_per_byte, measure_blocks,
                                     parse_block_activations)
from trainers.estimate.budget import BudgetPlan, fit_budget, tighten
from trainers.memory.operation_chunks import set_chunk_bytes
from trainers.state.checkpoint import (CorruptCheckpoint, ensure_writable, full_state_dict, load_checkpoint, read_trainer_state,
                                 resume_candidates, save_checkpoint)
from trainers.memory.chunks.states import ChunkedStates, largest_block_tensor
from trainers.config import TrainConfig
from trainers.state.continuation import REFUSED, REPORTED, changed_settings, check_continuation, flat_settings, run_settings
from trainers.loop.data import MicroBatch, StepSampler, check_batch_sizes, micro_batch_seed, pipeline_microbatches
from trainers.parallel.mesh import setup_distributed
from trainers.state.loss_scale import DynamicLossScaler
from trainers.memory.measure import RankMemory, StepMemoryProbe, gather_reports
from trainers.loop.metrics import MetricsSink
from trainers.state.gradients import clip_factor, scale_gradients, total_norm
from trainers.state.optimizer import TrainOptimizer, check_parameter_prefixes
from trainers.parallelize import parallelize, recompute_units
from trainers.pipeline.schedules import check_schedule
from trainers.pipeline.step import build_pipeline, pipeline_passes
from trainers.memory.recompute import RecomputePolicy, uniform_keep
from trainers.state.schedule import warmup_cosine_lr
from trainers.step import accumulate_gradients, gradient_sync, model_loss, to_device
from trainers.strategy import Strategy
from zoo.nn.logits import loss_only
from zoo.plan import model_plan

Batch = Mapping[str, Any]
log = logging.getLogger("trainers")
MEMORY_PROBE_STEP = 1
"""Which step of a `fit` is measured for `memory_report()`: the second it runs (0-based 1), when
optimizer state already exists; the first when it runs only one."""
BUDGET_STEPS_HELD = 2
"""Under a memory budget, steps are measured until this many have stayed within it (the first,
and the second, when optimizer state exists)."""
DEVICE_RERUNS = 2
"""Times a step with chunked states runs again after its forward or backward ran out of device memory."""


class Trainer:
    """Train `model` with `config` under `strategy`.

    Run it under torchrun for several ranks, or as plain python for one; every rank builds the same
    model (or builds it on the meta device) and calls `fit` with the same datasets. Progress goes to
    the "trainers" logger; throughput is counted in examples and, where batches hold `input_ids`, in
    the model's `input_ids_unit` (default "tokens"; "residues" for folding).
    """

    def __init__(self, model: nn.Module, config: TrainConfig, strategy: Strategy | None = None,
                 example_batch: Batch | None = None, anchor: dict[str, torch.Tensor] | None = None) -> None:
        """example_batch: one micro batch, from which a pipeline split (strategy.pp > 1) estimates
        each block's cost (without it the stages balance parameter counts) and a memory budget
        (strategy.memory_budget) plans; give the largest when batches differ in size.
        anchor: where config.anchor_decay pulls parameters back to, whole tensors by parameter name
        (e.g. a pretrained encoder's weights); an anchored parameter it lacks is anchored at its
        value when the trainer is made (a resumed run makes it from the same weights)."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a trainers.TrainConfig; got {type(config).__name__}")
        strategy = Strategy() if strategy is None else strategy
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a trainers.Strategy; got {type(strategy).__name__}")
        self.config, self.strategy = config, strategy
        self.env = setup_distributed(strategy.tp, strategy.pp)
        check_batch_sizes(config.global_batch_size, config.micro_batch_size, self.env.dp_size)
        microbatches = pipeline_microbatches(config.global_batch_size, config.micro_batch_size, self.env.dp_size,
                                             strategy.microbatches)
        if strategy.pp > 1:
            check_schedule(strategy.pp_schedule, strategy.pp, strategy.stages_per_rank, microbatches)
        if config.resume and not config.checkpoint_dir:
            raise ValueError("TrainConfig.resume=True needs TrainConfig.checkpoint_dir; got None")
        self.checkpoint_dir = ensure_writable(config.checkpoint_dir) if config.checkpoint_dir else None
        check_parameter_prefixes(model, config, chunked=strategy.offload == "chunks")
        self.model_class = type(model).__name__
        self.input_ids_unit = getattr(model, "input_ids_unit", "tokens")
        self.budget_plan: BudgetPlan | None = None
        """Under a memory budget, what the trainer chose to hold it (`trainers.estimate.budget`)."""
        self.recompute: RecomputePolicy | None = None
        self._budget_steps_held = 0
        if strategy.memory_budget is not None and strategy.offload != "chunks":
            strategy = self._plan_budget(model, strategy, example_batch)
            self.strategy = strategy
        per_block = strategy.activation_memory is not None or strategy.block_activations is not None
        blocks = model_plan(model).block_names(model)
        if strategy.offload == "chunks" and (per_block or strategy.recompute != "none") and blocks:
            units = recompute_units(model)  # held here: chunked states set how recomputed forwards run
            self.recompute = (block_activation_policy(units) if per_block
                              else RecomputePolicy(uniform_keep(units, strategy.recompute)))
        elif per_block:
            raise ValueError(f"Strategy.activation_memory and Strategy.block_activations choose per block, but "
                             f"{type(model).__name__} declares none (define parallel_plan() returning zoo.plan.ModelPlan)")
        self._activation_blocks = blocks
        """The blocks a per-block activation plan decides for."""
        self.model, self.pipeline_parts = parallelize(model, strategy, self.env, example_batch, microbatches,
                                                      self.recompute)
        self.pipeline = None
        if self.pipeline_parts is not None:
            self.pipeline = build_pipeline(self.pipeline_parts, strategy, self.env, microbatches)
        self.microbatches = microbatches
        self.chunks: ChunkedStates | None = None
        """Under offload="chunks", the model states in chunks (they then run the optimizer)."""
        if strategy.offload == "chunks":
            self.chunks = ChunkedStates(self.model, config, str(Path(strategy.offload_dir) / f"rank{self.env.rank:05d}"),
                                        strategy.memory_budget, self.env.mesh["dp"].get_group(),
                                        largest_block_tensor(self.model), shard=strategy.zero == 3,
                                        swap_min_bytes=(strategy.swap_activations or 0) if per_block
                                        else strategy.swap_activations, **self._device_tier(strategy))
            self.optimizer = None
            if self.recompute is not None:
                self.recompute.recompute_context = self.chunks.parameter_access
        else:
            self.optimizer = TrainOptimizer(
                self.model, config, shard_state=strategy.zero == 1, offload=strategy.offload == "optimizer",
                group=self.env.mesh["dp"].get_group(), anchor=anchor,
            )
        self.block_activations: dict[str, Choice] | None = None
        """Under a per-block activation plan: each block's choice (`trainers.memory.activations.plan`)."""
        self.block_costs: list[BlockCost] | None = None
        """Under Strategy.activation_memory: what the probe measured of each block (rank 0's)."""
        if strategy.block_activations is not None:
            self._apply_block_activations(parse_block_activations(strategy.block_activations, self._activation_blocks))
        self.loss_scaler = DynamicLossScaler() if strategy.precision == "fp16" else None
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self._steps_run = 0
        self._memory: list[dict[str, Any]] | None = None

    # ---------------------------------------------------------------- public API
    def fit(self, train_dataset: Sequence[Batch], eval_dataset: Sequence[Batch] | None = None,
            collate_fn: Callable[[list[Batch]], Batch] | None = None,
            eval_collate_fn: Callable[[list[Batch]], Batch] | None = None) -> list[dict[str, Any]]:
        """Train until `config.max_steps`; return the history of logged records (also written to
        `output_dir/metrics.jsonl`). Resumes from `checkpoint_dir/latest` when `config.resume`.
        Examples are batched by `collate_fn`, the eval set's by `eval_collate_fn` (default: the
        same; another when training batches are augmented)."""
        config, env = self.config, self.env
        collate = collate_fn or default_collate
        sampler = StepSampler(len(train_dataset), config.global_batch_size, config.micro_batch_size,
                              env.dp_size, env.dp_rank, config.seed)
        if eval_dataset is not None and len(eval_dataset) == 0:
            raise ValueError("eval_dataset is empty; pass None to train without evaluation")
        if config.resume:
            self.resume()
        sink = MetricsSink(config.output_dir, active=env.is_main, total_steps=config.max_steps,
                           start_step=self.step, progress=config.progress)
        parameters = self.num_parameters()
        if env.is_main:
            log.info("training %s (%s parameters) on %d rank(s) with %s: steps %d-%d of %d examples (%d a micro "
                     "batch), %d training examples%s", self.model_class, f"{parameters:,}", env.world_size,
                     self.strategy, self.step + 1, config.max_steps, config.global_batch_size,
                     config.micro_batch_size, len(train_dataset),
                     "" if eval_dataset is None else f", {len(eval_dataset)} evaluation examples")
        self.model.train()  # a model fresh from zoo.load is in eval mode
        with sink.routing_logs():
            self._fit_steps(train_dataset, eval_dataset, sampler, collate, eval_collate_fn, sink)
        return self.history

    def _fit_steps(self, train_dataset, eval_dataset, sampler, collate, eval_collate_fn, sink) -> None:
        """The steps of `fit` from `self.step` on: train, evaluate, log, checkpoint."""
        config, unit = self.config, self.input_ids_unit
        try:
            while self.step < config.max_steps:
                started = time.perf_counter()
                micro_batches = sampler.micro_batches(self.step)
                record = self._train_step(lambda: self._seeded_batches(train_dataset, micro_batches, collate),
                                          len(micro_batches))
                record["step_seconds"] = time.perf_counter() - started
                record["examples_per_second"] = config.global_batch_size / record["step_seconds"]
                if unit in record:
                    record[f"{unit}_per_second"] = record[unit] / record["step_seconds"]
                self.step += 1
                last = self.step == config.max_steps
                if eval_dataset is not None and ((config.eval_every and self.step % config.eval_every == 0) or last):
                    record.update(self.evaluate(eval_dataset, collate_fn=eval_collate_fn or collate))
                rate = (f"{record[f'{unit}_per_second']:,.0f} {unit}/s" if unit in record
                        else f"{record['examples_per_second']:,.1f} examples/s")
                memory = f"{record.get('cuda_max_allocated_bytes', record['peak_rss_bytes']) / 2**20:,.0f} MiB"
                if self.step % config.log_every == 0 or last or "eval_loss" in record:
                    self.history.append(record)
                    sink.write(record)
                    if self.env.is_main:
                        log.info("step %d/%d loss %.4f%s lr %.2e grad norm %.3g, %s, %s", self.step, config.max_steps,
                                 record["loss"], f" eval loss {record['eval_loss']:.4f}" if "eval_loss" in record
                                 else "", record["lr"], record["grad_norm"], rate, memory)
                sink.advance({"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}", "rate": rate, "mem": memory})
                if self.checkpoint_dir is not None and ((config.checkpoint_every and self.step % config.checkpoint_every == 0) or last):
                    folder = self.save()
                    if self.env.is_main:
                        log.info("saved checkpoint %s", folder)
        finally:
            sink.close()

    @torch.no_grad()
    def evaluate(self, dataset: Sequence[Batch], collate_fn: Callable[[list[Batch]], Batch] | None = None) -> dict[str, float]:
        """Mean loss over the first `eval_batches x micro_batch_size` examples (the same examples
        whatever the number of ranks, which share them), weighted by examples: {"eval_loss"}."""
        collate = collate_fn or default_collate
        config, env = self.config, self.env
        size = min(len(dataset), config.eval_batches * config.micro_batch_size)
        chunks = [list(range(i, min(i + config.micro_batch_size, size))) for i in range(0, size, config.micro_batch_size)]
        totals = torch.zeros(2, dtype=torch.float64, device=env.device)
        self.model.eval()
        try:
            # Every rank runs the same number of forwards (sharded parameters are gathered
            # collectively); a rank past the end repeats the first chunk with weight 0.
            # Tensor-parallel ranks run the same chunk together.
            for start in range(0, len(chunks), env.dp_size):
                index = start + env.dp_rank
                chunk = chunks[index] if index < len(chunks) else chunks[0]
                weight = len(chunk) if index < len(chunks) else 0
                # Random draws of the examples (crops) depend on the chunk alone, not on the run so far.
                torch.manual_seed(micro_batch_seed(config.seed, -1, index))
                loss = self._loss(to_device(collate([dataset[i] for i in chunk]), env.device))
                totals[0] += loss.double() * weight
                totals[1] += weight
        finally:
            self.model.train()
        dist.all_reduce(totals, group=env.mesh["dp"].get_group())
        return {"eval_loss": (totals[0] / totals[1].clamp(min=1)).item()}

    def num_parameters(self) -> int:
        """Trainable parameters of the whole model (every shard, and a pipeline's tied copies,
        counted once; collective under pipeline parallelism)."""
        if self.chunks is not None:
            return sum(member.param.numel() for member in self.chunks.members)
        if self.pipeline is None:
            return sum(slot.param.numel() for slot in self.optimizer.slots)
        count = torch.tensor(sum(p.numel() for p in self.pipeline_parts.tied.counted(self.optimizer.params)))
        dist.all_reduce(count, group=self.env.mesh["pp"].get_group())
        return int(count)

    def memory_report(self) -> list[dict[str, Any]]:
        """Per rank, bytes of parameters, gradients, optimizer state, other long-lived tensors and
        the activation peak, measured from live tensors during one training step (the second
        `fit` runs; see `MEMORY_PROBE_STEP` and `trainers.memory.measure.RankMemory`). Empty before then,
        under offload="chunks" (whose steps record their disk traffic instead) and without
        `TrainConfig.measure_memory`."""
        return self._memory or []

    def save(self) -> Path:
        """Write a checkpoint of the current step (collective: call on every rank)."""
        if self.checkpoint_dir is None:
            raise ValueError("TrainConfig.checkpoint_dir is not set; there is nowhere to save")
        state = {
            "step": self.step,
            "model_class": self.model_class,
            **run_settings(self.config, self.strategy, self.env.world_size),
            "loss_scaler": asdict(self.loss_scaler) if self.loss_scaler else None,
        }
        return save_checkpoint(self.checkpoint_dir, self.step, self.model, self.chunks or self.optimizer, state,
                               keep=self.config.keep_checkpoints, pipeline=self._pipeline_group)

    def resume(self, folder: str | Path | None = None, *, strict: bool = True) -> bool:
        """Load `folder`, or by default the newest intact checkpoint of `checkpoint_dir`: the one
        `latest` names, else (with a warning for each damaged one) the newest complete older one.
        Returns False when nothing has been saved yet.

        strict: refuse a checkpoint saved under settings that make the rest of the run another
        computation (`trainers.state.continuation.REFUSED`: optimizer, schedule, global batch, seed,
        precision) before loading anything; False loads it anyway and logs the differences. Changes
        that keep the run correct (`REPORTED`: more steps, another world size or ZeRO stage) are logged.
        """
        if folder is None:
            if self.checkpoint_dir is None:
                raise ValueError("TrainConfig.checkpoint_dir is not set; there is nothing to resume")
            candidates = resume_candidates(self.checkpoint_dir)
            if not candidates:
                return False
        else:
            candidates = [Path(folder)]
        damaged = []
        for candidate in candidates:
            try:
                self._check_settings(read_trainer_state(candidate), candidate, strict)
                state = load_checkpoint(candidate, self.model, self.chunks or self.optimizer, self.model_class,
                                        self._pipeline_group)
            except CorruptCheckpoint as error:
                damaged.append(str(error))
                if self.env.is_main and candidate != candidates[-1]:
                    log.warning("%s; falling back to an older checkpoint", error)
                continue
            self.step = int(state["step"])
            if self.loss_scaler is not None and state.get("loss_scaler"):
                self.loss_scaler = DynamicLossScaler(**state["loss_scaler"])
            if self.env.is_main:
                log.info("resumed from %s (step %d)", candidate, self.step)
            return True
        raise CorruptCheckpoint("no intact checkpoint to resume from: " + "; ".join(damaged))

    def _check_settings(self, state: dict[str, Any], folder: Path, strict: bool) -> None:
        """Refuse (strict) or log the settings that changed since the checkpoint was saved."""
        saved = flat_settings(state)
        current = flat_settings(run_settings(self.config, self.strategy, self.env.world_size))
        if strict:
            changes = check_continuation(saved, current, str(folder))
        else:
            changes = changed_settings(saved, current, REFUSED + REPORTED)
        if changes and self.env.is_main:
            log.warning("resuming from %s with changed settings: %s", folder, "; ".join(changes))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The consolidated model state on rank 0's CPU (empty elsewhere), e.g. for `zoo.save`
        (collective: call on every rank)."""
        if self.chunks is not None:
            return self.chunks.state_dict(self.model, keep=self.env.is_main)
        return full_state_dict(self.model, self._pipeline_group)

    @property
    def _pipeline_group(self) -> dist.ProcessGroup | None:
        """This rank's pipeline group when the model is pipelined."""
        return None if self.pipeline is None else self.env.mesh["pp"].get_group()

    # ---------------------------------------------------------------- memory budget
    def _apply_block_activations(self, plan: dict[str, Choice]) -> None:
        apply_block_activations(self.model, plan, self.recompute, self.chunks.swap)
        self.block_activations = plan
        if self.env.is_main:
            counts = {choice: sum(1 for chosen in plan.values() if chosen == choice) for choice in CHOICES}
            log.info("blocks' activations: %s", ", ".join(f"{count} {choice}" for choice, count in counts.items()))

    def _choose_block_activations(self, batch: Batch) -> None:
        """Under Strategy.activation_memory, before the first step: measure the blocks on `batch`
        (one micro batch) and the disk, choose, and apply the same plan on every rank."""
        chunks = self.chunks
        with chunks.access_region():
            costs = measure_blocks(self.model, self._activation_blocks,
                                   lambda: model_loss(self.model, self.model_class, batch), chunks.holds_parameter)
        seconds_per_byte = disk_seconds_per_byte(chunks.swap.directory)
        shared = [costs, choose_block_activations(costs, self.strategy.activation_memory, seconds_per_byte)]
        dist.broadcast_object_list(shared, group=self.env.mesh["dp"].get_group(), group_src=0)
        self.block_costs = shared[0]
        if self.env.is_main:
            log.info("blocks measured (saved MiB, forward ms): %s; disk %.2f s/GiB written and read back",
                     ", ".join(f"{c.name} {c.saved_bytes / 2**20:.1f} {c.forward_seconds * 1e3:.1f}" for c in costs),
                     seconds_per_byte * 2**30)
        self._apply_block_activations(shared[1])

    def _device_tier(self, strategy: Strategy) -> dict[str, Any]:
        """ChunkedStates' device tier: on a GPU under strategy.device_memory_budget (None: the device
        memory free now); off a GPU only when a device budget is given (a pool of host memory)."""
        device, budget = self.env.device, strategy.device_memory_budget
        if device.type == "cuda":
            return {"device": device, "device_budget": budget if budget is not None else torch.cuda.mem_get_info(device)[0]}
        return {} if budget is None else {"device": device, "device_budget": budget}

    def _plan_budget(self, model: nn.Module, strategy: Strategy, example_batch: Batch | None) -> Strategy:
        """Plan for strategy.memory_budget on rank 0 and apply the plan on every rank: the
        strategy to parallelise with (returned), the recompute policy, the chunk sizes."""
        if example_batch is None:
            raise ValueError("Strategy.memory_budget needs Trainer(example_batch=...): one micro batch (the largest) "
                             "to plan the step's memory with; got None")
        outcome: list[Any] = [None]
        if self.env.rank == 0:
            try:
                outcome[0] = fit_budget(model, example_batch, strategy, self.env.world_size, self.config,
                                        self.env.device)
            except Exception as error:  # every rank raises it, rather than waiting for rank 0
                outcome[0] = error
        dist.broadcast_object_list(outcome, src=0)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        plan = self.budget_plan = outcome[0]
        if self.env.is_main:
            log.info("memory budget %s per rank: %s. Candidates traced: %s", f"{strategy.memory_budget / 2**20:,.1f} MiB",
                     plan.describe(), "; ".join(plan.tried))
        set_chunk_bytes(model, plan.chunk_bytes)
        self.recompute = RecomputePolicy(plan.keep)
        return replace(plan.strategy, memory_budget=strategy.memory_budget)

    def _hold_budget(self, report: RankMemory) -> int:
        """After a measured step: when the largest peak over the ranks (returned) went over the
        budget, tighten what the blocks keep or the chunks for the next steps (the same on every rank)."""
        measured = report.cuda_max_allocated if report.cuda_max_allocated is not None else report.peak
        peak = torch.tensor(float(measured), device=self.env.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        peak, budget = int(peak.item()), self.strategy.memory_budget
        if peak <= budget:
            self._budget_steps_held += 1
            if self.env.is_main:
                log.info("step %d held %s of the %s memory budget", self.step + 1, f"{peak / 2**20:,.1f} MiB",
                         f"{budget / 2**20:,.1f} MiB")
            return peak
        change = tighten(self.budget_plan, self.recompute, self.model, peak)
        if self.env.is_main:
            log.warning("step %d peaked at %s, over the %s memory budget: %s", self.step + 1,
                        f"{peak / 2**20:,.1f} MiB", f"{budget / 2**20:,.1f} MiB", change)
        return peak

    # ---------------------------------------------------------------- one step
    def _loss(self, batch: dict[str, Any]) -> torch.Tensor:
        if self.pipeline is not None:
            with loss_only():
                return self.pipeline.evaluate(batch)
        with self.chunks.access_region() if self.chunks is not None else nullcontext():
            return model_loss(self.model, self.model_class, batch)

    def _seeded_batches(self, dataset: Sequence[Batch], micro_batches: list[MicroBatch],
                        collate: Callable[[list[Batch]], Batch]) -> Iterator[Batch]:
        """Each micro batch fetched and collated as the step consumes it, after seeding torch's
        generator from its place in the global batch, so its draws in the dataset, the collate
        function and the forward pass do not depend on the number of ranks."""
        for micro in micro_batches:
            torch.manual_seed(micro_batch_seed(self.config.seed, self.step, micro.index))
            yield collate([dataset[i] for i in micro.examples])

    def _train_step(self, make_batches: Callable[[], Iterator[Batch]], accumulation: int) -> dict[str, Any]:
        """One optimizer step over the micro batches `make_batches()` yields (seeded as they are drawn)."""
        config, env = self.config, self.env
        follow_step = getattr(self.model, "set_training_step", None)
        if follow_step is not None:  # the model's own schedules (a loss warm-up) follow the optimizer step
            follow_step(self.step)
        probe = None
        last = self.step == config.max_steps - 1
        measure = (config.measure_memory and self._memory is None and (self._steps_run == MEMORY_PROBE_STEP or last)
                   and self.chunks is None)
        hold = self.budget_plan is not None and self._budget_steps_held < BUDGET_STEPS_HELD
        if measure or hold:
            probe = StepMemoryProbe(self.model, self.optimizer.inner, self.optimizer.kept_tensors(), env.device)
        if self.chunks is not None:
            record = self._chunked_step(make_batches, accumulation)
        else:
            with probe or nullcontext():
                record = self._forward_backward_step(make_batches(), accumulation, probe)
        if probe is not None:
            report = probe.report(env.rank)
            if measure:
                self._memory = gather_reports(report)
            if hold:  # the largest over the ranks, in the step's record
                record["measured_peak_bytes"] = self._hold_budget(report)
        self._steps_run += 1
        return record

    def _forward_backward_step(self, batches: Iterator[Batch], accumulation: int,
                               probe: StepMemoryProbe | None) -> dict[str, Any]:
        config, env = self.config, self.env
        scale = self.loss_scaler.scale if self.loss_scaler else 1.0
        if self.pipeline is not None:
            loss_sum, units = pipeline_passes(self.pipeline, self.pipeline_parts,
                                              (to_device(b, env.device) for b in batches), accumulation,
                                              self.microbatches, scale, env.device)
        else:
            loss_sum, units = accumulate_gradients(self.model, self.model_class, (to_device(b, env.device) for b in batches),
                                                   gradient_sync(self.model, self.strategy), accumulation, scale)
        if probe is not None:
            probe.after_backward()

        params = self.optimizer.params
        grads = [p.grad for p in params if p.grad is not None]
        scale_gradients(grads, 1.0 / scale)
        if self.pipeline is None:
            grad_norm = total_norm(grads)
        else:
            counted = self.pipeline_parts.tied.counted(params)
            grad_norm = total_norm([p.grad for p in counted if p.grad is not None], across=env.mesh["pp"].get_group())
        take_step = self.loss_scaler.update(grad_norm) if self.loss_scaler else math.isfinite(grad_norm)
        lr = warmup_cosine_lr(self.step, config)
        if take_step:
            scale_gradients(grads, clip_factor(grad_norm, config.grad_clip))
            self.optimizer.step(lr)
        self.optimizer.zero_grad()
        return self._step_record(loss_sum, units, accumulation, lr, grad_norm, take_step)

    def _chunked_step(self, make_batches: Callable[[], Iterator[Batch]], accumulation: int) -> dict[str, Any]:
        """One step with the model states in chunks (`trainers.memory.chunks.states`). A step whose forward
        or backward runs out of device memory runs again from its first micro batch, with more of the
        device budget left to the allocator, up to `DEVICE_RERUNS` times (where
        `ChunkedStates.can_rerun_step`)."""
        chunks, config = self.chunks, self.config
        batches = make_batches()
        if self.block_activations is None and self.strategy.activation_memory is not None:
            first = next(batches)  # drawn (and its random state seeded) as the step would
            batches = itertools.chain([first], batches)
            self._choose_block_activations(to_device(first, self.env.device))
        read, written, ahead = chunks.store.bytes_read, chunks.store.bytes_written, chunks.store.bytes_prefetched
        device = chunks.device
        up, down, up_ahead = (device.bytes_up, device.bytes_down, device.bytes_ahead) if device is not None else (0, 0, 0)
        allocated, retried = (device.allocations, device.out_of_memory_retries) if device is not None else (0, 0)
        on_device, on_host = chunks.updates_on_device, chunks.updates_on_host
        swapped = chunks.swap.bytes_written if chunks.swap is not None else 0
        for rerun in itertools.count():
            backward_done = False
            try:
                with chunks.step_region():
                    loss_sum, units = accumulate_gradients(self.model, self.model_class,
                                                           (to_device(b, self.env.device) for b in batches),
                                                           chunks.begin_micro_batch, accumulation, 1.0)
                    grad_norm = chunks.finish_backward()
                    backward_done = True
                    take_step = math.isfinite(grad_norm)
                    lr = warmup_cosine_lr(self.step, config)
                    if take_step:
                        chunks.step(lr, clip_factor(grad_norm, config.grad_clip))
                    else:
                        chunks.discard_gradients()
                break
            except torch.OutOfMemoryError:
                if backward_done or rerun == DEVICE_RERUNS or not chunks.can_rerun_step():
                    raise
            # Out of the `except` clause: the failed pass's tensors, which its traceback held, are freed.
            for param in self.model.parameters():
                param.grad = None
            chunks.prepare_rerun()
            log.warning("step %d ran out of device memory; running it again with %s bytes of the device budget left "
                        "to the allocator", self.step + 1, f"{chunks.allocator_slack:,}")
            batches = make_batches()
        record = self._step_record(loss_sum, units, accumulation, lr, grad_norm, take_step)
        record["device_step_reruns"] = rerun
        record["offload_read_bytes"] = chunks.store.bytes_read - read
        record["offload_written_bytes"] = chunks.store.bytes_written - written
        record["offload_read_ahead_bytes"] = chunks.store.bytes_prefetched - ahead
        if chunks.swap is not None:
            record["swapped_activation_bytes"] = chunks.swap.bytes_written - swapped
        if device is not None:
            record["device_up_bytes"] = device.bytes_up - up
            record["device_down_bytes"] = device.bytes_down - down
            record["device_up_ahead_bytes"] = device.bytes_ahead - up_ahead
            record["device_updated_chunks"] = chunks.updates_on_device - on_device
            record["host_updated_chunks"] = chunks.updates_on_host - on_host
            record["device_allocated_chunks"] = device.allocations - allocated
            record["device_out_of_memory_retries"] = device.out_of_memory_retries - retried
        return record

    def _step_record(self, loss_sum: torch.Tensor, units: int, accumulation: int, lr: float, grad_norm: float,
                     take_step: bool) -> dict[str, Any]:
        """The logged record of a step whose losses summed to `loss_sum` on this rank."""
        env = self.env
        dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        record = {
            "step": self.step + 1,
            "loss": loss_sum.item() / accumulation,
            "lr": lr,
            "grad_norm": grad_norm,
            "skipped": not take_step,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        if units:
            record[self.input_ids_unit] = units * env.dp_size
        if self.loss_scaler:
            record["loss_scale"] = self.loss_scaler.scale
        if env.device.type == "cuda":
            record["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        return record
