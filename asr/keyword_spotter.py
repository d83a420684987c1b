"""The keyword spotter: MLPerf Tiny's depthwise-separable CNN (DS-CNN) over one second's MFCCs,
small enough for a microcontroller's memory and for `zoo.partial`'s executors.

    input_features (B, 1, frames, coefficients): `asr.keywords.keyword_features` of one-second clips
    labels (B,) class ids
    -> {"logits" (B, num_labels)} (+ "loss": cross-entropy, smoothed by label_smoothing in training)

The network is one nn.Sequential (`network`): a strided full convolution, `blocks` depthwise 3x3 +
pointwise pairs, each convolution followed by batch norm and ReLU, dropout, average pooling and a
linear classifier: the operators `zoo.partial` plans, splits into channel slices and runs from one
arena (in eval mode, where dropout is the identity).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.registry import register


@dataclass
class KeywordSpotterConfig:
    """Shape of a DS-CNN keyword spotter (MLPerf Tiny's reference is the default)."""

    num_labels: int = 10
    """Classes the clip is sorted into."""
    channels: int = 64
    """Channels of every convolution."""
    blocks: int = 4
    """Depthwise-separable blocks after the first convolution."""
    frames: int = 49
    """MFCC frames of a clip (`asr.keywords.keyword_mfccs`: 49 for one second)."""
    coefficients: int = 10
    """MFCCs a frame."""
    stem_dropout: float = 0.2
    """Dropout after the first convolution, in training."""
    head_dropout: float = 0.4
    """Dropout before the pooling and the classifier, in training."""
    label_smoothing: float = 0.1
    """Label smoothing of the training loss (the loss in eval mode is plain cross-entropy)."""

    def __post_init__(self) -> None:
        for name in ("num_labels", "channels", "blocks", "frames", "coefficients"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        for name in ("stem_dropout", "head_dropout", "label_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1); got {getattr(self, name)}")


def _convolution(conv: nn.Conv2d) -> list[nn.Module]:
    return [conv, nn.BatchNorm2d(conv.out_channels), nn.ReLU(inplace=True)]


@register("keyword-spotter", KeywordSpotterConfig)
class KeywordSpotter(nn.Module):
    """forward(input_features (B, 1, frames, coefficients), labels (B,) class ids) -> dict (see the
    module docstring)."""

    def __init__(self, config: KeywordSpotterConfig) -> None:
        super().__init__()
        self.config = config
        c = config.channels
        layers: list[nn.Module] = [*_convolution(nn.Conv2d(1, c, (10, 4), stride=2, padding=(4, 1), bias=False)),
                                   nn.Dropout(config.stem_dropout)]
        for _ in range(config.blocks):
            layers += _convolution(nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False))
            layers += _convolution(nn.Conv2d(c, c, 1, bias=False))
        layers += [nn.Dropout(config.head_dropout), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, config.num_labels)]
        self.network = nn.Sequential(*layers)

    def forward(self, input_features: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        expected = (1, self.config.frames, self.config.coefficients)
        if input_features.ndim != 4 or tuple(input_features.shape[1:]) != expected:
            raise ValueError(f"input_features must have shape (B, {', '.join(map(str, expected))}); "
                             f"got {tuple(input_features.shape)}")
        logits = self.network(input_features)
        output = {"logits": logits}
        if labels is not None:
            if labels.shape != logits.shape[:1]:
                raise ValueError(f"labels must have shape (B,) = ({logits.shape[0]},); got {tuple(labels.shape)}")
            smoothing = self.config.label_smoothing if self.training else 0.0
            output["loss"] = F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)
        return output
