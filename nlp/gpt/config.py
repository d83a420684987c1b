"""Configuration of the GPT decoder."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GPTConfig:
    """Shape of a GPT (pre-LN decoder, learned positions, GELU (tanh) MLP, tied input/output embeddings)."""

    vocab_size: int = 50257
    """Number of token ids."""
    block_size: int = 1024
    """Longest sequence (number of learned positions)."""
    n_layer: int = 12
    """Number of transformer blocks."""
    n_head: int = 12
    """Attention heads per block."""
    n_kv_head: int | None = None
    """Key/value heads: None = n_head (multi-head), 1 = multi-query, else grouped-query (divides n_head)."""
    n_embd: int = 768
    """Hidden size; must be divisible by n_head."""
    dropout: float = 0.0
    """Dropout on embeddings, attention probabilities and residual branches."""
    bias: bool = True
    """Biases in linears and LayerNorms (as in GPT-2)."""
    recompute_attention: bool = False
    """Recompute q, k, v and attention in backward instead of keeping them (see zoo.nn.block)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd must be divisible by n_head={self.n_head}; got {self.n_embd}")
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ValueError(f"GPTConfig.n_kv_head must divide n_head={self.n_head}; got {self.n_kv_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1); got {self.dropout}")
