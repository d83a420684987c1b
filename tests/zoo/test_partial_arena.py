"""zoo.partial.arena: buffer lifetimes from a traced model and the greedy arena: no two buffers
alive at once overlap, a chain's arena is its largest adjacent pair, a residual branch stays alive."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo.partial import activation_buffers, plan_arena


def separable_cnn() -> nn.Module:
    """A DS-CNN-like keyword spotter's front: conv, then depthwise-separable blocks, pooling, linear."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(), nn.Conv2d(16, 32, 1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU(), nn.Conv2d(32, 32, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 12))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.body, self.head = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stem = self.stem(x)
        return self.head(torch.relu(self.body(stem)) + stem)


def check_no_overlap(plan) -> None:
    for a in plan.buffers:
        for b in plan.buffers:
            if a.name < b.name and a.meets(b):
                a0, b0 = plan.offsets[a.name], plan.offsets[b.name]
                assert a0 + a.nbytes <= b0 or b0 + b.nbytes <= a0, (a, b)


def test_a_chains_arena_is_its_largest_pair_of_neighbours():
    x = torch.randn(1, 1, 40, 32)
    buffers = activation_buffers(separable_cnn(), x)
    assert buffers[0].nbytes == x.numel() * 4 and buffers[0].first == 0 and buffers[0].last == 1
    assert all(b.last == b.first + 1 for b in buffers)  # a chain: each tensor read once, by the next operator
    plan = plan_arena(buffers)
    check_no_overlap(plan)
    pairs = max(a.nbytes + b.nbytes for a, b in zip(buffers, buffers[1:]))
    assert plan.lower_bound == pairs and plan.arena_bytes == pairs
    assert plan.arena_bytes < sum(b.nbytes for b in buffers) / 4


def test_a_residual_branch_stays_alive_across_the_body_and_the_plan_respects_it():
    x = torch.randn(1, 1, 16, 16)
    buffers = {b.name: b for b in activation_buffers(Residual(), x)}
    stem = buffers["stem"]
    assert stem.last == buffers["add"].first  # read by the body's conv and by the add
    plan = plan_arena(list(buffers.values()))
    check_no_overlap(plan)
    assert plan.lower_bound <= plan.arena_bytes <= sum(b.nbytes for b in buffers.values())
    body = 8 * 16 * 16 * 4
    assert plan.lower_bound == 3 * body  # at the add: stem, relu(body) and their sum


def test_a_model_fx_cannot_plan_is_refused_by_node():
    class Pair(nn.Module):
        def forward(self, x):
            return x.shape[0], x

    with pytest.raises(ValueError, match=r"activation_buffers plans tensors; node 'getattr_1' \(call_function .*getattr.*\) "
                                         r"makes NoneType"):
        activation_buffers(Pair(), torch.randn(2, 3))


def test_a_module_that_runs_in_place_writes_its_input_s_buffer():
    """An activation with inplace=True (a fused activation) makes no buffer: its input's lives on to
    the activation's reader."""
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 4, 1), nn.ReLU())
    buffers = activation_buffers(model, torch.randn(1, 1, 8, 8))
    assert [(b.name, b.nbytes, b.first, b.last) for b in buffers] == [
        ("input_1", 256, 0, 1), ("_0", 2048, 1, 3), ("_2", 1024, 3, 4), ("_3", 1024, 4, 5)]
    plan = plan_arena(buffers)
    assert plan.arena_bytes == plan.lower_bound == 2048 + 1024
