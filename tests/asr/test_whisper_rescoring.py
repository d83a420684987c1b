"""Whisper tiny.en's second pass over a transducer's n-best (`asr.whisper_rescoring`), on real
recorded speech (Debian pocketsphinx-testdata): its log probabilities of a text and its neighbours,
the re-ranking (Whisper's own transcript among the hypotheses or not), and the shipped entry (b)
decoding with it, clip by clip and on a long recording cut into segments. The decoder's parity with CTranslate2's
is tests/asr/test_whisper_decoder.py's."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from asr.data import read_audio, recorded_speech
from asr.decoding_tuning import BeamSearch, TuningFold, tuned_rescoring
from asr.transcription import recogniser, searched_transcripts, segment_hypotheses, whisper_rescorer
from asr.wer import error_counts
from asr.whisper_rescoring import Candidates, Rescoring, WhisperReading, best_rescored
from helpers import zoo_in_process
from zoo.parity import relative_error


@pytest.fixture(scope="module")
def librivox():
    row = next(r for r in recorded_speech() if r["set"] == "librivox")
    return read_audio(row["audio"], 16000), row["text"]


@pytest.mark.timeout(300)
def test_whisper_scores_the_said_text_above_its_neighbours(librivox):
    waveform, text = librivox
    words = text.split()
    texts = [text, " ".join(words[:-1]), " ".join(words[:3] + ["seven"] + words[4:]), ""]
    rescorer = whisper_rescorer()
    scored = rescorer.log_probs(waveform, texts)
    assert scored[0][0] > max(score for score, _ in scored[1:3])  # a missing and a wrong word cost
    assert [tokens for _, tokens in scored] == [len(rescorer.tokenizer.encode(" " + t, add_special_tokens=False).ids) + 1
                                                if t else 1 for t in texts]
    assert all(score < 0 for score, _ in scored)
    assert math.isclose(rescorer.log_probs(waveform, [text, "ten of clubs"])[0][0], scored[0][0], rel_tol=1e-5)
    with pytest.raises(ValueError, match="Whisper rescores clips of at most 30 s; got 31.0 s"):
        rescorer.log_probs(torch.zeros(31 * 16000), ["a"])


def test_the_second_pass_adds_whisper_to_the_first_pass_scores():
    hypotheses = [("ten of clubs", -1.0), ("tan of clubs", -1.5), ("ten of club", -2.0)]
    found = Candidates(hypotheses, [(-8.0, 5), (-3.0, 5), (-9.0, 4)])
    assert best_rescored(found, Rescoring()) == "ten of clubs"  # weight 0: the first pass's
    assert best_rescored(found, Rescoring(weight=1.0)) == "tan of clubs"  # -4.0 against -9.0
    assert best_rescored(found, Rescoring(weight=0.05)) == "ten of clubs"  # -1.4 against -1.65
    # A bonus a token favours the hypothesis of more tokens: -2 + (-8 + 9) = -1 against -1 + (-8 + 5) = -4.
    assert best_rescored(Candidates(hypotheses, [(-8.0, 5), (-8.0, 5), (-8.0, 9)]), Rescoring(1.0, 1.0)) == "ten of club"
    # Whisper's own transcript counts only when asked for: -3 + (-0.5) = -3.5 against -4.0.
    heard = Candidates(hypotheses, found.scored, transcript=("ten of cups", -3.0, -0.5, 5))
    assert best_rescored(heard, Rescoring(1.0)) == "tan of clubs"
    assert best_rescored(heard, Rescoring(1.0, whisper_transcript=True)) == "ten of cups"
    assert best_rescored(heard, Rescoring(0.1, whisper_transcript=True)) == "ten of clubs"  # -1.8 against -3.05
    better = Candidates(hypotheses, found.scored, transcript=("ten of cups", -0.5, -0.5, 5))
    assert best_rescored(better, Rescoring(0.0, whisper_transcript=True)) == "ten of clubs"  # weight 0: no second pass
    assert Rescoring(1.0, 2.0, True).key == "1.0,2.0,transcript" and Rescoring(0.5).key == "0.5,0.0"
    with pytest.raises(ValueError, match="one Whisper score per hypothesis; got 3 hypotheses and 2 scores"):
        Candidates(hypotheses, found.scored[:2])
    # A reading of the clip makes the candidates of any rescoring; its transcript joins when asked for.
    reading = WhisperReading(dict(zip([h for h, _ in hypotheses], found.scored)), ("ten of cups", -0.5, 5))
    assert reading.candidates(hypotheses) == found
    assert reading.candidates(hypotheses, {"ten of cups": -3.0}.get) == Candidates(hypotheses, found.scored,
                                                                                    ("ten of cups", -3.0, -0.5, 5))
    held = WhisperReading(reading.scored, ("tan of clubs", -3.0, 5))  # Whisper's transcript is a hypothesis
    assert held.candidates(hypotheses, {}.get) == found
    with pytest.raises(ValueError, match="need a reading made with transcript=True"):
        WhisperReading(reading.scored, None).candidates(hypotheses, {}.get)
    with pytest.raises(ValueError, match="Rescoring.weight must be >= 0; got -1"):
        Rescoring(weight=-1)


@pytest.fixture(scope="module")
def first_pass():
    """Entry (b), the recordings, their audio and the entry's first pass over each clip (as
    `transcribe` makes it), shared by the tests below; the second passes keep Whisper's readings."""
    found = recogniser("asr-transducer-whisper-tiny")
    rows = recorded_speech()
    audio = [read_audio(row["audio"], 16000) for row in rows]
    finals = segment_hypotheses(found.model, audio, found.tokenizer, found.features, found.beam,
                                language_model=found.language_model, lm_weight=found.lm_weight,
                                ilm_weight=found.ilm_weight)
    return found, rows, audio, finals


@pytest.mark.timeout(600)
def test_entry_b_rescored_by_whisper_on_the_recordings(capsys, first_pass):
    found, rows, _, finals = first_pass
    assert all(len(parts) == 1 for parts in finals)
    plain = [parts[0].hypotheses[0][0] for parts in finals]  # the first pass's best (the grid's weight 0 below)
    # the encoder output kept to score Whisper's transcript holds no autograd graph (its activations)
    assert all(parts[0].encoded.shape[1] == found.model.config.encoder.width and not parts[0].encoded.requires_grad
               for parts in finals)
    assert all(len(segment.hypotheses) > 1 and [s for _, s in segment.hypotheses] == sorted(
        (s for _, s in segment.hypotheses), reverse=True) for segment, in finals)
    references = [row["text"] for row in rows]
    # Whisper's own transcript among the hypotheses: on recorded people, often the one chosen. Whisper
    # reads each segment once (its transcript included); the other rescorings re-rank that reading.
    heard = searched_transcripts(dataclasses.replace(found, rescoring=Rescoring(1.0, 1.0, True)), finals)
    readings = [parts[0].whisper for parts in finals]
    assert all(reading is not None and reading.transcript is not None for reading in readings)
    rescored = searched_transcripts(dataclasses.replace(found, rescoring=Rescoring(1.0, 1.0)), finals)
    assert all(parts[0].whisper is reading for parts, reading in zip(finals, readings))
    assert all(text in [h for h, _ in parts[0].hypotheses] for text, parts in zip(rescored, finals))  # chosen from the beam
    first, second = error_counts(references, plain).rate, error_counts(references, rescored).rate
    assert second < first, (first, second)  # Whisper has heard people; the first pass has heard synthesisers
    # zoo transcribe: the model's own second pass (weight 1, bonus 2), and --rescore-weight 0 to turn it off.
    changed = [i for i, (a, b) in enumerate(zip(plain, rescored)) if a != b][:2]
    files = [str(rows[i]["audio"]) for i in changed]
    shipped = searched_transcripts(found, [finals[i] for i in changed])  # the entry's own second pass
    for extra, expected in (((), shipped), (("--rescore-weight", "0"), [plain[i] for i in changed])):
        done = zoo_in_process(capsys, "transcribe", "asr-transducer-whisper-tiny", *files, *extra)
        assert done.returncode == 0 and done.stdout.splitlines() == [f"{f}: {t}" for f, t in zip(files, expected)]
    assert len(changed) == 2 and shipped != [plain[i] for i in changed]
    # The grid, chosen on these clips as one fold: weight 0 is the first pass's WER.
    search = BeamSearch(found.beam, found.ilm_weight, found.features)
    fold = TuningFold(rows, found.language_model.base, found.language_model.words)
    third = error_counts(references, heard).rate
    assert third < second and any(text not in [h for h, _ in parts[0].hypotheses] for text, parts in zip(heard, finals))
    grid = [Rescoring(), Rescoring(1.0, 1.0), Rescoring(1.0, 1.0, True)]
    chosen, tried = tuned_rescoring(found.model, found.tokenizer, [fold], grid, found.lm_weight,
                                    found.language_model.penalty, search)
    assert tried == {"0.0,0.0": pytest.approx(first), "1.0,1.0": pytest.approx(second),
                     "1.0,1.0,transcript": pytest.approx(third)} and chosen == grid[2]




@pytest.mark.timeout(600)
def test_a_long_recording_is_read_by_both_passes_segment_by_segment(first_pass):
    found, rows, audio, finals = first_pass
    recording = torch.cat([torch.cat([clip, torch.zeros(16000)]) for clip in audio])  # ~50 s, a 1 s pause a clip
    (parts,) = segment_hypotheses(found.model, [recording], found.tokenizer, found.features, found.beam,
                                  language_model=found.language_model, lm_weight=found.lm_weight,
                                  ilm_weight=found.ilm_weight)
    assert len(parts) == len(rows)  # cut at each pause
    for segment in (parts[0], parts[-1]):  # each keeps its own encoder output, as if searched alone
        ((alone,),) = segment_hypotheses(found.model, [segment.waveform], found.tokenizer, found.features, found.beam,
                                         language_model=found.language_model, lm_weight=found.lm_weight,
                                         ilm_weight=found.ilm_weight)
        assert relative_error(segment.encoded, alone.encoded) < 1e-4
    alone = searched_transcripts(found, finals)  # the shipped decoding of each clip: both passes
    (whole,) = searched_transcripts(found, [parts])  # transcribe's second pass on the first pass above
    reference = " ".join(row["text"] for row in rows)
    rates = [error_counts([reference], [text]).rate for text in (" ".join(alone), whole)]
    # measured: 0.054 alone, 0.076 cut from the recording (segments keep 0.05 s of silence about their
    # sound, not the clips' own edges: Whisper then reads three card names differently)
    assert rates[1] <= rates[0] + 0.03, rates
