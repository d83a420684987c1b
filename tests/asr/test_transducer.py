"""The transducer model: padding-invariant Conformer encoding, the four training objectives against
each other, the pruned warm-up, saving and loading, greedy / beam decoding of a trained model, and
the decoder stepped one position at a time as a search steps it."""

from __future__ import annotations

import pytest
import torch

import zoo
from asr.conformer import subsampled_lengths
from asr.decoder import StatelessDecoder
from asr.decoding import greedy_search, modified_beam_search
from asr.model import TransducerConfig
from tiny_transducer import BINS, tiny, token_utterances
from zoo.parity import relative_error

@pytest.mark.parametrize("frame_stack", [1, 2])
def test_an_utterance_encodes_the_same_alone_and_padded_in_a_batch(frame_stack):
    model = tiny(encoder_frame_stack=frame_stack).eval()
    features, mask, _ = token_utterances(3, seed=1)
    encoded, lengths = model.encode(features, mask)
    assert lengths.tolist() == subsampled_lengths(mask.sum(1), frame_stack).tolist()
    assert lengths.tolist() == [((int(n) - 1) // 2 - 1) // 2 // frame_stack for n in mask.sum(1)]
    for row in range(3):
        frames = int(mask[row].sum())
        alone, _ = model.encode(features[row : row + 1, :frames])
        assert relative_error(encoded[row, : lengths[row]], alone[0]) < 1e-5
    with pytest.raises(ValueError, match=f"features need at least {4 * frame_stack + 3} frames"):
        model.encode(features[:1, : 4 * frame_stack + 2])


def test_the_four_objectives_agree():
    features, mask, labels = token_utterances(4, seed=2)
    losses, gradients = {}, {}
    for kind in ("full", "samplewise", "pruned", "samplewise_pruned"):
        model = tiny(loss=kind, prune_range=7, samplewise_memory_budget=1)  # budget 1: one sample per group
        model.set_training_step(10_000)
        output = model(features, mask, labels)
        output["loss"].backward()
        losses[kind] = {name: value.item() for name, value in output.items()}
        gradients[kind] = torch.cat([p.grad.flatten() for p in model.encoder.parameters()])
    # prune_range 7 covers every label sequence (U <= 5): the pruned loss is the full loss.
    assert losses["full"]["loss"] == pytest.approx(losses["samplewise"]["loss"], rel=1e-5)
    assert losses["pruned"]["transducer_loss"] == pytest.approx(losses["full"]["loss"], rel=1e-5)
    for name in ("loss", "simple_loss", "transducer_loss"):
        assert losses["samplewise_pruned"][name] == pytest.approx(losses["pruned"][name], rel=1e-5)
    assert losses["pruned"]["loss"] == pytest.approx(0.5 * losses["pruned"]["simple_loss"] + losses["full"]["loss"], rel=1e-5)
    assert relative_error(gradients["samplewise"], gradients["full"]) < 1e-4
    assert relative_error(gradients["samplewise_pruned"], gradients["pruned"]) < 1e-4


def test_pruned_warm_up_moves_weight_from_the_simple_to_the_pruned_loss():
    model = tiny(warm_steps=100, simple_loss_scale=0.5)
    scales = []
    for step in (0, 50, 100, 500):
        model.set_training_step(step)
        scales.append(model.loss_scales())
    assert scales == [(1.0, 0.1), (0.75, 0.55), (0.5, 1.0), (0.5, 1.0)]
    with pytest.raises(ValueError, match="loss must be one of"):
        TransducerConfig(loss="ctc")


def test_saved_and_loaded_with_its_feature_statistics(tmp_path):
    model = tiny(spec_augment=None)
    model.set_feature_stats(torch.linspace(-1, 1, BINS), torch.linspace(0.5, 2, BINS))
    zoo.save(model, tmp_path / "asr", card="# test")
    loaded = zoo.load(tmp_path / "asr")
    assert loaded.config == model.config and loaded.feature_std.equal(model.feature_std)
    features, mask, labels = token_utterances(2, seed=3)
    model.eval()
    assert torch.equal(loaded(features, mask)["encoder_out"], model(features, mask)["encoder_out"])
    with pytest.raises(ValueError, match="std > 0"):
        model.set_feature_stats(torch.zeros(BINS), torch.zeros(BINS))


def test_decoders_recover_the_tokens_a_trained_model_learned():
    model = tiny(loss="pruned", warm_steps=20, prune_range=3)
    features, mask, labels = token_utterances(16, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    for step in range(120):
        model.set_training_step(step)
        loss = model(features, mask, labels)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    encoded, lengths = model.encode(features, mask)
    references = [[t for t in row.tolist() if t != -100] for row in labels]
    greedy = greedy_search(model, encoded, lengths)
    beam = modified_beam_search(model, encoded, lengths, beam=4)
    several = modified_beam_search(model, encoded, lengths, beam=4, max_symbols_per_frame=3)
    assert sum(h == r for h, r in zip(greedy, references)) >= 14
    assert sum(h == r for h, r in zip(beam, references)) >= 14
    assert sum(h == r for h, r in zip(several, references)) >= 14


@pytest.mark.parametrize("symbols", [1, 3])
def test_beam_one_is_greedy_with_as_many_symbols_per_frame(symbols):
    model = tiny(seed=5, vocab_size=6).eval()
    features, mask, _ = token_utterances(4, seed=4)
    encoded, lengths = model.encode(features, mask)
    searched = modified_beam_search(model, encoded, lengths, beam=1, max_symbols_per_frame=symbols)
    assert searched == greedy_search(model, encoded, lengths, symbols)
    if symbols > 1:  # an untrained model emits several tokens in a frame: the case is exercised
        assert max(len(h) - n for h, n in zip(searched, lengths.tolist())) > 0
    with pytest.raises(ValueError, match="beam and max_symbols_per_frame must be >= 1"):
        modified_beam_search(model, encoded, lengths, beam=0)


@pytest.mark.parametrize("blank", [0, 7])
def test_the_example_batch_is_ten_seconds_of_frames_with_non_blank_labels_the_model_trains_on(blank):
    model = tiny(blank_id=blank)
    batch = type(model).example_batch(model.config, 2)
    assert batch["input_features"].shape == (2, 1001, BINS) and batch["attention_mask"].shape == (2, 1001)
    assert batch["attention_mask"].dtype == torch.long and bool(batch["attention_mask"].eq(1).all())
    labels = batch["labels"]
    assert labels.shape == (2, 100) and bool(labels.ne(blank).all()) and 0 <= labels.min() <= labels.max() < 8
    loss = model(**batch)["loss"]
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_the_model_builds_on_the_meta_device_as_a_planner_builds_it():
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in tiny().named_parameters()}
    assert shapes == {name: p.shape for name, p in tiny().named_parameters()}


@pytest.mark.parametrize("context_size", [1, 2, 3])
def test_a_search_steps_the_decoder_as_it_runs_over_a_sequence(context_size):
    torch.manual_seed(0)
    decoder = StatelessDecoder(vocab_size=12, width=16, context_size=context_size).double()
    contexts = torch.randint(0, 12, (9, context_size))
    contexts[0] = 0  # blanks: the context of a hypothesis with no token yet
    with torch.no_grad():
        assert relative_error(decoder.last(contexts), decoder(contexts)[:, -1]) < 1e-12
    with pytest.raises(ValueError, match=rf"contexts must be \(N, {context_size}\); got \(9, {context_size + 1}\)"):
        decoder.last(torch.zeros(9, context_size + 1, dtype=torch.long))
