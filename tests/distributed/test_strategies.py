"""ZeRO 0-3 x offload on 2 ranks equal one process: parameters and gradients, fp32, the blocks'
parameters decaying toward anchors (`TrainConfig.anchor_decay`) as they train."""

from __future__ import annotations

import pytest
import torch

from zoo.parity import relative_error

COMBOS = [f"{zero}:{offload}" for zero in (0, 1, 2, 3) for offload in ("none", "optimizer", "params")]
WORKER_RUNS = [(1, "strategies", "{out}/strategies-single.pt", "0:none"), (2, "strategies", "{out}/strategies-two.pt", *COMBOS)]
"""One process at ZeRO 0, and 2 ranks at every combination (conftest.py)."""


@pytest.fixture(scope="module")
def runs(worker_runs):
    return torch.load(worker_runs / "strategies-single.pt")["0:none"], torch.load(worker_runs / "strategies-two.pt")


@pytest.mark.parametrize("combo", COMBOS)
def test_two_ranks_match_one_process(runs, combo):
    single, two = runs[0], runs[1][combo]
    assert single["params"].keys() == two["params"].keys()
    for name, expected in single["params"].items():
        assert relative_error(two["params"][name], expected) < 1e-5, name
    for name, expected in single["grads"].items():
        assert expected.norm() > 0, name
        assert relative_error(two["grads"][name], expected) < 1e-5, name
    # Training moved the parameters: the comparison is not between two initialisations.
    assert two["losses"][-1] < two["losses"][0]
