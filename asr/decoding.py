"""Transducer decoding: batched greedy search and modified beam search (identical hypotheses
merged by log-add; with one symbol per frame, icefall's `modified_beam_search`; more symbols per
frame let character models keep up with fast speech).

Both take a `Transducer` and its encoder output (B, T, E) with lengths (B,), and return one token
id list per utterance (blank never included); `beam_search_hypotheses` returns each utterance's
final beam (its n-best) with scores. `greedy_continue` goes on from a `GreedyState` over
frames that arrive later (`asr.streaming`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from asr.language_model import END, LanguageModel
from asr.model import Transducer


def _decoder_proj(model: Transducer, contexts: torch.Tensor) -> torch.Tensor:
    """(N, context_size) last tokens -> the joiner's decoder projection of the last position (N, J)."""
    return model.joiner.decoder_proj(model.decoder.last(contexts))


@dataclass
class GreedyState:
    """Where a batch of greedy searches stands, so that it can go on over later frames (streaming)."""

    contexts: torch.Tensor
    """(B, context_size) each hypothesis's last tokens (blanks before the first)."""
    decoder_proj: torch.Tensor
    """(B, J) the joiner's decoder projection of those contexts."""
    hypotheses: list[list[int]]
    """Tokens emitted so far, per utterance."""
    frames: list[list[int]]
    """The encoder frame (counted from the first one searched) each of those tokens was emitted at."""
    frames_done: int = 0
    """Encoder frames searched so far."""

    @classmethod
    def start(cls, model: Transducer, batch: int, device: torch.device | str = "cpu") -> GreedyState:
        blank = model.config.blank_id
        contexts = torch.full((batch, model.config.context_size), blank, dtype=torch.long, device=device)
        return cls(contexts, _decoder_proj(model, contexts), [[] for _ in range(batch)], [[] for _ in range(batch)])


@torch.no_grad()
def greedy_continue(model: Transducer, encoder_out: torch.Tensor, lengths: torch.Tensor, state: GreedyState,
                    max_symbols_per_frame: int = 3) -> GreedyState:
    """Greedy search over encoder_out (B, T, E) (lengths (B,)) going on from `state`, which it updates:
    at each frame, emit the argmax token until it is blank or `max_symbols_per_frame` were emitted there."""
    if max_symbols_per_frame < 1:
        raise ValueError(f"max_symbols_per_frame must be >= 1; got {max_symbols_per_frame}")
    blank = model.config.blank_id
    encoder_proj = model.joiner.encoder_proj(encoder_out)
    for t in range(encoder_out.shape[1]):
        active = t < lengths
        for _ in range(max_symbols_per_frame):
            tokens = model.joiner.combine(encoder_proj[:, t], state.decoder_proj).argmax(-1)
            emitted = active & (tokens != blank)
            if not emitted.any():
                break
            for row in emitted.nonzero().squeeze(1).tolist():
                state.hypotheses[row].append(int(tokens[row]))
                state.frames[row].append(state.frames_done + t)
            state.contexts = torch.where(emitted[:, None], torch.cat([state.contexts[:, 1:], tokens[:, None]], 1),
                                         state.contexts)
            state.decoder_proj = torch.where(emitted[:, None], _decoder_proj(model, state.contexts), state.decoder_proj)
            active = emitted
    state.frames_done += encoder_out.shape[1]
    return state


@torch.no_grad()
def greedy_search(model: Transducer, encoder_out: torch.Tensor, lengths: torch.Tensor,
                  max_symbols_per_frame: int = 3) -> list[list[int]]:
    """Batched greedy decoding: at each frame, emit the argmax token until it is blank or
    `max_symbols_per_frame` tokens were emitted there."""
    state = GreedyState.start(model, encoder_out.shape[0], encoder_out.device)
    return greedy_continue(model, encoder_out, lengths, state, max_symbols_per_frame).hypotheses


Hypotheses = dict[tuple[int, ...], float]
"""Token sequence -> its log probability (a float32 value: the search adds in float32)."""


def _log_add(hypotheses: Hypotheses, key: tuple[int, ...], score: float) -> None:
    """Merge `score` into key's (log-add in float32, as the scores are computed)."""
    hypotheses[key] = float(np.logaddexp(np.float32(hypotheses[key]), np.float32(score))) if key in hypotheses else score


def _best(hypotheses: Hypotheses, count: int) -> Hypotheses:
    return dict(sorted(hypotheses.items(), key=lambda item: -item[1])[:count])


def modified_beam_search(model: Transducer, encoder_out: torch.Tensor, lengths: torch.Tensor,
                         beam: int = 4, max_symbols_per_frame: int = 1,
                         language_model: LanguageModel | None = None, lm_weight: float = 0.0,
                         ilm_weight: float = 0.0) -> list[list[int]]:
    """Each utterance's best hypothesis of `beam_search_hypotheses` (same arguments)."""
    return [hypotheses[0][0] for hypotheses in beam_search_hypotheses(
        model, encoder_out, lengths, beam, max_symbols_per_frame, language_model, lm_weight, ilm_weight)]


@torch.no_grad()
def beam_search_hypotheses(model: Transducer, encoder_out: torch.Tensor, lengths: torch.Tensor,
                           beam: int = 4, max_symbols_per_frame: int = 1,
                           language_model: LanguageModel | None = None, lm_weight: float = 0.0,
                           ilm_weight: float = 0.0) -> list[list[tuple[list[int], float]]]:
    """Beam search over frames. At each frame, up to `max_symbols_per_frame` rounds: every hypothesis
    still expanding at this frame is extended by blank (it moves on to the next frame) or by one
    token; the `beam` best extensions are kept, and a token extension keeps expanding at this frame
    unless this was the last round (then it moves on, as in icefall's one-symbol search).
    Hypotheses with equal tokens are merged (log-add of their probabilities); `beam` of them carry
    over to the next frame. Returns each utterance's final hypotheses (at most `beam`: its n-best
    for a second pass to rescore), best first, as (token ids, score).

    Shallow fusion: with a `language_model`, each token adds `lm_weight` x its log probability
    given the hypothesis's tokens, and the final choice adds `lm_weight` x that of the sentence end
    (equal token sequences have equal language-model scores, so merging stays a log-add). Tokens
    the language model rules out (log probability -inf, as a lexicon does) are never taken; if every
    final hypothesis is ruled out (speech ends inside a word), the best is chosen without the end.

    Internal language model estimation (ILME, Meng et al. 2021): in the fusion, each token also
    subtracts `ilm_weight` x its log probability under the transducer's own language model (the
    joiner without the encoder), so that the prior of the training text is not counted twice."""
    if beam < 1 or max_symbols_per_frame < 1:
        raise ValueError(f"beam and max_symbols_per_frame must be >= 1; got {beam} and {max_symbols_per_frame}")
    blank, context = model.config.blank_id, model.config.context_size
    if language_model is not None and (language_model.vocab_size != model.config.vocab_size or blank != END):
        raise ValueError(f"language_model must share the model's {model.config.vocab_size} tokens with blank id {END}; "
                         f"got vocab_size {language_model.vocab_size} (blank id {blank})")
    fused = language_model is not None and lm_weight != 0
    device = encoder_out.device
    # Context (the last context_size tokens) -> its (J,) decoder projection: a hypothesis that only
    # adds blanks keeps its context, so the decoder runs once per new context, not once per frame.
    projected: dict[tuple[int, ...], torch.Tensor] = {}
    results = []
    for row in range(encoder_out.shape[0]):
        encoder_proj = model.joiner.encoder_proj(encoder_out[row, : int(lengths[row])])
        hypotheses: Hypotheses = {(): 0.0}
        fusion: dict[tuple[int, ...], torch.Tensor] = {}  # hypothesis -> its (V,) fusion terms, while in the beam
        for frame in encoder_proj:
            expanding, moved_on = hypotheses, {}
            fusion = {k: fusion[k] for k in hypotheses if k in fusion}
            for round_ in range(max_symbols_per_frame):
                keys = list(expanding)
                contexts = [tuple(([blank] * context + list(k))[-context:]) for k in keys]
                new = [c for c in dict.fromkeys(contexts) if c not in projected]
                if new:
                    projected.update(zip(new, _decoder_proj(model, torch.tensor(new, device=device))))
                decoder_proj = torch.stack([projected[c] for c in contexts])
                log_probs = model.joiner.combine(frame, decoder_proj).float().log_softmax(-1)
                if fused:
                    unseen = [i for i, k in enumerate(keys) if k not in fusion]
                    if unseen:
                        terms = _fusion_terms(model, [keys[i] for i in unseen], decoder_proj[unseen], language_model,
                                              lm_weight, ilm_weight)
                        fusion.update(zip([keys[i] for i in unseen], terms))
                    log_probs = log_probs + torch.stack([fusion[k] for k in keys])
                scores = torch.tensor([expanding[k] for k in keys], dtype=torch.float32, device=device)
                candidates = (log_probs + scores[:, None]).flatten()
                top = candidates.topk(min(beam, candidates.numel()))
                last_round, expanding = round_ == max_symbols_per_frame - 1, {}
                for score, index in zip(top.values.tolist(), top.indices.tolist()):
                    if score == -math.inf:  # ruled out by the language model
                        continue
                    source, token = divmod(index, log_probs.shape[1])
                    if token == blank:
                        _log_add(moved_on, keys[source], score)
                    else:
                        _log_add(moved_on if last_round else expanding, keys[source] + (token,), score)
                if len(moved_on) >= beam:  # expansions only lose probability: drop those already out of the beam
                    floor = min(_best(moved_on, beam).values())
                    expanding = {k: v for k, v in expanding.items() if v > floor}
                if not expanding:
                    break
            hypotheses = _best(moved_on, beam)
        if fused:
            ended = {k: v + lm_weight * float(language_model.log_probs(k)[END]) for k, v in hypotheses.items()}
            hypotheses = ended if any(v > -math.inf for v in ended.values()) else hypotheses
        results.append(sorted(((list(tokens), score) for tokens, score in hypotheses.items()), key=lambda item: -item[1]))
    return results


def _fusion_terms(model: Transducer, keys: list[tuple[int, ...]], decoder_proj: torch.Tensor,
                  language_model: LanguageModel, lm_weight: float, ilm_weight: float) -> torch.Tensor:
    """(N, V) what shallow fusion adds to each next token's log probability after each of the
    hypotheses `keys` (whose decoder projections are decoder_proj (N, J)): lm_weight x the language
    model's log probability less ilm_weight x the internal language model's; 0 for the blank. On
    decoder_proj's device."""
    terms = lm_weight * _token_log_probs(language_model, keys, model.config.blank_id).to(decoder_proj.device)
    return terms - ilm_weight * internal_log_probs(model, decoder_proj) if ilm_weight else terms


@torch.no_grad()
def hypothesis_scores(model: Transducer, encoder_out: torch.Tensor, hypotheses: list[list[int]],
                      max_symbols_per_frame: int = 1, language_model: LanguageModel | None = None,
                      lm_weight: float = 0.0, ilm_weight: float = 0.0) -> list[float]:
    """The score `beam_search_hypotheses` would give each of `hypotheses` (token ids) of one
    utterance's encoder output (T, E) if its beam kept every prefix: the log of the summed
    probability of all its alignments the search can take (at most `max_symbols_per_frame` tokens a
    frame, the last of them moving on to the next frame without a blank), and with a
    `language_model` and lm_weight != 0, + lm_weight x its log probability of each token and of the
    end, - ilm_weight x the internal language model's of each token. A hypothesis from elsewhere
    (another recogniser) is so scored as the beam's own are."""
    if max_symbols_per_frame < 1:
        raise ValueError(f"max_symbols_per_frame must be >= 1; got {max_symbols_per_frame}")
    blank, fused = model.config.blank_id, language_model is not None and lm_weight != 0
    encoder_proj = model.joiner.encoder_proj(encoder_out)  # (T, J), shared by the hypotheses
    scores = []
    for tokens in hypotheses:
        targets = torch.tensor(tokens, dtype=torch.long, device=encoder_out.device)
        start = torch.full((1,), blank, dtype=torch.long, device=encoder_out.device)
        decoder_proj = model.joiner.decoder_proj(model.decoder(torch.cat([start, targets])[None])[0])  # (U+1, J)
        log_probs = model.joiner.combine(encoder_proj[:, None], decoder_proj[None]).float().log_softmax(-1)  # (T, U+1, V)
        next_token = log_probs[:, :-1].gather(2, targets.expand(log_probs.shape[0], -1)[..., None])[..., 0]
        score = float(_alignment_sum(log_probs[..., blank].double(), next_token.double(), max_symbols_per_frame))
        if fused:  # the beam's own fusion terms of each token after its prefix, and of the end
            if tokens:
                terms = _fusion_terms(model, [tuple(tokens[:i]) for i in range(len(tokens))], decoder_proj[:-1],
                                      language_model, lm_weight, ilm_weight)
                score += float(terms[torch.arange(len(tokens)), targets].double().sum())
            score += lm_weight * float(language_model.log_probs(tokens)[END])
        scores.append(score)
    return scores


def _alignment_sum(blank: torch.Tensor, token: torch.Tensor, max_symbols_per_frame: int) -> torch.Tensor:
    """log of the summed probability of every alignment of U tokens to T frames that
    `beam_search_hypotheses` can take, given the log probabilities of the blank (T, U+1) and of the
    next token (T, U) at each frame and number of tokens emitted."""
    frames, width = blank.shape
    entering = torch.full((width,), -torch.inf, dtype=blank.dtype, device=blank.device)
    entering[0] = 0.0  # log probability of starting frame t with u tokens emitted
    for t in range(frames):
        leaving = entering + blank[t]  # a blank ends the frame
        in_frame = entering
        for round_ in range(max_symbols_per_frame):
            emitted = torch.full_like(entering, -torch.inf)
            emitted[1:] = in_frame[:-1] + token[t]  # one more token at this frame
            if round_ == max_symbols_per_frame - 1:  # the last round's token moves on without a blank
                leaving = torch.logaddexp(leaving, emitted)
            else:
                leaving = torch.logaddexp(leaving, emitted + blank[t])
                in_frame = emitted
        entering = leaving
    return entering[-1]


def _token_log_probs(language_model: LanguageModel, keys: list[tuple[int, ...]], blank: int) -> torch.Tensor:
    """(N, V) language-model log probabilities of each hypothesis's next token; 0 for the blank."""
    scores = torch.stack([language_model.log_probs(k) for k in keys]).float()
    scores[:, blank] = 0
    return scores


def internal_log_probs(model: Transducer, decoder_proj: torch.Tensor) -> torch.Tensor:
    """(N, V) the transducer's internal language model (ILME, Meng et al. 2021): the joiner without
    the encoder's projection, normalised over the non-blank tokens; 0 for the blank."""
    logits = model.joiner.out(torch.tanh(decoder_proj)).float()
    logits[:, model.config.blank_id] = -torch.inf
    scores = logits.log_softmax(-1)
    scores[:, model.config.blank_id] = 0
    return scores
