"""Learning-rate schedule: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math

from trainers.config import TrainConfig


def warmup_cosine_lr(step: int, config: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): linear from lr/warmup to lr over
    `warmup_steps`, then cosine from lr to lr x min_lr_ratio at `max_steps`."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.max_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = config.lr * config.min_lr_ratio
    return floor + 0.5 * (config.lr - floor) * (1.0 + math.cos(math.pi * progress))
