"""What a resumed run may change: a resume is an exact continuation only under the saved settings.

The checkpoint stores the run's `TrainConfig`, `Strategy` and world size. On resume, a change to what
the mathematics of the remaining steps depends on (the optimizer, the schedule's shape, the batch,
the seed, the precision, the adapters) is refused with the list of changes; a change that keeps the run correct
but not bit-for-bit the same (more or fewer steps, which stretch the cosine schedule; another world
size, micro batch, ZeRO stage or tensor-parallel layout with the same global batch) is reported for the log; the rest
(logging, evaluation, checkpoint cadence, paths) may change freely.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from trainers.config import TrainConfig
from trainers.strategy import Strategy

REFUSED = ("config.global_batch_size", "config.lr", "config.min_lr_ratio", "config.warmup_steps",
           "config.weight_decay", "config.lr_scales", "config.anchor_decay", "config.betas", "config.eps", "config.grad_clip", "config.seed",
           "config.adapter", "strategy.precision")
"""Settings whose change makes the rest of the run another computation."""
log = logging.getLogger("trainers")
REPORTED = ("config.max_steps", "config.micro_batch_size", "strategy.zero", "strategy.offload",
            "strategy.recompute", "strategy.tp", "strategy.sequence_parallel", "strategy.pp", "strategy.pp_schedule",
            "strategy.microbatches", "strategy.stages_per_rank", "world_size")
"""Settings that may change on resume; the change is said in the log."""


def run_settings(config: TrainConfig, strategy: Strategy, world_size: int) -> dict[str, Any]:
    """The settings a checkpoint's trainer state records: {"config", "strategy", "world_size"}."""
    return {"config": asdict(config), "strategy": asdict(strategy), "world_size": world_size}


def flat_settings(trainer_state: dict[str, Any]) -> dict[str, Any]:
    """`run_settings` (or a checkpoint's trainer state holding them) flat: {"config.lr": ...,
    "strategy.zero": ..., "world_size": ...}; {} for a checkpoint saved without them."""
    flat = {f"config.{k}": v for k, v in trainer_state.get("config", {}).items()}
    flat.update({f"strategy.{k}": v for k, v in trainer_state.get("strategy", {}).items()})
    if "world_size" in trainer_state:
        flat["world_size"] = trainer_state["world_size"]
    return flat


def _comparable(value: Any) -> Any:
    """`value` with its lists as tuples, nested ones too (JSON keeps tuples as lists)."""
    if isinstance(value, dict):
        return {key: _comparable(item) for key, item in value.items()}
    return tuple(map(_comparable, value)) if isinstance(value, (list, tuple)) else value


def changed_settings(saved: dict[str, Any], current: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    """"name: saved -> current" for each of `names` that differs (names the checkpoint lacks are skipped)."""
    return [f"{name}: {saved[name]!r} -> {current[name]!r}" for name in names
            if name in saved and _comparable(saved[name]) != _comparable(current[name])]


def check_resumed(trainer_state: dict[str, Any], current: dict[str, Any], folder: str, strict: bool,
                  announce: bool) -> None:
    """Compare a checkpoint's trainer state with the `current` run settings (`run_settings`): strict,
    ValueError naming every refused change (`check_continuation`); the changes left (all of them when
    not strict) logged as a warning where `announce`."""
    saved, now = flat_settings(trainer_state), flat_settings(current)
    changes = check_continuation(saved, now, folder) if strict else changed_settings(saved, now, REFUSED + REPORTED)
    if changes and announce:
        log.warning("resuming from %s with changed settings: %s", folder, "; ".join(changes))


def check_continuation(saved: dict[str, Any], current: dict[str, Any], folder: str) -> list[str]:
    """ValueError naming every refused change between the `saved` and `current` flat run settings
    (`flat_settings`); otherwise the reported changes, for the log."""
    refused = changed_settings(saved, current, REFUSED)
    if refused:
        raise ValueError(f"cannot resume from {folder!r} as an exact continuation; these settings changed: "
                         + "; ".join(refused) + ". Restore them, or start a new run from these weights with "
                         "Trainer.resume(folder, strict=False)")
    return changed_settings(saved, current, REPORTED)
