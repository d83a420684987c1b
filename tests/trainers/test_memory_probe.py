"""The step memory probe measures a backward split into input and weight passes (zero-bubble
pipelines) without keeping any micro batch alive."""

import torch
from torch import nn
from zoo.torch_compat import stage_backward_input, stage_backward_weight

from trainers import Strategy, zero_model_states
from trainers.memory.measure import StepMemoryProbe

WIDTH, ROWS = 64, 256
ACTIVATION = ROWS * WIDTH * 4
"""Bytes of one layer's output for one micro batch."""


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def split_backward_peak(micro_batches: int) -> tuple[int, int]:
    """(activation peak, activation bytes alive after the step) of a two-block stage running
    `micro_batches` forwards, each followed by its input pass and then its weight pass, as a
    zero-bubble stage between two others does."""
    torch.manual_seed(0)
    stage = nn.Sequential(Block(), Block())
    probe = StepMemoryProbe(stage, None, [], torch.device("cpu"))
    with probe:
        for _ in range(micro_batches):
            received = torch.randn(ROWS, WIDTH, requires_grad=True)
            output = stage(received)
            _, weight_pass = stage_backward_input([output], [torch.ones_like(output)], [received],
                                                  stage.parameters())
            stage_backward_weight(stage.parameters(), weight_pass)
            del received, output, weight_pass
    report = probe.report(rank=0)
    alive = sum(stats.get("activations", 0) + stats.get("temporaries", 0)
                for stats in probe.tracker.get_tracker_snapshot("current").values())
    return report.activation_peak, alive


def test_split_backward_keeps_no_micro_batch_alive():
    one_peak, one_alive = split_backward_peak(1)
    eight_peak, eight_alive = split_backward_peak(8)
    assert one_peak >= 4 * ACTIVATION  # the measurement sees the stage's activations
    assert eight_peak == one_peak  # each micro batch is freed after its weight pass
    assert one_alive == eight_alive == 0


def test_a_frozen_parameter_is_counted_and_only_the_trainable_ones_have_gradients():
    torch.manual_seed(0)
    stage = nn.Sequential(Block(), Block())
    stage[0].requires_grad_(False)  # as a model's post-training readout, held but never trained
    probe = StepMemoryProbe(stage, None, [], torch.device("cpu"))
    with probe:
        stage(torch.randn(ROWS, WIDTH)).sum().backward()
        probe.after_backward()
    report = probe.report(rank=0)
    block_bytes = sum(p.numel() * 4 for p in stage[1].parameters())
    assert report.parameters == 2 * block_bytes
    assert report.gradients == block_bytes and stage[0].up.weight.grad is None


def test_the_zero_formula_keeps_no_gradient_or_optimizer_state_for_frozen_parameters():
    stage = nn.Sequential(Block(), Block())
    stage[0].requires_grad_(False)
    total = sum(p.numel() for p in stage.parameters())
    trained = sum(p.numel() for p in stage[1].parameters())
    estimate = zero_model_states(stage, Strategy(zero=2), world_size=2)
    assert estimate["parameters"] == 4 * total
    assert estimate["gradients"] == 4 * trained / 2 and estimate["optimizer"] == 8 * trained / 2
