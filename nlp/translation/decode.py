"""Beam search for the `Translator` (greedy is one beam), with its caches: the decoder's self-attention
keys and values of past positions (`zoo.nn.KVCache`, reordered as hypotheses survive) and the
encoder output's keys and values for each cross-attention, computed once per source.

The search is CTranslate2's (OpenNMT's): scores are sums of token log-probabilities; each step ranks
2 x beams continuations of a source's live hypotheses; each of the first `beams` that emits
`eos_token_id` is finished (its score over its length, EOS included, to the power `length_penalty`)
and its place taken by the next continuation that does not; a source is done once `beams`
hypotheses finished, or at its maximum length (`max_length_ratio` times its source tokens, at
least `min_length`, below the model's positions), where its live hypotheses finish as they are.
Without `use_cache` each step runs the decoder over the whole prefix: the same tokens, more work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from nlp.translation.config import TranslatorConfig
from nlp.translation.embedding import TranslatorEmbeddings
from zoo.nn import KVCache


class DecodedTranslator(Protocol):
    """What beam search reads of `nlp.translation.model.Translator` (which imports this module)."""

    config: TranslatorConfig
    embeddings: TranslatorEmbeddings
    decoder: nn.ModuleList
    """The decoder's `zoo.nn.DecoderBlock`s."""
    decoder_norm: nn.Module | None
    logits_bias: torch.Tensor | None
    """(V,), added to the logits; None without."""

    @property
    def filler_token_id(self) -> int:
        """The id of positions that carry nothing."""

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's weight (V, W)."""

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The source's memory (B, S, W)."""


@dataclass(frozen=True)
class BeamSettings:
    """How `beam_search` decodes."""

    beams: int = 4
    """Hypotheses kept per source (1: greedy)."""
    length_penalty: float = 1.0
    """A finished hypothesis scores sum log p / length ** length_penalty (its tokens, EOS included;
    0: no normalisation)."""
    max_length_ratio: float = 2.0
    """Most target tokens per source token (real tokens, the attention mask's)."""
    min_length: int = 8
    """Target tokens always allowed, whatever the source's length."""

    def __post_init__(self) -> None:
        if self.beams < 1:
            raise ValueError(f"BeamSettings.beams must be >= 1; got {self.beams}")
        if self.max_length_ratio <= 0:
            raise ValueError(f"BeamSettings.max_length_ratio must be > 0; got {self.max_length_ratio}")


class _Steps:
    """The decoder run one position at a time for hypotheses over their sources' memory (B x beams
    rows), with the caches (module docstring)."""

    def __init__(self, model: DecodedTranslator, memory: torch.Tensor, mask: torch.Tensor, use_cache: bool,
                 max_length: int) -> None:
        self.model, self.mask = model, mask
        self.memory_kv = [block.cross_attn.memory_kv(memory) for block in model.decoder]
        self_attn = model.decoder[0].self_attn
        self.cache = KVCache(len(model.decoder), memory.shape[0], self_attn.kv_heads, self_attn.head_dim, max_length,
                             dtype=memory.dtype, device=memory.device) if use_cache else None

    def reorder(self, rows: torch.Tensor) -> None:
        """Hypothesis i continues the old hypothesis rows[i] (same source)."""
        if self.cache is not None:
            self.cache.reorder(rows)

    def log_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """prefix (R, T) of decoder inputs -> log-probabilities of the next token (R, V), fp32."""
        model, cache = self.model, self.cache
        new = prefix[:, -1:] if cache is not None else prefix
        x = model.embeddings(new, start=prefix.shape[1] - new.shape[1], zero_start=model.config.zero_start_embedding)
        for index, block in enumerate(model.decoder):
            x = block(x, memory_padding_mask=self.mask, cache=None if cache is None else cache.layer(index),
                      memory_kv=self.memory_kv[index])
        if cache is not None:
            cache.advance(1)
        if model.decoder_norm is not None:
            x = model.decoder_norm(x)
        logits = F.linear(x[:, -1], model.head_weight, model.logits_bias)
        return logits.float().log_softmax(-1)


@torch.no_grad()
def beam_search(model: DecodedTranslator, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                settings: BeamSettings = BeamSettings(), use_cache: bool = True) -> list[list[int]]:
    """The best translation of each source row of input_ids (B, S) (attention_mask (B, S), 1 for
    real tokens): its target token ids, without the start token, ending with EOS unless it reached
    its maximum length."""
    config, beams = model.config, settings.beams
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    batch = input_ids.shape[0]
    limits = [min(config.max_positions - 1, max(settings.min_length, math.ceil(settings.max_length_ratio * n)))
              for n in mask.sum(1).tolist()]
    memory = model.encode(input_ids, mask).repeat_interleave(beams, 0)
    steps = _Steps(model, memory, mask.repeat_interleave(beams, 0), use_cache, max(limits) + 1)
    prefix = input_ids.new_full((batch * beams, 1), config.decoder_start_token_id)
    scores = torch.full((batch, beams), -math.inf, device=input_ids.device)
    scores[:, 0] = 0.0  # one live hypothesis a source to begin with
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = [False] * batch
    for length in range(1, max(limits) + 1):
        log_probs = steps.log_probs(prefix).view(batch, beams, -1)
        candidates = (scores[:, :, None] + log_probs).view(batch, -1)
        top_scores, top = candidates.topk(2 * beams, dim=1)
        rows, new_scores, tokens = [], [], []
        for b in range(batch):
            ranked = [(score, b * beams + index // log_probs.shape[-1], index % log_probs.shape[-1])
                      for score, index in zip(top_scores[b].tolist(), top[b].tolist())]
            live: list[tuple[float, int, int]] = []  # (score, row it continues, token)
            spare = iter(item for item in ranked[beams:] if item[2] != config.eos_token_id)
            for score, row, token in ranked[:beams] if not done[b] else ():
                if score == -math.inf:
                    break
                if token == config.eos_token_id or length == limits[b]:
                    finished[b].append((score / length ** settings.length_penalty, prefix[row, 1:].tolist() + [token]))
                    replacement = next(spare, None)
                    if replacement is not None and replacement[0] != -math.inf and length < limits[b]:
                        live.append(replacement)
                else:
                    live.append((score, row, token))
            if length == limits[b] or len(finished[b]) >= beams:
                done[b] = True
            live += [(-math.inf, b * beams, model.filler_token_id)] * (beams - len(live))  # idle rows
            for score, row, token in live[:beams]:
                new_scores.append(score)
                rows.append(row)
                tokens.append(token)
        if all(done):
            break
        order = torch.tensor(rows, device=prefix.device)
        steps.reorder(order)
        prefix = torch.cat([prefix[order], torch.tensor(tokens, device=prefix.device)[:, None]], dim=1)
        scores = torch.tensor(new_scores, device=scores.device).view(batch, beams)
    return [max(found, key=lambda item: item[0])[1] for found in finished]
