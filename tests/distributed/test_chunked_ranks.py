"""Chunked model states on 2 data-parallel ranks (each rank its own chunk files) train as one
process in memory does."""

from __future__ import annotations

import pytest
import torch

from helpers import relative_error, torchrun


@pytest.mark.timeout(600)
def test_two_ranks_with_chunked_states_match_one_process_in_memory(tmp_path):
    torchrun(1, "chunks", str(tmp_path / "one.pt"), str(tmp_path / "one"), "memory")
    torchrun(2, "chunks", str(tmp_path / "two.pt"), str(tmp_path / "two"), "memory", "chunks")
    single, two = torch.load(tmp_path / "one.pt")["memory"], torch.load(tmp_path / "two.pt")
    for mode in ("chunks", "memory"):
        assert two[mode]["losses"] == pytest.approx(single["losses"], rel=1e-6), mode
        for name, expected in single["params"].items():
            assert relative_error(two[mode]["params"][name], expected) < 1e-6, (mode, name)
    assert single["losses"][-1] < single["losses"][0]
    assert all(read > 0 for read in two["chunks"]["read"])
    assert sorted(path.name for path in (tmp_path / "two").iterdir()) == ["rank00000", "rank00001"]
