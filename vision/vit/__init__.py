"""Vision Transformer on the fused zoo.nn layers."""

from vision.vit.config import ViTConfig
from vision.vit.model import ViT, interpolate_positions

__all__ = ["ViT", "ViTConfig", "interpolate_positions"]
