"""Conformer encoder (Gulati et al., 2020) on the zoo.nn layers.

    features (B, T, F) -> 4x convolutional subsampling (then frame_stack frames merged into one)
    -> (B, T', W), T' = (((T - 1) // 2 - 1) // 2) // frame_stack
    -> blocks: x + FF/2, x + MHSA (rotary positions), x + Conv, x + FF/2, LayerNorm -> (B, T', W)

Padded frames (past each utterance's length) are never attended to and are zeroed before the
depthwise convolution, so an utterance encodes the same alone or padded in a batch.

Chunk-wise mode (chunk_frames > 0), for streaming: the subsampled frames fall into chunks of
chunk_frames; a frame attends to the frames of its own chunk and of left_chunks chunks before it
(-1: all before it), and the depthwise convolution is causal (it reads kernel - 1 frames back, none
ahead). A frame's encoding then depends on no input after its chunk but the subsampling's look-ahead
(the 3x3 convolutions read up to 6 input frames, 60 ms, past a subsampled frame's own four).

Dynamic chunks (dynamic_chunks > 0; WeNet's U2, Zhang et al. 2020): the convolution is causal and each
training forward draws its attention, the whole utterance with probability 1/2, else chunks of 1 to
dynamic_chunks frames (left_chunks of them back), so that one model encodes in full context and
streams in any chunk (`Transducer.with_chunk_frames`). Outside training it encodes with chunk_frames (0: every
frame attends to every frame, the convolution still causal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.nn import FusedMLP, Norm, SelfAttention, dropout_add
from zoo.nn.rotary import rotary_tables


@dataclass(frozen=True)
class ConformerConfig:
    """Shape of a Conformer encoder."""

    input_dim: int = 80
    """Feature bins F."""
    width: int = 144
    """Model width W; divisible by heads, head dimension even (rotary)."""
    layers: int = 6
    """Conformer blocks."""
    heads: int = 4
    """Attention heads."""
    ff_mult: int = 4
    """Feed-forward width as a multiple of W."""
    conv_kernel: int = 15
    """Depthwise convolution kernel (odd)."""
    subsampling_channels: tuple[int, int] = (8, 64)
    """Channels of the first and second stride-2 subsampling convolutions (the first runs at the full
    frame rate: few channels keep it cheap, as in icefall's Zipformer)."""
    dropout: float = 0.1
    """Dropout on every sublayer's output, the feed-forward hidden layer and the attention probabilities."""
    rotary_base: float = 10000.0
    """Base of the rotary position angles."""
    frame_stack: int = 1
    """Consecutive subsampled frames merged into one by the subsampling's output linear: 2 gives the
    blocks an 8x frame rate (80 ms), half the frames to process (a trailing odd frame is dropped)."""
    chunk_frames: int = 0
    """Chunk-wise mode: subsampled frames per attention chunk (8 = 320 ms at 40 ms a frame); 0: full
    context (see the module docstring)."""
    left_chunks: int = 4
    """Chunk-wise mode: chunks before its own that a frame attends to (-1: all)."""
    dynamic_chunks: int = 0
    """Dynamic chunk training when > 0: the largest chunk, in frames, a training forward may draw
    (WeNet's 25 = 1 s at 40 ms a frame; see the module docstring); 0: off."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "subsampling_channels", tuple(self.subsampling_channels))  # a list from config.json
        for name in ("input_dim", "width", "layers", "heads", "ff_mult", "frame_stack"):
            if getattr(self, name) < 1:
                raise ValueError(f"ConformerConfig.{name} must be >= 1; got {getattr(self, name)}")
        if len(self.subsampling_channels) != 2 or min(self.subsampling_channels) < 1:
            raise ValueError(f"ConformerConfig.subsampling_channels must be two counts >= 1; got {self.subsampling_channels}")
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise ValueError(f"ConformerConfig.width must split into {self.heads} heads of even size; got {self.width}")
        if self.chunk_frames < 0 or self.left_chunks < -1 or self.dynamic_chunks < 0:
            raise ValueError(f"ConformerConfig needs chunk_frames >= 0, left_chunks >= -1 and dynamic_chunks >= 0; got "
                             f"{self.chunk_frames}, {self.left_chunks} and {self.dynamic_chunks}")
        if self.conv_kernel < 1 or self.conv_kernel % 2 == 0:
            raise ValueError(f"ConformerConfig.conv_kernel must be odd; got {self.conv_kernel}")
        if self.input_dim < 7:
            raise ValueError(f"ConformerConfig.input_dim must be >= 7 (two stride-2 3x3 convolutions); got {self.input_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ConformerConfig.dropout must be in [0, 1); got {self.dropout}")

    @property
    def causal(self) -> bool:
        """Whether the depthwise convolution reads only frames before (chunk-wise or dynamic chunks)."""
        return bool(self.chunk_frames or self.dynamic_chunks)


CONFORMER_SIZES = {
    "tiny": ConformerConfig(width=144, layers=6, heads=4, conv_kernel=15),
    "small": ConformerConfig(width=256, layers=12, heads=4, conv_kernel=31, subsampling_channels=(16, 128)),
}
"""Preset encoder shapes (80 input bins)."""


def subsampled_lengths(lengths: torch.Tensor | int, frame_stack: int = 1) -> torch.Tensor | int:
    """Frames left of `lengths` frames after two 3x3 stride-2 convolutions without padding and
    merging `frame_stack` frames into one."""
    return (((lengths - 1) // 2 - 1) // 2) // frame_stack


class Subsampling(nn.Module):
    """(B, T, F) -> (B, T', W): Conv2d(3x3, stride 2) + ReLU twice, then a linear over channels x
    bins (x frame_stack consecutive frames)."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        first, second = config.subsampling_channels
        self.frame_stack = config.frame_stack
        self.conv1 = nn.Conv2d(1, first, 3, stride=2)
        self.conv2 = nn.Conv2d(first, second, 3, stride=2)
        self.out = nn.Linear(config.frame_stack * second * subsampled_lengths(config.input_dim),
                             config.width)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(features.unsqueeze(1)))))  # (B, C, T', F')
        x = x.permute(0, 2, 1, 3).flatten(2)  # (B, T', C F')
        frames = x.shape[1] // self.frame_stack * self.frame_stack
        return self.out(x[:, :frames].reshape(x.shape[0], frames // self.frame_stack, -1))


class FeedForward(nn.Module):
    """LayerNorm -> Linear -> SiLU -> dropout -> Linear (the half-step macaron branch)."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.norm = Norm(config.width)
        self.mlp = FusedMLP(config.width, config.ff_mult * config.width, "silu", dropout=config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x))


class RotaryAttention(nn.Module):
    """LayerNorm -> multi-head self-attention with rotary positions and a key padding mask, or a
    (B, T, T) mask of which frames each frame attends to (chunk-wise mode)."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.norm = Norm(config.width)
        self.attn = SelfAttention(config.width, config.heads, dropout=config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is not None:
            return self.attn(self.norm(x), rotary=rotary, attn_mask=attention_mask)
        return self.attn(self.norm(x), mask, rotary=rotary)


class ConvModule(nn.Module):
    """LayerNorm -> pointwise (W -> 2W) -> GLU -> depthwise conv -> LayerNorm -> SiLU -> pointwise."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.norm = Norm(config.width)
        self.pointwise_in = nn.Linear(config.width, 2 * config.width)
        # (left, right) zero padding of the depthwise convolution: centred, or causal
        self.padding = (config.conv_kernel - 1, 0) if config.causal else (config.conv_kernel // 2,) * 2
        self.depthwise = nn.Conv1d(config.width, config.width, config.conv_kernel, groups=config.width)
        self.depthwise_norm = Norm(config.width)
        self.pointwise_out = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = F.glu(self.pointwise_in(self.norm(x)), dim=-1).masked_fill(~mask[..., None], 0.0)
        x = self.depthwise(F.pad(x.transpose(1, 2), self.padding)).transpose(1, 2)
        return self.pointwise_out(F.silu(self.depthwise_norm(x)))


class ConformerBlock(nn.Module):
    """One macaron Conformer block; forward(x (B, T, W), mask (B, T) bool True = frame, rotary tables)."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.dropout = config.dropout
        self.ff1, self.attn, self.conv, self.ff2 = (FeedForward(config), RotaryAttention(config), ConvModule(config),
                                                    FeedForward(config))
        self.norm = Norm(config.width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        p, training = self.dropout, self.training
        x = dropout_add(0.5 * self.ff1(x), x, p=p, training=training)
        x = dropout_add(self.attn(x, mask, rotary, attention_mask), x, p=p, training=training)
        x = dropout_add(self.conv(x, mask), x, p=p, training=training)
        x = dropout_add(0.5 * self.ff2(x), x, p=p, training=training)
        return self.norm(x)


class ConformerEncoder(nn.Module):
    """forward(features (B, T, F), lengths (B,)) -> (encoded (B, T', W), lengths (B,) of T')."""

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.config = config
        self.subsampling = Subsampling(config)
        self.blocks = nn.ModuleList(ConformerBlock(config) for _ in range(config.layers))

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        carry = self.enter(features, lengths)
        for block in self.blocks:
            carry = self.run_block(block, carry)
        return self.leave(carry)

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype features enter in (that of the subsampling)."""
        return self.subsampling.out.weight.dtype

    def enter(self, features: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """Subsample features (B, T, F) of `lengths` (B,) frames into what every block reads:
        {"hidden": (B, T', W), "lengths": (B,) of T', "mask": (B, T') True at frames,
        "rotary_cos", "rotary_sin": (T', head_dim / 2) rotary tables}, and when attention is chunk-wise
        (chunk_frames, or a chunk drawn in dynamic chunk training) "attention_mask": (B, T', T') True
        where a frame attends to a frame (`chunk_attention_mask`)."""
        if features.ndim != 3 or features.shape[-1] != self.config.input_dim:
            raise ValueError(f"features must be (B, T, {self.config.input_dim}); got {tuple(features.shape)}")
        shortest = 4 * self.config.frame_stack + 3
        if features.shape[1] < shortest:
            raise ValueError(f"features need at least {shortest} frames ({4 * self.config.frame_stack}x subsampling); "
                             f"got {features.shape[1]}")
        x = self.subsampling(features)
        lengths = subsampled_lengths(lengths.to(x.device), self.config.frame_stack)
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        cos, sin = rotary_tables(x.shape[1], self.config.width // self.config.heads, self.config.rotary_base, x.device)
        carry = {"hidden": x, "lengths": lengths, "mask": mask, "rotary_cos": cos, "rotary_sin": sin}
        chunk = self.drawn_chunk_frames() if self.training and self.config.dynamic_chunks else self.config.chunk_frames
        if chunk:
            carry["attention_mask"] = chunk_attention_mask(mask, chunk, self.config.left_chunks)
        return carry

    def drawn_chunk_frames(self) -> int:
        """A dynamic-chunk training forward's chunk, drawn with the global generator: 0 (full context) with
        probability 1/2, else 1..config.dynamic_chunks frames uniformly."""
        if torch.rand(()) < 0.5:
            return 0
        return int(torch.randint(1, self.config.dynamic_chunks + 1, ()))

    @staticmethod
    def run_block(block: nn.Module, carry: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One Conformer block on the carry of `enter`."""
        return {**carry, "hidden": block(carry["hidden"], carry["mask"], (carry["rotary_cos"], carry["rotary_sin"]),
                                         carry.get("attention_mask"))}

    @staticmethod
    def leave(carry: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(encoded (B, T', W), lengths (B,)) of the last block's carry (each block ends with its own norm)."""
        return carry["hidden"], carry["lengths"]


def chunk_attention_mask(mask: torch.Tensor, chunk_frames: int, left_chunks: int) -> torch.Tensor:
    """(B, T, T) bool: frame i attends to frame j when j is a frame (mask (B, T)) in i's chunk of
    chunk_frames or in the left_chunks chunks before it (-1: any before it); a padded frame with no
    such frame attends to itself, so that no row is empty."""
    chunk = torch.arange(mask.shape[1], device=mask.device) // chunk_frames
    allowed = chunk[None, :] <= chunk[:, None]
    if left_chunks >= 0:
        allowed &= chunk[None, :] >= chunk[:, None] - left_chunks
    itself = torch.eye(mask.shape[1], dtype=torch.bool, device=mask.device)
    return (allowed[None] & mask[:, None, :]) | itself[None]
