"""Choosing the next token from a language model's logits: greedy, temperature, top-k, top-p."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn."""

    temperature: float = 1.0
    """Logits are divided by it; 0 means greedy (argmax)."""
    top_k: int | None = None
    """Keep only the k most likely tokens (None: all)."""
    top_p: float | None = None
    """Nucleus sampling: keep the smallest set of most likely tokens whose probability reaches p (None: all)."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None; got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None; got {self.top_p}")


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits: (B, V) of the last position -> (B, 1) int64 token ids."""
    logits = logits.float()
    if sampling.temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / sampling.temperature
    if sampling.top_k is not None:
        kth = torch.topk(logits, min(sampling.top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the more likely ones already reach top_p (the first one always stays).
        drop = probs.cumsum(dim=-1) - probs >= sampling.top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
