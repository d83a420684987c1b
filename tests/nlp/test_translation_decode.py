"""Decoding with the translator (`nlp.translation.decode`): a Marian-shaped translator trained 400 steps
to reverse its source, exported, decodes 16 held-out sources to the tokens transformers'
MarianMTModel.generate gives, greedy and with 4 beams; with and without the caches alike; bad
settings refused."""

from __future__ import annotations

import pytest
import torch

from nlp.translation import Translator, TranslatorConfig
from nlp.translation.decode import BeamSettings
from nlp.translation.marian import translator_to_hf

transformers = pytest.importorskip("transformers")
PAD, EOS, VOCAB = 0, 1, 16


def reversals(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources of 3-8 tokens (ids 2..15, padded), attention masks, and labels: the source reversed, EOS."""
    lengths = torch.randint(3, 9, (count,), generator=generator)
    source, labels = torch.full((count, 8), PAD), torch.full((count, 9), -100)
    for row, length in enumerate(lengths.tolist()):
        tokens = torch.randint(2, VOCAB, (length,), generator=generator)
        source[row, :length], labels[row, :length], labels[row, length] = tokens, tokens.flip(0), EOS
    return source, (source != PAD).long(), labels


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.manual_seed(0)
    model = Translator(TranslatorConfig(vocab_size=VOCAB, width=32, heads=4, encoder_layers=2, decoder_layers=2,
                                        ffn_width=64, max_positions=16, dropout=0.0, label_smoothing=0.0,
                                        pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=EOS, prenorm=False,
                                        activation="silu", final_logits_bias=True))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    for _ in range(400):
        source, mask, labels = reversals(32, generator)
        loss = model(source, mask, labels=labels)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    folder = translator_to_hf(model.eval(), tmp_path_factory.mktemp("reverser"))
    held_out = reversals(16, generator)
    with torch.no_grad():
        loss = model(*held_out[:2], labels=held_out[2])["loss"]
    return model, transformers.MarianMTModel.from_pretrained(folder).eval(), held_out, loss.item()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("beams", [1, 4])
def test_decoding_gives_transformers_tokens_with_and_without_the_caches(trained, beams):
    model, hf, (source, mask, labels), loss = trained
    assert loss < 0.5  # on the held-out sources: it learned (ln 16 = 2.77 at chance)
    settings = BeamSettings(beams=beams, max_length_ratio=2.0, min_length=8)
    ours = model.generate(source, mask, settings)
    assert model.generate(source, mask, settings, use_cache=False) == ours
    with torch.no_grad():
        generated = hf.generate(input_ids=source, attention_mask=mask, num_beams=beams, do_sample=False,
                                max_new_tokens=15, length_penalty=1.0, early_stopping=False, forced_eos_token_id=None)
    theirs = [row[1:row.index(EOS) + 1] if EOS in row else row[1:] for row in generated.tolist()]
    assert ours == theirs
    reversed_right = sum(out == label[label >= 0].tolist() for out, label in zip(ours, labels))
    assert reversed_right >= 4  # some held-out sources reversed exactly already


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="BeamSettings.beams must be >= 1; got 0"):
        BeamSettings(beams=0)
    with pytest.raises(ValueError, match="BeamSettings.max_length_ratio must be > 0; got 0"):
        BeamSettings(max_length_ratio=0)
