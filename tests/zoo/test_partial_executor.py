"""zoo.partial.executor: a chain, and a partial-execution schedule, run from one preallocated arena of
the planned size, allocating nothing else (the profiler's allocation records), with the module's
outputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from test_partial_pex import evaluated, inverted_residual
from vision.photos import opencv_photos
from zoo.parity import relative_error
from zoo.partial import activation_buffers, plan_arena, schedule
from zoo.partial.executor import ArenaExecutor, ScheduleExecutor
from zoo.partial.pex import Segment, peak_bytes
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


@pytest.mark.parametrize("name,model,x", list(chains()), ids=lambda value: value if isinstance(value, str) else "")
def test_the_partial_execution_schedule_runs_in_its_peak_and_nothing_else(name, model, x):
    plan = schedule(model, x)
    executor = ScheduleExecutor(plan, x)
    assert executor.arena.numel() == plan.peak_bytes
    executor.run(x)
    assert allocated_while(lambda: executor.run(x)) == 0
    with torch.no_grad():
        assert relative_error(executor(x), model(x.clone())) < 1e-5


def test_a_segment_that_ends_in_place_writes_its_whole_output():
    model = evaluated(nn.Conv2d(3, 32, 1), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(32, 2))
    x = torch.randn(1, 3, 40, 40)
    plan = schedule(model, x)  # which splits nothing here (it would not lower the peak); split by hand:
    segments = [Segment(0, 2, slices=4, opens=True, channels=32)]
    plan = dataclasses.replace(plan, segments=segments, peak_bytes=peak_bytes(plan.modules, plan.sizes, segments))
    with torch.no_grad():
        assert relative_error(ScheduleExecutor(plan, x)(x), model(x.clone())) < 1e-5


def test_a_module_without_an_out_form_is_named():
    with pytest.raises(ValueError, match="zoo.partial has no allocation-free form of GELU"):
        ArenaExecutor(nn.Sequential(nn.Conv2d(1, 2, 1), nn.GELU()), torch.randn(1, 1, 4, 4))
