"""A training step's forward and backward on this rank, unpipelined: the model's loss checked, the
micro batches' losses accumulated, and when replicated gradients reduce. The trainer and the memory
estimator (`trainers.estimate.trace`) both step through these. And what follows a step whose
gradient norm was not finite (`SkippedSteps`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from trainers.strategy import Strategy
from zoo.nn.logits import loss_only

Batch = Mapping[str, Any]
log = logging.getLogger("trainers")


def to_device(batch: Batch, device: torch.device) -> dict[str, Any]:
    """`batch` with its tensors on `device` (copied without blocking where the device allows)."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def model_loss(model: nn.Module, model_class: str, batch: Mapping[str, Any]) -> torch.Tensor:
    """`model(**batch)["loss"]`, checked to be a scalar tensor (`model_class` names the model in
    the error)."""
    with loss_only():  # a model that can skips its logits (zoo.nn.logits), in evaluation too
        output = model(**batch)
    if not isinstance(output, Mapping) or "loss" not in output:
        raise TypeError(f"{model_class}.forward(**batch) must return a mapping with a 'loss'; got {type(output).__name__}")
    loss = output["loss"]
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        raise TypeError(f"{model_class}.forward(**batch)['loss'] must be a scalar tensor; got {getattr(loss, 'shape', loss)}")
    return loss


def accumulate_gradients(model: nn.Module, model_class: str, batches: Iterable[Mapping[str, Any]],
                         before_backward: Callable[[bool], None] | None, accumulation: int,
                         scale: float) -> tuple[torch.Tensor, int]:
    """Forward and backward of a step's `accumulation` micro batches (on this rank, unpipelined),
    each loss times `scale / accumulation`; returns the sum of their losses and the input_ids they
    held. `before_backward(last)` is told before each micro batch whether it is the step's last:
    under ZeRO 0-1 only the last backward reduces the gradients (`gradient_sync`); under ZeRO 2-3
    they are reduce-scattered after every micro batch (None), so that each rank keeps only its shard."""
    loss_sum, units = None, 0
    for index, batch in enumerate(batches):
        if before_backward is not None:
            before_backward(index == accumulation - 1)
        loss = model_loss(model, model_class, batch)
        (loss * (scale / accumulation)).backward()
        loss_sum = loss.detach().float() if loss_sum is None else loss_sum + loss.detach().float()
        if isinstance(batch.get("input_ids"), torch.Tensor):
            units += batch["input_ids"].numel()
    return loss_sum, units


def gradient_sync(model: nn.Module, strategy: Strategy) -> Callable[[bool], None] | None:
    """What `accumulate_gradients` tells before each backward under `strategy`: whether the
    gradients reduce after it (the step's last does): ZeRO-0 all-reduces its replicated ones, ZeRO-1
    reduce-scatters its whole ones and only then gives back its gathered parameters; None where every
    backward reduces (ZeRO 2-3)."""
    if strategy.zero == 1:
        def reduce_after(last: bool) -> None:
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
        return reduce_after
    return model.set_requires_gradient_sync if strategy.zero == 0 else None


class SkippedSteps:
    """Optimizer steps skipped in a row because their gradient norm was not finite (each logged on
    rank 0); `FloatingPointError` once `limit` have been (`TrainConfig.max_skipped_steps`)."""

    def __init__(self, limit: int, log_skips: bool) -> None:
        self.limit, self.log_skips = limit, log_skips
        self.in_a_row = 0

    def record(self, step: int, grad_norm: float, taken: bool, loss_scale: float | None = None) -> None:
        """Step `step` (1-based) with gradient norm `grad_norm` was `taken` or skipped; under fp16,
        `loss_scale` is the scale the next step uses."""
        if taken:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        scaled = "" if loss_scale is None else f"; the loss scale falls to {loss_scale:g}"
        if self.log_skips:
            log.warning("step %d skipped: its gradient norm is %s%s (%d in a row; TrainConfig.max_skipped_steps=%d)",
                        step, grad_norm, scaled, self.in_a_row, self.limit)
        if self.in_a_row >= self.limit:
            raise FloatingPointError(
                f"the gradient norm was not finite in {self.in_a_row} steps in a row, up to step {step} "
                f"(TrainConfig.max_skipped_steps={self.limit}): training diverged; lower TrainConfig.lr, clip "
                f"harder (TrainConfig.grad_clip) or check the data")
