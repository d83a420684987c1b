"""Measured model-state bytes per rank against the ZeRO formula."""

from __future__ import annotations

import pytest
import torch

from helpers import torchrun
from trainers import Strategy, zero_model_states


@pytest.mark.timeout(300)
def test_zero3_model_states_are_16_bytes_per_parameter_over_ranks(tmp_path):
    torchrun(2, "memory", str(tmp_path / "z3.pt"), "3")
    result = torch.load(tmp_path / "z3.pt")
    expected = 16 * result["numel"] / 2
    assert zero_model_states(result["numel"], Strategy(zero=3), 2)["total"] == expected
    for report in result["reports"]:
        model_states = report["parameters"] + report["gradients"] + report["optimizer"]
        assert abs(model_states - expected) / expected < 0.10, report
        assert report["activation_peak"] > 0


@pytest.mark.timeout(300)
def test_zero1_shards_only_optimizer_state(tmp_path):
    torchrun(2, "memory", str(tmp_path / "z1.pt"), "1")
    result = torch.load(tmp_path / "z1.pt")
    numel = result["numel"]
    reports = result["reports"]
    for report in reports:
        assert report["gradients"] == 4 * numel
    # Each rank holds the Adam moments of its own parameters only; together, all of them.
    total_optimizer = sum(r["optimizer"] for r in reports)
    assert abs(total_optimizer - 8 * numel) / (8 * numel) < 0.01
    assert max(r["optimizer"] for r in reports) < 0.6 * 8 * numel
