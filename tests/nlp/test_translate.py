"""The zoo entry translator-opus-zh-en: loaded by name or language pair from its package with its
tokenizer, translating text and files (`zoo translate`) as CTranslate2 translates the same package;
bad input refused by name."""

from __future__ import annotations

import pytest

from helpers import zoo_in_process
from nlp.translation.decode import BeamSettings
from nlp.translation.model import Translator
from nlp.translation.opus_zh_en import example_sources, model_directory
from nlp.translation.translate import language_pairs, load_translator, translate, translator_named
from zoo.ctranslate2_io import ctranslate2_folder, load_ctranslate2, read_spec_name

ctranslate2 = pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def opus():
    return load_translator("zh-en")


def test_the_entry_is_found_by_name_and_by_language_pair():
    assert language_pairs()["zh-en"] == "translator-opus-zh-en"
    assert translator_named("translator-opus-zh-en") == translator_named("zh-en") == "translator-opus-zh-en"
    with pytest.raises(ValueError, match=r"no translator 'de-en'.*pairs: \['en-de', 'zh-en'\]"):
        translator_named("de-en")
    with pytest.raises(ValueError, match="'gpt-shakespeare-char' is not a translator"):
        translator_named("gpt-shakespeare-char")


def test_an_argos_package_is_read_through_its_ctranslate2_folder(tmp_path):
    package = model_directory()
    assert ctranslate2_folder(package) == package / "model" and ctranslate2_folder(package / "model") == package / "model"
    assert ctranslate2_folder(tmp_path) is None
    assert read_spec_name(package / "model") == "TransformerSpec"
    with pytest.raises(ValueError, match="holds no CTranslate2 model.bin"):
        load_ctranslate2(tmp_path)
    (tmp_path / "model.bin").write_bytes(b"\x07\x00\x00\x00")
    with pytest.raises(ValueError, match="binary version must be one of"):
        read_spec_name(tmp_path)


@pytest.mark.timeout(300)
def test_translations_are_ctranslate2s_and_keep_their_order(opus):
    model, tokenizer = opus
    assert isinstance(model, Translator) and tokenizer.languages == ("zh", "en")
    sources = example_sources()[:6]
    ours = translate(model, tokenizer, sources, BeamSettings(beams=2, max_length_ratio=8.0), batch_size=4)
    peer = ctranslate2.Translator(str(model_directory() / "model"), device="cpu", compute_type="float32", intra_threads=1)
    pieces = [tokenizer.vocabulary.pieces(tokenizer.encode(text)[:-1]) for text in sources]
    theirs = [tokenizer.decode(tokenizer.vocabulary.ids(result.hypotheses[0]))
              for result in peer.translate_batch(pieces, beam_size=2, max_decoding_length=256)]
    assert ours == theirs and ours[0] == "The wheels are vibrating."


@pytest.mark.timeout(300)
def test_zoo_translate_reads_a_file_line_by_line_keeping_blank_lines(opus, capsys, tmp_path):
    model, tokenizer = opus
    sources = example_sources()[:2]
    (tmp_path / "lines.txt").write_text(f"{sources[0]}\n\n{sources[1]}\n", encoding="utf-8")
    done = zoo_in_process(capsys, "translate", "zh-en", str(tmp_path / "lines.txt"), "--beams", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == [*[translate(model, tokenizer, [s], BeamSettings(beams=1, max_length_ratio=3.0))[0]
                                        for s in sources[:1]], "",
                                       translate(model, tokenizer, sources[1:], BeamSettings(beams=1, max_length_ratio=3.0))[0], ""]


def test_bad_input_is_refused_with_its_index(opus, capsys):
    model, tokenizer = opus
    with pytest.raises(ValueError, match="text 1 is empty"):
        translate(model, tokenizer, ["机轮震动大。", "  "])
    with pytest.raises(ValueError, match=r"text 0 has \d+ tokens; this translator reads at most 2048"):
        translate(model, tokenizer, ["机" * 2100])
    with pytest.raises(ValueError, match="batch_size must be >= 1; got 0"):
        translate(model, tokenizer, ["机轮震动大。"], batch_size=0)
    done = zoo_in_process(capsys, "translate", "en-fr", "hello")
    assert done.returncode != 0 and "no translator 'en-fr'" in done.stderr
