"""With dropout on, training does not depend on the number of ranks: each micro batch draws its
dropout masks from a seed of its place in the global batch, not from the rank that runs it."""

from __future__ import annotations

import torch

from zoo.parity import relative_error

WORKER_RUNS = [(world, "dropout", f"{{out}}/dropout-{world}.pt") for world in (1, 2, 4)]
"""The same dropout training on 1, 2 and 4 ranks (conftest.py)."""


def test_dropout_training_is_the_same_on_1_2_and_4_ranks(worker_runs):
    runs = {world: torch.load(worker_runs / f"dropout-{world}.pt") for world in (1, 2, 4)}
    single = runs[1]
    assert single["losses"][-1] < single["losses"][0]
    for world in (2, 4):
        for step, (loss, expected) in enumerate(zip(runs[world]["losses"], single["losses"])):
            assert abs(loss - expected) < 1e-5 * abs(expected), (world, step, loss, expected)
        for name, expected in single["params"].items():
            assert relative_error(runs[world]["params"][name], expected) < 1e-5, (world, name)
