"""Dynamic loss scaling for fp16, correct under sharding.

Overflow is judged on the global gradient norm (all shards reduced), so every rank takes the same
decision to step or skip, which a per-rank inf check on a shard cannot guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class DynamicLossScaler:
    """Multiply the loss by `scale` before backward; halve on overflow, double after
    `growth_interval` clean steps."""

    scale: float = 2.0**16
    """Current loss multiplier."""
    growth_interval: int = 200
    """Clean steps before the scale doubles."""
    clean_steps: int = 0
    """Clean steps since the last change of scale."""
    skipped_steps: int = 0
    """Steps skipped for overflow since the start of training."""

    def update(self, grad_norm: float) -> bool:
        """Record one step whose unscaled global gradient norm is `grad_norm`; return True when
        the step may be taken, False when it overflowed and must be skipped."""
        if not math.isfinite(grad_norm):
            self.scale /= 2.0
            self.clean_steps = 0
            self.skipped_steps += 1
            return False
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= 2.0
            self.clean_steps = 0
        return True
