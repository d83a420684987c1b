"""What `Trainer.fit` reads examples from: a sequence (a list, a map-style torch `Dataset`), a Hugging
Face `datasets.Dataset` (its columns the batch's keys, read as tensors), or a stream (any
`torch.utils.data.IterableDataset`, `datasets.IterableDataset` included).

A map-style set is shuffled each epoch (`trainers.loop.data.StepSampler`). A stream is read in its
own order: step s takes its examples s x G to (s + 1) x G - 1 (G the global batch), so the examples
of a step do not depend on the number of ranks (each rank reads the stream and keeps its micro
batches) and a resumed run reads on from where it stopped (the stream read again up to there). A
stream that ends starts again, told its next epoch (`set_epoch`, as `datasets` shuffles by).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from trainers.config import TrainConfig


class StreamedExamples:
    """A stream's examples by position, read in order and held a window of `window` at a time:
    `examples[i]` is the stream's i-th example (counting on through its restarts). Reading a
    position before the window reads the stream again from its start."""

    def __init__(self, stream: Iterable[Any], window: int) -> None:
        self.stream, self.window = stream, window
        self._start, self._held = 0, []
        self._reader: Iterator[Any] | None = None
        self._epoch = 0

    def __getitem__(self, index: int) -> Any:
        if index < self._start:
            self._start, self._held, self._reader, self._epoch = 0, [], None, 0
        while index >= self._start + len(self._held):
            if len(self._held) == self.window:
                self._start, self._held = self._start + self.window, []
            self._held.append(self._next())
        return self._held[index - self._start]

    def _next(self) -> Any:
        """The stream's next example, restarting it (at the next epoch) where it ends."""
        for attempt in range(2):
            if self._reader is None:
                set_epoch = getattr(self.stream, "set_epoch", None)
                if callable(set_epoch):
                    set_epoch(self._epoch)
                self._reader = iter(self.stream)
            try:
                return next(self._reader)
            except StopIteration:
                if attempt or self._start + len(self._held) == 0:
                    break
                self._reader, self._epoch = None, self._epoch + 1
        raise ValueError(f"the training stream {type(self.stream).__name__} yields no examples")

    def first(self, count: int) -> list[Any]:
        """The stream's first `count` examples."""
        return [self[i] for i in range(count)]


def examples_of(dataset: Any, window: int, name: str = "train_dataset") -> Sequence[Any] | StreamedExamples:
    """`dataset` (the argument `name`) as `fit` reads it: a `datasets.Dataset` with its columns as
    tensors, a stream as `StreamedExamples` held a global batch (`window` examples) at a time, a
    sequence as it is. TypeError naming what it got otherwise."""
    if type(dataset).__module__ == "datasets.arrow_dataset":
        return dataset.with_format("torch")
    if isinstance(dataset, IterableDataset):
        return StreamedExamples(_as_tensors(dataset), window)
    if not isinstance(dataset, Sequence) and not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(f"{name} must be a sequence of examples, a torch Dataset, a datasets.Dataset or a "
                        f"stream (torch.utils.data.IterableDataset); got {type(dataset).__name__}")
    return dataset


def size_of(examples: Sequence[Any] | StreamedExamples) -> int | None:
    """Number of examples, None for a stream."""
    return None if isinstance(examples, StreamedExamples) else len(examples)


def evaluation_examples(dataset: Any, count: int) -> Sequence[Any]:
    """The examples an evaluation of `count` examples reads: a stream's first `count` (fewer where
    it ends before), a set as `examples_of` gives it."""
    if isinstance(dataset, IterableDataset):
        return list(itertools.islice(_as_tensors(dataset), count))
    return examples_of(dataset, count, "eval_dataset")


def _as_tensors(stream: IterableDataset) -> IterableDataset:
    """A `datasets` stream formatted to yield tensors; any other stream as it is."""
    return stream.with_format("torch") if type(stream).__module__ == "datasets.iterable_dataset" else stream


def fit_examples(train: Any, evaluation: Any | None,
                 config: TrainConfig) -> tuple[Sequence[Any] | StreamedExamples, Sequence[Any] | None]:
    """`fit`'s training set (`examples_of`, held a global batch at a time) and evaluation set (the
    examples an evaluation reads, `evaluation_examples`); ValueError for an empty evaluation set."""
    train = examples_of(train, config.global_batch_size)
    if evaluation is not None:
        evaluation = evaluation_examples(evaluation, config.eval_batches * config.micro_batch_size)
        if len(evaluation) == 0:
            raise ValueError("eval_dataset is empty; pass None to train without evaluation")
    return train, evaluation


def planning_examples(examples: Sequence[Any] | StreamedExamples, count: int) -> Sequence[Any]:
    """The examples a memory budget plans from: a stream's first `count` (its first global batch),
    the whole of a set."""
    return examples.first(count) if isinstance(examples, StreamedExamples) else examples
