"""A checkpoint saved by 2 ranks at ZeRO-3 loads at another stage, and on 1 rank."""

from __future__ import annotations

import torch

from zoo.parity import relative_error

WORKER_RUNS = [(2, "save", "{out}/reshard", "3"), (2, "load", "{out}/reshard", "1", "{out}/reshard-zero1.pt"),
               (2, "unreadable", "{out}/reshard", "{out}/reshard-unreadable.pt"),
               (1, "load", "{out}/reshard", "0", "{out}/reshard-single.pt")]
"""Saved at step 2 on 2 ranks at ZeRO-3, then loaded at ZeRO-1 on 2 ranks, resumed while rank 0 cannot
read a file, and loaded in one process (conftest.py)."""


def test_zero3_checkpoint_loads_at_zero1_and_on_one_rank(worker_runs):
    saved = torch.load(worker_runs / "reshard" / "saved.pt")
    assert saved["step"] == 2
    for result in ("reshard-zero1.pt", "reshard-single.pt"):
        loaded = torch.load(worker_runs / result)
        assert loaded["step"] == 2
        for name, value in saved["params"].items():
            assert torch.equal(loaded["params"][name], value), (result, name)
        for name, value in saved["optimizer"].items():
            assert value.abs().sum() > 0, name
            assert relative_error(loaded["optimizer"][name], value) == 0.0, (result, name)


def test_a_file_rank_0_cannot_read_is_raised_on_every_rank(worker_runs):
    """Rank 0 checks the checkpoint; when it cannot read a file (the disk, not the checkpoint) every
    rank raises, none left waiting for its verdict, and no older checkpoint is taken instead."""
    raised = torch.load(worker_runs / "reshard-unreadable.pt")
    assert raised[0].startswith("OSError: [Errno 5] Input/output error")
    assert raised[1].startswith("OSError: on rank 0: reading checkpoint") and "Input/output error" in raised[1]
