"""`Trainer`: runs any model whose `forward(**batch)` returns {"loss": scalar, ...} under a `Strategy`."""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import default_collate

from trainers.state.adapter import first_step_check, prepare_adapter, write_adapter
from trainers.config import TrainConfig
from trainers.estimate.held_budget import HeldBudget
from trainers.loop.data import StepSampler, check_batch_sizes, largest_micro_batch, pipeline_microbatches, seeded_batches
from trainers.loop.evaluation import evaluation_loss
from trainers.loop.metrics import MetricsSink, step_record
from trainers.loop.sources import fit_examples, planning_examples, size_of
from trainers.loop.throughput import Throughput
from trainers.memory.activations.plan import BlockActivations, chunked_recompute_policy, parse_block_activations
from trainers.memory.chunks.states import chunked_states
from trainers.memory.chunks.step import chunked_step
from trainers.memory.measure import StepMemoryProbe, gather_reports
from trainers.memory.recompute import RecomputePolicy
from trainers.parallel.mesh import setup_distributed
from trainers.parallelize import COMPUTE_DTYPES, parallelize
from trainers.pipeline.schedules import check_schedule
from trainers.pipeline.step import build_pipeline, pipeline_parameter_count, pipeline_passes
from trainers.state.checkpoint import (ensure_writable, full_state_dict, load_checkpoint, load_newest_intact,
                                       read_trainer_state, resume_candidates, save_checkpoint)
from trainers.state.continuation import check_resumed, run_settings
from trainers.state.gradients import clip_factor, scale_gradients, total_norm
from trainers.state.loss_scale import DynamicLossScaler
from trainers.state.optimizer import TrainOptimizer, check_parameter_prefixes
from trainers.state.schedule import warmup_cosine_lr
from trainers.step import SkippedSteps, accumulate_gradients, gradient_sync, model_loss, to_device
from trainers.strategy import Strategy
from zoo.nn.cross_entropy import loss_gradients
from zoo.nn.logits import loss_only
from zoo.plan import model_plan

Batch = Mapping[str, Any]
log = logging.getLogger("trainers")
MEMORY_PROBE_STEP = 1
"""Which step of a `fit` is measured for `memory_report()`: the second it runs (0-based 1), when
optimizer state already exists; the first when it runs only one."""


class Trainer:
    """Train `model` with `config` under `strategy`.

    Run it under torchrun for several ranks, or as plain python for one; every rank builds the same
    model (or builds it on the meta device) and calls `fit` with the same datasets. Progress goes to
    the "trainers" logger; throughput is counted in examples and, where batches hold `input_ids`, in
    the model's `input_ids_unit` (default "tokens"; "residues" for folding).

    `close()`, or leaving `with Trainer(...) as trainer:`, removes the chunk files of offload="chunks"
    (else removed at exit, `trainers.parallel.mesh.exit_process`'s too).
    """

    def __init__(self, model: nn.Module, config: TrainConfig, strategy: Strategy | None = None,
                 example_batch: Batch | None = None, anchor: dict[str, torch.Tensor] | None = None) -> None:
        """example_batch: one micro batch, from which a pipeline split (strategy.pp > 1) estimates
        each block's cost (without it the stages balance parameter counts) and a memory budget
        (strategy.memory_budget) plans; without it a memory budget plans at `fit`, for the training
        set's largest micro batch (`trainers.loop.data.largest_micro_batch`), and the model is
        parallelised then.
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
        self.env = setup_distributed(strategy.tp, strategy.pp, strategy.ep)
        check_batch_sizes(config.global_batch_size, config.micro_batch_size, self.env.dp_size)
        if config.resume and not config.checkpoint_dir:
            raise ValueError("TrainConfig.resume=True needs TrainConfig.checkpoint_dir; got None")
        self.checkpoint_dir = ensure_writable(config.checkpoint_dir) if config.checkpoint_dir else None
        self.adapted = prepare_adapter(model, config, strategy, self.env.is_main)  # the adapted modules' names
        check_parameter_prefixes(model, config, chunked=strategy.offload == "chunks")
        self.model_class = type(model).__name__
        self.input_ids_unit = getattr(model, "input_ids_unit", "tokens")
        self.budget: HeldBudget | None = None
        """Under a memory budget, what the trainer chose to hold it (`trainers.estimate.held_budget`)."""
        self.recompute: RecomputePolicy | None = None
        self.pipeline, self.chunks = None, None
        """The pipeline (strategy.pp > 1); the model states in chunks (offload="chunks"; they run the optimizer)."""
        self._unbuilt: tuple[nn.Module, dict[str, torch.Tensor] | None] | None = (model, anchor)
        """The model (and anchor) until parallelised: at `fit` when a memory budget plans from the training set."""
        if example_batch is not None or strategy.memory_budget is None or strategy.offload == "chunks":
            self._build(example_batch)
        self.loss_scaler = DynamicLossScaler() if strategy.precision == "fp16" else None
        self.skipped = SkippedSteps(config.max_skipped_steps, log_skips=self.env.is_main)
        self.throughput = Throughput(config.global_batch_size, self.input_ids_unit, self.env.device, COMPUTE_DTYPES[strategy.precision] or torch.float32)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self._steps_run = 0
        self._memory: list[dict[str, Any]] | None = None

    def _build(self, example_batch: Batch | None) -> None:
        """Plan a memory budget for `example_batch` (lowering `config.micro_batch_size` where it has
        to), then parallelise the model and make its optimizer (or chunked states)."""
        (model, anchor), self._unbuilt = self._unbuilt, None
        strategy, config = self.strategy, self.config
        if strategy.memory_budget is not None and strategy.offload != "chunks":
            self.budget, strategy, config = HeldBudget.plan_on_rank0(model, example_batch, strategy, config,
                                                                     self.env.device)
            self.strategy, self.config, self.recompute = strategy, config, self.budget.recompute
        microbatches = pipeline_microbatches(config.global_batch_size, config.micro_batch_size, self.env.dp_size,
                                             strategy.microbatches)
        if strategy.pp > 1:
            check_schedule(strategy.pp_schedule, strategy.pp, strategy.stages_per_rank, microbatches)
        per_block = strategy.activation_memory is not None or strategy.block_activations is not None
        if strategy.offload == "chunks":  # held here: chunked states set how recomputed forwards run
            self.recompute = chunked_recompute_policy(model, strategy.recompute, per_block)
        blocks = model_plan(model).block_names(model)  # those a per-block activation plan decides for
        self._model, self.pipeline_parts, self.partial_gradients = parallelize(
            model, strategy, self.env, example_batch, microbatches, self.recompute)
        if self.pipeline_parts is not None:
            self.pipeline = build_pipeline(self.pipeline_parts, strategy, self.env, microbatches)
        self.microbatches = microbatches
        if strategy.offload == "chunks":
            self.chunks = chunked_states(self.model, config, strategy, self.env.rank, self.env.mesh["dp"].get_group(),
                                         self.env.device)
            self.optimizer = None
            if self.recompute is not None:
                self.recompute.recompute_context = self.chunks.parameter_access
        else:
            self.optimizer = TrainOptimizer(self.model, config, offload=strategy.offload == "optimizer", anchor=anchor)
        self.block_activations = (BlockActivations(self.model, blocks, self.recompute, self.chunks.swap,
                                                   self.env.is_main) if per_block else None)
        """Under a per-block activation plan, each block's choice (`trainers.memory.activations.plan`)."""
        if strategy.block_activations is not None:
            self.block_activations.apply(parse_block_activations(strategy.block_activations, blocks))

    def close(self) -> None:
        """Remove the chunk files of offload="chunks", whose states cannot be read after (a checkpoint can)."""
        if self.chunks is not None:
            self.chunks.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *_exception) -> None:
        self.close()

    @property
    def model(self) -> nn.Module:
        """The model as parallelised; RuntimeError before `fit` where a memory budget plans there."""
        if self._unbuilt is not None:
            raise RuntimeError("Strategy.memory_budget without Trainer(example_batch=...) plans and parallelises the "
                               "model at fit, for the training set's largest micro batch; call fit first")
        return self._model

    # ---------------------------------------------------------------- public API
    def fit(self, train_dataset: Sequence[Batch] | Any, eval_dataset: Sequence[Batch] | Any | None = None,
            collate_fn: Callable[[list[Batch]], Batch] | None = None,
            eval_collate_fn: Callable[[list[Batch]], Batch] | None = None) -> list[dict[str, Any]]:
        """Train until `config.max_steps`; return the history of logged records (also written to
        `output_dir/metrics.jsonl`). Resumes from `checkpoint_dir/latest` when `config.resume`.
        Either set may be a `datasets.Dataset` or a stream (`trainers.loop.sources`). Examples are batched
        by `collate_fn`, the eval set's by `eval_collate_fn` (default: the same; another for augmented ones)."""
        collate = collate_fn or default_collate
        train_dataset, eval_dataset = fit_examples(train_dataset, eval_dataset, self.config)
        if self._unbuilt is not None:  # a memory budget plans for the training set's largest micro batch
            self._build(largest_micro_batch(planning_examples(train_dataset, self.config.global_batch_size),
                                            self.config.micro_batch_size, collate) if self.env.is_main else None)
        config, env = self.config, self.env
        sampler = StepSampler(size_of(train_dataset), config.global_batch_size, config.micro_batch_size,
                              env.dp_size, env.dp_rank, config.seed)
        if config.resume:
            self.resume()
        sink = MetricsSink(config.output_dir, active=env.is_main, total_steps=config.max_steps,
                           start_step=self.step, progress=config.progress)
        parameters = self.num_parameters()
        if env.is_main:
            log.info("training %s (%s parameters) on %d rank(s) with %s: steps %d-%d of %d examples (%d a micro "
                     "batch), %s training examples%s", self.model_class, f"{parameters:,}", env.world_size, self.strategy,
                     self.step + 1, config.max_steps, config.global_batch_size, config.micro_batch_size,
                     size_of(train_dataset) or "a stream of", "" if eval_dataset is None else f", {len(eval_dataset)} evaluation examples")
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
                record = self._train_step(lambda: seeded_batches(
                    train_dataset, micro_batches, collate, config.seed, self.step), len(micro_batches))
                self.throughput.complete(record, time.perf_counter() - started)
                self.step += 1
                last = self.step == config.max_steps
                if eval_dataset is not None and ((config.eval_every and self.step % config.eval_every == 0) or last):
                    record.update(self.evaluate(eval_dataset, collate_fn=eval_collate_fn or collate))
                logged = self.step % config.log_every == 0 or last or "eval_loss" in record
                if logged:
                    self.history.append(record)
                sink.advance(record, unit, config.max_steps, logged)
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
        self.model.eval()
        try:
            loss = evaluation_loss(self._loss, dataset, collate_fn or default_collate, self.config, self.env)
        finally:
            self.model.train()
        return {"eval_loss": loss}

    def num_parameters(self) -> int:
        """Trainable parameters of the whole model (every shard, and a pipeline's tied copies,
        counted once; collective under pipeline parallelism)."""
        if self._unbuilt is not None:
            return sum(p.numel() for p in self._unbuilt[0].parameters())
        if self.chunks is not None:
            return sum(member.param.numel() for member in self.chunks.members)
        if self.pipeline is None:
            return sum(slot.param.numel() for slot in self.optimizer.slots)
        return pipeline_parameter_count(self.pipeline_parts, self.optimizer.params, self.env)

    def memory_report(self) -> list[dict[str, Any]]:
        """Per rank, bytes of parameters, gradients, optimizer state, other long-lived tensors and the activation
        peak, measured from live tensors in one step (the second `fit` runs: `MEMORY_PROBE_STEP`, `RankMemory`),
        with its FLOPs and the last MFU (`trainers.loop.throughput`). Empty before then, under offload="chunks"
        (whose steps record their disk traffic) and without `TrainConfig.measure_memory`."""
        return [{**report, **self.throughput.figures()} for report in self._memory or []]

    def save(self) -> Path:
        """Write a checkpoint of the current step (collective: call on every rank)."""
        if self.checkpoint_dir is None:
            raise ValueError("TrainConfig.checkpoint_dir is not set; there is nowhere to save")
        state = {"step": self.step, "model_class": self.model_class, **run_settings(self.config, self.strategy,
                 self.env.world_size), "loss_scaler": asdict(self.loss_scaler) if self.loss_scaler else None}
        return save_checkpoint(self.checkpoint_dir, self.step, self.model, self.chunks or self.optimizer, state,
                               keep=self.config.keep_checkpoints, pipeline=self._pipeline_group)

    def resume(self, folder: str | Path | None = None, *, strict: bool = True) -> bool:
        """Load `folder`, or by default the newest intact checkpoint of `checkpoint_dir`: the one
        `latest` names, else (with a warning for each that fails its integrity check) the newest
        intact older one (`trainers.state.checkpoint.load_newest_intact`). Returns False when nothing
        has been saved yet.

        strict: refuse a checkpoint saved under settings that make the rest of the run another
        computation (`trainers.state.continuation.REFUSED`: optimizer, schedule, global batch, seed,
        precision) before loading anything; False loads it anyway. Every change is logged."""
        candidates = resume_candidates(self.checkpoint_dir) if folder is None else [Path(folder)]
        if not candidates:
            return False

        def load(candidate: Path) -> dict[str, Any]:
            check_resumed(read_trainer_state(candidate), run_settings(self.config, self.strategy, self.env.world_size),
                          str(candidate), strict, self.env.is_main)
            return load_checkpoint(candidate, self.model, self.chunks or self.optimizer, self.model_class,
                                   self._pipeline_group)

        candidate, state = load_newest_intact(candidates, load)
        self.step = int(state["step"])
        if self.loss_scaler is not None and state.get("loss_scaler"):
            self.loss_scaler = DynamicLossScaler(**state["loss_scaler"])
        if self.env.is_main:
            log.info("resumed from %s (step %d)", candidate, self.step)
        return True

    def save_adapter(self, folder: str | Path) -> None:
        """Write `config.adapter`'s adapters to `folder` in PEFT's format (collective; rank 0 writes)."""
        state = self.full_state_dict()
        if self.env.is_main:
            write_adapter(folder, state, self.config, self.adapted, self.model_class)

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

    # ---------------------------------------------------------------- one step
    def _loss(self, batch: dict[str, Any]) -> torch.Tensor:
        if self.pipeline is not None:
            with loss_only():
                return self.pipeline.evaluate(batch)
        with self.chunks.access_region() if self.chunks is not None else nullcontext():
            return model_loss(self.model, self.model_class, batch)

    def _train_step(self, make_batches: Callable[[], Iterator[Batch]], accumulation: int) -> dict[str, Any]:
        """One optimizer step over the micro batches `make_batches()` yields (seeded as they are drawn)."""
        config, env = self.config, self.env
        follow_step = getattr(self.model, "set_training_step", None)
        if follow_step is not None:  # the model's own schedules (a loss warm-up) follow the optimizer step
            follow_step(self.step)
        probe, last = None, self.step == config.max_steps - 1
        measure = (config.measure_memory and self._memory is None and (self._steps_run == MEMORY_PROBE_STEP or last)
                   and self.chunks is None)
        hold = self.budget is not None and self.budget.measuring
        if measure or hold:
            probe = StepMemoryProbe(self.model, self.optimizer.inner, self.optimizer.kept_tensors(), env.device)
        with self.throughput.counting(self._steps_run == MEMORY_PROBE_STEP or last), \
                loss_gradients(self.strategy.loss_gradients), first_step_check(self.model, self.adapted, self._steps_run):
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
                record["measured_peak_bytes"] = self.budget.hold(report, self.step + 1, env.device)
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
        self.partial_gradients.sum()
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
        self.skipped.record(self.step + 1, grad_norm, take_step, self.loss_scaler and self.loss_scaler.scale)
        return self._step_record(loss_sum, units, accumulation, lr, grad_norm, take_step)

    def _chunked_step(self, make_batches: Callable[[], Iterator[Batch]], accumulation: int) -> dict[str, Any]:
        """One step with the model states in chunks (`trainers.memory.chunks.step`); before the first
        under Strategy.activation_memory, the blocks' activation plan chosen on its first micro batch."""
        batches = make_batches()
        plan = self.block_activations
        if plan is not None and plan.choices is None:  # under Strategy.activation_memory
            first = to_device(next(batches), self.env.device)  # drawn (and its random state seeded) as the step would
            batches = itertools.chain([first], batches)
            with self.chunks.access_region():
                plan.choose(lambda: model_loss(self.model, self.model_class, first), self.chunks.holds_parameter,
                            self.strategy.activation_memory, self.env.mesh["dp"].get_group())
        draws = itertools.chain([batches], (make_batches() for _ in itertools.count()))
        chunks, device, lr = self.chunks, self.env.device, warmup_cosine_lr(self.step, self.config)
        loss_sum, units, grad_norm, take_step, traffic = chunked_step(
            chunks, self.model, self.step,
            lambda drawn: accumulate_gradients(self.model, self.model_class, (to_device(b, device) for b in drawn),
                                               chunks.begin_micro_batch, accumulation, 1.0),
            lambda: next(draws), lr, self.config.grad_clip)
        self.skipped.record(self.step + 1, grad_norm, take_step)
        return {**self._step_record(loss_sum, units, accumulation, lr, grad_norm, take_step), **traffic}

    def _step_record(self, loss_sum: torch.Tensor, units: int, accumulation: int, lr: float, grad_norm: float,
                     take_step: bool) -> dict[str, Any]:
        return step_record(self.step + 1, loss_sum, accumulation, lr, grad_norm, take_step,
                           (self.input_ids_unit, units * self.env.dp_size) if units else None,
                           self.loss_scaler.scale if self.loss_scaler else None, self.env.device)
