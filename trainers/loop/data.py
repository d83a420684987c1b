"""Deterministic assignment of examples to steps, ranks and micro batches.

The examples of optimizer step `s` depend only on (seed, s), never on the number of ranks: the
global batch is cut into micro batches and rank r takes micro batches r, r + W, r + 2W, ... So a
run on W ranks sees the same examples per step as a run on one, and resuming at step s needs no
saved iterator, only s. Each micro batch carries its position in the global batch, which seeds its
random draws (dropout, augmentation) the same way whatever the number of ranks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import torch
from torch.utils.data import default_collate


@lru_cache(maxsize=1)
def _epoch_order(dataset_size: int, seed: int, epoch: int) -> torch.Tensor:
    """The shuffle of one epoch, drawn once per epoch rather than once per step."""
    return torch.randperm(dataset_size, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def check_batch_sizes(global_batch_size: int, micro_batch_size: int, world_size: int) -> None:
    """ValueError unless the global batch splits into whole micro batches on every one of
    `world_size` data-parallel ranks (the world size over the tensor-parallel degree)."""
    per_round = micro_batch_size * world_size
    if global_batch_size % per_round:
        raise ValueError(
            f"TrainConfig.global_batch_size must be divisible by micro_batch_size x data-parallel ranks "
            f"({micro_batch_size} x {world_size} = {per_round}); got {global_batch_size}"
        )


def first_micro_batch(dataset: Sequence[Any], micro_batch_size: int,
                      collate: Callable[[list[Any]], Any] | None = None) -> Any:
    """The dataset's first `micro_batch_size` examples collated: the example batch from which a
    pipeline split estimates each block's cost (`Trainer(..., example_batch=...)`)."""
    return (collate or default_collate)([dataset[i] for i in range(min(micro_batch_size, len(dataset)))])


def largest_micro_batch(dataset: Sequence[Any], micro_batch_size: int,
                        collate: Callable[[list[Any]], Any] | None = None) -> Any:
    """The dataset's `micro_batch_size` largest examples collated, an example's size the number of
    elements it holds (ties kept in dataset order): the micro batch a memory budget plans for, as
    large as any a step draws when `collate` pads to the longest example. Reads every example."""
    sizes = [_elements(dataset[i]) for i in range(len(dataset))]
    largest = sorted(range(len(sizes)), key=lambda i: -sizes[i])[:micro_batch_size]
    return (collate or default_collate)([dataset[i] for i in largest])


def _elements(example: Any) -> int:
    """Elements of an example: a tensor's, a mapping's or sequence's summed over its items, a string's characters."""
    if isinstance(example, torch.Tensor):
        return example.numel()
    if isinstance(example, Mapping):
        return sum(_elements(value) for value in example.values())
    if isinstance(example, (list, tuple)):
        return sum(_elements(item) for item in example)
    return len(example) if isinstance(example, str) else 1


def pipeline_microbatches(global_batch_size: int, micro_batch_size: int, dp_size: int, microbatches: int | None) -> int:
    """Micro batches per pipeline run: `microbatches` (Strategy.microbatches), or None for all of
    a step's; ValueError unless it divides the step's count."""
    per_step = global_batch_size // (micro_batch_size * dp_size)
    if microbatches is None:
        return per_step
    if per_step % microbatches:
        raise ValueError(
            f"Strategy.microbatches={microbatches} must divide the micro batches of each step and data-parallel "
            f"rank: TrainConfig.global_batch_size / (micro_batch_size x data-parallel ranks) = "
            f"{global_batch_size} / ({micro_batch_size} x {dp_size}) = {per_step}")
    return microbatches


class MicroBatch(NamedTuple):
    """One forward/backward's share of an optimizer step."""

    index: int
    """Position in the step's global batch, 0 .. global_batch_size / micro_batch_size - 1: the same
    micro batch has the same index on any number of ranks."""
    examples: list[int]
    """Dataset indices of its examples."""


@dataclass(frozen=True)
class StepSampler:
    """Indices of the examples each rank uses in each optimizer step."""

    dataset_size: int | None
    """Number of examples in the (map-style) dataset; None: a stream, whose examples are taken in its
    order (`trainers.loop.sources`), not shuffled."""
    global_batch_size: int
    """Examples per optimizer step over all ranks."""
    micro_batch_size: int
    """Examples per forward/backward on one rank."""
    world_size: int
    """Number of data-parallel ranks (tensor-parallel ranks share one micro batch)."""
    rank: int
    """This rank's data-parallel coordinate."""
    seed: int
    """Seed of the per-epoch shuffles."""

    def __post_init__(self) -> None:
        check_batch_sizes(self.global_batch_size, self.micro_batch_size, self.world_size)
        if self.dataset_size is not None and self.dataset_size < self.global_batch_size:
            raise ValueError(
                f"the training set must hold at least global_batch_size={self.global_batch_size} "
                f"examples; it has {self.dataset_size}"
            )

    @property
    def accumulation_steps(self) -> int:
        """Micro batches per rank per optimizer step."""
        return self.global_batch_size // (self.micro_batch_size * self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        """Full global batches in one pass over the data (the remainder is dropped)."""
        return self.dataset_size // self.global_batch_size

    def micro_batches(self, step: int) -> list[MicroBatch]:
        """The `accumulation_steps` micro batches this rank runs at optimizer step `step`."""
        if self.dataset_size is None:
            batch = list(range(step * self.global_batch_size, (step + 1) * self.global_batch_size))
        else:
            epoch, position = divmod(step, self.steps_per_epoch)
            order = _epoch_order(self.dataset_size, self.seed, epoch)
            batch = order[position * self.global_batch_size : (position + 1) * self.global_batch_size].tolist()
        chunks = [batch[i : i + self.micro_batch_size] for i in range(0, len(batch), self.micro_batch_size)]
        return [MicroBatch(index, chunks[index]) for index in range(self.rank, len(chunks), self.world_size)]


def micro_batch_seed(seed: int, step: int, index: int) -> int:
    """Seed of the random draws (data augmentation, dropout) of micro batch `index` of the global
    batch of optimizer step `step`: the same on any number of ranks, and replayed exactly on resume."""
    digest = hashlib.blake2b(f"{seed}/{step}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def seeded_batches(dataset: Sequence[Any], micro_batches: list[MicroBatch], collate: Callable[[list[Any]], Any],
                   seed: int, step: int) -> Iterator[Any]:
    """The micro batches of optimizer step `step`, each fetched and collated as the step consumes it,
    after seeding torch's generator from its place in the global batch (`micro_batch_seed`), so its
    draws in the dataset, the collate function and the forward pass do not depend on the number of
    ranks."""
    for micro in micro_batches:
        torch.manual_seed(micro_batch_seed(seed, step, micro.index))
        yield collate([dataset[i] for i in micro.examples])
