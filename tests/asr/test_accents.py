"""Synthetic espeak-ng accents: random replacements drawn within phoneme classes, voice files that
espeak-ng really speaks with, and a corpus plan whose held-out splits they (and extra espeak-ng
accents) never touch."""

from __future__ import annotations

import random
import subprocess

import pytest

from asr.accents import (CONSONANTS, VOWELS, SyntheticAccent, accent_file, draw_accents, espeak_data,
                         system_espeak_data)
from asr.data import SPLITS, CorpusConfig, corpus_plan
from asr.voices import ACCENTS, HELD_OUT_ACCENT


def phonemes(text: str, voice: str, path=None) -> str:
    """espeak-ng's phoneme mnemonics of `text` spoken by `voice`."""
    option = [f"--path={path}"] if path is not None else []
    return subprocess.run(["espeak-ng", *option, "-v", voice, "-q", "-x", text], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_draws_replace_distinct_phonemes_within_their_class():
    bases = ("en-us", "en-gb")
    accents = draw_accents(40, 5, bases, random.Random(3))
    assert accents == draw_accents(40, 5, bases, random.Random(3))
    assert {a.base for a in accents} == set(bases) and len({a.name for a in accents}) == 40
    for accent in accents:
        replaced = [p for p, _ in accent.replacements]
        assert len(replaced) == len(set(replaced)) == 5
        for phoneme, replacement in accent.replacements:
            assert replacement != phoneme
            assert replacement in VOWELS if phoneme in VOWELS else replacement in CONSONANTS + ("NULL",)
    with pytest.raises(ValueError, match="rules >= 1"):
        draw_accents(2, 0, bases, random.Random(0))


def test_espeak_speaks_with_a_synthetic_accent(tmp_path):
    accent = SyntheticAccent(0, "en-gb-x-rp", (("h", "NULL"), ("T", "f")))
    path = espeak_data([accent], tmp_path)
    text = "he thinks his horse is healthy"
    base, synthetic = phonemes(text, "en-gb-x-rp"), phonemes(text, f"{accent.name}+m3", path)
    assert "h" in base and "T" in base
    assert "h" not in synthetic and "T" not in synthetic and synthetic.count("f") == base.count("f") + base.count("T")
    assert base == phonemes(text, "en-gb-x-rp", path)  # the system's voices stay as they are
    voice_file = accent.voice_file(system_espeak_data())
    assert voice_file.startswith(f"name {accent.name}\n") and "phonemes en-rp" in voice_file
    assert voice_file.index("replace 00 h NULL") < voice_file.index("replace 00  o@  O@")  # ahead of the base's rules
    with pytest.raises(ValueError, match="no accent 'en-xx'"):
        accent_file("en-xx", system_espeak_data())


def test_synthetic_accents_take_only_a_share_of_the_training_voices():
    config = CorpusConfig(train_sentences=400, validation_sentences=20, test_sentences=30, synthetic_accents=6,
                          synthetic_share=0.5)
    plain, _ = corpus_plan(CorpusConfig(train_sentences=400, validation_sentences=20, test_sentences=30))
    plan, accents = corpus_plan(config)
    assert len(accents) == 6 and all(a.base in ACCENTS and a.base != HELD_OUT_ACCENT for a in accents)
    assert all(plan[split] == plain[split] for split in SPLITS[1:])
    changed = [(old, new) for old, new in zip(plain["train"], plan["train"]) if old != new]
    assert 160 < len(changed) < 240
    assert all(o[0] == n[0] and n[1].accent.startswith("memzoo/") and (o[1].variant, o[1].speed, o[1].pitch) ==
               (n[1].variant, n[1].speed, n[1].pitch) for o, n in changed)
    assert len({n[1].accent for _, n in changed}) == 6
    assert config.key != CorpusConfig().key and CorpusConfig(accent_rules=9).key == CorpusConfig().key
    with pytest.raises(ValueError, match="synthetic_share in"):
        CorpusConfig(synthetic_accents=2, synthetic_share=1.5)


def test_extra_accents_speak_training_sentences_as_often_as_a_training_accent():
    sizes = dict(train_sentences=700, validation_sentences=20, test_sentences=30)
    plain, _ = corpus_plan(CorpusConfig(**sizes))
    plan, _ = corpus_plan(CorpusConfig(**sizes, extra_accents=("en-us-nyc",)))
    assert all(plan[split] == plain[split] for split in SPLITS[1:])
    changed = [(old, new) for old, new in zip(plain["train"], plan["train"]) if old != new]
    assert 70 < len(changed) < 130  # a seventh of 700: one more accent beside the six training ones
    assert all(n[1].accent == "en-us-nyc" and (o[0], o[1].variant, o[1].speed, o[1].pitch) ==
               (n[0], n[1].variant, n[1].speed, n[1].pitch) for o, n in changed)
    assert CorpusConfig(extra_accents=()).key == CorpusConfig().key != CorpusConfig(extra_accents=("en-us-nyc",)).key
    for bad in (("en-us",), ("en-us-nyc", "en-us-nyc"), (HELD_OUT_ACCENT,)):
        with pytest.raises(ValueError, match="extra_accents must be distinct and not among"):
            CorpusConfig(extra_accents=bad)
