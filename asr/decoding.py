"""Transducer decoding: batched greedy search and modified beam search (at most one symbol per
frame per hypothesis, identical hypotheses merged by log-add; icefall's `modified_beam_search`).

Both take a `Transducer` and its encoder output (B, T, E) with lengths (B,), and return one token
id list per utterance (blank never included).
"""

from __future__ import annotations

import torch

from asr.model import Transducer


def _decoder_proj(model: Transducer, contexts: torch.Tensor) -> torch.Tensor:
    """(N, context_size) last tokens -> the joiner's decoder projection of the last position (N, J)."""
    return model.joiner.decoder_proj(model.decoder(contexts)[:, -1])


@torch.no_grad()
def greedy_search(model: Transducer, encoder_out: torch.Tensor, lengths: torch.Tensor,
                  max_symbols_per_frame: int = 3) -> list[list[int]]:
    """Batched greedy decoding: at each frame, emit the argmax token until it is blank or
    `max_symbols_per_frame` tokens were emitted there."""
    if max_symbols_per_frame < 1:
        raise ValueError(f"max_symbols_per_frame must be >= 1; got {max_symbols_per_frame}")
    batch, blank = encoder_out.shape[0], model.config.blank_id
    contexts = torch.full((batch, model.config.context_size), blank, dtype=torch.long, device=encoder_out.device)
    decoder_proj = _decoder_proj(model, contexts)
    encoder_proj = model.joiner.encoder_proj(encoder_out)
    hypotheses: list[list[int]] = [[] for _ in range(batch)]
    for t in range(encoder_out.shape[1]):
        active = t < lengths
        for _ in range(max_symbols_per_frame):
            tokens = model.joiner.combine(encoder_proj[:, t], decoder_proj).argmax(-1)
            emitted = active & (tokens != blank)
            if not emitted.any():
                break
            for row in emitted.nonzero().squeeze(1).tolist():
                hypotheses[row].append(int(tokens[row]))
            contexts = torch.where(emitted[:, None], torch.cat([contexts[:, 1:], tokens[:, None]], 1), contexts)
            decoder_proj = torch.where(emitted[:, None], _decoder_proj(model, contexts), decoder_proj)
            active = emitted
    return hypotheses


@torch.no_grad()
def modified_beam_search(model: Transducer, encoder_out: torch.Tensor, lengths: torch.Tensor,
                         beam: int = 4) -> list[list[int]]:
    """Beam search with at most one symbol per frame: each frame extends every hypothesis by blank
    or one token, keeps the `beam` best, and merges hypotheses with equal tokens (log-add of their
    probabilities). Returns each utterance's best hypothesis."""
    if beam < 1:
        raise ValueError(f"beam must be >= 1; got {beam}")
    blank, context = model.config.blank_id, model.config.context_size
    results = []
    for row in range(encoder_out.shape[0]):
        encoder_proj = model.joiner.encoder_proj(encoder_out[row, : int(lengths[row])])
        hypotheses: dict[tuple[int, ...], torch.Tensor] = {(): torch.zeros((), device=encoder_out.device)}
        for frame in encoder_proj:
            keys = list(hypotheses)
            contexts = torch.tensor([([blank] * context + list(k))[-context:] for k in keys], device=encoder_out.device)
            scores = torch.stack([hypotheses[k] for k in keys])
            log_probs = model.joiner.combine(frame, _decoder_proj(model, contexts)).float().log_softmax(-1)
            candidates = (log_probs + scores[:, None]).flatten()
            top = candidates.topk(min(beam, candidates.numel()))
            merged: dict[tuple[int, ...], torch.Tensor] = {}
            vocab = log_probs.shape[1]
            for score, index in zip(top.values, top.indices.tolist()):
                source, token = divmod(index, vocab)
                key = keys[source] if token == blank else keys[source] + (token,)
                merged[key] = torch.logaddexp(merged[key], score) if key in merged else score
            hypotheses = merged
        results.append(list(max(hypotheses, key=lambda k: hypotheses[k].item())))
    return results
