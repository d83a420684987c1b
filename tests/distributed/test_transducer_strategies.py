"""The transducer trains the same at every ZeRO stage on 2 ranks as in one process (the recipe's
`--nproc 2 --strategy.zero N`): the pruned loss, and the sample-wise pruned loss whose joiner
gradients are accumulated group by group inside the forward pass."""

from __future__ import annotations

import pytest
import torch

from helpers import torchrun
from zoo.parity import relative_error

ZEROS = ("0", "1", "2", "3")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("loss", ["pruned", "samplewise_pruned"])
def test_two_ranks_at_every_stage_match_one_process(tmp_path, loss):
    torchrun(1, "transducer", str(tmp_path / "one.pt"), loss, "0")
    torchrun(2, "transducer", str(tmp_path / "two.pt"), loss, *ZEROS, timeout=400)
    single, two = torch.load(tmp_path / "one.pt")["0"], torch.load(tmp_path / "two.pt")
    for zero in ZEROS:
        assert two[zero]["params"].keys() == single["params"].keys()
        for name, expected in single["params"].items():
            if expected.is_floating_point():
                assert relative_error(two[zero]["params"][name], expected) < 1e-5, (zero, name)
        assert two[zero]["losses"] == pytest.approx(single["losses"], rel=1e-5)
    # Training moved the parameters: the comparison is not between two initialisations.
    assert single["losses"][-1] < single["losses"][0]
