"""TensorFlow Lite flatbuffers (`.tflite`) read into torch: a chain of operators becomes an
`nn.Sequential` of torch modules in NCHW, its weights dequantised to float32.

Read with the `tflite` package (the flatbuffer schema's Python reader). Operators: CONV_2D,
DEPTHWISE_CONV_2D, AVERAGE_POOL_2D, MAX_POOL_2D, RESHAPE to (batch, features) of a 1 x 1 map,
FULLY_CONNECTED and SOFTMAX, with fused ReLU or ReLU6 (modules that run in place, in their
operator's output, as the interpreter runs them); "SAME" padding that torch cannot say
symmetrically becomes `zoo.nn.conv.Conv2dSame`. An int8 model's weights are (q - zero point) x
scale per output channel and its biases (int32) likewise; its activations then run in float32, so
its outputs differ from the int8 interpreter's by the requantisation it skips. Any other operator,
a graph that is not one operator after another, or a model of several subgraphs (a streaming
model's state variables: `zoo.tflite.graph`) is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tflite
import torch
from torch import nn

from zoo.nn.conv import Conv2dSame, same_padding
from zoo.tflite.flatbuffer import FlatbufferReader, Quantization, conv_geometry


@dataclass
class TFLiteModel:
    """A .tflite model read into torch."""

    module: nn.Sequential
    """The operators as torch modules, on (N, C, H, W) float32 input (the file's is (N, H, W, C))."""
    input_shape: tuple[int, ...]
    """The file's input shape, as torch takes it (NCHW for a 4-d input)."""
    input_quantization: Quantization | None
    """How the file's int8 input holds real values; None for a float input."""
    output_quantization: Quantization | None
    """How the file's int8 output holds real values; None for a float output."""
    operators: tuple[str, ...]
    """The file's operators in order, by name."""

    def outputs(self, inputs: torch.Tensor) -> torch.Tensor:
        """The module on `inputs` (N, ...) float32 as the file's model reads them: an int8 input's
        values (quantised, then dequantised)."""
        if self.input_quantization is not None:
            inputs = self.input_quantization.dequantize(self.input_quantization.quantize(inputs))
        with torch.no_grad():
            return self.module(inputs)


def _activation(reader: FlatbufferReader, options, name: str) -> list[nn.Module]:
    """The fused activation as a module that runs in place (in its operator's output), or none."""
    clamp = reader.activation(options.FusedActivationFunction(), name)
    if clamp is None:
        return []
    return [nn.ReLU(inplace=True) if clamp[1] == float("inf") else nn.ReLU6(inplace=True)]


def _padded(size: tuple[int, int], kernel: tuple[int, int], options, **arguments) -> nn.Conv2d:
    """A convolution of `options`' padding, strides and dilations on an input of `size` (H, W)."""
    stride, dilation, (left, right, top, bottom) = conv_geometry(options, size, kernel)
    if top == bottom and left == right:
        return nn.Conv2d(kernel_size=kernel, stride=stride, dilation=dilation, padding=(top, left), **arguments)
    return Conv2dSame(kernel_size=kernel, stride=stride, dilation=dilation, pads=(left, right, top, bottom), **arguments)


def _conv(reader: FlatbufferReader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    options = reader.options(operator, tflite.Conv2DOptions)
    weight = reader.values(inputs[1]).permute(0, 3, 1, 2)  # OHWI -> OIHW
    _, height, width, channels = reader.shape(inputs[0])
    conv = _padded((height, width), tuple(weight.shape[2:]), options, in_channels=channels,
                   out_channels=weight.shape[0], bias=len(inputs) > 2 and inputs[2] >= 0)
    return [_loaded(conv, weight, reader, inputs), *_activation(reader, options, name)]


def _depthwise(reader: FlatbufferReader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    options = reader.options(operator, tflite.DepthwiseConv2DOptions)
    weight = reader.values(inputs[1]).permute(3, 0, 1, 2)  # 1HWC -> C1HW
    _, height, width, channels = reader.shape(inputs[0])
    conv = _padded((height, width), tuple(weight.shape[2:]), options, in_channels=channels,
                   out_channels=weight.shape[0], groups=channels, bias=len(inputs) > 2 and inputs[2] >= 0)
    return [_loaded(conv, weight, reader, inputs), *_activation(reader, options, name)]


def _loaded(module: nn.Module, weight: torch.Tensor, reader: FlatbufferReader, inputs: list[int]) -> nn.Module:
    with torch.no_grad():
        module.weight.copy_(weight)
        if module.bias is not None:
            module.bias.copy_(reader.values(inputs[2]))
    return module


def _pool(reader: FlatbufferReader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    options = reader.options(operator, tflite.Pool2DOptions)
    kernel, stride = (options.FilterHeight(), options.FilterWidth()), (options.StrideH(), options.StrideW())
    _, height, width, _ = reader.shape(inputs[0])
    if options.Padding() == tflite.Padding.SAME and any(
            sum(same_padding(size, k, s)) for size, k, s in zip((height, width), kernel, stride)):
        raise ValueError(f"{reader.path}: {name} pads its input ('SAME'), which read_tflite does not read")
    pool = nn.AvgPool2d(kernel, stride) if name == "AVERAGE_POOL_2D" else nn.MaxPool2d(kernel, stride)
    return [pool, *_activation(reader, options, name)]


def _reshape(reader: FlatbufferReader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    shape = reader.shape(inputs[0])
    if len(shape) != 4 or shape[1] * shape[2] != 1:
        raise ValueError(f"{reader.path}: read_tflite reads a RESHAPE of a 1 x 1 map to (batch, channels); "
                         f"its input is {shape}")
    return [nn.Flatten()]


def _fully_connected(reader: FlatbufferReader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    options = reader.options(operator, tflite.FullyConnectedOptions)
    weight = reader.values(inputs[1])
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=len(inputs) > 2 and inputs[2] >= 0)
    return [_loaded(linear, weight, reader, inputs), *_activation(reader, options, name)]


def _softmax(reader: FlatbufferReader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    beta = reader.options(operator, tflite.SoftmaxOptions).Beta()
    if beta != 1.0:
        raise ValueError(f"{reader.path}: read_tflite reads SOFTMAX with beta 1; got {beta}")
    return [nn.Softmax(dim=1)]


_OPERATORS = {"CONV_2D": _conv, "DEPTHWISE_CONV_2D": _depthwise, "AVERAGE_POOL_2D": _pool, "MAX_POOL_2D": _pool,
              "RESHAPE": _reshape, "FULLY_CONNECTED": _fully_connected, "SOFTMAX": _softmax}


def read_tflite(path: str | Path) -> TFLiteModel:
    """The model of a .tflite file (see the module docstring); ValueError naming what it cannot read."""
    path = Path(path)
    reader = FlatbufferReader(path)
    if reader.model.SubgraphsLength() != 1:
        raise ValueError(f"{path}: read_tflite reads a model of one subgraph; this one has "
                         f"{reader.model.SubgraphsLength()} (a streaming model's state variables: read_tflite_graph)")
    graph, layers, names = reader.graph, [], []
    (first,), (last,) = graph.InputsAsNumpy(), graph.OutputsAsNumpy()
    previous = first
    for position in range(graph.OperatorsLength()):
        operator = graph.Operators(position)
        name = reader.operator_name(operator)
        inputs, outputs = [int(i) for i in operator.InputsAsNumpy()], [int(i) for i in operator.OutputsAsNumpy()]
        if name not in _OPERATORS:
            raise ValueError(f"{path}: operator {position} is {name}, which read_tflite does not read "
                             f"(it reads {', '.join(_OPERATORS)})")
        if inputs[0] != previous or len(outputs) != 1:
            raise ValueError(f"{path}: read_tflite reads a chain of operators, each reading the one before; "
                             f"operator {position} ({name}) is not one")
        layers += _OPERATORS[name](reader, operator, inputs, name)
        names.append(name)
        previous = outputs[0]
    if previous != last:
        raise ValueError(f"{path}: the chain of operators does not end at the model's output")
    shape = reader.shape(first)
    return TFLiteModel(nn.Sequential(*layers).eval(), (shape[0], shape[3], shape[1], shape[2]) if len(shape) == 4 else shape,
                       reader.quantization(first), reader.quantization(last), tuple(names))
