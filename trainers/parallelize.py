"""Apply a `Strategy` to a model: the pipeline split first, then tensor parallelism, then
recompute, then data parallelism (FSDP2 on the "dp" mesh dimension, per pipeline stage), then
materialise.

Every ZeRO stage is built on FSDP2's DTensor parameters, so checkpoints, mixed precision and CPU
offload work the same way at every stage:
- zero 0 and 1: `replicate` (FSDP2's data-parallel twin: full parameters, all-reduced gradients);
  stage 1 adds the state-sharded optimizer of `trainers.optim`.
- zero 2: `fully_shard(reshard_after_forward=False)`: gradients and optimizer state sharded,
  parameters kept gathered from forward to backward.
- zero 3: `fully_shard(reshard_after_forward=True)`: parameters sharded outside their block's
  forward and backward as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from trainers.distributed import DistEnv
from trainers.pipeline_parallel import PipelineLayout, TiedCopies, build_stages, split_for_pipeline
from trainers.pipeline_stage import StageModule
from trainers.strategy import Strategy
from trainers.tensor_parallel import apply_tensor_parallel, check_plan
from zoo.plan import model_plan

COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# Outputs worth keeping under selective recompute: the matrix multiplies and attention kernels.
# Everything else (norms, activations, dropout, adds) is recomputed in backward.
_SAVED_UNDER_SELECTIVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_UNDER_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE


def apply_recompute(model: nn.Module, block_names: list[str], mode: str) -> None:
    """Wrap each named block in non-reentrant `torch.utils.checkpoint` ("blocks") or in selective
    checkpointing that keeps matmul/attention outputs ("selective"). State-dict keys are unchanged."""
    kwargs = {"context_fn": partial(create_selective_checkpoint_contexts, _selective_policy)} if mode == "selective" else {}
    for name in block_names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, checkpoint_wrapper(getattr(parent, child), preserve_rng_state=True, **kwargs))


@dataclass
class PipelineParts:
    """A pipelined model's pieces on this rank."""

    layout: PipelineLayout
    stages: list[StageModule]
    """This rank's stages, ascending; each is an FSDP root over its blocks."""
    tied: TiedCopies


def parallelize(model: nn.Module, strategy: Strategy, env: DistEnv, example_batch: Mapping[str, Any] | None = None,
                microbatches: int = 1) -> tuple[nn.Module, PipelineParts | None]:
    """Apply `strategy` to `model` in place; return it (under pipeline parallelism pruned to this
    rank's stages) and, when strategy.pp > 1, its `PipelineParts`. The pipeline split balances
    the stages' costs on `example_batch` (one micro batch; None balances parameter counts), with
    `microbatches` per optimizer step spreading the optimizer's cost.

    A model built on the meta device is materialised after sharding, each rank allocating only its
    shard, then initialised by its `init_weights()` method."""
    plan = model_plan(model)
    layout = None
    if strategy.pp > 1:
        if strategy.tp > 1:
            check_plan(model, plan, strategy.tp, strategy.sequence_parallel)  # on the whole model
        layout = split_for_pipeline(model, plan, strategy, env, example_batch, microbatches)
        plan = plan.present_in(model)
        block_names = [name for stage in layout.local_stages for name in layout.stage_modules(stage)[0]]
    else:
        block_names = plan.block_names(model)
    if strategy.tp > 1:
        apply_tensor_parallel(model, plan, env.mesh["tp"], strategy.sequence_parallel, whole=layout is None)
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta and not callable(getattr(model, "init_weights", None)):
        raise ValueError(
            f"model {type(model).__name__} was built on the meta device but has no init_weights() "
            "method to materialise its parameters after sharding"
        )
    if strategy.recompute != "none":
        if not block_names:
            raise ValueError(
                f"Strategy.recompute={strategy.recompute!r} needs blocks to recompute, but "
                f"{type(model).__name__} declares none (define parallel_plan() returning zoo.plan.ModelPlan)"
            )
        apply_recompute(model, block_names, strategy.recompute)

    common = dict(
        mesh=env.mesh["dp"],
        mp_policy=MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPES[strategy.precision], reduce_dtype=torch.float32),
        offload_policy=(
            CPUOffloadPolicy(pin_memory=env.device.type == "cuda") if strategy.offload == "params" else OffloadPolicy()
        ),
    )
    if strategy.zero <= 1:
        wrap = partial(replicate, **common)
    else:
        wrap = partial(fully_shard, reshard_after_forward=strategy.zero == 3, **common)
    stages = [] if layout is None else build_stages(model, layout)
    for name in block_names:
        wrap(model.get_submodule(name))
    for root in stages or [model]:
        wrap(root)

    if on_meta:
        model.to_empty(device="cpu" if strategy.offload == "params" else env.device)
        with torch.no_grad():
            model.init_weights()
    if layout is None:
        return model, None
    tied = TiedCopies(model, layout, env)
    if on_meta:
        tied.sync_values()
    return model, PipelineParts(layout, stages, tied)
