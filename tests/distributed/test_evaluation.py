"""Evaluation over ranks: same examples and same mean as one process, also when the micro
batches do not divide evenly over the ranks (no rank may skip a sharded forward)."""

from __future__ import annotations

import torch

WORKER_RUNS = [(1, "evaluate", "{out}/evaluate-one.pt"), (2, "evaluate", "{out}/evaluate-two.pt")]
"""The same evaluation in one process and on 2 ranks (conftest.py)."""


def test_uneven_evaluation_on_two_ranks_equals_one_process(worker_runs):
    one, two = torch.load(worker_runs / "evaluate-one.pt"), torch.load(worker_runs / "evaluate-two.pt")
    assert one["eval_loss"] > 1.0
    assert abs(one["eval_loss"] - two["eval_loss"]) < 1e-6 * one["eval_loss"]
