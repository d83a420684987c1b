"""zoo.partial.executor: a chain run from one preallocated arena of the planner's size, allocating
nothing else (the profiler's allocation records), with the module's outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from test_partial_pex import evaluated, inverted_residual
from vision.photos import opencv_photos
from zoo.parity import relative_error
from zoo.partial import activation_buffers, plan_arena
from zoo.partial.executor import ArenaExecutor
from zoo.store import locate
from zoo.tflite import read_tflite


def allocated_while(run) -> int:
    """Bytes the CPU allocator handed out while `run()` ran (torch's profiler records every allocation)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        run()
    return sum(max(event.self_cpu_memory_usage, 0) for event in recorded.key_averages())


def chains():
    photo = opencv_photos(96)[:1].float() / 255
    speech_like = torch.randn(1, 1, 49, 10, generator=torch.Generator().manual_seed(0)) * 10
    yield "person detector", read_tflite(locate("vww-mobilenet-v1-0.25-mlperf-tiny") / "model.tflite").module, photo
    yield "keyword spotter", read_tflite(locate("kws-dscnn-mlperf-tiny") / "model.tflite").module, speech_like
    yield "inverted residuals", evaluated(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU6(), *inverted_residual(8, 8, 1),
                                          *inverted_residual(8, 16, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                          nn.Linear(16, 2)), photo


@pytest.mark.parametrize("name,model,x", list(chains()), ids=lambda value: value if isinstance(value, str) else "")
def test_the_chain_runs_in_the_planned_arena_and_nothing_else(name, model, x):
    executor = ArenaExecutor(model, x)
    planned = plan_arena(activation_buffers(model, x)).arena_bytes
    assert executor.arena.numel() == planned and executor.arena.dtype == torch.uint8
    executor.run(x)  # warm: the first call may set up the kernels
    assert allocated_while(lambda: executor.run(x)) == 0
    with torch.no_grad():
        assert relative_error(executor(x), model(x.clone())) < 1e-5
    with torch.no_grad():
        assert allocated_while(lambda: model(x.clone())) > planned  # torch's own run allocates more


def test_a_module_without_an_out_form_is_named():
    with pytest.raises(ValueError, match="ArenaExecutor has no out= form of GELU"):
        ArenaExecutor(nn.Sequential(nn.Conv2d(1, 2, 1), nn.GELU()), torch.randn(1, 1, 4, 4))
