"""The chunking utility and the precision rules."""

import pytest
import torch

from protein.chunking import chunk_size_for, chunked
from protein.precision import LayerNorm, float32_einsum, float32_island


def test_chunked_slices_broadcasts_and_concatenates_on_the_output_dimension():
    a, b = torch.randn(3, 10, 4), torch.randn(3, 1, 4)
    calls = []

    def add(x, y):
        calls.append(x.shape[1])
        return (x + y).transpose(0, 1)  # the sliced dimension moves to 0

    out = chunked(add, (a, b), dim=1, chunk_size=4, out_dim=0)
    assert calls == [4, 4, 2] and torch.equal(out, (a + b).transpose(0, 1))
    assert torch.equal(chunked(add, (a, b), dim=1, chunk_size=None, out_dim=0), out) and calls[-1] == 10
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        chunked(add, (a, b), dim=1, chunk_size=0)


def test_chunk_size_from_a_memory_budget():
    assert chunk_size_for(None, 100) is None
    assert chunk_size_for(1000, 300) == 3 and chunk_size_for(10, 300) == 1
    with pytest.raises(ValueError, match="budget_bytes and bytes_per_slice must be > 0"):
        chunk_size_for(0, 10)


def test_islands_run_in_float32_under_bf16_autocast_and_keep_float64():
    norm = LayerNorm(8)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.Linear(8, 8)(x).dtype == torch.bfloat16  # autocast is on
        assert norm(x.bfloat16()).dtype == torch.float32
        assert float32_einsum("ij,kj->ik", x.bfloat16(), x.bfloat16()).dtype == torch.float32

    @float32_island
    def dtype_of(t):
        return t.dtype

    assert dtype_of(x.double()) == torch.float64 and dtype_of(x.half()) == torch.float32
