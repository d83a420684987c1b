"""BERT: against transformers run in float64, heads, padding, plan and errors."""

from __future__ import annotations

import pytest
import torch
import transformers

from nlp.bert import Bert, BertConfig
from nlp.hf import bert_state_from_hf
from zoo.parity import relative_error

TINY = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def pair(head: str, architecture: str, **extra):
    """Our Bert and a transformers float64 copy holding the same random weights."""
    torch.manual_seed(0)
    theirs = getattr(transformers, architecture)(transformers.BertConfig(**TINY, **extra)).double().eval()
    with torch.no_grad():
        for name, param in theirs.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    config = BertConfig(**TINY, head=head, **extra)
    ours = Bert(config).eval()
    ours.load_state_dict(bert_state_from_hf({k: v.float() for k, v in theirs.state_dict().items()}, config))
    return ours, theirs


def batch():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (2, 16), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    return ids, mask


def test_encoder_and_pooler_match_a_float64_reference():
    ours, theirs = pair("none", "BertModel")
    ids, mask = batch()
    out = ours(ids, mask)
    expected = theirs(input_ids=ids, attention_mask=mask)
    # padded positions are computed too (they attend to the real tokens), and must agree as well
    assert relative_error(out["last_hidden_state"], expected.last_hidden_state) < 1e-5
    assert relative_error(out["pooler_output"], expected.pooler_output) < 1e-5
    # padding changes nothing for the real tokens of a sequence
    alone = ours(ids[1:, :10])["last_hidden_state"]
    assert relative_error(alone, out["last_hidden_state"][1:, :10]) < 1e-5


def test_regression_head_uses_mean_squared_error():
    ours, theirs = pair("classification", "BertForSequenceClassification", num_labels=1)
    ids, mask = batch()
    target = torch.tensor([0.5, -1.0])
    out = ours(ids, mask, labels=target)
    expected = theirs(input_ids=ids, attention_mask=mask, labels=target.double())
    assert out["logits"].shape == (2, 1)
    assert abs(out["loss"].item() - expected.loss.item()) < 1e-5 * expected.loss.item()


def test_masked_lm_projects_only_labelled_positions():
    ours, _ = pair("mlm", "BertForMaskedLM")
    ids, mask = batch()
    labels = torch.full_like(ids, -100)
    labels[0, 3] = ids[0, 3]
    logits = ours(ids, mask)["logits"]
    expected = torch.nn.functional.cross_entropy(logits[0, 3][None], ids[0, 3][None])
    fused = ours(ids, mask, labels=labels, skip_logits=True)
    assert set(fused) == {"loss"} and abs(fused["loss"].item() - expected.item()) < 1e-5


def test_training_mode_dropout_and_plan():
    model = Bert(BertConfig(**{**TINY, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}, head="classification"))
    ids, mask = batch()
    torch.manual_seed(3)
    a = model(ids, mask, labels=torch.tensor([0, 1]))["loss"]
    torch.manual_seed(3)
    b = model(ids, mask, labels=torch.tensor([0, 1]))["loss"]
    model.eval()
    c = model(ids, mask, labels=torch.tensor([0, 1]))["loss"]
    assert a.item() == b.item() != c.item()
    plan = model.parallel_plan()
    assert plan.block_names(model) == ["blocks.0", "blocks.1"]
    assert plan.names(model, "colwise") == [f"blocks.{i}.{name}" for i in (0, 1)
                                            for name in ("attn.q", "attn.k", "attn.v", "mlp.fc1")]


def test_bad_inputs_are_named():
    model = Bert(BertConfig(**TINY))
    ids, mask = batch()
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids \(2, 16\); got \(2, 15\)"):
        model(ids, mask[:, :-1])
    with pytest.raises(ValueError, match="length must be <= max_position_embeddings=24; got 30"):
        model(torch.ones(1, 30, dtype=torch.long))
    with pytest.raises(ValueError, match="labels need a head; this BERT has head='none'"):
        model(ids, labels=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="BertConfig.head must be 'none', 'mlm' or 'classification'; got 'qa'"):
        BertConfig(head="qa")
