"""ZeRO 0-3 x offload on 2 ranks equal one process: parameters and gradients, fp32, the blocks'
parameters decaying toward anchors (`TrainConfig.anchor_decay`) as they train; and a model with
0-dim parameters (which FSDP2 refuses to shard) at every ZeRO stage."""

from __future__ import annotations

import pytest
import torch

from zoo.parity import relative_error

COMBOS = [f"{zero}:{offload}" for zero in (0, 1, 2, 3) for offload in ("none", "optimizer", "params")]
SCALAR_COMBOS = [f"{zero}:fp32" for zero in (0, 1, 2, 3)] + ["3:bf16"]
WORKER_RUNS = [(1, "strategies", "{out}/strategies-single.pt", "0:none"), (2, "strategies", "{out}/strategies-two.pt", *COMBOS),
               (1, "scalars", "{out}/scalars-single.pt", "0:fp32"), (2, "scalars", "{out}/scalars-two.pt", *SCALAR_COMBOS)]
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


@pytest.mark.parametrize("combo", SCALAR_COMBOS)
def test_zero_dim_parameters_train_under_every_zero_stage(worker_runs, combo):
    single = torch.load(worker_runs / "scalars-single.pt")["0:fp32"]
    two = torch.load(worker_runs / "scalars-two.pt")[combo]
    assert two["losses"][-1] < 0.9 * two["losses"][0], two["losses"]
    initial = {"gain": 0.5, "blocks.0.scale": 0.8}
    for name, start in initial.items():
        assert two["params"][name].ndim == 0 and abs(two["params"][name].item() - start) > 1e-3, name
    if combo.endswith("fp32"):
        for name, expected in single["params"].items():
            assert relative_error(two["params"][name], expected) < 1e-5, name
