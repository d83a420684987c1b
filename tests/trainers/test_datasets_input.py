"""`Trainer.fit` reads a Hugging Face `datasets.Dataset` (columns as batch keys, token lists as
tensors) and a stream (`datasets.IterableDataset`, any torch `IterableDataset`) as it reads a list."""

from __future__ import annotations

import datasets
import pytest
import torch
from torch import nn

from helpers import lm_examples, tiny_gpt
from trainers import TrainConfig, Trainer


def config(tmp_path, **overrides) -> TrainConfig:
    return TrainConfig(**{**dict(global_batch_size=4, micro_batch_size=2, max_steps=3, lr=1e-2, warmup_steps=0,
                                 log_every=1, progress=False, measure_memory=False, output_dir=str(tmp_path / "run")),
                          **overrides})


def table(examples: list[dict[str, torch.Tensor]]) -> datasets.Dataset:
    """The examples as `datasets` holds them by default: Python lists in Arrow columns."""
    return datasets.Dataset.from_dict({key: [e[key].tolist() if isinstance(e[key], torch.Tensor) else e[key]
                                             for e in examples] for key in examples[0]})


class FirstTokens(nn.Module):
    """Records the first token of every sequence it trains on, in order; a loss to step on."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))
        self.seen: list[int] = []

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, source: list[str] | None = None) -> dict:
        if self.training:
            self.seen += input_ids[:, 0].tolist()
        return {"loss": (self.weight * input_ids.float()).mean() ** 2}


def test_a_datasets_table_of_token_lists_trains_as_the_same_list_of_tensors(tmp_path):
    examples = lm_examples(16)
    listed = Trainer(tiny_gpt(), config(tmp_path)).fit(examples, eval_dataset=examples[:4])
    tabled = Trainer(tiny_gpt(), config(tmp_path)).fit(table(examples), eval_dataset=table(examples[:4]))
    assert [r["loss"] for r in tabled] == [r["loss"] for r in listed]
    assert tabled[-1]["eval_loss"] == listed[-1]["eval_loss"]


def test_a_stream_is_read_in_its_order_and_a_resumed_run_reads_on(tmp_path):
    rows = [{"input_ids": torch.tensor([i, 0]), "labels": torch.tensor([i, 0]), "source": f"row {i}"} for i in range(6)]
    stream = table(rows).to_iterable_dataset()
    model = FirstTokens()
    Trainer(model, config(tmp_path, max_steps=2, checkpoint_every=1, checkpoint_dir=str(tmp_path / "ckpt"))).fit(stream)
    # Step 1 reads rows 0-3, step 2 rows 4-5 and, the stream ended and restarted, 0-1.
    assert model.seen == [0, 1, 2, 3, 4, 5, 0, 1]
    resumed = FirstTokens()
    Trainer(resumed, config(tmp_path, max_steps=3, resume=True, checkpoint_dir=str(tmp_path / "ckpt"))).fit(stream)
    assert resumed.seen == [2, 3, 4, 5]  # step 3 only: where the stream had got to


def test_a_torch_stream_and_a_streamed_evaluation_set(tmp_path):
    class Counting(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(lm_examples(8))

    trainer = Trainer(tiny_gpt(), config(tmp_path, eval_batches=1))
    history = trainer.fit(Counting(), eval_dataset=Counting())
    assert len(history) == 3 and history[-1]["eval_loss"] == trainer.evaluate(lm_examples(2))["eval_loss"]


def test_what_fit_cannot_read_is_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match="train_dataset must be a sequence of examples, a torch Dataset, a "
                                        "datasets.Dataset or a stream .*; got generator"):
        Trainer(tiny_gpt(), config(tmp_path)).fit(e for e in lm_examples(8))

    class Empty(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(())

    with pytest.raises(ValueError, match="the training stream Empty yields no examples"):
        Trainer(tiny_gpt(), config(tmp_path)).fit(Empty())
    with pytest.raises(ValueError, match="eval_dataset is empty"):
        Trainer(tiny_gpt(), config(tmp_path)).fit(lm_examples(8), eval_dataset=Empty())
