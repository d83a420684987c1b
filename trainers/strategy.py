"""`Strategy`: how a model is spread over devices and how much memory each rank keeps.

One spec for every zoo model. It names the mathematics (which ZeRO stage, where state lives, which
precision, what is recomputed); `trainers.parallelize` turns it into torch.distributed calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

ZeroStage = Literal[0, 1, 2, 3]
Offload = Literal["none", "optimizer", "params"]
Precision = Literal["fp32", "bf16", "fp16"]
Recompute = Literal["none", "blocks", "selective"]


@dataclass
class Strategy:
    """Memory strategy applied to any model by the `Trainer`.

    The ranks form the job's `DeviceMesh` (`trainers.distributed.DistEnv.mesh`) with dimensions
    ("pp", "dp", "tp"): `tp` ranks split each layer, world / tp ranks hold the data-parallel
    replicas (or ZeRO shards); pipeline parallelism is not built yet, so "pp" has size 1.
    """

    zero: ZeroStage = 0
    """ZeRO stage. 0: plain data parallel (every rank holds parameters, gradients and optimizer
    state); 1: optimizer state sharded across ranks; 2: + gradients sharded (FSDP2 without
    resharding after forward); 3: + parameters sharded (FSDP2, resharded after forward)."""

    offload: Offload = "none"
    """Where state lives. "optimizer": fp32 master copies and optimizer state live on the CPU, and
    the optimizer step runs there; "params": parameters, gradients and optimizer state live on the
    CPU and each block is copied to the device when it runs (FSDP2 `CPUOffloadPolicy`)."""

    precision: Precision = "fp32"
    """Compute precision of the blocks. Master parameters, gradient reduction and optimizer state
    stay fp32; "fp16" adds dynamic loss scaling that skips steps whose gradients overflow."""

    recompute: Recompute = "none"
    """Activation recompute. "blocks": each block keeps only its input and recomputes the rest in
    backward; "selective": each block keeps the outputs of matrix multiplies and attention and
    recomputes the cheap element-wise ops. Selective pays off for unfused layers; `zoo.nn` blocks
    already keep no more than it would, so for them use "blocks" (or recompute_attention)."""

    tp: int = 1
    """Tensor-parallel degree: ranks that split each layer the model's plan names (attention heads,
    feed-forward columns, vocabulary rows; see `zoo.plan.ModelPlan`). Must divide the world size."""

    sequence_parallel: bool = False
    """Under tensor parallelism, also split the activations between the split layers (norms,
    dropout, residual adds) along the sequence, so each of the `tp` ranks keeps 1/tp of them:
    all-gather / reduce-scatter at the layers' edges instead of all-reduce. Needs tp > 1."""

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"Strategy.tp must be an integer >= 1; got {self.tp!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"Strategy.sequence_parallel must be True or False; got {self.sequence_parallel!r}")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("Strategy.sequence_parallel=True splits activations over the tensor-parallel ranks "
                             "and needs Strategy.tp > 1; got tp=1")
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or value not in allowed:
                raise ValueError(
                    f"Strategy.{name} must be one of {', '.join(map(repr, allowed))}; "
                    f"got {value!r}"
                )


_CHOICES = {
    "zero": get_args(ZeroStage),
    "offload": get_args(Offload),
    "precision": get_args(Precision),
    "recompute": get_args(Recompute),
}
