"""Batched image augmentation: random crop (a shift by whole pixels over a zero border) and a small
random rotation, done as one affine resampling of the batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Augmentation:
    """Random crop and rotation applied to each training image independently."""

    crop_padding: int = 2
    """Zero border, in pixels, that the random crop may move into: each image shifts by a whole
    number of pixels in [-crop_padding, crop_padding] on each axis (0: no crop)."""
    max_rotation: float = 10.0
    """Largest rotation, in degrees, drawn uniformly from [-max_rotation, max_rotation] (0: none)."""

    def __post_init__(self) -> None:
        if self.crop_padding < 0:
            raise ValueError(f"Augmentation.crop_padding must be >= 0; got {self.crop_padding}")
        if not 0.0 <= self.max_rotation <= 180.0:
            raise ValueError(f"Augmentation.max_rotation must be in [0, 180] degrees; got {self.max_rotation}")


def augment(images: torch.Tensor, augmentation: Augmentation, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, C, H, W) float images -> the same shape, each rotated about its centre and shifted
    (bilinear resampling, zeros outside). Draws from `generator` (default: torch's global one, so
    the trainer's per-step seed makes it reproducible)."""
    if images.ndim != 4 or not images.is_floating_point():
        raise ValueError(f"images must be (B, C, H, W) floating point; got {tuple(images.shape)} {images.dtype}")
    if augmentation.crop_padding == 0 and augmentation.max_rotation == 0:
        return images
    batch, _, height, width = images.shape
    pad = augmentation.crop_padding
    angle = (torch.rand(batch, generator=generator, dtype=torch.float64) * 2 - 1) * math.radians(augmentation.max_rotation)
    shift = torch.randint(-pad, pad + 1, (batch, 2), generator=generator).double()  # (dx, dy) pixels
    cos, sin = angle.cos(), angle.sin()
    # affine_grid maps output coordinates (normalised to [-1, 1]) to input coordinates; scaling by
    # the aspect keeps the rotation a rotation on non-square images, and -2*shift/size moves the
    # content by +shift pixels.
    theta = torch.zeros(batch, 2, 3, dtype=torch.float64)
    theta[:, 0, 0], theta[:, 0, 1] = cos, -sin * height / width
    theta[:, 1, 0], theta[:, 1, 1] = sin * width / height, cos
    theta[:, 0, 2], theta[:, 1, 2] = -2 * shift[:, 0] / width, -2 * shift[:, 1] / height
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
