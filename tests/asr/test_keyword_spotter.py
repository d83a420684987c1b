"""The keyword spotter's pieces: features of spoken digits (the shipped FSDD MFCCs against the
recordings), per-clip normalisation, augmentation, the DS-CNN, and its run under zoo.partial."""

from __future__ import annotations

from importlib import resources

import pytest
import torch

from asr.keyword_spotter import KeywordSpotter, KeywordSpotterConfig
from asr.keywords import KeywordAugmentation, centred_clip, keyword_features, keyword_mfccs
from asr.spoken_digits import FSDD_SPEAKERS, fsdd_clip, fsdd_mfccs
from zoo.partial import ArenaExecutor, ScheduleExecutor, schedule

SHIPPED_WAVS = resources.files("asr").joinpath("assets", "fsdd")


def test_shipped_mfccs_are_those_of_the_recordings():
    digits = fsdd_mfccs()
    assert digits.features.shape == (3000, 1, 49, 10) and set(digits.speakers) == set(FSDD_SPEAKERS)
    assert torch.bincount(digits.digits).tolist() == [300] * 10
    for digit in range(10):
        row = digits.names.index(f"{digit}_theo_0")
        assert digits.digits[row] == digit and digits.speakers[row] == "theo"
        made = keyword_mfccs(fsdd_clip(SHIPPED_WAVS / f"{digit}_theo_0.wav"))
        assert (made - digits.features[row]).abs().max() <= 1e-2 * made.abs().max()  # float16


def test_centred_clip_resamples_and_centres():
    tone = torch.sin(torch.arange(4000) * 0.3)  # half a second at 8 kHz
    clip = centred_clip(tone, 8000)
    assert clip.shape == (16000,) and clip[:3900].abs().max() == 0 and clip[12100:].abs().max() == 0
    assert clip[4000:12000].abs().max() > 0.9
    assert centred_clip(tone, 8000, start=0)[8000:].abs().max() == 0
    with pytest.raises(ValueError, match="start must be in"):
        centred_clip(tone, 8000, start=8001)


def test_keyword_features_normalise_each_coefficient_over_the_clip():
    features = keyword_features(fsdd_clip(SHIPPED_WAVS / "7_theo_0.wav"))
    assert features.shape == (1, 49, 10)
    assert features.mean(1).abs().max() < 1e-5
    assert (features.std(1) - 1).abs().max() < 1e-2


def test_augmentation_rolls_in_time_and_masks():
    features = torch.randn(8, 1, 49, 10)
    rolled = KeywordAugmentation(max_time_mask=0, max_coefficient_mask=0, noise=0.0)(features, torch.Generator().manual_seed(0))
    for clip, made in zip(features, rolled):
        shifts = [s for s in range(-10, 11) if torch.equal(torch.roll(clip, s, dims=1), made)]
        assert len(shifts) == 1
    masked = KeywordAugmentation(max_shift=0, noise=0.0)(features, torch.Generator().manual_seed(1))
    zeroed = masked == 0
    assert torch.equal(masked[~zeroed], features[~zeroed]) and zeroed.sum() > 0
    with pytest.raises(ValueError, match="noise must be >= 0"):
        KeywordAugmentation(noise=-1.0)


def test_spotter_logits_and_loss():
    torch.manual_seed(0)
    model = KeywordSpotter(KeywordSpotterConfig())
    assert sum(p.numel() for p in model.parameters()) == 23050  # MLPerf Tiny's DS-CNN: 22.6k weights + batch norms
    features, labels = torch.randn(4, 1, 49, 10), torch.tensor([0, 3, 9, 1])
    model.eval()
    output = model(features, labels)
    assert output["logits"].shape == (4, 10)
    reference = torch.nn.functional.cross_entropy(output["logits"].double(), labels)
    assert abs(output["loss"].item() - reference.item()) <= 1e-6 * reference.item()
    model.train()
    smoothed = model(features, labels)["loss"]
    assert smoothed.isfinite() and smoothed.requires_grad
    with pytest.raises(ValueError, match=r"input_features must have shape \(B, 1, 49, 10\)"):
        model(torch.randn(4, 49, 10))
    with pytest.raises(ValueError, match="channels must be >= 1"):
        KeywordSpotterConfig(channels=0)


def test_spotter_runs_from_one_arena_under_partial_execution():
    torch.manual_seed(0)
    model = KeywordSpotter(KeywordSpotterConfig())
    for module in model.modules():  # trained-looking batch norms
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.normal_()
            module.bias.data.normal_()
    network, features = model.eval().network, torch.randn(3, 1, 49, 10)
    plan = schedule(network, features[:1])
    assert plan.unknown == []  # dropouts in eval mode are the identity, in place
    executor = ScheduleExecutor(plan, features[:1])
    assert executor.arena.numel() == plan.peak_bytes <= plan.baseline_bytes
    expected = network(features)
    ran = torch.cat([executor.run(clip[None]).clone() for clip in features])
    assert (ran - expected).abs().max() <= 1e-6 * expected.abs().max()
    whole = ArenaExecutor(network, features[:1])
    assert whole.arena.numel() == plan.baseline_bytes
    assert (whole.run(features[:1]) - expected[:1]).abs().max() <= 1e-6 * expected.abs().max()
