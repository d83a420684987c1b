"""GPT: a pre-LN decoder-only transformer (nanoGPT-shaped), written plainly with SDPA attention.

The fused layers of `zoo.nn` replace these parts in a later step; the shapes and the state-dict
names stay.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nlp.gpt.config import GPTConfig
from zoo.plan import ModelPlan
from zoo.registry import register


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through `scaled_dot_product_attention`."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C)."""
        batch, length, channels = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_head, channels // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(batch, length, channels)))


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(C, 4C), GELU (tanh), Linear(4C, C), dropout."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C)."""
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    """x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C)."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


@register("gpt", GPTConfig)
class GPT(nn.Module):
    """Token + position embeddings, `n_layer` blocks, final LayerNorm, LM head tied to the token
    embedding. `forward(input_ids, labels=None)` returns {"logits", "loss"}."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    def parallel_plan(self) -> ModelPlan:
        """Each transformer block is one sharding and recompute unit."""
        return ModelPlan(blocks=("blocks.*",))

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer)."""
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith(".proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()

    def num_parameters(self) -> int:
        """Number of parameters (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """input_ids: (B, T) int64 with T <= block_size; labels: (B, T) int64 next-token targets
        (-100 ignored), already shifted. Returns logits (B, T, V) and, with labels, the mean
        cross-entropy "loss" computed in fp32."""
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must have shape (B, T); got {tuple(input_ids.shape)}")
        length = input_ids.shape[1]
        if length > self.config.block_size:
            raise ValueError(f"input_ids length must be <= block_size={self.config.block_size}; got {length}")
        positions = torch.arange(length, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        output = {"logits": logits}
        if labels is not None:
            output["loss"] = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        return output

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample `max_new_tokens` continuations of input_ids (B, T); returns (B, T + max_new_tokens).
        temperature 0 is greedy; top_k keeps the k most likely tokens."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0; got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {temperature}")
        ids = input_ids
        for _ in range(max_new_tokens):
            logits = self(ids[:, -self.config.block_size :])["logits"][:, -1, :].float()
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_id = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            ids = torch.cat([ids, next_id], dim=1)
        return ids
