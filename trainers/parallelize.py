"""Apply a `Strategy` to a model: the pipeline split first, then tensor parallelism, then expert
parallelism, then recompute, then torch.compile, then data parallelism (FSDP2 on the "dp" mesh
dimension, per pipeline stage; the routed experts' on "edp"), then materialise; an unpipelined
tensor-parallel model's first forward then proves the plan covers every parameter that meets a
shard (`trainers.parallel.shard_trace`).

Every ZeRO stage is built on FSDP2's DTensor parameters, so checkpoints, mixed precision and CPU
offload work the same way at every stage:
- zero 0: `replicate` (FSDP2's data-parallel twin: full parameters, all-reduced gradients).
- zero 1 and 2: `fully_shard(reshard_after_forward=False)`: optimizer state sharded, parameters
  kept gathered from forward to backward. Stage 2 reduce-scatters the gradients after every
  micro batch, keeping only a shard; stage 1 accumulates whole gradients and keeps the parameters
  gathered over a step's micro batches, then reduce-scatters once (`trainers.step.gradient_sync`):
  one all-gather and one reduce-scatter of the parameters a step, whatever the accumulation.
- zero 3: `fully_shard(reshard_after_forward=True)`: parameters sharded outside their block's
  forward and backward as well.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from trainers.speed.compile import apply_compile
from trainers.parallel.experts import apply_expert_parallel
from trainers.parallel.scalars import average_scalar_gradients
from trainers.parallel.mesh import DistEnv
from trainers.pipeline.split import PipelineLayout, TiedCopies, build_stages, split_for_pipeline
from trainers.pipeline.stage import StageModule
from trainers.memory.recompute import RecomputePolicy, apply_recompute, uniform_keep
from trainers.strategy import Strategy
from trainers.parallel.shard_trace import ShardProof
from trainers.parallel.unused import EveryParameterTakesPart
from trainers.parallel.tensor import PartialGradients, apply_tensor_parallel, check_plan
from zoo.library_training import for_training
from zoo.plan import model_plan, resolve
from zoo.torch_compat import replicate

log = logging.getLogger("trainers")
COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

@dataclass
class PipelineParts:
    """A pipelined model's pieces on this rank."""

    layout: PipelineLayout
    stages: list[StageModule]
    """This rank's stages, ascending; each is an FSDP root over its blocks."""
    tied: TiedCopies


def trains(module: nn.Module) -> bool:
    """Whether any parameter of `module` trains. A block with none is left to its parent's
    data-parallel unit: as a unit of its own it would be gathered and reduced for nothing, and one
    that a forward skips (a frozen encoder whose outputs were computed once, beforehand) would
    fail FSDP2's post-backward, which expects every unit it wrapped to have run."""
    return any(p.requires_grad for p in module.parameters())


def parallelize(model: nn.Module, strategy: Strategy, env: DistEnv, example_batch: Mapping[str, Any] | None = None,
                microbatches: int = 1, recompute: RecomputePolicy | None = None, checks: bool = True,
                ) -> tuple[nn.Module, PipelineParts | None, PartialGradients]:
    """Apply `strategy` to `model` in place; return it (under pipeline parallelism pruned to this
    rank's stages), when strategy.pp > 1 its `PipelineParts`, and the parameters whose gradients
    tensor parallelism leaves in part on each rank (summed after each step's backward passes). The pipeline split balances
    the stages' costs on `example_batch` (one micro batch; None balances parameter counts), with
    `microbatches` per optimizer step spreading the optimizer's cost. `recompute`, when given,
    decides what each block keeps instead of strategy.recompute (a memory budget's per-operator choice).
    `checks`: the run-time checks that exchange data between the ranks, each training forward (which
    FSDP2 units run: `trainers.parallel.unused`) or the first (the tensor-parallel proof:
    `trainers.parallel.shard_trace`); the estimator, whose ranks are traced one by one, runs neither.

    A model built on the meta device is materialised after sharding, each rank allocating only its
    shard, then initialised by its `init_weights()` method."""
    for change in for_training(model):
        log.info(change)
    plan, model_class = model_plan(model), type(model).__name__
    layout = None
    if strategy.pp > 1:
        if strategy.tp > 1:
            check_plan(model, plan, strategy.tp, strategy.sequence_parallel)  # on the whole model
        layout = split_for_pipeline(model, plan, strategy, env, example_batch, microbatches)
        plan = plan.present_in(model)
        block_names = [name for stage in layout.local_stages for name in layout.stage_modules(stage)[0]]
    else:
        block_names = plan.block_names(model)
    proof_names = None  # the plan's names before any wrapper, for the proof of the tensor-parallel invariant
    if checks and strategy.tp > 1 and layout is None:
        proof_names = check_plan(model, plan, strategy.tp, strategy.sequence_parallel)
    if strategy.tp > 1:
        partial_gradients = apply_tensor_parallel(model, plan, env.mesh["tp"], strategy.sequence_parallel, whole=layout is None)
    else:
        partial_gradients = PartialGradients([], None)
    experts = []  # the experts modules sharded over "ep", whose ZeRO runs over "edp"
    if strategy.ep > 1:
        experts = apply_expert_parallel(model, plan, env.expert_mesh["ep", "tp"] if strategy.tp > 1 else env.expert_mesh["ep"])
    elif strategy.tp > 1:
        apply_expert_parallel(model, plan, env.mesh["tp"])
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta and not callable(getattr(model, "init_weights", None)):
        raise ValueError(
            f"model {type(model).__name__} was built on the meta device but has no init_weights() "
            "method to materialise its parameters after sharding"
        )
    units = block_names + resolve(model, plan.recompute, "recompute")
    if recompute is None and strategy.recompute != "none":
        if not block_names:
            raise ValueError(
                f"Strategy.recompute={strategy.recompute!r} needs blocks to recompute, but "
                f"{type(model).__name__} declares none (define parallel_plan() returning zoo.plan.ModelPlan)"
            )
        recompute = RecomputePolicy(uniform_keep(units, strategy.recompute))
    if recompute is not None:
        missing = sorted(set(units) - set(recompute.keep))
        if missing:
            raise ValueError(f"the recompute policy names no choice for recompute units {missing[:3]}")
        apply_recompute(model, recompute, units)
    apply_compile(model, strategy, block_names, recompute)
    if strategy.offload == "chunks":  # one data-parallel layout, the chunks' (trainers.memory.chunks.states)
        return model, None, partial_gradients

    common = dict(
        mesh=env.mesh["dp"],
        mp_policy=MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPES[strategy.precision], reduce_dtype=torch.float32),
        offload_policy=(
            CPUOffloadPolicy(pin_memory=env.device.type == "cuda") if strategy.offload == "params" else OffloadPolicy()
        ),
    )
    if strategy.zero == 0:
        wrap = partial(replicate, **common)
    else:
        wrap = partial(fully_shard, reshard_after_forward=strategy.zero == 3, **common)
    stages = [] if layout is None else build_stages(model, layout)
    whole = set().union(*(average_scalar_gradients(root, env.mesh["dp"].get_group()) for root in stages or [model]))
    if strategy.zero < 3:  # frozen parameters stay whole: nothing of theirs to reduce, shard or gather
        whole |= {param for param in model.parameters() if not param.requires_grad}
    for name in experts:  # ZeRO over the ranks that hold the same experts
        wrap(model.get_submodule(name), ignored_params=whole, mesh=env.expert_mesh["edp"])
    for name in block_names:
        if trains(model.get_submodule(name)):
            wrap(model.get_submodule(name), ignored_params=whole)
    for root in stages or [model]:
        wrap(root, ignored_params=whole)
    if checks and layout is None:  # FSDP2 reduces only the gradients each rank has
        trained = {name: model.get_submodule(name) for name in block_names if trains(model.get_submodule(name))}
        recomputed = [name for name in units if name not in block_names]
        EveryParameterTakesPart(model, trained, env.mesh["dp"].get_group(), [*experts, *recomputed])

    if on_meta:
        model.to_empty(device="cpu" if strategy.offload == "params" else env.device)
        with torch.no_grad():
            model.init_weights()
    if layout is None:
        if proof_names is not None:  # after FSDP2's hooks, which give modules their gathered parameters
            ShardProof(model, proof_names, strategy.sequence_parallel, model_class)
        return model, None, partial_gradients
    tied = TiedCopies(model, layout, env)
    if on_meta:
        tied.sync_values()
    return model, PipelineParts(layout, stages, tied), partial_gradients
