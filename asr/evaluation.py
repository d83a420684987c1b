"""Word error rates of a recogniser on a set of utterances, by greedy search, beam search and beam
search fused with a language model, with every utterance's transcript."""

from __future__ import annotations

from typing import Any

from asr.data import read_audio
from asr.features import FeatureConfig
from asr.language_model import LanguageModel
from asr.model import Transducer
from asr.text import TranscriptTokenizer
from asr.transcription import transcribe
from asr.wer import error_counts
from asr.whisper_rescoring import Rescoring


def word_error_rates(model: Transducer, rows: list[dict[str, Any]], tokenizer: TranscriptTokenizer,
                     features: FeatureConfig, beam: int, language_model: LanguageModel | None,
                     lm_weight: float, ilm_weight: float, rescoring: Rescoring | None = None) -> dict[str, Any]:
    """{"greedy_wer", "beam_wer", "lm_wer", "lm_cer", "rescored_wer", "utterances", "examples",
    "per_utterance"} of `rows` {"audio", "text"}: greedy search, beam search, beam search with the
    language model (without a language model lm_* repeat the plain beam search's), and that with
    `rescoring`'s second pass (the model's transcripts; without rescoring, the same as lm_*); examples:
    the first 3 (reference, hypothesis) pairs; per_utterance: every one's, with its own WER."""
    waveforms = [read_audio(row["audio"], features.sample_rate) for row in rows]
    references = [row["text"] for row in rows]
    greedy = transcribe(model, waveforms, tokenizer, features, method="greedy")
    searched = transcribe(model, waveforms, tokenizer, features, method="beam", beam=beam)
    fused = (transcribe(model, waveforms, tokenizer, features, method="beam", beam=beam, language_model=language_model,
                        lm_weight=lm_weight, ilm_weight=ilm_weight) if language_model is not None else searched)
    final = (transcribe(model, waveforms, tokenizer, features, method="beam", beam=beam, language_model=language_model,
                        lm_weight=lm_weight, ilm_weight=ilm_weight, rescoring=rescoring)
             if rescoring is not None and rescoring.weight else fused)
    return {"greedy_wer": error_counts(references, greedy).rate, "beam_wer": error_counts(references, searched).rate,
            "lm_wer": error_counts(references, fused).rate, "lm_cer": error_counts(references, fused, "char").rate,
            "rescored_wer": error_counts(references, final).rate, "utterances": len(rows),
            "examples": [{"reference": r, "hypothesis": h} for r, h in list(zip(references, final))[:3]],
            "per_utterance": [{"reference": r, "hypothesis": h, "wer": error_counts([r], [h]).rate}
                              for r, h in zip(references, final)]}
