"""Speech data: sentences and tokens, espeak-ng synthesis into manifests read with `datasets`,
the recorded pocketsphinx clips, checked loading that skips bad clips with counts, buckets."""

from __future__ import annotations

import json
import logging
import random
import wave

import pytest
import torch
from scipy.io import wavfile

from asr import kokoro
from asr.data import (DOMAIN_SPLIT, KOKORO_VALIDATION_SPLIT, SPLITS, SYNTHESISER_SPLIT, CorpusConfig, DurationBuckets, SpeechExamples, build_corpus, collate_speech,
                      corpus_plan, language_model_sentences, load_manifest, read_audio, read_audio_pieces, recorded_speech,
                      sentence_sources, training_text_sentences)
from asr.features import FeatureConfig
from asr.text import CHARACTERS, TranscriptTokenizer, corpus_sentences, normalize
from asr.training_text import HELD_OUT_SOURCE, SOURCES, source_sentences
from asr.voices import HELD_OUT_ACCENT, HELD_OUT_VARIANTS, KOKORO_BLENDS, KOKORO_UNSEEN_BLENDS, Voice, speak, voices


def test_sentences_are_normalised_and_within_the_vocabulary():
    assert normalize("  O Romeo, ROMEO! wherefore art thou\u2019s 'Romeo'?") == "o romeo romeo wherefore art thou's romeo"
    text = "ROMEO. But soft! What light through yonder window breaks? [Enter JULIET.] It is the east. 1 2 3 four."
    sentences = corpus_sentences(text, min_words=2, max_words=6, vocabulary_size=100)
    assert sentences == ["but soft", "what light through yonder window breaks", "it is the east"]
    assert corpus_sentences(text + " but soft!", min_words=2, max_words=6, vocabulary_size=3) == ["but soft"]


def test_character_and_bpe_tokens_round_trip():
    chars = TranscriptTokenizer("char")
    assert chars.vocab_size == len(CHARACTERS) + 1 and chars.encode("ab c") == [2, 3, 1, 4]
    assert chars.decode([0, 2, 3, 0, 1, 4]) == "ab c"
    with pytest.raises(ValueError, match="characters outside"):
        chars.encode("Hello!")
    lines = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog"] * 20
    bpe = TranscriptTokenizer.train_bpe(lines, vocab_size=60)
    assert bpe.vocab_size <= 60 and all(bpe.decode(bpe.encode(line)) == line for line in lines)
    assert len(bpe.encode(lines[0])) < len(lines[0])  # pieces longer than characters
    again = TranscriptTokenizer.from_spec(json.loads(json.dumps(bpe.spec())))
    assert again.encode("the cat and the log") == bpe.encode("the cat and the log")


def test_held_out_voices_never_meet_training_voices():
    rng = random.Random(0)
    training, speakers, accent = voices("none", 300, rng), voices("variants", 300, rng), voices("accent", 300, rng)
    assert all(v.accent != HELD_OUT_ACCENT and v.variant not in HELD_OUT_VARIANTS for v in training)
    assert all(v.accent != HELD_OUT_ACCENT and v.variant in HELD_OUT_VARIANTS for v in speakers)
    assert all(v.accent == HELD_OUT_ACCENT and v.variant not in HELD_OUT_VARIANTS for v in accent)
    assert {v.variant for v in speakers} == set(HELD_OUT_VARIANTS) and len({v.accent for v in speakers}) == 6
    assert {v.variant for v in accent} == {v.variant for v in training}  # the training speakers, in the unseen accent
    assert all(140 <= v.speed <= 200 and 30 <= v.pitch <= 70 for v in training + speakers + accent)
    with pytest.raises(ValueError, match="held_out must be one of \\('none', 'variants', 'accent', 'synthesiser'\\); got True"):
        voices(True, 1, rng)


@pytest.mark.timeout(300)
def test_modern_text_draws_every_source_and_keeps_the_held_out_one_for_unseen_speakers():
    config = CorpusConfig(text="modern", train_sentences=1200, validation_sentences=60, test_sentences=60,
                          domain_sentences=50, max_words=20)
    assert config.splits == (*SPLITS, DOMAIN_SPLIT, SYNTHESISER_SPLIT) and config.key != CorpusConfig(max_words=20).key
    plan, _ = corpus_plan(config)
    source_of = {}  # a sentence several sources share belongs to the held-out one, or else the first
    for source in sorted(SOURCES, key=lambda s: s != HELD_OUT_SOURCE):
        for sentence in source_sentences(source):
            source_of.setdefault(sentence, source)
    train = [source_of[text] for text, _ in plan["train"]]
    # Round robin over the six training sources: each gives a sixth of the training sentences.
    assert {source: train.count(source) for source in set(train)} == {s: 200 for s in SOURCES if s != HELD_OUT_SOURCE}
    domain = [text for text, _ in plan[DOMAIN_SPLIT]]
    assert len(domain) == 50 and all(source_of[text] == HELD_OUT_SOURCE for text in domain)
    assert all(voice.variant in HELD_OUT_VARIANTS for _, voice in plan[DOMAIN_SPLIT])
    assert [t for t, _ in plan[SYNTHESISER_SPLIT]] == domain and {v.synthesiser for _, v in plan[SYNTHESISER_SPLIT]} == {"piper"}
    flite = sum(voice.synthesiser == "flite" for _, voice in plan["train"]) / len(plan["train"])
    assert abs(flite - config.flite_share) < 0.04 and all(v.synthesiser != "piper" for _, v in plan["train"])
    plain, _ = corpus_plan(CorpusConfig(**{**config.__dict__, "flite_share": 0.0}))
    assert [t for t, _ in plain["train"]] == [t for t, _ in plan["train"]]  # flite takes voices, not sentences
    # Kokoro takes a share of the voices drawn before it and leaves every other draw as it was; its
    # share is 0 by default and then not part of the key, so corpora made before it keep their folders.
    with_kokoro = CorpusConfig(**{**config.__dict__, "kokoro_share": 0.3})
    assert with_kokoro.key != config.key == CorpusConfig(**{**config.__dict__, "kokoro_share": 0.0}).key
    spoken, _ = corpus_plan(with_kokoro)
    kept = [a == b for a, b in zip(spoken["train"], plan["train"])]
    assert all(kept[i] or (text == plan["train"][i][0] and voice.synthesiser == "kokoro")
               for i, (text, voice) in enumerate(spoken["train"]))
    assert abs(kept.count(False) / len(kept) - 0.3) < 0.04 and all(spoken[s] == plan[s] for s in plan if s != "train")
    # With Kokoro, the validation sentences are spoken once more by Kokoro speakers no training clip has.
    assert with_kokoro.splits == (*config.splits, KOKORO_VALIDATION_SPLIT) and KOKORO_VALIDATION_SPLIT not in plan
    unseen = spoken[KOKORO_VALIDATION_SPLIT]
    assert [t for t, _ in unseen] == [t for t, _ in plan["validation"]]
    assert {v.variant for _, v in unseen} <= set(KOKORO_UNSEEN_BLENDS) and len({v.variant for _, v in unseen}) == 10
    assert not {v.name for _, v in unseen} & {v.name for _, v in spoken["train"]}
    with pytest.raises(ValueError, match=r"CorpusConfig.kokoro_share must be in \[0, 1\]; got 1.5"):
        CorpusConfig(text="modern", kokoro_share=1.5)
    # Blends of two Kokoro voices take a share of Kokoro's sentences, nothing else; no share, same key.
    blended = CorpusConfig(**{**with_kokoro.__dict__, "kokoro_blend_share": 0.5})
    assert blended.key != with_kokoro.key == CorpusConfig(**{**with_kokoro.__dict__, "kokoro_blend_share": 0.0}).key
    assert CorpusConfig(**{**config.__dict__, "kokoro_blend_share": 0.5}).key == config.key  # no Kokoro, no blends
    mixed, _ = corpus_plan(blended)
    changed = [(voice, before) for (_, voice), (_, before) in zip(mixed["train"], spoken["train"]) if voice != before]
    assert all(before.synthesiser == voice.synthesiser == "kokoro" and kokoro.BLEND in voice.variant for voice, before in changed)
    assert abs(len(changed) / kept.count(False) - 0.5) < 0.05 and {v.variant for v, _ in changed} == set(KOKORO_BLENDS)
    assert [t for t, _ in mixed["train"]] == [t for t, _ in spoken["train"]]
    assert mixed[KOKORO_VALIDATION_SPLIT] == unseen  # drawn by a generator of its own
    seen = {text for split in ("train", "validation") for text, _ in plan[split]}
    assert not seen & set(source_sentences(HELD_OUT_SOURCE)) and not seen & {t for t, _ in plan["test_sentences"]}
    learnt = set(training_text_sentences(config))  # what a tokenizer and language model may learn from
    assert seen <= learnt | {t for t, _ in plan["validation"]} and not learnt & ({t for t, _ in plan["validation"]} | set(domain))
    assert not learnt & {t for t, _ in plan["test_sentences"]} and len(learnt) > 50_000
    with pytest.raises(ValueError, match="training text sentences exist for text 'modern'"):
        training_text_sentences(CorpusConfig())
    # Each spoken validation sentence's source is known; the training text less one source is the
    # text of a language model that never read it (`asr.decoding_tuning`'s folds).
    validation_sources = sentence_sources(config, "validation")
    spoken_sources = [validation_sources[text] for text, _ in plan["validation"]]
    assert set(spoken_sources) == set(SOURCES) - {HELD_OUT_SOURCE}
    training_sources = sentence_sources(config, "train")
    without_tweets = training_text_sentences(config, without="tweets")
    assert without_tweets == [t for t in training_text_sentences(config) if training_sources[t] != "tweets"]
    assert 0 < len(learnt) - len(without_tweets) == sum(source == "tweets" for source in training_sources.values())
    with pytest.raises(ValueError, match=r"without must be a training source .*; got 'reddit'"):
        training_text_sentences(config, without="reddit")
    with pytest.raises(ValueError, match=r"split must be one of \['test', 'test_domain', 'train', 'validation'\]; got 'dev'"):
        sentence_sources(config, "dev")
    extra = language_model_sentences(config, ("wordnet",))  # a language model's text beside the training text's
    assert len(extra) > 30_000 and all(3 <= len(text.split()) <= config.max_words for text in extra)
    assert not set(extra) & ({t for split in plan if split != "train" for t, _ in plan[split]} | set(domain))
    with pytest.raises(ValueError, match=r"language-model sources must be among \('wordnet',\); got \['nyt'\]"):
        language_model_sentences(config, ("nyt",))
    assert all(3 <= len(text.split()) <= 20 for split in plan.values() for text, _ in split)
    with pytest.raises(ValueError, match=r"text in \('shakespeare', 'modern'\)"):
        CorpusConfig(text="news")


def test_a_small_corpus_is_synthesised_once_and_loads_with_datasets(tmp_path):
    config = CorpusConfig(train_sentences=6, validation_sentences=2, test_sentences=3, max_words=6)
    folder = build_corpus(config, tmp_path)
    manifests = {split: load_manifest(folder / f"{split}.jsonl") for split in SPLITS}
    assert {split: len(rows) for split, rows in manifests.items()} == {
        "train": 6, "validation": 2, "test_sentences": 3, "test_voices": 3, "test_accent": 3}
    assert manifests["test_voices"]["text"] == manifests["test_sentences"]["text"] == manifests["test_accent"]["text"]
    assert not set(manifests["test_sentences"]["text"]) & set(manifests["train"]["text"])
    assert all(v.split("+")[1] in HELD_OUT_VARIANTS for v in manifests["test_voices"]["voice"])
    assert all(v.split("+")[0] == HELD_OUT_ACCENT for v in manifests["test_accent"]["voice"])
    rate, samples = wavfile.read(manifests["train"][0]["audio"])
    assert rate == 16000 and samples.dtype.name == "int16"
    assert abs(len(samples) / rate - manifests["train"][0]["seconds"]) < 1e-3 and len(samples) > 0.5 * rate
    stamp = (folder / "train.jsonl").stat().st_mtime_ns
    assert build_corpus(config, tmp_path) == folder and (folder / "train.jsonl").stat().st_mtime_ns == stamp
    only = build_corpus(config, tmp_path / "evaluation", splits=("validation", "test_voices"))
    assert sorted(p.name for p in only.glob("*.jsonl")) == ["test_voices.jsonl", "validation.jsonl"]
    assert not list((only / "wav").glob("train_*"))
    for split in ("validation", "test_voices"):
        alone = [{k: v for k, v in row.items() if k != "audio"} for row in load_manifest(only / f"{split}.jsonl")]
        assert alone == [{k: v for k, v in row.items() if k != "audio"} for row in manifests[split]]
    with pytest.raises(ValueError, match=r"build_corpus splits must be among .*; got \['test_domain'\]"):
        build_corpus(config, tmp_path, splits=("validation", "test_domain"))
    examples = SpeechExamples(manifests["train"], TranscriptTokenizer("char"))
    example = examples[0]
    assert example["input_features"].shape == (len(samples) // 160 + 1, 80)
    assert TranscriptTokenizer("char").decode(example["labels"].tolist()) == manifests["train"][0]["text"]


def test_bad_clips_are_skipped_with_counts(tmp_path, caplog):
    good = tmp_path / "good.wav"
    speak("to be or not to be", Voice("en-us", "m1", 170, 50), good)
    wavfile.write(tmp_path / "empty.wav", 16000, torch.zeros(0, dtype=torch.int16).numpy())
    wavfile.write(tmp_path / "short.wav", 16000, torch.zeros(800, dtype=torch.int16).numpy())
    wavfile.write(tmp_path / "low.wav", 4000, torch.zeros(8000, dtype=torch.int16).numpy())
    rate_22k = tmp_path / "rate22k.wav"
    wavfile.write(rate_22k, 22050, (torch.randn(22050) * 1000).to(torch.int16).numpy())
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF\x00\x00not a wave file")
    rows = [{"audio": str(good), "text": "To be, or not to be"}, {"audio": str(good), "text": " !? "},
            {"audio": str(tmp_path / "empty.wav"), "text": "a"}, {"audio": str(tmp_path / "short.wav"), "text": "a"},
            {"audio": str(tmp_path / "low.wav"), "text": "a"}, {"audio": str(tmp_path / "corrupt.wav"), "text": "a"},
            {"audio": str(tmp_path / "missing.wav"), "text": "a"}, {"audio": str(rate_22k), "text": "noise"}]
    with caplog.at_level(logging.WARNING, logger="asr.data"):
        examples = SpeechExamples(rows, TranscriptTokenizer("char"))
    assert [row["text"] for row in examples.rows] == ["to be or not to be", "noise"]
    assert examples.skipped == {"empty transcript": 1, "empty audio": 1, "shorter than 0.3 s": 1,
                                "sample rate below 8000 Hz": 1, "unreadable audio": 2}
    assert "skipped 6 of 8 utterances" in caplog.text
    assert read_audio(rate_22k, 16000).shape == (16000,)  # other rates are resampled
    with pytest.raises(ValueError, match="has sample rate 4000 Hz; expected at least 8000 Hz"):
        read_audio(tmp_path / "low.wav", 16000)


def test_a_file_read_in_pieces_is_the_file_read_whole(tmp_path):
    """Mapped at the model's rate (int16 stereo, float32 mono), read whole and resampled at
    another (8 kHz), read whole when 24-bit; an empty file and a missing one get the whole
    reader's errors."""
    generator = torch.Generator().manual_seed(4)
    files = {"stereo.wav": (16000, (torch.randn(10001, 2, generator=generator) * 3000).to(torch.int16)),
             "float.wav": (16000, torch.rand(7000, generator=generator) - 0.5),
             "narrow.wav": (8000, (torch.randn(4001, generator=generator) * 3000).to(torch.int16))}
    for name, (rate, samples) in files.items():
        wavfile.write(tmp_path / name, rate, samples.numpy())
        pieces = list(read_audio_pieces(tmp_path / name, 16000, 1024))
        whole = read_audio(tmp_path / name, 16000)
        assert all(len(piece) == 1024 for piece in pieces[:-1]) and 0 < len(pieces[-1]) <= 1024, name
        assert torch.equal(torch.cat(pieces), whole), name
    with wave.open(str(tmp_path / "24bit.wav"), "wb") as packed:  # scipy reads 24-bit PCM but cannot map it
        packed.setnchannels(1), packed.setsampwidth(3), packed.setframerate(16000)
        packed.writeframes(b"".join(value.to_bytes(3, "little", signed=True)
                                    for value in torch.randint(-2**23, 2**23, (3000,), generator=generator).tolist()))
    pieces = list(read_audio_pieces(tmp_path / "24bit.wav", 16000, 1024))
    assert [len(piece) for piece in pieces] == [1024, 1024, 952]
    assert torch.equal(torch.cat(pieces), read_audio(tmp_path / "24bit.wav", 16000))
    wavfile.write(tmp_path / "empty.wav", 16000, torch.zeros(0, dtype=torch.int16).numpy())
    for name, message in (("empty.wav", "empty audio"), ("missing.wav", "unreadable audio")):
        with pytest.raises(ValueError, match=message):
            list(read_audio_pieces(tmp_path / name, 16000, 1024))


def test_buckets_group_similar_durations_and_collate_pads(tmp_path):
    rows = []
    for index, words in enumerate(["a b", "a b c d e f g h", "a b c", "a b c d e f g h i j", "a b c d"]):
        path = tmp_path / f"{index}.wav"
        speak(words, Voice("en-gb", "f1", 170, 50), path)
        rows.append({"audio": str(path), "text": words})
    examples = SpeechExamples(rows, TranscriptTokenizer("char"))
    buckets = DurationBuckets(examples, size=2)
    assert len(buckets) == 2  # 5 utterances: two pairs, the longest left out
    assert [sorted(examples.seconds[i] for i in group) for group in buckets.groups] == [
        sorted(examples.seconds)[0:2], sorted(examples.seconds)[2:4]]
    batch = collate_speech([buckets[0], buckets[1]])
    assert batch["input_features"].shape[0] == 4 and batch["attention_mask"].sum(1).tolist() == [
        examples[i]["input_features"].shape[0] for group in buckets.groups for i in group]
    assert (batch["labels"] == -100).any() and batch["labels"].max() < len(CHARACTERS) + 1


def test_recorded_clips_of_pocketsphinx_testdata():
    rows = recorded_speech()
    assert len(rows) == 10 and {row["set"] for row in rows} == {"librivox", "cards"}
    assert rows[1]["text"] == "he was not an ill disposed young man"
    waveform = read_audio(rows[1]["audio"], FeatureConfig().sample_rate)
    assert 2.5 < waveform.numel() / 16000 < 3.5 and waveform.abs().max() > 0.05
