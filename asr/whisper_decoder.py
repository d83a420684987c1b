"""Whisper's text decoder (Radford et al., 2022) on the zoo.nn layers, imported from the CTranslate2
`model.bin` of a converted Whisper checkpoint, for teacher-forced scoring of given token sequences.

    tokens (N, L) -> embeddings + learned positions -> pre-LN blocks of
        causal self-attention, cross-attention over the encoded audio (1, T', W), feed-forward
    -> LayerNorm -> (N, L, W) -> logits against the tied embeddings (V)

A clip's cross-attention keys and values are projected once (`memories`) for every query of every
sequence. `sequence_log_probs` scores N sequences of one clip as a tree of their distinct prefixes
(the hypotheses of a beam share most of theirs): each prefix is decoded once, attending its
ancestors only (tree attention, as SpecInfer scores its token trees), and the vocabulary projection
runs once per prefix. Whisper tiny.en: W = 384, 4 blocks of 6 heads, V = 51,864, 448 positions.
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

Memories = list[tuple[torch.Tensor, torch.Tensor]]
"""One clip as the decoder reads it: each block's cross-attention keys and values (1, H, T', D)
(`WhisperDecoder.memories`)."""


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
                cache: LayerKVCache | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (N, L, W) -> (N, L, W); padding after a sequence's end never reaches its tokens (causal).
        cache: this block's past self-attention keys and values (x then holds only the new positions).
        attn_mask: (L, L) bool, True where a position may attend another (and causally)."""
        x = x + self.self_attn(self.norm1(x), cache=cache, attn_mask=attn_mask)
        x = x + self.cross(self.norm_cross(x), memory)
        return x + self.mlp(self.norm2(x))


class WhisperDecoder(nn.Module):
    """forward(tokens (N, L), encoded (1, T', W)) -> hidden (N, L, W) after the final norm;
    `logits(hidden (..., W))` -> (..., V); `memories(encoded)` projects a clip for `decode`,
    `sequence_log_probs` (which scores whole sequences) and `greedy` (which transcribes)."""

    def __init__(self, config: WhisperDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.width)
        self.positions = nn.Parameter(torch.zeros(config.max_tokens, config.width))
        self.blocks = nn.ModuleList(WhisperDecoderBlock(config) for _ in range(config.layers))
        self.norm = Norm(config.width)

    def forward(self, tokens: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        return self.decode(tokens, self.memories(encoded))

    def memories(self, encoded: torch.Tensor) -> Memories:
        """Each block's cross-attention keys and values (1, H, T', D) of one clip's encoded audio (1, T', W)."""
        c = self.config
        if encoded.ndim != 3 or encoded.shape[0] != 1 or encoded.shape[2] != c.width:
            raise ValueError(f"encoded must be one clip's (1, T', {c.width}); got {tuple(encoded.shape)}")
        return [block.cross.project_memory(encoded) for block in self.blocks]

    def decode(self, tokens: torch.Tensor, memories: Memories, cache: KVCache | None = None,
               tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """tokens (N, L) with a clip's `memories` -> hidden (N, L, W) after the final norm. With
        `cache`, the tokens follow the cached positions, whose self-attention keys and values it
        holds, and theirs join it. With `tree` = (positions (L,), ancestors (L, L) bool), the L tokens
        are nodes of a tree, each at its own position and attending only its ancestors and itself
        (which come before it)."""
        c, start = self.config, 0 if cache is None else cache.length
        if tree is None:
            if tokens.ndim != 2 or not 1 <= start + tokens.shape[1] <= c.max_tokens:
                raise ValueError(f"tokens must be (N, L) with 1 <= L <= {c.max_tokens - start}; got {tuple(tokens.shape)}")
            positions, mask = self.positions[start : start + tokens.shape[1]], None
        else:
            depths, mask = tree
            if cache is not None or tokens.ndim != 2 or depths.shape != tokens.shape[1:] or int(depths.max()) >= c.max_tokens:
                raise ValueError(f"a tree decodes without a cache, tokens (N, L) at positions (L,) below {c.max_tokens}; "
                                 f"got tokens {tuple(tokens.shape)}, positions up to {int(depths.max())}")
            positions = self.positions[depths]
        x = self.embeddings(tokens) + positions
        for index, (block, memory) in enumerate(zip(self.blocks, memories)):
            x = block(x, memory, None if cache is None else cache.layer(index), mask)
        if cache is not None:
            cache.advance(tokens.shape[1])
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """hidden (..., W) -> (..., V), the output projection tied to the embeddings; with `count`,
        the first `count` tokens' only (..., count)."""
        return hidden @ self.embeddings.weight[:count].T

    @torch.no_grad()
    def sequence_log_probs(self, memories: Memories, prompt: Sequence[int], sequences: Sequence[Sequence[int]]
                           ) -> list[float]:
        """log P(sequence | prompt, clip) of each of `sequences` (token ids, each scored after
        `prompt`, teacher-forced), given one clip's `memories`. The distribution at a position
        depends on the tokens up to it only, so each distinct prefix of prompt + sequence[:-1] is one
        node of a tree, decoded once."""
        if not sequences:
            return []
        if not prompt or any(not s for s in sequences):
            raise ValueError("prompt and every sequence must hold at least one token")
        nodes: dict[tuple[int, ...], int] = {}  # prefix -> node, parents before children
        tokens, depths, parents, picks = [], [], [], []  # picks: (sequence, node predicting, token)
        for i, sequence in enumerate(sequences):
            row = list(prompt) + list(sequence[:-1])
            for p in range(len(row)):
                prefix = tuple(row[: p + 1])
                if prefix not in nodes:
                    nodes[prefix] = len(tokens)
                    tokens.append(row[p])
                    depths.append(p)
                    parents.append(nodes[prefix[:-1]] if p else None)
                if p >= len(prompt) - 1:
                    picks.append((i, nodes[prefix], sequence[p - len(prompt) + 1]))
        ancestors = torch.eye(len(tokens), dtype=torch.bool)
        for node, parent in enumerate(parents):
            if parent is not None:
                ancestors[node] |= ancestors[parent]
        device = memories[0][0].device
        hidden = self.decode(torch.tensor([tokens], device=device), memories,
                             tree=(torch.tensor(depths, device=device), ancestors.to(device)))[0]  # (nodes, W)
        predicting = {node: row for row, node in enumerate(dict.fromkeys(node for _, node, _ in picks))}
        log_probs = self.logits(hidden[list(predicting)]).log_softmax(-1)  # (predicting nodes, V)
        chosen = log_probs[[predicting[node] for _, node, _ in picks], [token for _, _, token in picks]].tolist()
        totals = [0.0] * len(sequences)
        for (i, _, _), value in zip(picks, chosen):
            totals[i] += value
        return totals

    @torch.no_grad()
    def greedy(self, memories: Memories, prompt: Sequence[int], end: int, max_new: int) -> list[int]:
        """Whisper's greedy transcript of one clip (its `memories`) after `prompt`: at each step the
        most probable of the text tokens and `end` (Whisper's special tokens, numbered after its end
        of text, are never chosen), until `end` (not returned), `max_new` tokens or the last
        position; one token a step through a cache of the past keys and values."""
        c, keys = self.config, memories[0][0]
        length = min(len(prompt) + max_new, c.max_tokens)
        cache = KVCache(c.layers, 1, c.heads, c.width // c.heads, length, dtype=keys.dtype, device=keys.device)
        step, tokens = list(prompt), []
        while len(prompt) + len(tokens) < length:
            hidden = self.decode(torch.tensor([step], device=keys.device), memories, cache)[0, -1]
            token = int(self.logits(hidden, end + 1).argmax())
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
