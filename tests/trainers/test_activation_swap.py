"""Saved tensors to files and back (trainers.memory.activations.swap): bit for bit, with their strides, files
removed with autograd's record, changed files refused, and a whole backward through swapped tensors."""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from trainers.memory.activations.saved import fills_its_region
from trainers.memory.activations.swap import ActivationSwap, SwappedTensor


@pytest.fixture
def swap(tmp_path):
    with ThreadPoolExecutor(max_workers=1) as io:
        yield ActivationSwap(tmp_path / "activations", 64, io)


def test_which_views_fill_their_region():
    x = torch.randn(2, 3, 4)
    assert fills_its_region(x) and fills_its_region(x.transpose(1, 2)) and fills_its_region(x[:1])
    assert not fills_its_region(x[:, :, :2]) and not fills_its_region(x.expand(2, 2, 3, 4))


def test_tensors_come_back_bit_for_bit_with_their_strides_and_their_files_go_with_them(swap, tmp_path):
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(4, 8, 6, generator=generator)
    tensors = {"contiguous": base, "transposed": base.transpose(0, 2), "slice": base[:, :, 1:4],
               "mask": torch.rand(16, 16, generator=generator) > 0.5, "small": torch.randn(3)}
    saved = {name: swap.pack(t) for name, t in tensors.items()}
    assert saved["small"] is tensors["small"]  # below min_bytes: kept
    swap.end_step()  # every write done: the tensors are released and come back from the files
    assert len(list((tmp_path / "activations").iterdir())) == 4
    for name, tensor in tensors.items():
        back = swap.unpack(saved[name])
        assert back.dtype == tensor.dtype and torch.equal(back, tensor), name
        if name != "slice":
            assert back.stride() == tensor.stride(), name
    assert swap.bytes_read == swap.bytes_written == sum(t.nbytes for t in tensors.values()) - tensors["small"].nbytes
    del saved
    gc.collect()
    assert not list((tmp_path / "activations").iterdir())


def test_a_changed_file_is_refused(swap):
    saved = swap.pack(torch.randn(64))
    swap.end_step()
    assert isinstance(saved, SwappedTensor)
    data = bytearray(saved.path.read_bytes())
    data[0] ^= 1
    saved.path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"chunk file .*saved\d+.bin changed on disk since it was written"):
        swap.unpack(saved)


def test_backward_through_swapped_tensors_gives_the_same_gradients(swap):
    """A small MLP with a transposed and a sliced activation: gradients through the swap equal
    those of keeping every saved tensor, bit for bit; reads ahead took part."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 16, generator=generator)
    weights = [torch.randn(16, 16, generator=generator).requires_grad_() for _ in range(4)]

    def loss() -> torch.Tensor:
        h = x
        for w in weights:
            h = torch.tanh(h @ w).t().contiguous().t()
        return (h[:, 3:11] ** 2).sum()

    loss().backward()
    expected = [w.grad.clone() for w in weights]
    for w in weights:
        w.grad = None
    swap.begin_step()
    with torch.autograd.graph.saved_tensors_hooks(swap.pack, swap.unpack):
        value = loss()
    swap.end_step()
    value.backward()
    assert all(torch.equal(w.grad, e) for w, e in zip(weights, expected))
    assert swap.bytes_written > 0 and swap.bytes_read == swap.bytes_written
