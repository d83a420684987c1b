"""The Conformer transducer trains the same with its states in chunks on disk
(Strategy(offload="chunks")) as in memory."""

from __future__ import annotations

import pytest

from asr.data import collate_speech
from helpers import chunk_budget
from tiny_transducer import tiny, token_utterances
from trainers import Strategy, TrainConfig, Trainer
from zoo.parity import relative_error


def config(**overrides) -> TrainConfig:
    return TrainConfig(**{"max_steps": 5, "global_batch_size": 8, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 1,
                          "grad_clip": 0.5, "log_every": 1, "progress": False, **overrides})


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("loss", "swap"), [("full", None), ("samplewise_pruned", None), ("full", 16 * 2**10)])
def test_chunked_conformer_transducer_trains_as_in_memory(tmp_path, loss, swap):
    """The Conformer transducer, also with the sample-wise loss, whose joiner gradients are taken
    inside the forward pass, and with the saved activations of 16 KiB and more swapped to disk:
    5 steps match training in memory to 1e-6."""
    features, mask, labels = token_utterances(16, seed=5)
    data = [{"input_features": x[: int(m.sum())], "labels": y[y >= 0]} for x, m, y in zip(features, mask, labels)]
    build = lambda: tiny(loss=loss, warm_steps=2, prune_range=3, samplewise_memory_budget=1)  # noqa: E731
    plain = Trainer(build(), config(output_dir=str(tmp_path / "plain")))
    expected = plain.fit(data, collate_fn=collate_speech)
    chunked = Trainer(build(), config(output_dir=str(tmp_path / "chunked")),
                      Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget=chunk_budget(4 * 2**20),
                               swap_activations=swap))
    history = chunked.fit(data, collate_fn=collate_speech)
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in expected], rel=1e-6)
    assert expected[-1]["loss"] < expected[0]["loss"]
    params, reference = chunked.full_state_dict(), plain.full_state_dict()
    for name, value in reference.items():
        if value.is_floating_point():
            assert relative_error(params[name], value) < 1e-6, name
    assert all(r["offload_read_bytes"] > 0 for r in history[1:])
    assert all(r.get("swapped_activation_bytes", 0) > 0 for r in history) == bool(swap)
