"""zoo.partial.pex: partial execution of a chain, a slice of channels at a time: the same outputs and
multiplies as the unsplit chain, and the arena it needs beside the sequential planner's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from trainers.memory.tensor_peak import TensorPeak
from zoo.parity import relative_error
from zoo.partial import schedule


def inverted_residual(cin: int, cout: int, stride: int, expand: int = 6) -> list[nn.Module]:
    """MobileNetV2's block without its shortcut: expand 1x1, depthwise 3x3, project 1x1."""
    mid = cin * expand
    return [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]


def depthwise_separable(cin: int, cout: int, stride: int) -> list[nn.Module]:
    """MobileNetV1's block: depthwise 3x3, pointwise 1x1."""
    return [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU(),
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def evaluated(*layers: nn.Module) -> nn.Sequential:
    """The chain in eval mode with batch norms of non-trivial statistics (seeded)."""
    torch.manual_seed(0)
    model = nn.Sequential(*layers).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return model


def run_both(model: nn.Module, x: torch.Tensor):
    plan = schedule(model, x)
    with torch.no_grad(), FlopCounterMode(display=False) as whole:
        expected = model(x)
    with torch.no_grad(), FlopCounterMode(display=False) as split:
        got = plan(x)
    return plan, expected, got, whole.get_total_flops(), split.get_total_flops()


def test_inverted_residual_chains_run_in_a_fifth_of_the_arena_with_the_same_outputs_and_multiplies():
    model = evaluated(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU6(), *inverted_residual(8, 8, 1), *inverted_residual(8, 16, 2),
                      *inverted_residual(16, 16, 1), *inverted_residual(16, 24, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(24, 2))
    plan, expected, got, whole_flops, split_flops = run_both(model, torch.randn(1, 3, 96, 96))
    assert relative_error(got, expected) < 1e-6
    assert split_flops == whole_flops == 2 * plan.macs
    assert plan.baseline_bytes == 2 * 48 * 48 * 48 * 4  # the first block's expanded 48 x 48 x 48 buffers, twice
    assert plan.peak_bytes == 3 * 96 * 96 * 4 + 8 * 48 * 48 * 4  # the input and the first convolution's output
    assert plan.baseline_bytes / plan.peak_bytes >= 4
    assert all(segment.slices > 1 for segment in plan.segments) and len(plan.segments) == 4
    # Measured: the live tensors torch holds (the caller's input aside) peak at the two arenas.
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad(), TensorPeak() as plain:
        model(x)
    with torch.no_grad(), TensorPeak() as split:
        plan(x)
    assert plain.peak == plan.baseline_bytes and split.peak <= plan.peak_bytes
    with pytest.raises(ValueError, match=rf"memory_budget=100000 bytes is below the smallest arena partial execution "
                                         rf"reaches for Sequential: {plan.peak_bytes} bytes \(unsplit: {plan.baseline_bytes}\)"):
        schedule(model, torch.randn(1, 3, 96, 96), memory_budget=100_000)


def test_a_mobilenet_v1_chain_is_held_by_its_input_and_first_convolution():
    """MobileNetV1-0.25 at 96 x 96: no expansion, so a split segment still holds its whole input and
    output; the arena falls from two 16 x 48 x 48 buffers to the 3 x 96 x 96 input beside the first
    convolution's 8 x 48 x 48 output, which no channel split can shrink."""
    layers = [nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU()]
    for cin, cout, stride in [(8, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2),
                              *[(128, 128, 1)] * 5, (128, 256, 2), (256, 256, 1)]:
        layers += depthwise_separable(cin, cout, stride)
    model = evaluated(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 2))
    plan, expected, got, whole_flops, split_flops = run_both(model, torch.randn(1, 3, 96, 96))
    assert relative_error(got, expected) < 1e-6 and split_flops == whole_flops
    assert plan.baseline_bytes == 2 * 16 * 48 * 48 * 4
    assert plan.peak_bytes == 3 * 96 * 96 * 4 + 8 * 48 * 48 * 4


def test_a_model_that_is_not_a_chain_is_refused_by_node():
    class Shortcut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 1)

        def forward(self, x):
            return self.conv(x) + x

    with pytest.raises(ValueError, match=r"zoo.partial runs a chain of modules, each reading the one before; node 'add' "
                                         r"\(call_function .*add.*\) is not one"):
        schedule(Shortcut(), torch.randn(1, 4, 8, 8))


def test_a_module_the_pass_does_not_know_runs_whole_and_is_named(caplog):
    model = evaluated(nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16), nn.GELU(), nn.Conv2d(16, 16, 3, padding=1, groups=16),
                      nn.ReLU(), nn.Conv2d(16, 8, 1))
    x = torch.randn(1, 3, 24, 24)
    with caplog.at_level("WARNING", logger="zoo.partial.pex"):
        plan, expected, got, whole_flops, split_flops = run_both(model, x)
    assert plan.unknown == ["2: GELU"] and "2: GELU" in caplog.text
    assert all(not segment.first <= 2 <= segment.last for segment in plan.segments if segment.slices > 1)
    assert relative_error(got, expected) < 1e-6 and split_flops == whole_flops
