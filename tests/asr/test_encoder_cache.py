"""The frozen encoder's cached outputs (asr.encoder_cache): each utterance's frames equal the
encoder's output of that utterance alone, within float16 storage; the transducer's loss from them
equals its loss from the features; a view is encoded once and read back, keyed on the encoder's
weights and not the head's; views draw their own augmentation, repeatably from the seed."""

from __future__ import annotations

import pytest
import torch

from asr.augmentation import ROBUST
from asr.data import DurationBuckets, SpeechExamples, collate_speech
from asr.encoder_cache import EncodedExamples
from asr.model import Transducer, TransducerConfig
from asr.text import TranscriptTokenizer
from asr.voices import Voice, speak
from asr.whisper_encoder import WhisperEncoderConfig
from zoo.parity import relative_error

SENTENCES = ["very easy to use", "the bus leaves at nine", "my neighbour cooks on sundays",
             "a quiet kitchen", "we met on a tuesday morning"]


def whisper_transducer(seed: int = 0, **fields) -> Transducer:
    """A small transducer on a Whisper-style encoder of the recipe's 80 mel bins (2 blocks of width 64)."""
    torch.manual_seed(seed)
    encoder = WhisperEncoderConfig(input_dim=80, width=64, layers=2, heads=4, max_frames=512)
    return Transducer(TransducerConfig(**{"vocab_size": 29, "decoder_dim": 32, "joiner_dim": 32,
                                          "encoder_kind": "whisper", "encoder": encoder, **fields}))


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict[str, str]]:
    folder = tmp_path_factory.mktemp("clips")
    spoken = []
    for index, text in enumerate(SENTENCES):
        speak(text, Voice("en-gb", "m3", 170, 50), folder / f"{index}.wav")
        spoken.append({"audio": str(folder / f"{index}.wav"), "text": text})
    return spoken


@pytest.mark.timeout(120)
def test_cached_outputs_are_the_encoders_and_give_the_same_loss(rows, tmp_path):
    examples = SpeechExamples(rows, TranscriptTokenizer("char"))
    model = whisper_transducer(spec_augment=None).eval()
    encoded = EncodedExamples.build(model, examples, augmented=False, root=tmp_path)
    assert len(encoded) == len(examples) and encoded.seconds == examples.seconds
    with torch.no_grad():
        for index in range(len(examples)):
            alone, _ = model.encode(examples[index]["input_features"][None])
            assert relative_error(encoded[index]["encoder_outputs"], alone[0]) < 1e-3
            assert torch.equal(encoded[index]["labels"], examples[index]["labels"])
        bucket = DurationBuckets(examples, 4).groups[0]
        from_features = model(**collate_speech([examples[i] for i in bucket]))["loss"]
        from_cache = model(**collate_speech([encoded[i] for i in bucket]))["loss"]
    assert relative_error(from_cache, from_features) < 1e-3

    [folder] = list(tmp_path.glob("encoded_*"))
    stamp = (folder / "frames.bin").stat().st_mtime_ns
    with torch.no_grad():
        model.joiner.out.weight.add_(1.0)  # not the encoder: the same frames, read back
    EncodedExamples.build(model, examples, augmented=False, root=tmp_path)
    assert list(tmp_path.glob("encoded_*")) == [folder] and (folder / "frames.bin").stat().st_mtime_ns == stamp
    with torch.no_grad():
        model.encoder.blocks[0].mlp.fc1.weight.mul_(1.5)  # another encoder: encoded anew, elsewhere
    again = EncodedExamples.build(model, examples, augmented=False, root=tmp_path)
    assert len(list(tmp_path.glob("encoded_*"))) == 2
    assert not torch.equal(again[0]["encoder_outputs"], encoded[0]["encoder_outputs"])


@pytest.mark.timeout(120)
def test_views_draw_their_own_augmentation_repeatably(rows, tmp_path):
    examples = SpeechExamples(rows, TranscriptTokenizer("char"), augment=ROBUST)
    model = whisper_transducer()
    first = EncodedExamples.build(model, examples, views=2, seed=3, root=tmp_path / "a")
    assert len(first) == 2 * len(examples) and first.seconds == 2 * examples.seconds
    frames = [[first[view * len(examples) + i]["encoder_outputs"] for i in range(len(examples))] for view in range(2)]
    assert any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(*frames))
    assert model.training  # left as it was
    second = EncodedExamples.build(model, examples, views=2, seed=3, root=tmp_path / "b", first_view=1)
    assert all(torch.equal(second[i]["encoder_outputs"], first[i]["encoder_outputs"]) for i in range(len(first)))


def test_the_transducer_takes_features_or_encoder_outputs_and_names_bad_ones():
    model = whisper_transducer()
    with pytest.raises(ValueError, match="one of input_features and encoder_outputs; got neither"):
        model(labels=torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="got both"):
        model(torch.zeros(1, 10, 80), encoder_outputs=torch.zeros(1, 5, 64))
    with pytest.raises(ValueError, match=r"encoder_outputs must be \(B, T', 64\); got \(1, 5, 32\)"):
        model(encoder_outputs=torch.zeros(1, 5, 32))
