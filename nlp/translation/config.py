"""Configuration of the encoder-decoder translator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zoo.nn.activation import Activation


@dataclass
class TranslatorConfig:
    """Shape of an encoder-decoder Transformer (Vaswani et al. 2017): by default transformer-base,
    pre-norm, one vocabulary shared by source, target and output head; post-norm with swish
    feed-forwards and a final logits bias is Marian's (OPUS-MT)."""

    vocab_size: int = 32000
    """Token ids of the shared vocabulary (source and target)."""
    width: int = 512
    """Model width d_model."""
    heads: int = 8
    """Attention heads in every attention layer; must divide `width`."""
    encoder_layers: int = 6
    """Encoder blocks."""
    decoder_layers: int = 6
    """Decoder blocks."""
    ffn_width: int = 2048
    """Hidden width of every feed-forward."""
    activation: Activation = "relu"
    """Feed-forward activation: "relu" (transformer-base), "silu" (Marian's swish), "gelu"."""
    prenorm: bool = True
    """True: x + f(norm(x)) with a final norm after each stack; False: norm(x + f(x)) (Marian)."""
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    """Sinusoidal positions (sines of the first half of the width, cosines of the second, Marian's and
    fairseq's layout) or a learned table."""
    max_positions: int = 512
    """Longest source or target sequence."""
    scale_embedding: bool = True
    """Multiply token embeddings by sqrt(width) before adding positions."""
    final_logits_bias: bool = False
    """A bias on the output logits (Marian's `final_logits_bias`)."""
    pad_token_id: int | None = 0
    """Padding id (its embedding row zero, untrained); None: the vocabulary has none (padded source
    positions are masked by attention_mask whatever their id; labels of -100 shift in as EOS)."""
    decoder_start_token_id: int = 0
    """The id the decoder starts from (Marian: the pad id)."""
    zero_start_embedding: bool = False
    """The decoder's first position embeds zeros instead of its start token's embedding (Marian's
    convention; CTranslate2's `start_from_zero_embedding`)."""
    eos_token_id: int = 2
    """End of sentence: decoding stops after it."""
    dropout: float = 0.1
    """Dropout on embeddings and each sublayer's output."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""
    label_smoothing: float = 0.1
    """Label smoothing of the training loss."""
    bias: bool = True
    """Biases in the linears and norms."""
    eps: float = 1e-5
    """The norms' epsilon."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "width", "heads", "encoder_layers", "decoder_layers", "ffn_width", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"TranslatorConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.width % self.heads:
            raise ValueError(f"TranslatorConfig.heads ({self.heads}) must divide width ({self.width})")
        if self.positions not in ("sinusoidal", "learned"):
            raise ValueError(f"TranslatorConfig.positions must be 'sinusoidal' or 'learned'; got {self.positions!r}")
        for name in ("pad_token_id", "decoder_start_token_id", "eos_token_id"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"TranslatorConfig.{name} must be a token id below vocab_size={self.vocab_size}; "
                                 f"got {getattr(self, name)}")
