"""Input checks shared by the transducer losses: each bad argument is a ValueError or TypeError that
names it, says what was expected and what came."""

from __future__ import annotations

import torch

from asr.losses.lattice import TOPOLOGIES

REDUCTIONS = ("mean", "sum", "none")


def resolve_blank(blank: int, vocab: int) -> int:
    """The blank id in [0, V); a negative blank counts from the end (-1 is the last, as in torchaudio)."""
    if not -vocab <= blank < vocab:
        raise ValueError(f"blank must lie in [-V, V) = [{-vocab}, {vocab}); got {blank}")
    return blank % vocab


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")


def check_transducer_inputs(reference: torch.Tensor, frames: int, width: int, vocab: int, targets: torch.Tensor,
                            logit_lengths: torch.Tensor, target_lengths: torch.Tensor, blank: int,
                            reduction: str = "mean", topology: str = "regular", reference_name: str = "logits",
                            companion: tuple[str, torch.Tensor] | None = None) -> None:
    """Check targets (B, U), logit_lengths (B,), target_lengths (B,) against the float tensor
    `reference_name` whose first dimension is B, whose lattice has `frames` frames and `width` = U+1
    columns, and whose device all (and the `companion` float tensor, such as lm beside am) must share;
    the used targets must be symbol ids in [0, vocab) other than `blank` (already in [0, V))."""
    for name, tensor in ((reference_name, reference),) + ((companion,) if companion else ()):
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor; got {tensor.dtype}")
    if companion and companion[1].device != reference.device:
        raise ValueError(f"{companion[0]} must be on {reference_name}'s device {reference.device}; "
                         f"got {companion[1].device}")
    check_choice("reduction", reduction, REDUCTIONS)
    check_choice("topology", topology, TOPOLOGIES)
    batch = reference.shape[0]
    for name, tensor, shape in (("targets", targets, (batch, width - 1)), ("logit_lengths", logit_lengths, (batch,)),
                                ("target_lengths", target_lengths, (batch,))):
        if tensor.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64; got {tensor.dtype}")
        if tensor.device != reference.device:
            raise ValueError(f"{name} must be on {reference_name}'s device {reference.device}; got {tensor.device}")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}; got {tuple(tensor.shape)}")
    for name, lengths, low, high in (("logit_lengths", logit_lengths, 1, frames),
                                     ("target_lengths", target_lengths, 0, width - 1)):
        if batch and (lengths.min() < low or lengths.max() > high):
            raise ValueError(f"{name} must lie in [{low}, {high}] (the tensor's size); "
                             f"got min {lengths.min().item()}, max {lengths.max().item()}")
    used = torch.arange(width - 1, device=targets.device)[None, :] < target_lengths[:, None]
    if (targets[used] == blank).any():
        sample = int((targets == blank).logical_and(used).any(1).nonzero()[0])
        raise ValueError(f"targets must not contain the blank id {blank}; sample {sample} does")
    symbols = targets[used]
    if symbols.numel() and (symbols.min() < 0 or symbols.max() >= vocab):
        raise ValueError(f"targets must be symbol ids in [0, {vocab}); got min {symbols.min().item()}, "
                         f"max {symbols.max().item()}")


def reduce_losses(losses: torch.Tensor, reduction: str) -> torch.Tensor:
    """(B,) per-sample losses -> the batch mean, the sum, or unchanged ("none")."""
    if reduction == "mean":
        return losses.mean()
    return losses.sum() if reduction == "sum" else losses
