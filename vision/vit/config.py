"""Configuration of the Vision Transformer (field names as in Hugging Face's ViTConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ViTHead = Literal["none", "classification"]


@dataclass
class ViTConfig:
    """Shape of a ViT: convolutional patch embedding, class token, learned positions, pre-LN blocks
    with exact GELU, a final LayerNorm and an optional linear classifier on the class token."""

    image_size: int = 224
    """Side of the (square) training images, in pixels; other sizes interpolate the positions."""
    patch_size: int = 16
    """Side of each square patch, in pixels; divides image_size."""
    num_channels: int = 3
    """Input channels C."""
    hidden_size: int = 768
    """Model width W; divisible by num_attention_heads."""
    num_hidden_layers: int = 12
    """Number of transformer blocks."""
    num_attention_heads: int = 12
    """Attention heads per block."""
    intermediate_size: int = 3072
    """Feed-forward width."""
    hidden_dropout_prob: float = 0.0
    """Dropout on the embeddings and on each sublayer's output."""
    attention_probs_dropout_prob: float = 0.0
    """Dropout on the attention probabilities."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon."""
    head: ViTHead = "classification"
    """"none": the encoder and a tanh pooler on the class token (ViTModel); "classification": a linear
    classifier on the final-normed class token (ViTForImageClassification)."""
    num_labels: int = 1000
    """Classes of the classification head."""
    recompute_attention: bool = False
    """Recompute q, k, v and attention in backward instead of keeping them (see zoo.nn.block)."""

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "intermediate_size", "num_labels"):
            if getattr(self, name) < 1:
                raise ValueError(f"ViTConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.image_size % self.patch_size:
            raise ValueError(f"ViTConfig.image_size must be divisible by patch_size={self.patch_size}; "
                             f"got {self.image_size}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"ViTConfig.hidden_size must be divisible by num_attention_heads="
                             f"{self.num_attention_heads}; got {self.hidden_size}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"ViTConfig.{name} must be in [0, 1); got {getattr(self, name)}")
        if self.head not in ("none", "classification"):
            raise ValueError(f"ViTConfig.head must be 'none' or 'classification'; got {self.head!r}")

    @property
    def grid(self) -> int:
        """Patches per side at image_size."""
        return self.image_size // self.patch_size
