"""`TransformerBlock`: self-attention and feed-forward on the fused ops, pre-LN or post-LN.

What one block keeps for backward, with x (B, S, W), F = mlp_ratio * W, and SDPA saving q, k, v,
its output and a log-sum-exp:

    pre-LN:  norm1 output (W), q k v (W + 2 W_kv), attention output (W), norm2 output (W), fc1 output (F)
    post-LN: block input (W, the previous block's output), q k v, attention output, norm1 output (W),
             fc1 output (F), norm2 output (W, the next block's input)

No dropout mask, no residual sum, no activation output and no norm input is kept.
With `recompute_attention`, q, k, v are not kept either: the q, k, v projections and the attention
forward run again in backward (from the norm output the block keeps anyway), so a pre-LN block
keeps 3W + F per token instead of 6W + 2 W_kv + F (plus one log-sum-exp per head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.nn.activation import Activation
from zoo.nn.attention import SelfAttention
from zoo.nn.kv_cache import LayerKVCache
from zoo.nn.mlp import FusedMLP
from zoo.nn.moe import MoEConfig, MoEFeedForward
from zoo.nn.norm import Norm, NormKind, dropout_add
from zoo.plan import ModelPlan


@dataclass
class TransformerBlockConfig:
    """Shape and options of one transformer block."""

    width: int = 768
    """Model (hidden) width W."""
    heads: int = 12
    """Query heads; must divide `width`."""
    kv_heads: int | None = None
    """Key/value heads (None: `heads`; 1: multi-query; otherwise grouped-query, dividing `heads`)."""
    mlp_ratio: float = 4.0
    """Feed-forward width F = round(mlp_ratio * width)."""
    activation: Activation = "gelu"
    """Feed-forward activation: "gelu" (erf, BERT/ViT), "gelu_tanh" (GPT-2), "silu", "relu"."""
    norm: NormKind = "layer"
    """"layer" (LayerNorm) or "rms" (RMSNorm)."""
    prenorm: bool = True
    """True: x + f(norm(x)) (GPT, ViT); False: norm(x + f(x)) (BERT)."""
    causal: bool = False
    """Causal self-attention (decoders)."""
    dropout: float = 0.0
    """Dropout on each sublayer's output before the residual add."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities."""
    bias: bool = True
    """Biases in the linear layers and LayerNorms."""
    eps: float = 1e-5
    """Normalisation epsilon."""
    recompute_attention: bool = False
    """Recompute the q, k, v projections and attention in backward instead of keeping q, k, v
    (about one extra projection and attention forward per step)."""
    qk_norm: bool = False
    """RMS-normalise the query and key projections before attention (OLMoE); not under tensor
    parallelism (`block_plan` refuses it)."""
    moe: MoEConfig | None = None
    """A mixture of experts as the feed-forward (`zoo.nn.moe`; its width must be `width`) instead
    of the dense one; None: dense."""

    @property
    def mlp_width(self) -> int:
        return round(self.mlp_ratio * self.width)


class TransformerBlock(nn.Module):
    """One block: `attn` (q, k, v, out), `mlp` (fc1, fc2), `norm1`, `norm2`. forward(x (B, S, W),
    key_padding_mask (B, S) bool or None) -> (B, S, W), or only some positions' outputs (`rows`).
    Its plan (`block_plan`) makes it one shard and recompute unit, with attention and feed-forward
    as tensor-parallel regions."""

    def __init__(self, config: TransformerBlockConfig) -> None:
        super().__init__()
        self.config = config
        self.attn = SelfAttention(config.width, config.heads, config.kv_heads, bias=config.bias,
                                  causal=config.causal, dropout=config.attention_dropout,
                                  recompute=config.recompute_attention, qk_norm=config.qk_norm, eps=config.eps)
        if config.moe is not None and config.moe.width != config.width:
            raise ValueError(f"TransformerBlockConfig.moe.width must be the block's width {config.width}; "
                             f"got {config.moe.width}")
        self.mlp = (FusedMLP(config.width, config.mlp_width, config.activation, bias=config.bias) if config.moe is None
                    else MoEFeedForward(config.moe))
        self.aux_loss: torch.Tensor | None = None
        """A mixture-of-experts block's auxiliary loss of its last forward (None for a dense block)."""
        self.norm1 = Norm(config.width, config.norm, config.eps, bias=config.bias)
        self.norm2 = Norm(config.width, config.norm, config.eps, bias=config.bias)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                cache: LayerKVCache | None = None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None, rows: slice | None = None) -> torch.Tensor:
        """x: (B, S, W); key_padding_mask: (B, Skv) bool, True = attend; cache: this block's past keys
        and values for incremental decoding (x then holds only the new positions); rotary: (cos,
        sin) tables (S, head_dim / 2) of x's positions rotating queries and keys (`zoo.nn.rotary`).
        rows: the positions whose outputs are wanted (None: all): queries, the output projection,
        the residuals and the feed-forward run on those R positions only, keys and values on all
        (a non-causal block without a cache); returns (B, R, W)."""
        p = self.config.dropout
        kept = x if rows is None else x[:, rows]
        if self.config.prenorm:
            attended = self.attn(self.norm1(x), key_padding_mask, cache, rotary, rows=rows)
            normed, residual = self.norm2(attended, kept, p=p, prenorm=True)
            return dropout_add(self._feed_forward(normed), residual, p=p, training=self.training)
        hidden = self.norm1(self.attn(x, key_padding_mask, cache, rotary, rows=rows), kept, p=p)
        return self.norm2(self._feed_forward(hidden), hidden, p=p)

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.moe is None:
            return self.mlp(x)
        y, self.aux_loss = self.mlp(x)
        return y


def attention_plan(pattern: str, config: TransformerBlockConfig) -> ModelPlan:
    """The tensor-parallel region of the attention `pattern` (e.g. "blocks.*.attn") in blocks of
    shape `config`: q, k, v column-, out row-parallel, split by heads; multi-query attention's one
    key/value head replicated."""
    kv = (f"{pattern}.k", f"{pattern}.v")
    multi_query = config.heads > 1 and (config.kv_heads or config.heads) == 1
    head_dim = config.width // config.heads
    return ModelPlan(colwise=(f"{pattern}.q", *(() if multi_query else kv)), rowwise=(f"{pattern}.out",),
                     replicated=kv if multi_query else (), regions=(pattern,),
                     heads=tuple((f"{pattern}.{name}", head_dim) for name in "qkv"))


def block_plan(pattern: str, config: TransformerBlockConfig) -> ModelPlan:
    """The plan of a stack of `TransformerBlock`s of shape `config` whose names match `pattern`
    (e.g. "blocks.*"): each block one shard and recompute unit; attention (`attention_plan`) and
    feed-forward are the tensor-parallel regions (fc1 column-, fc2 row-parallel), the norms run on
    sequence shards. A mixture of experts is a region too: its routed experts split by hidden width
    (`ModelPlan.experts`, also sharded by expert under expert parallelism), its shared experts' gate
    and up column- and down row-parallel, its router replicated. Blocks with QK-norm split nothing
    (but their experts)."""
    mlp = f"{pattern}.mlp"
    experts = (f"{mlp}.experts",) if config.moe is not None else ()
    if config.qk_norm:  # its norms span every head, which a split by heads would cut
        return ModelPlan(blocks=(pattern,), experts=experts)
    if config.moe is None:
        feed_forward = ModelPlan(colwise=(f"{mlp}.fc1",), rowwise=(f"{mlp}.fc2",))
    else:
        shared = config.moe.shared_experts > 0
        feed_forward = ModelPlan(colwise=(f"{mlp}.shared.gate", f"{mlp}.shared.up") if shared else (),
                                 rowwise=(f"{mlp}.shared.down",) if shared else (), replicated=(f"{mlp}.router",),
                                 experts=experts)
    return ModelPlan(blocks=(pattern,), regions=(f"{pattern}.attn", mlp),
                     sequence_parallel=(f"{pattern}.norm1", f"{pattern}.norm2"),
                     ).merged(attention_plan(f"{pattern}.attn", config)).merged(feed_forward)
