"""What the step counters see: matrix-multiply FLOPs, the other operators' memory traffic and calls."""

from __future__ import annotations

import torch

from trainers.estimate.fake import HostFakeMode
from trainers.estimate.counters import Work, WorkCount


def test_work_is_flops_for_matmuls_bytes_for_the_rest_and_nothing_for_views():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with WorkCount() as counter:
        product = a @ b  # 2 * 8 * 16 * 4 FLOPs
    assert counter.work == Work(flops=2 * 8 * 16 * 4, memory_bytes=0, calls=1)
    with WorkCount() as counter:
        total = a + 1.0  # reads a, writes the sum
        total.t()[:3].unsqueeze(0)  # views: no work
        total.add_(a)  # reads both, writes total (its result is total itself)
    assert counter.work == Work(flops=0, memory_bytes=2 * a.nbytes + 3 * a.nbytes, calls=2)
    assert product.shape == (8, 4)


def test_work_on_fake_tensors_matches_real_ones_through_a_training_step():
    def step() -> Work:
        torch.manual_seed(0)
        layer = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
        optimizer = torch.optim.AdamW(layer.parameters(), foreach=True)
        with WorkCount() as counter:
            layer(torch.randn(4, 16)).square().mean().backward()
            optimizer.step()
        return counter.work

    real = step()
    with HostFakeMode():
        fake = step()
    assert fake == real and real.flops == 3 * 2 * 4 * (16 * 32 + 32 * 1) - 2 * 4 * 16 * 32  # no input gradient
    assert real.memory_bytes > 4 * 4 * (16 * 32 + 32 + 32 + 1)  # AdamW reads and writes every state


def test_cpu_flash_attention_counts_its_matmul_flops():
    batch, heads, length, width = 2, 4, 16, 8
    query, key, value = (torch.randn(batch, heads, length, width, requires_grad=True) for _ in range(3))
    with WorkCount() as forward:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    with WorkCount() as backward:
        out.sum().backward()
    scores = 2 * batch * heads * length * length * width  # one (length x width) @ (width x length) per head
    assert forward.work == Work(flops=2 * scores, memory_bytes=0, calls=1)  # scores and their product with values
    assert backward.work.flops == 5 * scores  # the scores again and four gradient products
