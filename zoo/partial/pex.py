"""Partial execution (Pex, Liberis & Lane): a chain of operators that keep channels apart runs one
slice of channels at a time, so its full intermediate buffers never exist.

A segment is a run of a chain's modules: an optional convolution that opens it (one group: its
output channels can be made a slice at a time from the whole input), modules that
act on each channel alone (depthwise convolutions, batch norms in eval mode, element-wise
activations), and an optional pointwise convolution that closes it (its output is the sum over the
slices of its input channels, accumulated in place). With the channels split in n slices, the
segment holds its whole input and output and one slice of two neighbouring intermediates, where
the whole chain held two neighbouring whole buffers; the multiplies are the same ones.

`schedule(model, example_input, memory_budget=None)` traces a chain (an `nn.Sequential`, or any
module torch.fx traces to one module after another), chooses where segments start and end and how
many slices each takes (the lowest arena, with the fewest slices that reach it), and returns a
`PartialSchedule` callable like the model. The unsplit arena is `zoo.partial.arena`'s plan; the
split one counts what a sequential executor holds while each module runs (`peak_bytes`), which
`zoo.partial.executor.ScheduleExecutor` runs the schedule in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from zoo.nn.conv import Conv2dSame, conv2d_on
from zoo.partial.arena import activation_buffers, in_place, plan_arena
from zoo.partial.chain import chain_macs, chain_of, channel_wise, pointwise
from zoo.partial.rows import stream

log = logging.getLogger(__name__)

RUN_WHOLE = (nn.Linear, nn.Flatten, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.MaxPool2d, nn.Softmax)
"""Modules the pass knows and runs whole: they mix channels (or positions) and sit where buffers are small."""


def _opens(module: nn.Module) -> bool:
    """A convolution whose output channels are made a slice at a time from its whole input."""
    return isinstance(module, nn.Conv2d) and module.groups == 1


def _closes(module: nn.Module) -> bool:
    """A pointwise convolution whose output accumulates over slices of its input channels in place."""
    return pointwise(module) and not isinstance(module, Conv2dSame)


@dataclass
class Segment:
    """Modules `first`..`last` of the chain (indices into its modules), run in `slices` slices."""

    first: int
    last: int
    slices: int = 1
    opens: bool = False
    """Whether a convolution opens it (its input stays whole)."""
    closes: bool = False
    """Whether a pointwise convolution closes it (its output accumulates)."""
    channels: int = 0
    """The channels split into slices."""


@dataclass
class PartialSchedule:
    """The chain run with its segments split (see the module docstring); call it like the model."""

    modules: list[nn.Module]
    segments: list[Segment]
    baseline_bytes: int
    """The sequential executor's arena for the unsplit chain."""
    peak_bytes: int
    """The arena with the segments split."""
    macs: int
    """Multiply-accumulates of one call (the same split or not)."""
    sizes: list[int] = field(default_factory=list)
    """Bytes of the chain's input and of each module's output."""
    unknown: list[str] = field(default_factory=list)
    """The chain's modules the pass does not know ("index: class"), each run whole where it stands."""
    shapes: list[torch.Size] = field(default_factory=list)
    """Shapes of the chain's input and of each module's output."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        starts = {segment.first: segment for segment in self.segments}
        index = 0
        while index < len(self.modules):
            segment = starts.get(index)
            if segment is None or segment.slices == 1:
                x = self.modules[index](x)
                index += 1
                continue
            x = _run_split(self.modules[segment.first : segment.last + 1], segment, x)
            index = segment.last + 1
        return x


def _slice_module(module: nn.Module, channels: slice, x: torch.Tensor, opener: bool) -> torch.Tensor:
    """`module` on slice `channels`: the opening convolution makes those output channels from the
    whole x; a module acting on each channel alone runs on x, the slice."""
    bias = None if getattr(module, "bias", None) is None else module.bias[channels]
    if opener:
        return conv2d_on(module, x, module.weight[channels], bias, 1)
    if isinstance(module, nn.Conv2d):
        return conv2d_on(module, x, module.weight[channels], bias, channels.stop - channels.start)
    if isinstance(module, nn.BatchNorm2d):
        weight = None if module.weight is None else module.weight[channels]
        return F.batch_norm(x, module.running_mean[channels], module.running_var[channels], weight, bias, False, 0.0,
                            module.eps)
    return module(x)


def _run_split(modules: list[nn.Module], segment: Segment, x: torch.Tensor) -> torch.Tensor:
    """The segment's modules on `x`, one slice of `segment.channels` at a time."""
    closer = modules[-1] if segment.closes else None
    inner = modules[:-1] if segment.closes else modules
    out = None
    for start in range(0, segment.channels, segment.channels // segment.slices):
        channels = slice(start, start + segment.channels // segment.slices)
        part = x if segment.opens else x[:, channels]
        for position, module in enumerate(inner):
            part = _slice_module(module, channels, part, opener=segment.opens and position == 0)
        if closer is None:
            out = part.new_empty(part.shape[0], segment.channels, *part.shape[2:]) if out is None else out
            out[:, channels] = part
            continue
        if out is None:
            out = part.new_zeros(part.shape[0], closer.out_channels, *part.shape[2:])
        weight = closer.weight[:, channels].flatten(1).expand(part.shape[0], -1, -1)
        accumulated = out.flatten(2)
        torch.baddbmm(accumulated, weight, part.flatten(2), out=accumulated)  # in place: no whole-size temporary
    if closer is not None and closer.bias is not None:
        out.add_(closer.bias[:, None, None])
    return out


def _splittable(chain: list[nn.Module], first: int, last: int) -> Segment | None:
    """Modules first..last as a segment (see the module docstring), or None when they do not make one."""
    opens, closes = _opens(chain[first]), last > first and _closes(chain[last])
    middle = range(first + 1 if opens else first, last if closes else last + 1)
    if last == first or not all(channel_wise(chain[module]) for module in middle):
        return None
    return Segment(first, last, opens=opens, closes=closes)


def _segments(chain: list[nn.Module], shapes: list[torch.Size], sizes: list[int]) -> list[Segment]:
    """The segments that give the lowest arena, each split into as many slices as its channels:
    a min-max dynamic programme over where segments start and end along the chain."""
    count = len(chain)
    best: list[tuple[int, Segment | None, int]] = [(0, None, 0)]
    """best[i]: (the lowest arena of modules 0..i-1, the segment ending at i-1 or None, where it starts)."""
    for end in range(1, count + 1):
        alone = max(best[end - 1][0], _module_bytes(chain, sizes, end - 1, None))
        choice = (alone, None, end - 1)
        for first in range(end - 1):
            segment = _splittable(chain, first, end - 1)
            if segment is None:
                continue
            segment.channels = shapes[first][1]
            segment.slices = segment.channels
            peak = max(best[first][0], _segment_peak(chain, sizes, segment))
            if peak < choice[0]:
                choice = (peak, segment, first)
        best.append(choice)
    segments, end = [], count
    while end > 0:
        _, segment, first = best[end]
        if segment is not None:
            segments.append(segment)
        end = first
    return segments[::-1]


def _module_bytes(chain: list[nn.Module], sizes: list[int], module: int, segment: Segment | None) -> int:
    """Bytes alive while chain module `module` runs: its input and output outside a split segment;
    in one, the segment's whole input and output and the slices of the module's input and output
    (none for the segment's input, a view of it or read whole, nor for a closing convolution's
    output, accumulated in place). A module that runs in place has no output of its own."""
    writes_input = in_place(chain[module])
    if segment is None or segment.slices == 1:
        return sizes[module] + (0 if writes_input else sizes[module + 1])
    n = segment.slices
    sliced_in = 0 if module == segment.first else sizes[module] // n
    sliced_out = 0 if writes_input or (module == segment.last and segment.closes) else sizes[module + 1] // n
    return sizes[segment.first] + sizes[segment.last + 1] + sliced_in + sliced_out


def peak_bytes(chain: list[nn.Module], sizes: list[int], segments: list[Segment]) -> int:
    """A sequential executor's arena for `chain`, whose buffers are `sizes` (its input, then each
    module's output), its segments split as they say: the most bytes alive while one module runs."""
    within = {module: segment for segment in segments for module in range(segment.first, segment.last + 1)}
    return max(_module_bytes(chain, sizes, module, within.get(module)) for module in range(len(chain)))


def _segment_peak(chain: list[nn.Module], sizes: list[int], segment: Segment) -> int:
    return max(_module_bytes(chain, sizes, module, segment) for module in range(segment.first, segment.last + 1))


def _streamed(model: nn.Module, example_input: torch.Tensor) -> str:
    """What streaming `model` a row at a time would take instead, for an error message ("" when it does not stream)."""
    try:
        rows = stream(model, example_input)
    except ValueError:
        return ""
    return f"; a row at a time (zoo.partial.stream) it runs in {rows.peak_bytes} bytes"


def schedule(model: nn.Module, example_input: torch.Tensor, memory_budget: int | None = None) -> PartialSchedule:
    """See the module docstring: every segment split as finely as its channels allow gives the
    lowest arena; each takes the fewest slices that keep it within that arena. `memory_budget`:
    bytes the arena must fit; ValueError naming the smallest arena the splits reach when it cannot
    (and the row stream's, `zoo.partial.stream`, where the chain streams)."""
    chain, sizes, shapes = chain_of(model, example_input)
    segments = _segments(chain, shapes, sizes)
    lowest = peak_bytes(chain, sizes, segments)
    for segment in segments:
        segment.slices = next(n for n in range(1, segment.channels + 1)
                              if segment.channels % n == 0 and _segment_peak(chain, sizes, replace(segment, slices=n)) <= lowest)
    baseline, peak = plan_arena(activation_buffers(model, example_input)).arena_bytes, peak_bytes(chain, sizes, segments)
    if memory_budget is not None and peak > memory_budget:
        raise ValueError(f"memory_budget={memory_budget} bytes is below the smallest arena partial execution reaches "
                         f"for {type(model).__name__}: {peak} bytes (unsplit: {baseline}){_streamed(model, example_input)}")
    unknown = [f"{index}: {type(module).__name__}" for index, module in enumerate(chain)
               if not (_opens(module) or channel_wise(module) or isinstance(module, RUN_WHOLE))]
    if unknown:
        log.warning("partial execution runs modules it does not know whole, splitting none around them: %s",
                    ", ".join(unknown))
    return PartialSchedule(chain, segments, baseline, peak, chain_macs(chain, shapes), sizes, unknown,
                           [example_input.shape, *shapes])
