"""Configuration of the GPT decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class GPTConfig:
    """Shape of a GPT: a pre-norm decoder, by default GPT-2's (learned positions, LayerNorm, GELU
    (tanh) feed-forwards, the output head tied to the word embedding); with rotary positions,
    RMSNorm, no biases, experts and a head of its own, Mixtral's."""

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
    positions: Literal["learned", "rotary"] = "learned"
    """Where positions enter: a learned table of block_size positions added to the token embeddings
    (GPT-2), or rotary angles applied to every block's queries and keys (Llama, Mixtral)."""
    rope_theta: float = 10000.0
    """Base of the rotary angles (positions="rotary")."""
    norm: Literal["layer", "rms"] = "layer"
    """The blocks' and the final norm: LayerNorm (GPT-2) or RMSNorm (Llama, Mixtral)."""
    norm_eps: float = 1e-5
    """The norms' epsilon."""
    qk_norm: bool = False
    """RMS-normalise every block's query and key projections (OLMoE); such a GPT splits nothing
    for tensor parallelism."""
    tie_embeddings: bool = True
    """The output head is the word embedding (GPT-2); False: a head of its own, `lm_head` (Mixtral)."""
    recompute_attention: bool = False
    """Recompute q, k, v and attention in backward instead of keeping them (see zoo.nn.block)."""
    n_experts: int = 0
    """Routed experts of a mixture-of-experts feed-forward (`zoo.nn.moe`); 0: every block dense."""
    moe_top_k: int = 2
    """Experts each token goes to (1 <= moe_top_k <= n_experts)."""
    n_shared_experts: int = 0
    """Experts every token goes through besides its routed ones."""
    moe_every: int = 1
    """Every moe_every-th block (the moe_every-th, 2 moe_every-th, ...) is a mixture of experts."""
    moe_hidden: int | None = None
    """Hidden width of each expert; None: 4 x n_embd, the dense block's."""
    moe_normalize_top_k: bool = True
    """Rescale a token's top-k router weights to sum to 1 (Mixtral: yes; OLMoE: no)."""
    moe_balance_weight: float = 0.01
    """Weight of the load-balancing loss added to the training loss, per mixture-of-experts block."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd must be divisible by n_head={self.n_head}; got {self.n_embd}")
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ValueError(f"GPTConfig.n_kv_head must divide n_head={self.n_head}; got {self.n_kv_head}")
        if self.n_experts < 0 or (self.n_experts and not 1 <= self.moe_top_k <= self.n_experts):
            raise ValueError(f"GPTConfig.moe_top_k must be between 1 and n_experts={self.n_experts} (n_experts >= 0); "
                             f"got moe_top_k={self.moe_top_k}")
        if self.n_experts and not 1 <= self.moe_every <= self.n_layer:
            raise ValueError(f"GPTConfig.moe_every must be between 1 and n_layer={self.n_layer}; got {self.moe_every}")
        if self.positions not in ("learned", "rotary") or self.norm not in ("layer", "rms"):
            raise ValueError(f"GPTConfig.positions must be 'learned' or 'rotary' and norm 'layer' or 'rms'; got "
                             f"positions={self.positions!r}, norm={self.norm!r}")
        if self.positions == "rotary" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"GPTConfig.positions='rotary' needs an even head dimension; got "
                             f"n_embd / n_head = {self.n_embd // self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1); got {self.dropout}")
