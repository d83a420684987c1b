"""Running a chain of modules from one preallocated arena, so that its activation memory is a
measured fact: one byte tensor of the planned size, every activation a view of it at its planned
offset, each module writing its output into its view with `zoo.partial.kernels` (which allocate
nothing). `ArenaExecutor` runs the unsplit chain in the sequential plan (`zoo.partial.arena`);
`ScheduleExecutor` runs a partial-execution schedule (`zoo.partial.pex`) in its `peak_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.partial.arena import ArenaPlan, in_place, plan_arena, traced_buffers
from zoo.partial.kernels import Kernel, accumulating_kernel, kernel
from zoo.partial.pex import PartialSchedule, Segment


@dataclass
class _Call:
    """One module's kernel with the views it reads and writes."""

    kernel: Kernel
    source: torch.Tensor
    target: torch.Tensor


class ArenaExecutor:
    """A chain of modules (`nn.Sequential` or any module torch.fx traces to one module after another)
    run from one arena of `plan.arena_bytes` (see the module docstring), for inputs of
    `example_input`'s shape and dtype."""

    def __init__(self, model: nn.Module, example_input: torch.Tensor) -> None:
        traced = traced_buffers(model, example_input)
        self.plan: ArenaPlan = plan_arena(traced.buffers)
        self.arena = torch.empty(self.plan.arena_bytes, dtype=torch.uint8, device=example_input.device)
        modules = dict(traced.graph.named_modules())
        buffers = {buffer.name: buffer for buffer in self.plan.buffers}
        views: dict[str, torch.Tensor] = {}
        self.calls: list[_Call] = []
        for node in traced.graph.graph.nodes:
            if node.op == "output":
                self.output = views[node.all_input_nodes[0].name]
                continue
            meta = node.meta["tensor_meta"]
            holder = buffers[traced.holder[node.name]]
            offset = self.plan.offsets[holder.name]
            views[node.name] = self.arena[offset : offset + holder.nbytes].view(meta.dtype).view(meta.shape)
            if node.op == "placeholder":
                self.input = views[node.name]
            elif node.op == "call_module" and len(node.all_input_nodes) == 1:
                self.calls.append(_Call(kernel(modules[node.target]), views[node.all_input_nodes[0].name],
                                        views[node.name]))
            else:
                raise ValueError(f"ArenaExecutor runs a chain of modules; node {node.name!r} ({node.op} {node.target}) "
                                 "is not one")

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The model on `x`: a view of the arena, valid until the next run."""
        self.input.copy_(x)
        with torch.no_grad():
            for call in self.calls:
                call.kernel(call.source, call.target)
        return self.output

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`run`'s output, copied out of the arena."""
        return self.run(x).clone()


@dataclass
class _SegmentRun:
    calls: list[_Call]
    """Every slice's modules in order."""
    output: torch.Tensor
    """The segment's whole output."""
    accumulates: bool
    """Whether a closing convolution adds into `output` (zeroed first)."""
    bias: torch.Tensor | None
    """The closing convolution's bias, added once after the slices."""


def _copy(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x)


class ScheduleExecutor:
    """A partial-execution schedule run from one arena of its `peak_bytes`.

    The whole tensors that exist (the input, each output outside a split segment's inside, a
    segment's input and output; an in-place module's output is its input's) alternate between the
    arena's two ends, so that each module's input and output sit apart; inside a split segment the
    slices alternate between the two ends of the gap its whole input and output leave, the opening
    convolution reads the whole input, the last module writes its channels of the whole output (or
    the closing convolution adds its product into it). At every module that is what `peak_bytes`
    counts, so everything fits."""

    def __init__(self, schedule: PartialSchedule, example_input: torch.Tensor) -> None:
        self.schedule = schedule
        self.arena = torch.empty(schedule.peak_bytes, dtype=torch.uint8, device=example_input.device)
        self.dtype = example_input.dtype
        split = {module: segment for segment in schedule.segments if segment.slices > 1
                 for module in range(segment.first, segment.last + 1)}
        self.bottom: dict[int, bool] = {}
        """Whether whole tensor k (0: the input, k: module k - 1's output) sits at the arena's start."""
        side = True
        for k in range(len(schedule.modules) + 1):
            segment = split.get(k - 1)
            if k and segment is not None and k - 1 != segment.last:
                continue  # inside a split segment: only slices
            if k and segment is None and in_place(schedule.modules[k - 1]):
                self.bottom[k] = self.bottom[k - 1]
                continue
            self.bottom[k], side = side, not side
        self.whole = {k: self._view(0 if bottom else schedule.peak_bytes - schedule.sizes[k], schedule.shapes[k])
                      for k, bottom in self.bottom.items()}
        self.steps: list[_Call | _SegmentRun] = []
        index = 0
        while index < len(schedule.modules):
            segment = split.get(index)
            if segment is None:
                self.steps.append(_Call(kernel(schedule.modules[index]), self.whole[index], self.whole[index + 1]))
                index += 1
            else:
                self.steps.append(self._segment(segment))
                index = segment.last + 1

    def _bytes(self, shape: torch.Size) -> int:
        return shape.numel() * torch.empty((), dtype=self.dtype).element_size()

    def _view(self, offset: int, shape: torch.Size) -> torch.Tensor:
        return self.arena[offset : offset + self._bytes(shape)].view(self.dtype).view(shape)

    def _segment(self, segment: Segment) -> _SegmentRun:
        schedule, first, last = self.schedule, segment.first, segment.last
        whole_in, whole_out = self.whole[first], self.whole[last + 1]
        low = schedule.sizes[first] if self.bottom[first] else schedule.sizes[last + 1]
        high = schedule.peak_bytes - (schedule.sizes[last + 1] if self.bottom[first] else schedule.sizes[first])
        inner = schedule.modules[first : last + 1 - segment.closes]
        width = segment.channels // segment.slices
        calls = []
        for start in range(0, segment.channels, width):
            channels = slice(start, start + width)
            part, at_low = whole_in if segment.opens else whole_in[:, channels], True
            for position, module in enumerate(inner):
                if in_place(module):
                    calls.append(_Call(kernel(module, channels), part, part))
                    if first + position == last:  # the segment ends in place: its channels of the whole output
                        calls.append(_Call(_copy, part, whole_out[:, channels]))
                    continue
                if first + position == last:  # the segment's last module: its channels of the whole output
                    target = whole_out[:, channels]
                else:
                    made = schedule.shapes[first + position + 1]
                    shape = torch.Size([made[0], width, *made[2:]])
                    target = self._view(low if at_low else high - self._bytes(shape), shape)
                    at_low = not at_low
                calls.append(_Call(kernel(module, channels), part, target))
                part = target
            if segment.closes:
                calls.append(_Call(accumulating_kernel(schedule.modules[last], channels), part, whole_out))
        closer = schedule.modules[last] if segment.closes else None
        bias = None if closer is None or closer.bias is None else closer.bias.detach()[:, None, None]
        return _SegmentRun(calls, whole_out, segment.closes, bias)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The schedule on `x`: a view of the arena, valid until the next run."""
        self.whole[0].copy_(x)
        with torch.no_grad():
            for step in self.steps:
                if isinstance(step, _Call):
                    step.kernel(step.source, step.target)
                    continue
                if step.accumulates:
                    step.output.zero_()
                for call in step.calls:
                    call.kernel(call.source, call.target)
                if step.bias is not None:
                    step.output.add_(step.bias)
        return self.whole[len(self.schedule.modules)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`run`'s output, copied out of the arena."""
        return self.run(x).clone()
