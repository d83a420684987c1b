"""The bert_sentiment recipe: its data split, and a short run on two ranks through `zoo train`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from nlp.bert import Bert
from zoo.corpora import VADER_COUNTS, vader_snippets
from recipes.bert_sentiment import split_snippets

ZOO = str(Path(sys.executable).parent / "zoo")


def test_split_holds_out_one_whole_source():
    snippets = vader_snippets()
    assert len(snippets) == sum(VADER_COUNTS.values()) == 23703
    assert snippets[0]["source"] == "movie" and snippets[0]["rating"] == pytest.approx(2.26666666667)
    splits = split_snippets(snippets, "amazon", 0.05)
    assert [len(splits[k]) for k in ("train", "validation", "test")] == [18996, 999, 3708]
    assert {s["source"] for s in splits["test"]} == {"amazon"}
    assert "amazon" not in {s["source"] for s in splits["train"] + splits["validation"]}
    again = split_snippets(snippets, "amazon", 0.05)
    assert [s["text"] for s in again["validation"]] == [s["text"] for s in splits["validation"]]


@pytest.mark.ranks
@pytest.mark.timeout(600)
def test_two_ranks_zero3_fine_tune_writes_a_loadable_classifier(tmp_path):
    command = [ZOO, "train", "bert_sentiment", "--nproc", "2", "--strategy.zero", "3", "--train.max_steps", "3",
               "--train.global_batch_size", "8", "--train.micro_batch_size", "4", "--train.eval_every", "3",
               "--train.eval_batches", "2", "--train.progress", "false", "--accuracy_examples", "64",
               "--train.output_dir", str(tmp_path / "run"), "--output", str(tmp_path / "model")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=580,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert "test (amazon, never trained on) accuracy" in result.stdout
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["arch"] == "bert" and config["config"]["head"] == "classification"
    assert config["metrics"]["accuracy_examples"] == {"validation": 64, "test": 64}
    assert 0.0 <= config["metrics"]["test_accuracy"] <= 1.0 and config["tokenizer"]["kind"] == "wordpiece"
    model = zoo.load(tmp_path / "model")
    assert isinstance(model, Bert) and model.classifier.weight.shape == (2, 384)
    card = (tmp_path / "model" / "README.md").read_text()
    assert all(f" {words} " in card for words in ("--nproc 2", "--train.max_steps 3", "--strategy.zero 3"))


def test_missing_fine_tuned_model_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMZOO_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="no model 'bert-sentiment'.*train it with `zoo train bert_sentiment`"):
        zoo.load("bert-sentiment")
    with pytest.raises(ValueError, match="train it with `zoo train gpt_shakespeare`"):
        zoo.load("gpt-shakespeare-gpt2")
