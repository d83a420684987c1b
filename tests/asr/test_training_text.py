"""Training text: written English in spoken form, prose sentences of every packaged source, and
splits that keep the held-out source and each sentence in one place."""

from __future__ import annotations

import pytest

from asr.spoken_form import spoken_form
from asr.training_text import (HELD_OUT_SOURCE, LANGUAGE_MODEL_SOURCE_CREDITS, LANGUAGE_MODEL_SOURCES, SOURCES,
                               TextSplitConfig, source_sentences, split_by_source, written_sentences)


@pytest.mark.parametrize("written, spoken", [
    ("Dr. Lee paid $3.50 at 7:05.", "doctor lee paid three dollars fifty cents at seven oh five"),
    ("On the 2nd of May 1998, 10% off!", "on the second of may nineteen ninety eight ten percent off"),
    ("In the 1990s and the '80s 1,250 came.", "in the nineties and the eighties one thousand two hundred and fifty came"
     .replace("the nineties", "the nineteen nineties")),
    ("$1, $2.01, $4.5 million and £3", "one dollar two dollars one cent four point five million dollars and three pounds"),
    ("Pi is 3.14 at 12:00 in room 101.", "pi is three point one four at twelve o'clock in room one hundred and one"),
    ("Tom & Jerry +5 #win, e.g. in 2021", "tom and jerry plus five win for example in twenty twenty one"),
])
def test_numbers_symbols_and_abbreviations_are_spelled_out(written, spoken):
    assert spoken_form(written) == spoken


def test_written_sentences_cut_after_full_stops_but_not_abbreviations_and_drop_code():
    text = ("Mr. Smith met Dr. Jones at 5 p.m. today. It rained... a lot! See https://example.org now. "
            "Call os.path.join() here. Thanks @bob for it. Is it 3.5 metres? Yes -- it is.")
    assert written_sentences(text) == ["mister Smith met doctor Jones at 5 p m today.", "It rained, a lot!",
                                       "Is it 3.5 metres?", "Yes , it is."]


def test_splits_hold_out_the_domain_and_share_no_sentence():
    sentences = {"fortunes": [f"fortune number {i} is here" for i in range(400)] + ["one two", "shared words in both"],
                 HELD_OUT_SOURCE: ["shared words in both", "this product works well"],
                 "nyt": ["fortune number 3 is here", "news of the day today"]}
    splits = split_by_source(sentences, TextSplitConfig(min_words=3, max_words=6, held_out_fraction=0.1))
    assert splits["test_domain"] == [(HELD_OUT_SOURCE, "shared words in both"), (HELD_OUT_SOURCE, "this product works well")]
    kept = [s for name in ("train", "validation", "test") for _, s in splits[name]]
    assert len(kept) == len(set(kept)) == 401  # 400 fortunes and the news; "one two" is too short, the shared one held out
    assert 20 <= len(splits["validation"]) <= 60 and 20 <= len(splits["test"]) <= 60
    with pytest.raises(ValueError, match="held_out_fraction must be in"):
        TextSplitConfig(held_out_fraction=0.5)


@pytest.mark.timeout(300)
def test_every_source_gives_thousands_of_spoken_sentences():
    for source in SOURCES + LANGUAGE_MODEL_SOURCES:
        sentences = source_sentences(source)
        assert len(sentences) >= 3000, source
        assert all(s and not any(c.isdigit() for c in s) and s == s.lower() for s in sentences), source
    assert "the public is an old woman" in source_sentences("fortunes")
    assert "most extension types only use simple attributes" in source_sentences("python_docs")
    assert "the camera panned across the room" in source_sentences("wordnet")  # a WordNet usage example
    assert LANGUAGE_MODEL_SOURCE_CREDITS.keys() == set(LANGUAGE_MODEL_SOURCES)  # each names its license's notice
    with pytest.raises(ValueError, match="source must be one of"):
        source_sentences("wikipedia")
