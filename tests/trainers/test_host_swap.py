"""Saved tensors from the device to host memory and back (trainers.memory.activations.host), on a GPU
where there is one, else on the CPU stand-in of the device tier (a second pool of host memory): bit
for bit with their strides, out of the step's device tensors while away, a whole backward through
them with reads ahead; and what torch's own `save_on_cpu` would have cost."""

from __future__ import annotations

import pytest
import torch

from trainers.memory.activations.host import HostSwap, HostTensor
from trainers.memory.tensor_peak import TensorPeak


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def swap():
    return HostSwap(DEVICE, 64)


def test_tensors_come_back_bit_for_bit_with_their_strides(swap):
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(4, 8, 6, generator=generator).to(DEVICE)
    tensors = {"contiguous": base, "transposed": base.transpose(0, 2), "slice": base[:, :, 1:4],
               "mask": (torch.rand(16, 16, generator=generator) > 0.5).to(DEVICE), "small": torch.randn(3, device=DEVICE)}
    saved = {name: swap.pack(t) for name, t in tensors.items()}
    assert saved["small"] is tensors["small"]  # below min_bytes: kept
    assert all(isinstance(saved[name], HostTensor) for name in tensors if name != "small")
    for name, tensor in tensors.items():
        back = swap.unpack(saved[name])
        assert back.dtype == tensor.dtype and torch.equal(back, tensor), name
        assert back.data_ptr() != tensor.data_ptr() or name == "small", name
        if name != "slice":
            assert back.stride() == tensor.stride(), name
    swapped = sum(t.nbytes for name, t in tensors.items() if name != "small")
    assert swap.bytes_read == swap.bytes_written == swapped


def test_backward_through_host_swapped_tensors_gives_the_same_gradients_from_fewer_device_bytes(swap):
    """An 8-layer MLP: gradients through the swap equal those of keeping every saved tensor, bit for
    bit; the device's tensors (all but the host copies) peak at a third of keeping them; every
    tensor came back, all but the last-saved by a read ahead."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=generator).to(DEVICE)
    weights = [torch.randn(32, 32, generator=generator).to(DEVICE).requires_grad_() for _ in range(8)]

    def loss() -> torch.Tensor:
        h = x
        for w in weights:
            h = torch.tanh(h @ w).t().contiguous().t()
        return (h[:, 3:11] ** 2).sum()

    def peak(hooks) -> tuple[int, torch.Tensor]:
        with TensorPeak(DEVICE.type) as tracked, hooks:
            value = loss()
        return tracked.peak, value

    kept, value = peak(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    value.backward()
    expected = [w.grad.clone() for w in weights]
    for w in weights:
        w.grad = None
    swap.begin_step()
    on_device, value = peak(torch.autograd.graph.saved_tensors_hooks(swap.pack, swap.unpack))
    ahead = []
    original = swap._start_read
    swap._start_read = lambda swapped: (ahead.append(swapped.index), original(swapped))
    value.backward()
    assert all(torch.equal(w.grad, e) for w, e in zip(weights, expected))
    assert on_device * 3 < kept
    packed = len(swap._order)
    assert swap.bytes_read == swap.bytes_written and sorted(ahead) == list(range(packed - 1))


def test_save_on_cpu_copies_the_parameters_it_saves():
    """torch.autograd.graph.save_on_cpu(pin_memory=True), as a GPU would run it, cannot tell a
    parameter from an activation: a Linear's weight, saved for the input's gradient, is copied at
    every forward (on a GPU every weight would go down and up each step), where the chunk engine
    keeps parameters by reference (`trainers.memory.chunks.parameters`) and swaps only the rest."""
    linear = torch.nn.Linear(256, 256, bias=False)
    x = torch.randn(4, 256, requires_grad=True)
    with TensorPeak() as plain:
        y = linear(x)
    with TensorPeak() as on_cpu, torch.autograd.graph.save_on_cpu(pin_memory=True):
        z = linear(x)
    assert plain.live == y.nbytes
    assert on_cpu.live == z.nbytes + linear.weight.nbytes + x.nbytes
