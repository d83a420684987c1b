"""A checkpoint saved by 2 ranks at ZeRO-3 loads at another stage, and on 1 rank."""

from __future__ import annotations

import pytest
import torch

from helpers import torchrun
from zoo.parity import relative_error


@pytest.mark.timeout(600)
def test_zero3_checkpoint_loads_at_zero1_and_on_one_rank(tmp_path):
    torchrun(2, "save", str(tmp_path), "3")
    torchrun(2, "load", str(tmp_path), "1", str(tmp_path / "zero1.pt"))
    torchrun(1, "load", str(tmp_path), "0", str(tmp_path / "single.pt"))
    saved = torch.load(tmp_path / "saved.pt")
    assert saved["step"] == 2
    for result in ("zero1.pt", "single.pt"):
        loaded = torch.load(tmp_path / result)
        assert loaded["step"] == 2
        for name, value in saved["params"].items():
            assert torch.equal(loaded["params"][name], value), (result, name)
        for name, value in saved["optimizer"].items():
            assert value.abs().sum() > 0, name
            assert relative_error(loaded["optimizer"][name], value) == 0.0, (result, name)
