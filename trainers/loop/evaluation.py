"""An evaluation's mean loss over a dataset's first examples, shared by the data-parallel ranks:
the same examples, the same random draws and the same figure whatever their number."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from trainers.config import TrainConfig
from trainers.loop.data import micro_batch_seed
from trainers.loop.sources import evaluation_examples
from trainers.parallel.mesh import DistEnv
from trainers.step import to_device


def evaluation_shares(size: int, micro_batch_size: int, dp_size: int, dp_rank: int) -> list[tuple[int, list[int], int]]:
    """Rank `dp_rank`'s share of an evaluation of the first `size` examples in micro batches:
    (micro batch index, its examples, its weight). Every rank runs as many forwards (sharded
    parameters are gathered collectively): a rank past the end repeats the first micro batch with
    weight 0."""
    batches = [list(range(i, min(i + micro_batch_size, size))) for i in range(0, size, micro_batch_size)]
    shares = []
    for start in range(0, len(batches), dp_size):
        index = start + dp_rank
        shares.append((index, batches[index], len(batches[index])) if index < len(batches) else (index, batches[0], 0))
    return shares


def evaluation_loss(loss_of: Callable[[Mapping[str, Any]], torch.Tensor], dataset: Sequence[Any],
                    collate: Callable[[list[Any]], Mapping[str, Any]], config: TrainConfig, env: DistEnv) -> float:
    """Mean of `loss_of(batch)` over the first `config.eval_batches x micro_batch_size` examples of
    `dataset` in micro batches, weighted by examples (collective over the data-parallel ranks). Each
    micro batch's random draws (crops) are seeded by its index alone, not by the run so far;
    tensor-parallel ranks run the same micro batch together."""
    dataset = evaluation_examples(dataset, config.eval_batches * config.micro_batch_size)
    size = min(len(dataset), config.eval_batches * config.micro_batch_size)
    totals = torch.zeros(2, dtype=torch.float64, device=env.device)
    for index, examples, weight in evaluation_shares(size, config.micro_batch_size, env.dp_size, env.dp_rank):
        torch.manual_seed(micro_batch_seed(config.seed, -1, index))
        loss = loss_of(to_device(collate([dataset[i] for i in examples]), env.device))
        totals[0] += loss.double() * weight
        totals[1] += weight
    dist.all_reduce(totals, group=env.mesh["dp"].get_group())
    return (totals[0] / totals[1].clamp(min=1)).item()
