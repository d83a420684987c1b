"""The encoder-decoder translator (`nlp.translation`): a MarianMTModel that transformers builds from a
seeded tiny config loads through `zoo.load` with the same logits and loss, and our export loads in
transformers with the same logits; the fused label-smoothed loss equals the unfused one; bad
configs are refused by name."""

from __future__ import annotations

import pytest
import torch

import zoo
from nlp.translation import Translator, TranslatorConfig
from nlp.translation.marian import translator_config_from_hf, translator_to_hf
from nlp.translation.embedding import sinusoidal_positions
from nlp.translation.model import shift_right
from zoo.parity import relative_error

transformers = pytest.importorskip("transformers")


def tiny_marian(folder):
    """A MarianMTModel of transformers' own making, seeded, with a non-zero final logits bias."""
    torch.manual_seed(0)
    config = transformers.MarianConfig(vocab_size=64, decoder_vocab_size=64, d_model=32, encoder_layers=2,
                                       decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                       encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
                                       pad_token_id=63, eos_token_id=0, decoder_start_token_id=63,
                                       activation_function="swish")  # OPUS-MT's
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.5)
    model.save_pretrained(folder)
    return model


def batch():
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(1, 60, (3, 9), generator=generator)
    mask = torch.ones_like(source)
    mask[1, 6:], mask[2, 3:] = 0, 0  # padded sources
    source = source.masked_fill(mask == 0, 63)
    labels = torch.randint(1, 60, (3, 7), generator=generator)
    labels[2, 5:] = -100
    return source, mask, labels


def test_a_marian_model_loads_with_its_logits_and_exports_back(tmp_path):
    theirs = tiny_marian(tmp_path / "hf")
    ours = zoo.load(tmp_path / "hf").eval()
    assert isinstance(ours, Translator) and ours.config.activation == "silu" and not ours.config.prenorm
    source, mask, labels = batch()
    with torch.no_grad():
        expected = theirs(input_ids=source, attention_mask=mask, labels=labels)
        got = ours(source, mask, labels=labels, skip_logits=False)
    assert relative_error(got["logits"], expected.logits) < 1e-5
    assert abs(got["loss"].item() - expected.loss.item()) < 1e-5 * expected.loss.item()
    translator_to_hf(ours, tmp_path / "exported")
    back = transformers.MarianMTModel.from_pretrained(tmp_path / "exported").eval()
    with torch.no_grad():
        again = back(input_ids=source, attention_mask=mask, decoder_input_ids=shift_right(labels, 63, 63))
    assert relative_error(again.logits, expected.logits) < 1e-5


def test_the_fused_loss_is_the_label_smoothed_cross_entropy_and_every_parameter_learns():
    torch.manual_seed(0)
    model = Translator(TranslatorConfig(vocab_size=50, width=32, heads=4, encoder_layers=2, decoder_layers=2, ffn_width=64,
                                        max_positions=16, dropout=0.0, label_smoothing=0.1))
    source, mask, labels = batch()
    source, labels = source % 50, labels.masked_fill(labels >= 50, 7)
    fused = model(source, mask, labels=labels, skip_logits=True)["loss"]
    plain = model(source, mask, labels=labels, skip_logits=False)["loss"]
    assert abs(fused.item() - plain.item()) < 1e-5 * plain.item()
    fused.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_sinusoidal_positions_are_marians_table():
    table = sinusoidal_positions(7, 6)
    t, i = 5, 1
    assert table[t, i] == pytest.approx(torch.sin(torch.tensor(t / 10000 ** (2 * i / 6))).item(), abs=1e-6)
    assert table[t, 3 + i] == pytest.approx(torch.cos(torch.tensor(t / 10000 ** (2 * i / 6))).item(), abs=1e-6)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match=r"TranslatorConfig.heads \(5\) must divide width \(32\)"):
        TranslatorConfig(width=32, heads=5)
    with pytest.raises(ValueError, match=r"TranslatorConfig.eos_token_id must be a token id below vocab_size=10; got 12"):
        TranslatorConfig(vocab_size=10, eos_token_id=12, pad_token_id=0, decoder_start_token_id=0)
    hf = dict(vocab_size=10, decoder_vocab_size=10, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
              decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8, max_position_embeddings=8, pad_token_id=0,
              eos_token_id=1)
    with pytest.raises(ValueError, match=r"marian config decoder_ffn_dim=16 is not supported; expected 8"):
        translator_config_from_hf({**hf, "decoder_ffn_dim": 16})
    with pytest.raises(ValueError, match=r"marian config share_encoder_decoder_embeddings=False is not supported"):
        translator_config_from_hf({**hf, "share_encoder_decoder_embeddings": False})
    with pytest.raises(ValueError, match="Translator needs decoder_input_ids or labels"):
        Translator(TranslatorConfig(vocab_size=10, width=8, heads=2, encoder_layers=1, decoder_layers=1, ffn_width=8,
                                    eos_token_id=1))(torch.zeros(1, 3, dtype=torch.long))
