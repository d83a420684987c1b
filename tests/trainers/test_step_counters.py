"""What the step counters see: matrix-multiply FLOPs, the other operators' memory traffic and calls,
and the collectives of a step."""

from __future__ import annotations

import torch

from helpers import lm_examples, tiny_gpt
from trainers import Strategy, TrainConfig
from trainers.estimate.counters import Work, WorkCount
from trainers.estimate.fake import HostFakeMode
from trainers.estimate.trace import estimate_memory
from trainers.loop.data import first_micro_batch
from zoo.nn.moe import MoEConfig, MoEFeedForward


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


def test_zero_1_moves_its_parameters_once_each_way_a_step_whatever_the_accumulation():
    """ZeRO-1 on 2 ranks, 4 micro batches a step: one all-gather of the parameters (in the first
    forward, kept to the last backward) and one reduce-scatter of the accumulated gradients, both
    bucketed by block; no all-reduce of the gradients and no broadcast of the parameters."""
    model = tiny_gpt()
    batch = first_micro_batch(lm_examples(8), 2)
    config = TrainConfig(global_batch_size=16, micro_batch_size=2, max_steps=1, progress=False)
    estimate = estimate_memory(model, batch, Strategy(zero=1), 2, config)
    traffic: dict[str, list[int]] = {}
    for (kind, _), (nbytes, calls) in estimate.traffic[0].items():
        traffic.setdefault(kind, [0, 0])
        traffic[kind][0] += nbytes
        traffic[kind][1] += calls
    parameter_bytes = 4 * sum(p.numel() for p in model.parameters())
    units = len(model.blocks) + 1  # the blocks and the root
    assert not any("broadcast" in kind for kind in traffic), traffic
    assert sum(nbytes for kind, (nbytes, _) in traffic.items() if "all_reduce" in kind) < parameter_bytes / 100, traffic
    gathered = sum(nbytes for kind, (nbytes, _) in traffic.items() if "all_gather" in kind)
    scattered = sum(nbytes for kind, (nbytes, _) in traffic.items() if "reduce_scatter" in kind)
    assert parameter_bytes <= gathered <= 1.1 * parameter_bytes and parameter_bytes <= scattered <= 1.1 * parameter_bytes
    assert sum(calls for _, calls in traffic.values()) <= 3 * units, traffic


def test_the_flop_count_sees_a_mixture_of_experts_grouped_products():
    """Forward of 64 tokens of width 32 to 2 of 4 experts of width 48: the router's product
    (2 N W E) and three grouped products over the N k assignments (gate, up: 2 A W F; down: 2 A F W)."""
    torch.manual_seed(0)
    layer = MoEFeedForward(MoEConfig(width=32, hidden=48, experts=4, top_k=2))
    with torch.no_grad(), WorkCount() as counter:
        layer(torch.randn(64, 32))
    assignments = 64 * 2
    assert counter.work.flops == 2 * 64 * 32 * 4 + 3 * 2 * assignments * 32 * 48
