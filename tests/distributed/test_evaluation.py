"""Evaluation over ranks: same examples and same mean as one process, also when the micro
batches do not divide evenly over the ranks (no rank may skip a sharded forward)."""

from __future__ import annotations

import pytest
import torch

from helpers import torchrun


@pytest.mark.timeout(300)
def test_uneven_evaluation_on_two_ranks_equals_one_process(tmp_path):
    torchrun(1, "evaluate", str(tmp_path / "one.pt"))
    torchrun(2, "evaluate", str(tmp_path / "two.pt"), timeout=120)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["eval_loss"] > 1.0
    assert abs(one["eval_loss"] - two["eval_loss"]) < 1e-6 * one["eval_loss"]
