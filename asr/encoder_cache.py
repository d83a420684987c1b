"""A frozen encoder's outputs of a speech set, computed once and kept on disk, so that a transducer's
decoder and joiner can train on them without running the encoder at every step.

This is the first phase of training on a pretrained encoder: the new decoder and joiner learn while
the encoder is frozen, then the whole model fine-tunes (Kumar et al., 2022, linear probing then
fine-tuning), so that the random head's first gradients never reach the pretrained weights. Frozen,
the encoder's outputs do not change from step to step: encoding each utterance once replaces a
forward pass at every step (`benchmarks/asr_encoder_cache.py` times both).

    encoded = EncodedExamples.build(model, examples, views=2, seed=0)   # once; later calls read it
    encoded[i] -> {"encoder_outputs" (T', E) float32, "labels" (U,) token ids}
    DurationBuckets(encoded, 16), collate_speech -> {"encoder_outputs" (B, T', E), "attention_mask"
    (B, T'), "labels" (B, U)}: Transducer.forward's encoder_outputs

Each view is one pass over the examples as training draws them: the examples' waveform augmentation
and, with `augmented`, the model's SpecAugment, drawn afresh from a seed of its own; example i of
view v is item v * len(examples) + i. A view is a folder of float16 frames (frames.bin, (frames, E)
row-major, memory-mapped) and each utterance's first frame and frame count (index.npy, (N, 2)
int64). Its name is a digest of the model's encoder and feature statistics, the clips and their
transcripts, the augmentation, the seed and the view, so that frames of other weights or data are
never read; it is written whole or not at all (`zoo.downloads.unpacked_once`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch

from asr.data import SpeechExamples, collate_speech
from asr.model import Transducer
from zoo.downloads import data_dir, unpacked_once

log = logging.getLogger(__name__)

FRAMES_FILE = "frames.bin"
INDEX_FILE = "index.npy"
SHAPE_FILE = "shape.json"
ENCODE_BATCH = 16
"""Utterances of similar length encoded at once."""


def view_digest(model: Transducer, examples: SpeechExamples, augmented: bool, seed: int, view: int) -> str:
    """SHA-256 (hex) of what a view's frames depend on: the encoder's weights and config, the feature
    statistics, SpecAugment when `augmented`, the clips and transcripts, the waveform augmentation,
    the feature settings, the seed and the view."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if name.startswith(("encoder.", "feature_mean", "feature_std")):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    settings = {"encoder": dataclasses.asdict(model.config.encoder), "kind": model.config.encoder_kind,
                "spec_augment": dataclasses.asdict(model.config.spec_augment)
                if augmented and model.config.spec_augment is not None else None,
                "augment": dataclasses.asdict(examples.augment) if examples.augment is not None else None,
                "features": dataclasses.asdict(examples.features), "rows": examples.rows, "seed": seed, "view": view}
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()


@torch.no_grad()
def encode_view(model: Transducer, examples: SpeechExamples, augmented: bool, seed: int, folder: Path) -> None:
    """Write into `folder` the encoder outputs of every example (frames.bin, index.npy, shape.json),
    drawing the examples' augmentation and, when `augmented`, SpecAugment from `seed`."""
    order = sorted(range(len(examples)), key=lambda i: examples.seconds[i])
    index = np.zeros((len(examples), 2), dtype=np.int64)
    written, was_training, device = 0, model.training, next(model.parameters()).device
    model.train(augmented)
    try:
        with torch.random.fork_rng(), open(folder / FRAMES_FILE, "wb") as frames:
            torch.manual_seed(seed)
            for start in range(0, len(order), ENCODE_BATCH):
                rows = order[start : start + ENCODE_BATCH]
                batch = collate_speech([examples[i] for i in rows])
                out, lengths = model.encode(batch["input_features"].to(device), batch["attention_mask"].to(device))
                for row, length, encoded in zip(rows, lengths.tolist(), out.half().cpu()):
                    frames.write(encoded[:length].contiguous().numpy().tobytes())
                    index[row] = written, length
                    written += length
    finally:
        model.train(was_training)
    np.save(folder / INDEX_FILE, index)
    (folder / SHAPE_FILE).write_text(json.dumps({"frames": written, "width": model.config.encoder.width}))


class EncodedExamples(torch.utils.data.Dataset):
    """views x len(examples) examples {"encoder_outputs" (T', E) float32, "labels" (U,)} read from
    the view folders; `seconds` repeats the examples' durations once per view (for DurationBuckets)."""

    def __init__(self, examples: SpeechExamples, folders: list[Path]) -> None:
        self.examples, self.views = examples, []
        for folder in folders:
            shape = json.loads((folder / SHAPE_FILE).read_text())
            index = np.load(folder / INDEX_FILE)
            if len(index) != len(examples):
                raise ValueError(f"{folder} holds {len(index)} utterances; the examples are {len(examples)}")
            frames = np.memmap(folder / FRAMES_FILE, dtype=np.float16, mode="r",
                               shape=(shape["frames"], shape["width"]))
            self.views.append((frames, index))
        self.seconds = list(examples.seconds) * len(folders)

    @classmethod
    def build(cls, model: Transducer, examples: SpeechExamples, views: int = 1, augmented: bool = True,
              seed: int = 0, root: Path | None = None, first_view: int = 0) -> EncodedExamples:
        """The `views` views of `examples` under model's encoder, each encoded once into
        root/encoded_<digest> (root: the data cache) and read back afterwards. `first_view` rotates
        the order they are made in, so that ranks building the same views at once start on different
        ones."""
        if views < 1:
            raise ValueError(f"views must be >= 1; got {views}")
        root = data_dir() if root is None else root
        folders = [root / f"encoded_{view_digest(model, examples, augmented, seed, view)[:16]}"
                   for view in range(views)]
        for view in [(first_view + k) % views for k in range(views)]:
            if not folders[view].is_dir():
                log.info("encoding %d utterances with the frozen encoder (view %d of %d, once; later runs reuse it)",
                         len(examples), view + 1, views)
            unpacked_once(folders[view], lambda private, v=view: encode_view(
                model, examples, augmented, seed * 1_000_003 + v, private))
        return cls(examples, folders)

    def __len__(self) -> int:
        return len(self.examples) * len(self.views)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        view, utterance = divmod(index, len(self.examples))
        frames, positions = self.views[view]
        start, length = positions[utterance]
        return {"encoder_outputs": torch.from_numpy(np.array(frames[start : start + length], dtype=np.float32)),
                "labels": torch.tensor(self.examples.tokenizer.encode(self.examples.rows[utterance]["text"]))}
