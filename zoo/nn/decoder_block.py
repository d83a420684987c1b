"""`DecoderBlock`: an encoder-decoder's decoder layer on the fused ops: causal self-attention,
cross-attention over the encoder's output (`zoo.nn.cross_attention`), feed-forward; pre-LN or
post-LN, each sublayer's dropout, residual add and norm fused (`zoo.nn.norm`).

    pre-LN:  x + self(norm1(x)) -> h; h + cross(norm2(h)) -> g; g + mlp(norm3(g))
    post-LN: norm1(x + self(x)) -> h; norm2(h + cross(h)) -> g; norm3(g + mlp(g))
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.nn.attention import SelfAttention
from zoo.nn.block import TransformerBlockConfig, attention_plan
from zoo.nn.cross_attention import CrossAttention
from zoo.nn.kv_cache import LayerKVCache
from zoo.nn.mlp import FusedMLP
from zoo.nn.norm import Norm, dropout_add
from zoo.plan import ModelPlan


class DecoderBlock(nn.Module):
    """`self_attn` (causal; q, k, v, out), `cross_attn` (q, k, v, out), `mlp` (fc1, fc2), `norm1`,
    `norm2`, `norm3`, shaped by a `TransformerBlockConfig` (its `causal` and `moe` fields unused:
    the self-attention is causal, the feed-forward dense). forward(x (B, S, W), memory (B, Sm, W),
    memory_padding_mask (B, Sm) bool, True for real source positions) -> (B, S, W); for incremental
    decoding `cache` holds the past positions' keys and values and `memory_kv` the memory's
    (`CrossAttention.memory_kv`), and x only the new positions."""

    def __init__(self, config: TransformerBlockConfig) -> None:
        super().__init__()
        self.config = config
        self.self_attn = SelfAttention(config.width, config.heads, config.kv_heads, bias=config.bias, causal=True,
                                       dropout=config.attention_dropout, recompute=config.recompute_attention,
                                       eps=config.eps)
        self.cross_attn = CrossAttention(config.width, config.heads, bias=config.bias, dropout=config.attention_dropout)
        self.mlp = FusedMLP(config.width, config.mlp_width, config.activation, bias=config.bias)
        self.norm1, self.norm2, self.norm3 = (Norm(config.width, config.norm, config.eps, bias=config.bias)
                                              for _ in range(3))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                memory_padding_mask: torch.Tensor | None = None, cache: LayerKVCache | None = None,
                memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        p = self.config.dropout
        cross = lambda h: self.cross_attn(h, memory, memory_padding_mask, memory_kv)  # noqa: E731
        if self.config.prenorm:
            normed, residual = self.norm2(self.self_attn(self.norm1(x), cache=cache), x, p=p, prenorm=True)
            normed, residual = self.norm3(cross(normed), residual, p=p, prenorm=True)
            return dropout_add(self.mlp(normed), residual, p=p, training=self.training)
        hidden = self.norm1(self.self_attn(x, cache=cache), x, p=p)
        hidden = self.norm2(cross(hidden), hidden, p=p)
        return self.norm3(self.mlp(hidden), hidden, p=p)


def decoder_block_plan(pattern: str, config: TransformerBlockConfig) -> ModelPlan:
    """The plan of a stack of `DecoderBlock`s of shape `config` whose names match `pattern`: each
    block one shard and recompute unit; self-attention, cross-attention (its memory enters whole,
    `trainers` summing its gradient) and feed-forward the tensor-parallel regions, split by heads
    and by hidden columns; the norms run on sequence shards."""
    mlp = f"{pattern}.mlp"
    return ModelPlan(blocks=(pattern,), colwise=(f"{mlp}.fc1",), rowwise=(f"{mlp}.fc2",), regions=(mlp,),
                     sequence_parallel=tuple(f"{pattern}.norm{i}" for i in (1, 2, 3)),
                     ).merged(attention_plan(f"{pattern}.self_attn", config)).merged(
                         attention_plan(f"{pattern}.cross_attn", config))
