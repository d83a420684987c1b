"""Row streaming: a chain that opens with a convolution and then keeps its rows apart runs one row at
a time from one arena, so that no layer's whole output ever exists.

The chain: a convolution reading the whole input (any kernel, stride and padding) makes its output
one row at a time; then depthwise convolutions (stride 1, odd kernels, padding half the kernel) and
pointwise ones, each followed by channel-wise modules (batch norms in eval mode, ReLU, ReLU6,
dropouts in eval mode), pass rows on; a pool over the whole map (`AdaptiveAvgPool2d(1)`, or an
`AvgPool2d` whose window is the map) sums them; the modules after it (Flatten, Linear, Softmax,
dropouts) run whole on the pooled vector. MLPerf Tiny's DS-CNN has this shape.

A row pushed into a depthwise layer adds its taps into the partial output rows it reaches, the
layer's accumulators: the rows it completes (every input row they read has arrived) go on down the
chain at once and are freed there, so each depthwise layer of a k-row kernel holds k - 1 partial
rows between pushes, and a pointwise layer one row in and one out while it runs. Every product of
the model is made once (counted as made: `counted_products`), in another order of additions only.

`stream(model, example_input)` returns a `RowStream` (callable like the model) whose `peak_bytes`
is its arena: the input whole, the most row slots ever held at once (found by running the stream's
allocation without computing) and the pooled vector and the tail's outputs; it runs from one byte
tensor of exactly that size and allocates nothing else while it runs. A batch of N samples streams
side by side (a slot holds one row of each), in exactly N times one sample's arena.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from zoo.partial.arena import activation_buffers, plan_arena
from zoo.partial.chain import chain_macs, chain_of, channel_wise, conv_padding, pointwise
from zoo.partial.kernels import kernel, tap_window

aten = torch.ops.aten


def _depthwise_rows(conv: nn.Module) -> bool:
    """A depthwise convolution that keeps rows in place: stride 1, odd kernel, padding half of it."""
    return (isinstance(conv, nn.Conv2d) and conv.groups == conv.in_channels == conv.out_channels
            and conv.stride == (1, 1) and conv.dilation == (1, 1) and all(k % 2 for k in conv.kernel_size)
            and conv_padding(conv) == (conv.kernel_size[0] // 2, conv.kernel_size[1] // 2))


def _whole_map_pool(module: nn.Module, source: torch.Size) -> bool:
    """A pool whose one output is the mean of the whole (H, W) map of shape `source` it reads."""
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return module.output_size in (1, (1, 1))
    if not isinstance(module, nn.AvgPool2d):
        return False
    window = module.kernel_size if isinstance(module.kernel_size, tuple) else (module.kernel_size,) * 2
    return (tuple(window) == tuple(source[2:]) and module.padding in (0, (0, 0)) and module.divisor_override is None)


@dataclass
class _Stage:
    """A convolution of the stream and the channel-wise modules after it (run on each finished row)."""

    conv: nn.Conv2d
    post: list[Callable[[torch.Tensor, torch.Tensor], None]]
    rows: int
    """Rows of the stage's output (its input's, but for the opening convolution)."""
    accumulators: dict[int, int] = field(default_factory=dict)
    """A depthwise stage's partial output rows: row -> slot."""


class RowStream:
    """A chain run a row at a time from one arena (see the module docstring; made by `stream`); call
    it like the model.

    Figures: `baseline_bytes`, the sequential planner's arena for the chain (`zoo.partial.arena`);
    `peak_bytes`, the stream's arena (`arena.numel()`): its input, `slots` rows (the most held at
    once), the pooled vector and the tail's outputs; `macs`, the multiply-accumulates of the chain's
    convolutions and linear layers as `zoo.partial.schedule` counts them (taps on padding included);
    `products`, those that read input values (taps on padding left out), the ones the model's
    arithmetic needs; `counted_products`, the products the last run made, counted as it made them."""

    def __init__(self, chain: list[nn.Module], shapes: list[torch.Size], example_input: torch.Tensor,
                 baseline_bytes: int) -> None:
        self.dtype, self.device = example_input.dtype, example_input.device
        self.input_shape, self.batch = example_input.shape, example_input.shape[0]
        self.stages: list[_Stage] = []
        pool = self._read_stages(chain, shapes)
        last = shapes[pool - 1]
        self.channels, self.width, self.map_rows = last[1], last[3], last[2]
        self.row_elements = max(shape[1] * shape[3] for shape in shapes[:pool])
        self.tail = [(module, kernel(module), shape) for module, shape in zip(chain[pool + 1 :], shapes[pool + 1 :])
                     if not isinstance(module, (nn.Flatten, nn.Dropout))]
        self.weights = torch.full((1, self.width, 1), 1.0 / (self.map_rows * self.width), dtype=self.dtype,
                                  device=self.device).expand(self.batch, -1, -1)
        """The pool's weight of each column of a row, for each sample: the pooled mean is a sum of rows times it."""
        self.slots = self._count_slots()
        self._lay_out(example_input)
        self.baseline_bytes, self.peak_bytes = baseline_bytes, self.arena.numel()
        self.macs, self.products = chain_macs(chain, shapes), _products(chain, shapes, example_input.shape)
        self.counted_products = 0

    def _read_stages(self, chain: list[nn.Module], shapes: list[torch.Size]) -> int:
        """The stream's stages from the chain; the index of its pool. ValueError naming a module that
        does not fit the shape the module docstring gives."""
        opening = chain[0]
        if not (isinstance(opening, nn.Conv2d) and opening.groups == 1):
            raise ValueError(f"a row stream opens with a convolution of one group; got {type(opening).__name__}")
        index = 0
        while index < len(chain) and isinstance(chain[index], nn.Conv2d):
            conv = chain[index]
            if self.stages and not (_depthwise_rows(conv) or pointwise(conv)):
                raise ValueError(f"module {index} of the chain ({conv}) is neither a depthwise convolution of "
                                 "stride 1 keeping its rows nor a pointwise one: a row stream cannot pass it")
            rows = shapes[index][2]
            index += 1
            post = []
            while index < len(chain) and channel_wise(chain[index]) and not isinstance(chain[index], nn.Conv2d):
                post.append(kernel(chain[index]))
                index += 1
            self.stages.append(_Stage(conv, post, rows))
        if index == len(chain) or not _whole_map_pool(chain[index], shapes[index - 1]):
            found = type(chain[index]).__name__ if index < len(chain) else "the chain's end"
            raise ValueError(f"a row stream ends its convolutions with a pool over the whole map; got {found}")
        return index

    def _lay_out(self, example_input: torch.Tensor) -> None:
        """The arena and its regions: the input, the row slots, the pooled vector, the tail's outputs."""
        item, batch = example_input.element_size(), self.batch
        sizes = [example_input.numel(), self.slots * batch * self.row_elements, batch * self.channels]
        sizes += [shape.numel() for _, _, shape in self.tail]
        self.arena = torch.empty(sum(sizes) * item, dtype=torch.uint8, device=self.device)
        flat = self.arena.view(self.dtype)
        offsets = [0]
        for size in sizes:
            offsets.append(offsets[-1] + size)
        self.input = flat[offsets[0] : offsets[1]].view(example_input.shape)
        self.rows_memory = flat[offsets[1] : offsets[2]].view(self.slots, batch * self.row_elements)
        self.pooled = flat[offsets[2] : offsets[3]].view(batch, self.channels)
        self.tail_outputs = [flat[offsets[3 + i] : offsets[4 + i]].view(shape) for i, (_, _, shape) in enumerate(self.tail)]

    # ---------------------------------------------------------------- slots
    def _count_slots(self) -> int:
        """The most row slots the stream holds at once: its allocation run without arithmetic."""
        self.computing, self.free, self.held, self.most, self.created = False, [], 0, 0, 0
        self._stream()
        return self.most

    def _take(self) -> int:
        self.held += 1
        self.most = max(self.most, self.held)
        if self.free:
            return self.free.pop()
        self.created += 1
        return self.created - 1

    def _give(self, slot: int) -> None:
        self.held -= 1
        self.free.append(slot)

    def _row(self, slot: int, channels: int) -> torch.Tensor:
        """Slot `slot` as one row (N, channels, W) of every sample."""
        return self.rows_memory[slot, : self.batch * channels * self.width].view(self.batch, channels, self.width)

    # ---------------------------------------------------------------- running
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output for `x` (a copy out of the arena)."""
        return self.run(x).clone()

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output for `x`: a view of the arena, valid until the next run."""
        if x.shape != self.input_shape or x.dtype != self.dtype:
            raise ValueError(f"this row stream runs inputs of shape {tuple(self.input_shape)} and {self.dtype}; "
                             f"got {tuple(x.shape)} {x.dtype}")
        self.input.copy_(x)
        self.computing, self.free, self.held, self.created = True, list(range(self.slots))[::-1], 0, self.slots
        self.counted_products = 0
        with torch.no_grad():
            self.pooled.zero_()
            self._stream()
            source = self.pooled
            for (module, run, _), out in zip(self.tail, self.tail_outputs):
                run(source, out)
                if isinstance(module, nn.Linear):
                    self.counted_products += out.numel() * module.in_features
                source = out
        return source

    def _stream(self) -> None:
        """Every row of the input's samples (side by side) through the stages into the pooled vector."""
        for row in range(self.stages[0].rows):
            slot = self._take()
            if self.computing:
                self._opening_row(row, slot)
            self._finish(0, row, slot)
        if any(stage.accumulators for stage in self.stages):
            raise RuntimeError("a row stream ended with partial rows left")

    def _opening_row(self, row: int, slot: int) -> None:
        conv = self.stages[0].conv
        top, left = conv_padding(conv)
        (stride_h, stride_w), (dilation_h, dilation_w) = conv.stride, conv.dilation
        weight = conv.weight.detach()
        out = self._row(slot, conv.out_channels)
        out.zero_()
        for a in range(conv.kernel_size[0]):
            source_row = row * stride_h + a * dilation_h - top
            if not 0 <= source_row < self.input.shape[2]:
                continue
            for b in range(conv.kernel_size[1]):
                cols, read_cols = tap_window(self.input.shape[3], self.width, b * dilation_w - left, stride_w)
                for channel in range(self.input.shape[1]):
                    out[:, :, cols].addcmul_(self.input[:, channel, None, source_row, read_cols],
                                             weight[None, :, channel, a, b, None])
                self.counted_products += self.batch * conv.out_channels * self.input.shape[1] * (cols.stop - cols.start)

    def _finish(self, stage_index: int, row: int, slot: int) -> None:
        """Row `row` of stage `stage_index`'s output, complete in `slot`: bias and channel-wise modules,
        then on to the next stage (or the pool); the slot is freed on the way."""
        stage = self.stages[stage_index]
        if self.computing:
            out = self._row(slot, stage.conv.out_channels)
            if stage.conv.bias is not None:
                out.add_(stage.conv.bias.detach()[:, None])
            view = out[:, :, None, :]  # (N, C, 1, W): the modules' own layout
            for run in stage.post:
                run(view, view)
        if stage_index + 1 == len(self.stages):
            if self.computing:
                self.pooled[:, :, None].baddbmm_(out, self.weights)
            self._give(slot)
            return
        self._push(stage_index + 1, row, slot)

    def _push(self, stage_index: int, row: int, slot: int) -> None:
        """Input row `row` (in `slot`) into stage `stage_index`; the slot is freed here."""
        stage = self.stages[stage_index]
        conv = stage.conv
        if pointwise(conv):
            out_slot = self._take()
            if self.computing:
                weight = conv.weight.detach().flatten(1).expand(self.batch, -1, -1)
                aten.bmm.out(weight, self._row(slot, conv.in_channels), out=self._row(out_slot, conv.out_channels))
                self.counted_products += self.batch * conv.out_channels * conv.in_channels * self.width
            self._give(slot)
            self._finish(stage_index, row, out_slot)
            return
        height, reach = conv.kernel_size[0], conv.kernel_size[0] // 2
        targets = [target for target in range(row - reach, row + reach + 1) if 0 <= target < stage.rows]
        for target in targets:  # partial rows already begun first, then the rows this input begins
            if target not in stage.accumulators:
                stage.accumulators[target] = self._take()
                if self.computing:
                    self._row(stage.accumulators[target], conv.out_channels).zero_()
            if self.computing:
                self._depthwise_taps(conv, row, target, slot, stage.accumulators[target])
        self._give(slot)
        done = [target for target in sorted(stage.accumulators)
                if min(target + reach, stage.rows - 1) <= row]
        for target in done:
            self._finish(stage_index, target, stage.accumulators.pop(target))
        assert len(stage.accumulators) <= height - 1

    def _depthwise_taps(self, conv: nn.Conv2d, row: int, target: int, slot: int, accumulator: int) -> None:
        """Input row `row`'s taps into output row `target` of a depthwise convolution."""
        a = row - target + conv.kernel_size[0] // 2  # the kernel row that reads `row` for `target`
        source, out = self._row(slot, conv.in_channels), self._row(accumulator, conv.out_channels)
        weight = conv.weight.detach()
        for b in range(conv.kernel_size[1]):
            cols, read_cols = tap_window(self.width, self.width, b - conv.kernel_size[1] // 2, 1)
            out[:, :, cols].addcmul_(source[:, :, read_cols], weight[None, :, 0, a, b, None])
            self.counted_products += self.batch * conv.out_channels * (cols.stop - cols.start)


def _products(chain: list[nn.Module], shapes: list[torch.Size], input_shape: torch.Size) -> int:
    """Products the chain's convolutions and linear layers make on input values (see RowStream.products)."""
    total = 0
    for module, source, shape in zip(chain, [input_shape, *shapes], shapes):
        if isinstance(module, nn.Linear):
            total += shape.numel() * module.in_features
        elif isinstance(module, nn.Conv2d):
            top, left = conv_padding(module)
            for a in range(module.kernel_size[0]):
                rows, _ = tap_window(source[2], shape[2], a * module.dilation[0] - top, module.stride[0])
                for b in range(module.kernel_size[1]):
                    cols, _ = tap_window(source[3], shape[3], b * module.dilation[1] - left, module.stride[1])
                    total += ((rows.stop - rows.start) * (cols.stop - cols.start) * shape[0] * shape[1]
                              * module.in_channels // module.groups)
    return total


def stream(model: nn.Module, example_input: torch.Tensor) -> RowStream:
    """`model` (a chain torch.fx traces, of the shape the module docstring gives) as a row stream for
    inputs of `example_input`'s shape and dtype; ValueError naming the module it cannot stream."""
    chain, _, shapes = chain_of(model, example_input)
    return RowStream(chain, shapes, example_input, plan_arena(activation_buffers(model, example_input)).arena_bytes)
