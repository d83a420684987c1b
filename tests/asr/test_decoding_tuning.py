"""Choosing the fusion's settings over folds (`asr.decoding_tuning`): errors pooled over the folds,
each decoded with its own language model; entry (a)'s recogniser on fresh espeak-ng clips."""

from __future__ import annotations

import random

import pytest

from asr.data import CorpusConfig, split_sentences
from asr.decoding_tuning import BeamSearch, TuningFold, tuned_lexicon_penalty, tuned_lm_weight
from asr.language_model import NgramLanguageModel
from asr.transcription import recogniser, transcribe
from asr.voices import speak, voices
from asr.wer import error_counts


@pytest.mark.timeout(300)
def test_folds_pool_their_errors_and_each_decodes_with_its_own_language_model(tmp_path):
    found = recogniser("asr-transducer-conformer-streaming")
    shipped = found.language_model.base  # the token n-gram under the entry's soft lexicon
    sentences = split_sentences(CorpusConfig(text="modern"))[1][:3]
    rows = []
    for index, (sentence, voice) in enumerate(zip(sentences, voices("variants", 3, random.Random(7)))):
        speak(sentence, voice, tmp_path / f"{index}.wav")
        rows.append({"audio": str(tmp_path / f"{index}.wav"), "text": sentence})
    search = BeamSearch(beam=4, ilm_weight=0.2, features=found.features)
    weights = (0.0, 0.4, 3.0)
    whole, tried = tuned_lm_weight(found.model, found.tokenizer, [TuningFold(rows, shipped)], weights, search)
    assert tried[str(whole)] == min(tried.values()) and len(set(tried.values())) > 1
    fused = transcribe(found.model, [row["audio"] for row in rows], found.tokenizer, found.features, beam=4,
                       language_model=shipped, lm_weight=0.4, ilm_weight=0.2)
    assert tried["0.4"] == error_counts(sentences, fused).rate
    # Folds of 1 and 2 utterances: errors pooled over words, not a mean of the folds' rates.
    split = [TuningFold(rows[:1], shipped), TuningFold(rows[1:], shipped)]
    assert tuned_lm_weight(found.model, found.tokenizer, split, weights, search) == (whole, tried)
    # Each fold decodes with its own model: one that knows only the first sentence's text changes
    # what the first fold's utterance gets at a high weight, and so the pooled rate.
    narrow = NgramLanguageModel.train([found.tokenizer.encode(sentences[0])], found.tokenizer.vocab_size, 8)
    _, own = tuned_lm_weight(found.model, found.tokenizer, [TuningFold(rows[:1], narrow), TuningFold(rows[1:], shipped)],
                             (3.0,), search)
    alone = transcribe(found.model, [rows[0]["audio"]], found.tokenizer, found.features, beam=4, language_model=narrow,
                       lm_weight=3.0, ilm_weight=0.2)
    others = transcribe(found.model, [row["audio"] for row in rows[1:]], found.tokenizer, found.features, beam=4,
                        language_model=shipped, lm_weight=3.0, ilm_weight=0.2)
    assert own["3.0"] == error_counts(sentences, alone + others).rate
    assert alone != transcribe(found.model, [rows[0]["audio"]], found.tokenizer, found.features, beam=4,
                               language_model=shipped, lm_weight=3.0, ilm_weight=0.2)
    words = frozenset(word for sentence in sentences for word in sentence.split())
    _, penalties = tuned_lexicon_penalty(found.model, found.tokenizer, [TuningFold(rows, shipped, words)],
                                         (0.0, 5.0), 0.4, search)
    assert penalties["0.0"] == tried["0.4"]  # no penalty: the language model alone
    with pytest.raises(ValueError, match=r"tuning needs folds and values to try; got 0 folds and values \(0.4,\)"):
        tuned_lm_weight(found.model, found.tokenizer, [], (0.4,), search)
