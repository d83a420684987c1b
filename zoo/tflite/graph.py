"""A .tflite model of any graph, streaming state variables included, as one torch module.

`TFLiteGraph` runs the file's operators in the file's order on its own layout (NHWC), each a torch
function of real (dequantised) values: convolutions through torch's NCHW ones, concatenations,
strided slices, splits, reshapes, fully connected layers, the logistic and softmax functions, and a
QUANTIZE or DEQUANTIZE as the identity on real values. A streaming model's resource variables (the
windows its layers keep between calls) are buffers of the module, set by the file's initialising
subgraphs and read and assigned as the file does; `reset()` restores them. An int8 file runs in
float32 on its dequantised weights, so its outputs differ from the interpreter's by the
requantisation it skips. Any other operator is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tflite
import torch
import torch.nn.functional as F
from torch import nn

from zoo.tflite.flatbuffer import FlatbufferReader, conv_geometry

Values = dict[int, torch.Tensor]
"""Real values of the graph's tensors by index, as the forward pass makes them."""


@dataclass
class _Step:
    name: str
    inputs: list[int]
    outputs: list[int]
    run: Callable[..., torch.Tensor | tuple[torch.Tensor, ...] | None]
    """Called with the input values (None for an absent optional input); returns the output values."""


def _clamped(reader: FlatbufferReader, options, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    clamp = reader.activation(options.FusedActivationFunction(), name)
    return (lambda x: x) if clamp is None else (lambda x: x.clamp(*clamp))


def _ints(reader: FlatbufferReader, index: int) -> list[int]:
    return [int(v) for v in reader.values(index).flatten().tolist()]


def _conv(reader: FlatbufferReader, operator, name: str, weight: torch.Tensor, bias: torch.Tensor | None,
          input_shape: tuple[int, ...], groups: int) -> Callable[..., torch.Tensor]:
    """An NHWC convolution by torch's NCHW one; weight OIHW."""
    kind = tflite.Conv2DOptions if name == "CONV_2D" else tflite.DepthwiseConv2DOptions
    options = reader.options(operator, kind)
    stride, dilation, pads = conv_geometry(options, input_shape[1:3], tuple(weight.shape[2:]))
    activation = _clamped(reader, options, name)

    def run(x: torch.Tensor, *_) -> torch.Tensor:
        y = F.conv2d(F.pad(x.permute(0, 3, 1, 2), pads), weight, bias, stride, 0, dilation, groups)
        return activation(y).permute(0, 2, 3, 1)

    return run


def _strided_slice(reader: FlatbufferReader, operator, inputs: list[int]) -> Callable[..., torch.Tensor]:
    options = reader.options(operator, tflite.StridedSliceOptions)
    if options.EllipsisMask() or options.NewAxisMask():
        raise ValueError(f"{reader.path}: a STRIDED_SLICE with an ellipsis or new axes is not one zoo.tflite reads")
    begin, end, strides = (_ints(reader, index) for index in inputs[1:4])
    shape = reader.shape(inputs[0])
    index: list[slice | int] = []
    for axis, size in enumerate(shape):
        start = 0 if options.BeginMask() >> axis & 1 else begin[axis] % size if begin[axis] < 0 else begin[axis]
        stop = size if options.EndMask() >> axis & 1 else end[axis] + size if end[axis] < 0 else end[axis]
        if options.Offset():
            stop = start + end[axis]
        index.append(start if options.ShrinkAxisMask() >> axis & 1 else slice(start, min(stop, size), strides[axis]))
    return lambda x, *_: x[tuple(index)]


class TFLiteGraph(nn.Module):
    """The main subgraph of a .tflite file (see the module docstring). forward(x): x of the file's
    input shape, real values; returns the file's output in real values."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        reader = FlatbufferReader(path)
        self.path = reader.path
        graph = reader.graph
        (self.input_index,), (self.output_index,) = graph.InputsAsNumpy(), graph.OutputsAsNumpy()
        self.input_quantization = reader.quantization(int(self.input_index))
        self.output_quantization = reader.quantization(int(self.output_index))
        self.input_shape = reader.shape(int(self.input_index))
        self._initial: dict[str, torch.Tensor] = {}
        for number in range(1, reader.model.SubgraphsLength()):
            self._read_initialiser(FlatbufferReader(path, number))
        for number, (name, value) in enumerate(self._initial.items()):
            self.register_buffer(f"state{number}", value.clone())
        self._state_of = {name: f"state{number}" for number, name in enumerate(self._initial)}
        self._handles: dict[int, str] = {}
        """Variable name of each resource tensor of the main subgraph."""
        self.steps: list[_Step] = []
        for position in range(graph.OperatorsLength()):
            operator = graph.Operators(position)
            name = reader.operator_name(operator)
            inputs = [int(i) for i in operator.InputsAsNumpy()] if operator.InputsLength() else []
            outputs = [int(i) for i in operator.OutputsAsNumpy()] if operator.OutputsLength() else []
            run = self._step(reader, operator, name, inputs, outputs)
            if run is not None:
                self.steps.append(_Step(name, inputs, outputs, run))

    def _read_initialiser(self, reader: FlatbufferReader) -> None:
        handles = {}
        for position in range(reader.graph.OperatorsLength()):
            operator = reader.graph.Operators(position)
            name = reader.operator_name(operator)
            if name == "VAR_HANDLE":
                handles[int(operator.OutputsAsNumpy()[0])] = self._variable_name(reader, operator)
            elif name == "ASSIGN_VARIABLE":
                handle, value = (int(i) for i in operator.InputsAsNumpy())
                self._initial[handles[handle]] = reader.values(value)
            else:
                raise ValueError(f"{reader.path}: an initialising subgraph's {name} is not one zoo.tflite reads")

    @staticmethod
    def _variable_name(reader: FlatbufferReader, operator) -> str:
        options = reader.options(operator, tflite.VarHandleOptions)
        return f"{(options.Container() or b'').decode()}/{options.SharedName().decode()}"

    def _step(self, reader: FlatbufferReader, operator, name: str, inputs: list[int], outputs: list[int]):
        """The torch function of one operator, or None for one that only sets things up."""
        if name == "CALL_ONCE":
            return None
        if name == "VAR_HANDLE":
            self._handles[outputs[0]] = self._variable_name(reader, operator)
            return None
        if name == "READ_VARIABLE":
            state = self._state_of[self._handles[inputs[0]]]
            return lambda *_: getattr(self, state).clone()  # as the interpreter's read, a copy
        if name == "ASSIGN_VARIABLE":
            state = self._state_of[self._handles[inputs[0]]]

            def assign(_, value: torch.Tensor) -> None:
                getattr(self, state).copy_(value)

            return assign
        if name == "RESHAPE":
            shape = reader.shape(outputs[0])
            return lambda x, *_: x.reshape(shape)
        if name == "CONCATENATION":
            options = reader.options(operator, tflite.ConcatenationOptions)
            axis, activation = options.Axis(), _clamped(reader, options, name)
            return lambda *parts: activation(torch.cat(parts, axis))
        if name == "STRIDED_SLICE":
            return _strided_slice(reader, operator, inputs)
        if name == "SPLIT_V":
            sizes, (axis,) = _ints(reader, inputs[1]), _ints(reader, inputs[2])
            return lambda x, *_: torch.split(x, sizes, axis)
        if name == "CONV_2D":
            weight, bias = reader.values(inputs[1]).permute(0, 3, 1, 2), reader.values(inputs[2])
            return _conv(reader, operator, name, weight, bias, reader.shape(inputs[0]), 1)
        if name == "DEPTHWISE_CONV_2D":
            weight, bias = reader.values(inputs[1]).permute(3, 0, 1, 2), reader.values(inputs[2])
            return _conv(reader, operator, name, weight, bias, reader.shape(inputs[0]), weight.shape[0])
        if name == "FULLY_CONNECTED":
            options = reader.options(operator, tflite.FullyConnectedOptions)
            weight = reader.values(inputs[1])
            bias = reader.values(inputs[2]) if len(inputs) > 2 and inputs[2] >= 0 else None
            activation, shape = _clamped(reader, options, name), reader.shape(outputs[0])
            return lambda x, *_: activation(F.linear(x.reshape(-1, weight.shape[1]), weight, bias)).reshape(shape)
        if name == "LOGISTIC":
            return lambda x: torch.sigmoid(x)
        if name == "SOFTMAX":
            return lambda x: torch.softmax(x, -1)
        if name in ("QUANTIZE", "DEQUANTIZE"):
            return lambda x: x
        raise ValueError(f"{reader.path}: operator {name} is not one TFLiteGraph reads")

    def reset(self) -> None:
        """The state variables back to the values the file initialises them to."""
        for name, value in self._initial.items():
            getattr(self, self._state_of[name]).copy_(value)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values: Values = {int(self.input_index): x}
        for step in self.steps:
            made = step.run(*(values.get(index) for index in step.inputs))
            if made is None:
                continue
            for index, value in zip(step.outputs, made if isinstance(made, tuple) else (made,)):
                values[index] = value
        return values[int(self.output_index)]


def read_tflite_graph(path: str | Path) -> TFLiteGraph:
    """`TFLiteGraph(path)`, its state variables at their initial values."""
    return TFLiteGraph(path).eval()

