"""The ZeRO paper's closed form of the model-state bytes each rank keeps (`zero_model_states`),
beside which the trainer's measured states and the estimator's traces are reported."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainers.strategy import Strategy


def _split_over_tp(param: torch.Tensor) -> bool:
    """Whether `param` is split over the "tp" mesh dimension (a tensor-parallel layer's weight)."""
    if not isinstance(param, DTensor) or "tp" not in (param.device_mesh.mesh_dim_names or ()):
        return False
    return not param.placements[param.device_mesh.mesh_dim_names.index("tp")].is_replicate()


def zero_model_states(model_or_numel: nn.Module | int, strategy: Strategy, world_size: int) -> dict[str, float]:
    """Model-state bytes per rank predicted by the ZeRO paper (Rajbhandari et al., 2020, sec. 5).

    With Psi parameters and N data-parallel ranks: fp32 training keeps 4 Psi parameter, 4 Psi gradient
    and K = 8 Psi Adam bytes; mixed precision (bf16/fp16) keeps 2 Psi + 2 Psi and K = 12 Psi (fp32
    master copy and both moments). Stage 1 divides the optimizer term by N, stage 2 also the
    gradients, stage 3 also the parameters. Offloaded terms move from "device" to "cpu". A module's
    frozen parameters (requires_grad False) count as parameters only: no gradient or optimizer state
    is kept for them.

    Under tensor parallelism N = world_size / strategy.tp and Psi counts one tensor-parallel rank's
    parameters: a parallelised model's split parameters count 1/tp of their elements (an int
    `model_or_numel` is taken as that count already). Under pipeline parallelism N is also divided
    by strategy.pp and Psi counts one pipeline rank's stages: a pipelined model (the trainer's) is
    already pruned to them; pass an int for a whole model's share.

    Returns bytes per rank: parameters, gradients, optimizer, total, and the device/cpu split.
    """
    degree = strategy.tp * strategy.pp
    if world_size < 1 or world_size % degree:
        what = f"Strategy.tp={strategy.tp}" if strategy.pp == 1 else f"Strategy.tp x Strategy.pp = {degree}"
        raise ValueError(f"world_size must be a positive multiple of {what}; got {world_size}")
    if isinstance(model_or_numel, int):
        numel = trained = model_or_numel
    else:
        shares = [(-(-p.numel() // strategy.tp) if _split_over_tp(p) else p.numel(), p.requires_grad)
                  for p in model_or_numel.parameters()]
        numel, trained = sum(n for n, _ in shares), sum(n for n, trainable in shares if trainable)
    world_size //= degree
    param_bytes, grad_bytes, optim_bytes = (4, 4, 8) if strategy.precision == "fp32" else (2, 2, 12)
    shards = {
        "parameters": world_size if strategy.zero >= 3 else 1,
        "gradients": world_size if strategy.zero >= 2 else 1,
        "optimizer": world_size if strategy.zero >= 1 else 1,
    }
    estimate = {
        "parameters": numel * param_bytes / shards["parameters"],
        "gradients": trained * grad_bytes / shards["gradients"],
        "optimizer": trained * optim_bytes / shards["optimizer"],
    }
    off_device = ("parameters", "gradients", "optimizer")  # "chunks": between host memory and files
    on_cpu = {"none": (), "optimizer": ("optimizer",), "params": off_device, "chunks": off_device}[strategy.offload]
    estimate["total"] = sum(estimate.values())
    estimate["cpu"] = sum(estimate[key] for key in on_cpu)
    estimate["device"] = estimate["total"] - estimate["cpu"]
    return estimate
