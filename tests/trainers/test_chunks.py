"""Chunked parameters: the layout, the chunk-size search, and chunks moved to disk and back."""

from __future__ import annotations

import pytest
import torch

from helpers import TINY
from nlp.gpt import GPT
from trainers.chunk_store import ParameterChunks
from trainers.chunks import lay_out, search_chunk_size


def test_tensors_fill_chunks_in_order_and_never_span_two():
    layout = lay_out([3000, 1000, 3000, 1000, 500], 4096)
    assert layout.slots == ((0, 0), (0, 3000), (1, 0), (1, 3000), (2, 0))
    assert layout.chunks == 3 and layout.members(1) == [2, 3]
    assert layout.waste == pytest.approx(1 - 8500 / (3 * 4096))
    with pytest.raises(ValueError, match="chunk_numel must be at least the largest tensor's 3000 elements; got 2048"):
        lay_out([3000, 1000], 2048)
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


def _loss(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids)["loss"]


def test_chunked_parameters_train_and_survive_the_disk_bit_for_bit(tmp_path):
    torch.manual_seed(0)
    plain, chunked = GPT(TINY), GPT(TINY)
    chunked.load_state_dict(plain.state_dict())
    ids = torch.randint(0, TINY.vocab_size, (2, TINY.block_size), generator=torch.Generator().manual_seed(1))
    chunks = ParameterChunks(chunked, tmp_path)
    first = chunks.parameters[0]
    assert chunks.buffers[0].data_ptr() == first.data_ptr()  # the parameter is a view into its chunk
    for model in (plain, chunked):  # one SGD step: the update writes into the chunk
        _loss(model, ids).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    assert torch.equal(_loss(plain, ids), _loss(chunked, ids))
    for chunk in range(chunks.layout.chunks):
        chunks.evict(chunk)
    assert chunks.resident_bytes() == 0 and all(p.numel() == 0 for p in chunked.parameters())
    assert len(list(tmp_path.glob("chunk*.bin"))) == chunks.layout.chunks
    for chunk in range(chunks.layout.chunks):
        chunks.fetch(chunk)
    assert torch.equal(_loss(plain, ids), _loss(chunked, ids))
    assert chunks.resident_bytes() == chunks.layout.numel * 4 and not list(tmp_path.glob("chunk*"))


def test_a_changed_or_truncated_chunk_file_and_a_directory_that_cannot_take_it_are_refused(tmp_path):
    model = GPT(TINY)
    chunks = ParameterChunks(model, tmp_path / "chunks")
    chunks.evict(0)
    path = chunks.path(0)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"chunk file .*chunk00000.bin changed on disk since it was written"):
        chunks.fetch(0)
    path.write_bytes(bytes(data[:-8]))
    with pytest.raises(RuntimeError, match=rf"chunk file .*chunk00000.bin holds {len(data) - 8} bytes; {len(data)} were "
                                           "written"):
        chunks.fetch(0)
    (tmp_path / "a file").write_text("")
    model = GPT(TINY)
    blocked = ParameterChunks(model, tmp_path / "a file" / "chunks")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(OSError, match=r"directory='.*a file/chunks' cannot take chunk 0 \(\d+ bytes\): .*; the chunk "
                                      "stays in memory"):
        blocked.evict(0)
    assert blocked.tiers[0] == "memory" and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match=r"module's parameters must share one dtype to share chunks; got \['torch.bfloat16', "
                                         r"'torch.float32'\]"):
        ParameterChunks(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).bfloat16()), tmp_path)
