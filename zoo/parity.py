"""The error measure of every parity check: a fused op, loss or imported checkpoint against its reference."""

from __future__ import annotations

import torch


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (Frobenius norms over all elements, in float64); the
    denominator is clamped at 1e-30 so that an all-zero reference gives the absolute error scaled up."""
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).norm() / expected.norm().clamp(min=1e-30)).item()
