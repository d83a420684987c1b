"""The transducer trains the same at every ZeRO stage on 2 ranks as in one process (the recipe's
`--nproc 2 --strategy.zero N`): the pruned loss, and the sample-wise pruned loss whose joiner
gradients are accumulated group by group inside the forward pass."""

from __future__ import annotations

import pytest
import torch

from zoo.parity import relative_error

ZEROS = ("0", "1", "2", "3")
LOSSES = ("pruned", "samplewise_pruned")
WORKER_RUNS = [(nproc, "transducer", f"{{out}}/transducer-{loss}{nproc}.pt", loss, *zeros)
               for nproc, zeros in ((1, ("0",)), (2, ZEROS)) for loss in LOSSES]
"""Per loss, one process at ZeRO 0 and 2 ranks at every stage (conftest.py)."""


@pytest.fixture(scope="module")
def runs(worker_runs) -> dict[str, tuple[dict, dict]]:
    """Per loss: the one-process run, and the 2-rank runs by ZeRO stage."""
    return {loss: (torch.load(worker_runs / f"transducer-{loss}1.pt")["0"], torch.load(worker_runs / f"transducer-{loss}2.pt"))
            for loss in LOSSES}


@pytest.mark.parametrize("loss", LOSSES)
def test_two_ranks_at_every_stage_match_one_process(runs, loss):
    single, two = runs[loss]
    for zero in ZEROS:
        assert two[zero]["params"].keys() == single["params"].keys()
        for name, expected in single["params"].items():
            if expected.is_floating_point():
                assert relative_error(two[zero]["params"][name], expected) < 1e-5, (zero, name)
        assert two[zero]["losses"] == pytest.approx(single["losses"], rel=1e-5)
    # Training moved the parameters: the comparison is not between two initialisations.
    assert single["losses"][-1] < single["losses"][0]
