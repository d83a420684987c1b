"""Whisper's text decoder (Radford et al., 2022) on the zoo.nn layers, imported from the CTranslate2
`model.bin` of a converted Whisper checkpoint, for teacher-forced scoring of given token sequences.

    tokens (N, L) -> embeddings + learned positions -> pre-LN blocks of
        causal self-attention, cross-attention over the encoded audio (1, T', W), feed-forward
    -> LayerNorm -> (N, L, W) -> logits against the tied embeddings (V)

`sequence_log_probs` scores N sequences that share one clip: the cross-attention keys and values are
projected once for the clip (every query of every sequence attends the same keys, unmasked), and the
vocabulary projection, most of the cost, runs once per distinct prefix: the hypotheses of a beam
share most of theirs. Whisper tiny.en: W = 384, 4 blocks of 6 heads, V = 51,864, 448 positions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from asr.whisper_encoder import layer_state, whisper_part
from zoo.nn import FusedMLP, KVCache, Norm, SelfAttention
from zoo.nn.attention import attention
from zoo.nn.kv_cache import LayerKVCache


@dataclass(frozen=True)
class WhisperDecoderConfig:
    """Shape of a Whisper text decoder (the defaults are tiny.en's)."""

    vocab_size: int = 51864
    """Tokens V (tiny.en's byte-level BPE and its special tokens)."""
    width: int = 384
    """Model width W."""
    layers: int = 4
    """Decoder blocks."""
    heads: int = 6
    """Attention heads; must divide W."""
    max_tokens: int = 448
    """Learned positions: the longest token sequence."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "width", "layers", "heads", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"WhisperDecoderConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.width % self.heads:
            raise ValueError(f"WhisperDecoderConfig.width must be divisible by heads ({self.heads}); got {self.width}")


class CrossAttention(nn.Module):
    """Attention of queries (N, L, W) over one clip's encoded audio (1, T', W) shared by all N:
    q, k, v, out as in `SelfAttention`; the keys and values are projected once (`project_memory`)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))

    def project_memory(self, encoded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """encoded (1, T', W) -> keys and values (1, H, T', D)."""
        return tuple(linear(encoded).unflatten(-1, (self.heads, -1)).transpose(1, 2) for linear in (self.k, self.v))

    def forward(self, x: torch.Tensor, memory: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x (N, L, W), memory from `project_memory` -> (N, L, W). The N x L queries attend as one
        sequence of N L: with no mask, each query's output is its own."""
        n, length, width = x.shape
        q = self.q(x).reshape(1, n * length, self.heads, -1).transpose(1, 2)  # (1, H, N L, D)
        y = attention(q, *memory, training=False)
        return self.out(y.transpose(1, 2).reshape(n, length, width))


class WhisperDecoderBlock(nn.Module):
    """Pre-LN: x + self_attn(norm1(x)) (causal), + cross(norm_cross(.)), + mlp(norm2(.))."""

    def __init__(self, config: WhisperDecoderConfig) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config.width, config.heads, causal=True)
        self.cross = CrossAttention(config.width, config.heads)
        self.mlp = FusedMLP(config.width, 4 * config.width, "gelu")
        self.norm1, self.norm_cross, self.norm2 = (Norm(config.width) for _ in range(3))

    def forward(self, x: torch.Tensor, memory: tuple[torch.Tensor, torch.Tensor],
                cache: LayerKVCache | None = None) -> torch.Tensor:
        """x (N, L, W) -> (N, L, W); padding after a sequence's end never reaches its tokens (causal).
        cache: this block's past self-attention keys and values (x then holds only the new positions)."""
        x = x + self.self_attn(self.norm1(x), cache=cache)
        x = x + self.cross(self.norm_cross(x), memory)
        return x + self.mlp(self.norm2(x))


class WhisperDecoder(nn.Module):
    """forward(tokens (N, L), encoded (1, T', W)) -> hidden (N, L, W) after the final norm;
    `logits(hidden (..., W))` -> (..., V); `sequence_log_probs` scores whole sequences, `greedy`
    transcribes."""

    def __init__(self, config: WhisperDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.width)
        self.positions = nn.Parameter(torch.zeros(config.max_tokens, config.width))
        self.blocks = nn.ModuleList(WhisperDecoderBlock(config) for _ in range(config.layers))
        self.norm = Norm(config.width)

    def forward(self, tokens: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        return self.decode(tokens, self.memories(encoded))

    def memories(self, encoded: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each block's cross-attention keys and values (1, H, T', D) of one clip's encoded audio (1, T', W)."""
        c = self.config
        if encoded.ndim != 3 or encoded.shape[0] != 1 or encoded.shape[2] != c.width:
            raise ValueError(f"encoded must be one clip's (1, T', {c.width}); got {tuple(encoded.shape)}")
        return [block.cross.project_memory(encoded) for block in self.blocks]

    def decode(self, tokens: torch.Tensor, memories: list[tuple[torch.Tensor, torch.Tensor]],
               cache: KVCache | None = None) -> torch.Tensor:
        """tokens (N, L) with a clip's `memories` -> hidden (N, L, W) after the final norm. With
        `cache`, the tokens follow the cached positions, whose self-attention keys and values it
        holds, and theirs join it."""
        c, start = self.config, 0 if cache is None else cache.length
        if tokens.ndim != 2 or not 1 <= start + tokens.shape[1] <= c.max_tokens:
            raise ValueError(f"tokens must be (N, L) with 1 <= L <= {c.max_tokens - start}; got {tuple(tokens.shape)}")
        x = self.embeddings(tokens) + self.positions[start : start + tokens.shape[1]]
        for index, (block, memory) in enumerate(zip(self.blocks, memories)):
            x = block(x, memory, None if cache is None else cache.layer(index))
        if cache is not None:
            cache.advance(tokens.shape[1])
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., W) -> (..., V), the output projection tied to the embeddings."""
        return hidden @ self.embeddings.weight.T

    @torch.no_grad()
    def sequence_log_probs(self, encoded: torch.Tensor, prompt: Sequence[int],
                           sequences: Sequence[Sequence[int]]) -> list[float]:
        """log P(sequence | prompt, encoded) of each of `sequences` (token ids, each scored after
        `prompt`, teacher-forced), given one clip's encoded audio (1, T', W)."""
        if not sequences:
            return []
        if not prompt or any(not s for s in sequences):
            raise ValueError("prompt and every sequence must hold at least one token")
        inputs = [list(prompt) + list(s[:-1]) for s in sequences]
        length = max(map(len, inputs))
        tokens = torch.tensor([row + [0] * (length - len(row)) for row in inputs], device=encoded.device)
        hidden = self(tokens, encoded)  # (N, L, W)
        # The distribution at position p depends on tokens[: p + 1] only: one row per distinct prefix.
        rows: dict[tuple[int, ...], int] = {}
        where, picks = [], []
        for i, (row, sequence) in enumerate(zip(inputs, sequences)):
            for p in range(len(prompt) - 1, len(row)):
                prefix = tuple(row[: p + 1])
                if prefix not in rows:
                    rows[prefix] = len(where)
                    where.append((i, p))
                picks.append((i, rows[prefix], sequence[p - len(prompt) + 1]))
        index = torch.tensor(where, device=encoded.device)
        log_probs = self.logits(hidden[index[:, 0], index[:, 1]]).log_softmax(-1)  # (distinct prefixes, V)
        totals = [0.0] * len(sequences)
        chosen = log_probs[[r for _, r, _ in picks], [t for _, _, t in picks]].tolist()
        for (i, _, _), value in zip(picks, chosen):
            totals[i] += value
        return totals

    @torch.no_grad()
    def greedy(self, encoded: torch.Tensor, prompt: Sequence[int], end: int, max_new: int) -> list[int]:
        """Whisper's greedy transcript of one clip's encoded audio (1, T', W) after `prompt`: at each
        step the most probable of the text tokens and `end` (Whisper's special tokens, numbered after
        its end of text, are never chosen), until `end` (not returned), `max_new` tokens or the last
        position; one token a step through a cache of the past keys and values."""
        c = self.config
        length = min(len(prompt) + max_new, c.max_tokens)
        cache = KVCache(c.layers, 1, c.heads, c.width // c.heads, length, dtype=encoded.dtype, device=encoded.device)
        memories, step, tokens = self.memories(encoded), list(prompt), []
        while len(prompt) + len(tokens) < length:
            hidden = self.decode(torch.tensor([step], device=encoded.device), memories, cache)[0, -1]
            token = int(self.logits(hidden)[: end + 1].argmax())
            if token == end:
                break
            tokens.append(token)
            step = [token]
        return tokens

    @classmethod
    def from_ctranslate2(cls, path: str | os.PathLike) -> WhisperDecoder:
        """The decoder of the CTranslate2 Whisper `model.bin` at `path` (or in the folder `path`), in
        float32, its shape read from the file. Projections Whisper has without a bias (keys) get
        CTranslate2's stored zero biases."""
        v, layers = whisper_part(path, "decoder")
        vocab_size, width = v["embeddings/weight"].shape
        config = WhisperDecoderConfig(vocab_size=vocab_size, width=width, layers=layers, heads=int(v["num_heads"]),
                                      max_tokens=v["position_encodings/encodings"].shape[0])
        state = {"embeddings.weight": v["embeddings/weight"], "positions": v["position_encodings/encodings"],
                 "norm.weight": v["layer_norm/gamma"], "norm.bias": v["layer_norm/beta"]}
        for i in range(layers):
            layer, block = f"layer_{i}", f"blocks.{i}"
            state |= layer_state(v, i, "self_attn")
            for kind in ("weight", "bias"):
                cross_k, cross_v = v[f"{layer}/attention/linear_1/{kind}"].chunk(2)
                state |= {f"{block}.cross.q.{kind}": v[f"{layer}/attention/linear_0/{kind}"],
                          f"{block}.cross.k.{kind}": cross_k, f"{block}.cross.v.{kind}": cross_v,
                          f"{block}.cross.out.{kind}": v[f"{layer}/attention/linear_2/{kind}"]}
            state |= {f"{block}.norm_cross.weight": v[f"{layer}/attention/layer_norm/gamma"],
                      f"{block}.norm_cross.bias": v[f"{layer}/attention/layer_norm/beta"]}
        decoder = cls(config)
        decoder.load_state_dict(state)
        return decoder
