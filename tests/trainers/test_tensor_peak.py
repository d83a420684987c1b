"""TensorPeak counts each storage created inside once, while it lives."""

import torch

from trainers.memory.tensor_peak import TensorPeak

MIB = 1 << 20


def test_peak_counts_storages_alive_together_and_releases_dead_ones():
    x = torch.randn(MIB // 4, requires_grad=True)  # 1 MiB of float32, made outside: not counted
    with TensorPeak() as tracked:
        x_view = x.detach()[: MIB // 8]  # a view of x: allocates nothing
        assert tracked.live == 0 and x_view.numel() == MIB // 8
        doubled = x * 2  # 1 MiB
        view = doubled.view(-1, 4)  # a view: same storage
        exponent = view.exp()  # 1 MiB, saved by exp's backward
        del doubled, view  # mul saves nothing: its output dies here
        spare = torch.empty(2 * MIB // 4)  # 2 MiB
        assert tracked.live == 3 * MIB
        del spare
        exponent.sum().backward()  # the gradient of x (1 MiB) and exp's temporaries
    assert tracked.peak >= 3 * MIB
    assert tracked.live == MIB + x.grad.nbytes  # exponent and x.grad remain
