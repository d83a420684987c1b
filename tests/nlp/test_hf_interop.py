"""Hugging Face parity: tiny random GPT-2 and BERT models saved by transformers load into ours with
equal logits and loss gradients, and our export loads back into transformers."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import zoo
from nlp.bert import Bert
from nlp.gpt import GPT
from zoo.hf import export_hf as to_hf
from zoo.parity import relative_error

GPT2_NAMES = {"embeddings.word.weight": "transformer.wte.weight", "embeddings.position.weight": "transformer.wpe.weight",
              "norm.weight": "transformer.ln_f.weight", "norm.bias": "transformer.ln_f.bias"}
GPT2_BLOCK = {"norm1": "ln_1", "attn.out": "attn.c_proj", "norm2": "ln_2", "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj"}
GPT2_QKV = ("attn.q", "attn.k", "attn.v")
"""Our projections, side by side in GPT-2's attn.c_attn."""


def hf_gpt2(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # non-trivial norms and biases, so that a misplaced one shows
        for name, param in model.named_parameters():
            if "ln" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(tmp_path / "hf_gpt2")
    return model, tmp_path / "hf_gpt2"


def hf_bert(tmp_path, kind: str, **extra):
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=80, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, num_labels=3, **extra)
    model = getattr(transformers, kind)(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(tmp_path / kind)
    return model, tmp_path / kind


def gpt2_grad(hf_model, ours_name: str) -> torch.Tensor:
    if ours_name in GPT2_NAMES:
        return hf_model.get_parameter(GPT2_NAMES[ours_name]).grad
    _, layer, *mine, kind = ours_name.split(".")
    mine = ".".join(mine)
    if mine in GPT2_QKV:
        grad = hf_model.get_parameter(f"transformer.h.{layer}.attn.c_attn.{kind}").grad
        piece = grad.split(grad.shape[-1] // 3, dim=-1)[GPT2_QKV.index(mine)]
        return piece.t() if kind == "weight" else piece
    grad = hf_model.get_parameter(f"transformer.h.{layer}.{GPT2_BLOCK[mine]}.{kind}").grad
    return grad.t() if kind == "weight" and not mine.startswith("norm") else grad


def test_gpt2_logits_and_gradients_match_transformers(tmp_path):
    """In float64, where the two implementations' orders of summation differ by rounding alone (in
    float32 the gradients of the tiny q weights differ by 1e-5 relative on one CPU, not another)."""
    hf_model, folder = hf_gpt2(tmp_path)
    model = zoo.load(folder)
    assert isinstance(model, GPT) and model.config.n_embd == 32
    model, hf_model = model.double(), hf_model.double()
    ids = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(2))
    theirs = hf_model(ids, labels=ids)  # the same batch: both shift the labels inside
    out = model(ids, labels=ids)
    assert relative_error(out["logits"], theirs.logits) < 1e-12
    ours = out["loss"]
    assert abs(ours.item() - theirs.loss.item()) < 1e-12 * theirs.loss.item()
    model.train()  # the fused path, as in training, gives the same loss (its logits reduced in float32)
    assert abs(model(ids, labels=ids)["loss"].item() - theirs.loss.item()) < 1e-6 * theirs.loss.item()
    ours.backward()
    theirs.loss.backward()
    for name, param in model.named_parameters():
        if name.endswith("attn.k.bias"):  # shifts every score of a query equally: zero gradient up to rounding
            assert param.grad.abs().max() < 1e-15 and gpt2_grad(hf_model, name).abs().max() < 1e-15
            continue
        assert relative_error(param.grad, gpt2_grad(hf_model, name)) < 1e-10, name


def test_gpt2_round_trip_through_our_export(tmp_path):
    hf_model, folder = hf_gpt2(tmp_path)
    to_hf(zoo.load(folder), tmp_path / "exported")
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "exported").eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    exported = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert exported["bos_token_id"] == exported["eos_token_id"] == 63  # inside the 64-token vocabulary
    after, before = reloaded(ids, labels=ids), hf_model(ids, labels=ids)
    assert relative_error(after.logits, before.logits) < 1e-6
    after.loss.backward()
    before.loss.backward()
    for name, param in hf_model.named_parameters():
        assert relative_error(reloaded.get_parameter(name).grad, param.grad) < 1e-5, name
    stored = load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert "lm_head.weight" not in stored and stored["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)


def padded_batch(vocab: int):
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(1, vocab, (3, 14), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 9:], mask[2, 5:] = 0, 0
    ids = ids.masked_fill(mask == 0, 0)
    types = torch.zeros_like(ids)
    types[:, 7:] = 1
    return ids, mask, types


def test_bert_masked_lm_matches_transformers(tmp_path):
    hf_model, folder = hf_bert(tmp_path, "BertForMaskedLM")
    model = zoo.load(folder)
    assert isinstance(model, Bert) and model.config.head == "mlm"
    ids, mask, types = padded_batch(80)
    labels = torch.full_like(ids, -100)
    labels[0, [1, 4, 8]], labels[1, [2, 3]], labels[2, [0]] = ids[0, [1, 4, 8]], ids[1, [2, 3]], ids[2, [0]]
    theirs = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    out = model(ids, mask, types, labels=labels)  # loss and logits, as transformers returns
    assert relative_error(out["logits"], theirs.logits) < 1e-5
    ours = out["loss"]
    assert abs(ours.item() - theirs.loss.item()) < 1e-5 * theirs.loss.item()
    fused = model(ids, mask, types, labels=labels, skip_logits=True)
    assert set(fused) == {"loss"} and abs(fused["loss"].item() - theirs.loss.item()) < 1e-5 * theirs.loss.item()
    ours.backward()
    theirs.loss.backward()
    compare_gradients(model, hf_model, tmp_path)


def compare_gradients(model, hf_model, tmp_path):
    """Our gradients against theirs: write ours through the exporter (which knows every name and
    layout) and read them back as an HF state."""
    grads = type(model)(model.config)
    with torch.no_grad():
        for name, param in grads.named_parameters():
            param.copy_(dict(model.named_parameters())[name].grad)
    to_hf(grads, tmp_path / "grads")
    exported = load_file(str(tmp_path / "grads" / "model.safetensors"))
    theirs = {name: p.grad for name, p in hf_model.named_parameters() if p.grad is not None}
    assert set(exported) <= set(theirs) | {"cls.predictions.bias"}
    for name, grad in exported.items():
        if name.endswith("attention.self.key.bias"):  # exactly zero in exact arithmetic (softmax ignores it)
            assert grad.abs().max() < 1e-9 and theirs[name].abs().max() < 1e-9
            continue
        expected = theirs.get(name, theirs.get("cls.predictions.decoder.bias"))
        assert relative_error(grad, expected) < 1e-5, name


def test_bert_classification_matches_transformers_and_round_trips(tmp_path):
    hf_model, folder = hf_bert(tmp_path, "BertForSequenceClassification")
    model = zoo.load(folder)
    assert model.config.head == "classification" and model.config.num_labels == 3
    ids, mask, types = padded_batch(80)
    labels = torch.tensor([0, 2, 1])
    theirs = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    ours = model(ids, mask, types, labels=labels)
    assert relative_error(ours["logits"], theirs.logits) < 1e-5
    assert abs(ours["loss"].item() - theirs.loss.item()) < 1e-5 * theirs.loss.item()
    ours["loss"].backward()
    theirs.loss.backward()
    compare_gradients(model, hf_model, tmp_path)
    to_hf(model, tmp_path / "exported")
    reloaded = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "exported").eval()
    after = reloaded(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert relative_error(after.logits, theirs.logits) < 1e-6
    after.loss.backward()
    for name, param in hf_model.named_parameters():
        if not name.endswith("attention.self.key.bias"):  # zero in exact arithmetic
            assert relative_error(reloaded.get_parameter(name).grad, param.grad) < 1e-5, name


def test_bert_legacy_names_without_prefix_and_masked_lm_round_trip(tmp_path):
    hf_model, folder = hf_bert(tmp_path, "BertForMaskedLM")
    state = load_file(str(folder / "model.safetensors"))
    legacy = {name.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): t
              for name, t in state.items()}
    legacy["embeddings.position_ids"] = torch.arange(40)[None]
    assert any(name.endswith("gamma") for name in legacy) and not any(name.startswith("bert.") for name in legacy)
    save_file(legacy, str(folder / "model.safetensors"))
    model = zoo.load(folder)
    to_hf(model, tmp_path / "exported")
    reloaded = transformers.BertForMaskedLM.from_pretrained(tmp_path / "exported").eval()
    ids, mask, types = padded_batch(80)
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        assert relative_error(model(ids, mask, types)["logits"], expected) < 1e-5
        assert relative_error(reloaded(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, expected) < 1e-6


def test_unsupported_or_mismatched_checkpoints_are_named(tmp_path):
    _, folder = hf_gpt2(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    with pytest.raises(ValueError, match="activation_function='relu' is not supported; expected one of \\['gelu_new'"):
        zoo.load(folder)
    (folder / "config.json").write_text(json.dumps({**config, "n_layer": 1}))
    with pytest.raises(ValueError, match="has 12 tensors this model has no place for: \\['h.1"):
        zoo.load(folder)
    (folder / "config.json").write_text(json.dumps({**config, "n_layer": 3}))
    with pytest.raises(ValueError, match="has no tensor 'h.2.ln_1.weight'"):
        zoo.load(folder)
    with pytest.raises(ValueError, match="GPT-2 has biases, multi-head attention.*this GPT has bias=True, n_kv_head=1"):
        to_hf(zoo.create("gpt", vocab_size=8, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=8), tmp_path / "x")


def test_bert_multi_label_classification_follows_problem_type(tmp_path):
    hf_model, folder = hf_bert(tmp_path, "BertForSequenceClassification", problem_type="multi_label_classification")
    model = zoo.load(folder)
    assert model.config.problem_type == "multi_label_classification"
    ids, mask, types = padded_batch(80)
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    theirs = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    ours = model(ids, mask, types, labels=labels)
    assert abs(ours["loss"].item() - theirs.loss.item()) < 1e-5 * theirs.loss.item()
    with pytest.raises(ValueError, match=r"labels for multi_label_classification must have shape \(3, 3\); got \(3,\)"):
        model(ids, mask, types, labels=torch.tensor([0, 1, 2]))
    to_hf(model, tmp_path / "exported")
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["problem_type"] == "multi_label_classification"
