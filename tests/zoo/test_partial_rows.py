"""zoo.partial.rows: a DS-CNN-shaped chain streamed a row at a time from one arena, with the model's
outputs, every product made once, nothing allocated while it runs, and the arena the slots it held
give."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from test_partial_executor import allocated_while
from test_partial_pex import evaluated
from zoo.parity import relative_error
from zoo.partial import schedule, stream
from zoo.store import locate
from zoo.tflite import read_tflite


def separable(channels: int, kernel: int) -> list[nn.Module]:
    """A depthwise kernel x kernel convolution and a pointwise one, each with a batch norm and a ReLU."""
    return [nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=channels), nn.BatchNorm2d(channels),
            nn.ReLU(), nn.Conv2d(channels, channels, 1), nn.BatchNorm2d(channels), nn.ReLU()]


def mlperf_spotter() -> nn.Module:
    return read_tflite(locate("kws-dscnn-mlperf-tiny") / "model.tflite").module


def check(model: nn.Module, x: torch.Tensor):
    rows = stream(model, x)
    assert rows.arena.numel() == rows.peak_bytes and rows.arena.dtype == torch.uint8
    rows.run(x)
    assert allocated_while(lambda: rows.run(x)) == 0
    with torch.no_grad():
        expected = model(x.clone())
    assert relative_error(rows(x), expected) < 1e-6
    assert rows.counted_products == rows.products <= rows.macs  # each product made once; taps on padding left out
    return rows


def test_mlperf_keyword_spotter_streams_in_a_quarter_of_its_sequential_arena():
    speech_like = torch.randn(1, 1, 49, 10, generator=torch.Generator().manual_seed(0)) * 10
    rows = check(mlperf_spotter(), speech_like)
    # the input whole (1,960 B), ten rows of 64 x 5 floats (two a depthwise layer, and a pointwise
    # layer's row in and row out), the pooled 64 and the 12 logits and probabilities
    assert rows.slots == 10 and rows.peak_bytes == 1960 + 10 * 1280 + 4 * 64 + 2 * 4 * 12 == 15112
    assert rows.baseline_bytes == 64000 and rows.baseline_bytes >= 4 * rows.peak_bytes
    assert rows.macs == 2656768  # the figure zoo.partial.schedule gives for the same file
    with pytest.raises(ValueError, match=r"memory_budget=20000 bytes is below the smallest arena partial execution "
                                         r"reaches for Sequential: 64000 bytes \(unsplit: 64000\); a row at a time "
                                         r"\(zoo.partial.stream\) it runs in 15112 bytes"):
        schedule(mlperf_spotter(), speech_like, memory_budget=20_000)


def test_batch_norms_wider_kernels_and_a_batch_stream_as_the_model_runs():
    model = evaluated(nn.Conv2d(2, 16, (5, 3), stride=(2, 1), padding=(2, 1)), nn.BatchNorm2d(16), nn.ReLU6(),
                      nn.Dropout(0.2), *separable(16, 5), *separable(16, 3), nn.AvgPool2d((10, 6)), nn.Flatten(),
                      nn.Linear(16, 4), nn.Softmax(dim=1))
    x = torch.randn(3, 2, 20, 6, generator=torch.Generator().manual_seed(1))
    rows = check(model, x)
    assert rows.slots == 4 + 2 + 2  # a 5-row kernel keeps four partial rows, a 3-row one two
    assert rows.peak_bytes == 4 * (x.numel() + 8 * 3 * 16 * 6 + 3 * 16 + 2 * 3 * 4)
    assert rows.peak_bytes == 3 * stream(model, x[:1]).peak_bytes  # the samples side by side, each in its share


@pytest.mark.parametrize("model,message", [
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4),
                   nn.AdaptiveAvgPool2d(1)), r"module 2 of the chain \(Conv2d\(4, 4.*stride=\(2, 2\).*neither a depthwise"),
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 14 * 14, 2)),
     "a row stream ends its convolutions with a pool over the whole map; got Flatten"),
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.AvgPool2d(2)), "a pool over the whole map; got AvgPool2d"),
    (nn.Sequential(nn.ReLU(), nn.Conv2d(1, 4, 3), nn.AdaptiveAvgPool2d(1)), "opens with a convolution of one group; got ReLU"),
])
def test_a_chain_that_cannot_stream_is_refused_naming_its_module(model, message):
    with pytest.raises(ValueError, match=message):
        stream(model.eval(), torch.randn(1, 1, 16, 16))


def test_an_input_of_another_shape_is_refused():
    rows = stream(mlperf_spotter(), torch.zeros(1, 1, 49, 10))
    with pytest.raises(ValueError, match=r"runs inputs of shape \(1, 1, 49, 10\) and torch.float32; got \(2, 1, 49, 10\)"):
        rows(torch.zeros(2, 1, 49, 10))
