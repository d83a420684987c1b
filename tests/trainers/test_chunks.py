"""Chunked parameters: the layout, the chunk-size search, and chunks moved to disk and back."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import TINY
from nlp.gpt import GPT
from trainers.memory.chunks.store import ChunkStore
from trainers.memory.chunks.layout import chunk_owners, lay_out, search_chunk_size


def test_chunk_owners_share_the_elements_nearly_equally_largest_first():
    """ZeRO over chunks: a vocabulary-sized chunk and six block chunks on 2 ranks give 13 and 15
    elements (round robin would give 19 and 9); equal chunks go round robin; spare ranks own none."""
    owners = chunk_owners([10, 3, 3, 3, 3, 3, 3], 2)
    assert owners == [0, 1, 1, 1, 1, 0, 1]
    assert sorted(sum(size for size, owner in zip([10, 3, 3, 3, 3, 3, 3], owners) if owner == r) for r in (0, 1)) == [13, 15]
    assert chunk_owners([4] * 6, 3) == [0, 1, 2, 0, 1, 2]
    assert chunk_owners([5, 1], 4) == [0, 1]
    with pytest.raises(ValueError, match="ranks must be at least 1; got 0"):
        chunk_owners([1], 0)


def test_tensors_fill_chunks_in_order_and_never_span_two():
    layout = lay_out([3000, 1000, 3000, 1000, 500], 4096)
    assert layout.slots == ((0, 0), (0, 3000), (1, 0), (1, 3000), (2, 0))
    assert layout.chunks == 3 and layout.members()[1] == [2, 3]
    assert layout.waste == pytest.approx(1 - 8500 / (3 * 4096))
    with pytest.raises(ValueError, match="numels must name at least one tensor; got none"):
        search_chunk_size([])


def test_the_search_finds_the_size_of_least_memory():
    # Chunks of the largest tensor (3072) need 4 for these; 4096 holds them in 2 (5120 would need 2
    # as well, in more memory).
    numels = [3000, 1000, 3000, 1000]
    assert lay_out(numels, 3072).numel == 4 * 3072 and lay_out(numels, 5120).chunks == 2
    found = search_chunk_size(numels)
    assert (found.chunk_numel, found.chunks) == (4096, 2)
    gpt = [p.numel() for p in GPT(TINY).parameters()]
    found = search_chunk_size(gpt)
    every = [lay_out(gpt, size) for size in range(max(gpt), 2 * max(gpt) + 1, 1024)]
    assert found.numel == min(layout.numel for layout in every) and found.chunks > 1
    assert found.waste < lay_out(gpt, max(gpt)).waste


def test_a_tensor_larger_than_the_chunks_gets_one_of_its_own():
    # A vocabulary embedding (6000) among block tensors of 1000: sized for the blocks, the chunks
    # hold it alone, at its size, and the tensors after it fill the chunk that was open.
    numels = [1500, 6000, 500, 1500, 500]
    layout = search_chunk_size(numels, largest=1500)
    assert layout.sizes == (2048, 6000, 2048) and layout.waste == pytest.approx(1 - 10000 / 10096)
    assert layout.slots == ((0, 0), (1, 0), (0, 1500), (2, 0), (2, 1500)) and layout.members() == [[0, 2], [1], [3, 4]]
    assert search_chunk_size(numels).chunk_numel >= 6000


def test_a_chunk_goes_to_disk_and_back_bit_for_bit_and_is_written_only_when_changed(tmp_path):
    store = ChunkStore(tmp_path / "chunks")
    values = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    store.load(("param", 0), 4096).copy_(values)
    assert store.evict(("param", 0)) == 4096 * 4 and store.resident_bytes() == 4096 * 4  # counted until written
    store.settle(0)
    assert store.resident_bytes() == 0 and store.path(("param", 0)).stat().st_size == 4096 * 4
    assert torch.equal(store.load(("param", 0), 4096), values) and store.bytes_read == 4096 * 4
    assert store.evict(("param", 0)) == 0  # unchanged since read: the file still holds it
    store.load(("param", 0), 4096).mul_(2)
    store.changed(("param", 0))
    assert store.evict(("param", 0)) == 4096 * 4
    assert torch.equal(store.load(("param", 0), 4096), 2 * values)  # back from its write (or its file once written)
    assert store.evict(("param", 0)) == 0
    store.flush()
    read = store.bytes_read
    assert store.prefetch(("param", 0), 4096) and not store.prefetch(("param", 0), 4096)
    assert store.resident_bytes() == 4096 * 4 and store.pending(("param", 0))
    assert torch.equal(store.load(("param", 0), 4096), 2 * values) and store.bytes_read == read + 4096 * 4
    assert not store.prefetch(("param", 0), 4096) and not store.prefetch(("grad", 0), 4096)  # in memory; no file
    assert torch.equal(store.load(("grad", 0), 4096), torch.zeros(4096))  # never written: zeros
    store.drop(("param", 0))
    store.drop(("grad", 0))
    assert not list((tmp_path / "chunks").iterdir()) and store.resident_bytes() == 0


def test_a_changed_or_truncated_chunk_file_and_a_directory_that_cannot_take_it_are_refused(tmp_path):
    store = ChunkStore(tmp_path / "chunks")
    store.load(("param", 0), 1024).normal_()
    store.evict(("param", 0))
    store.flush()
    path = store.path(("param", 0))
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"chunk file .*param00000.bin changed on disk since it was written"):
        store.load(("param", 0), 1024)
    path.write_bytes(bytes(data[:-8]))
    with pytest.raises(RuntimeError, match=r"chunk file .*param00000.bin holds 4,088 bytes; 4,096 were written"):
        store.load(("param", 0), 1024)
    (tmp_path / "a file").write_text("")
    blocked = ChunkStore(tmp_path / "a file" / "chunks")
    values = blocked.load(("param", 0), 1024).normal_().clone()
    assert blocked.evict(("param", 0)) == 4096  # written in the background: the error comes with the next call
    with pytest.raises(OSError, match=r"offload directory '.*a file/chunks' cannot take chunk param 0 \(4,096 bytes\): "
                                      ".*; the chunk stays in memory"):
        blocked.flush()
    assert torch.equal(blocked.memory[("param", 0)], values)


def test_closing_a_store_stops_its_thread_and_removes_its_files(tmp_path):
    store = ChunkStore(tmp_path / "rank0")
    for index in range(3):
        store.load(("param", index), 1024).fill_(index)
        store.changed(("param", index))
        store.evict(("param", index))
    store.flush()
    assert len(list((tmp_path / "rank0").glob("*.bin"))) == 3
    store.close()
    assert not (tmp_path / "rank0").exists()
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):  # its thread is gone
        store.io.submit(print)


def test_a_store_never_closed_removes_its_files_at_exit(tmp_path):
    script = textwrap.dedent(f"""
        from trainers.memory.chunks.store import ChunkStore
        store = ChunkStore({str(tmp_path / "rank0")!r})
        store.load(("param", 0), 1024).fill_(1.0)
        store.changed(("param", 0))
        store.evict(("param", 0))
        store.flush()
        assert (store.directory / "param00000.bin").exists()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert not (tmp_path / "rank0").exists()
