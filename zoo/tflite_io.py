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
model's state variables) is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tflite
import torch
from torch import nn

from zoo.nn.conv import Conv2dSame, same_padding
from zoo.partial.arena import ArenaPlan, Buffer, plan_arena


@dataclass(frozen=True)
class Quantization:
    """An int8 tensor's real value: (q - zero_point) x scale."""

    scale: float
    zero_point: int

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """float -> int8, rounded to nearest and saturated."""
        return (torch.round(x / self.scale) + self.zero_point).clamp(-128, 127).to(torch.int8)

    def dequantize(self, q: torch.Tensor) -> torch.Tensor:
        """int8 -> float32."""
        return (q.to(torch.float32) - self.zero_point) * self.scale


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


def interpreter_outputs(path: str | Path, model: TFLiteModel, inputs: torch.Tensor) -> torch.Tensor:
    """TensorFlow Lite's interpreter (the `ai-edge-litert` package) on the file at `path`, one input
    of `inputs` (N, ...) float32 in torch's layout at a time (quantised for an int8 input); its
    outputs dequantised, (N, ...) float32. `model`: the file as `read_tflite` reads it."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    (given,), (made,) = interpreter.get_input_details(), interpreter.get_output_details()
    outputs = []
    for x in inputs:
        x = x[None] if model.input_quantization is None else model.input_quantization.quantize(x[None])
        interpreter.set_tensor(given["index"], (x.permute(0, 2, 3, 1) if x.ndim == 4 else x).contiguous().numpy())
        interpreter.invoke()
        out = torch.from_numpy(interpreter.get_tensor(made["index"]).copy())
        outputs.append(out if model.output_quantization is None else model.output_quantization.dequantize(out))
    return torch.cat(outputs)


_OPERATOR_NAMES = {value: name for name, value in vars(tflite.BuiltinOperator).items() if not name.startswith("_")}
_ELEMENT_BYTES = {tflite.TensorType.FLOAT32: 4, tflite.TensorType.INT32: 4, tflite.TensorType.INT16: 2,
                  tflite.TensorType.INT8: 1, tflite.TensorType.UINT8: 1, tflite.TensorType.BOOL: 1}


@dataclass(frozen=True)
class FileArena:
    """The memory an interpreter of a .tflite file plans, as `file_arena` finds it."""

    plan: ArenaPlan
    """The activation tensors of the main subgraph (input and output included) placed by
    `zoo.partial.plan_arena`, in the file's own element sizes (one byte an int8 value)."""
    variable_bytes: int
    """The state variables a streaming model keeps between calls (persistent, beside the arena)."""


def file_arena(path: str | Path) -> FileArena:
    """The activation arena of the file's main subgraph in the order its operators run: each tensor
    that no buffer holds (not a weight) and that is not a variable's handle is a buffer from the
    operator that writes it (0: a graph input) to the last that reads it (the graph's outputs to the
    end); the variables' bytes are what the file's initialising subgraphs assign them."""
    model = tflite.Model.GetRootAsModel(Path(path).read_bytes(), 0)
    graph = model.Subgraphs(0)
    made = {int(i): 0 for i in graph.InputsAsNumpy()}
    read: dict[int, int] = {}
    for position in range(graph.OperatorsLength()):
        operator = graph.Operators(position)
        for tensor in (operator.InputsAsNumpy() if operator.InputsLength() else []):
            read[int(tensor)] = position + 1
        for tensor in (operator.OutputsAsNumpy() if operator.OutputsLength() else []):
            made.setdefault(int(tensor), position + 1)
    end = graph.OperatorsLength() + 1
    for tensor in graph.OutputsAsNumpy():
        read[int(tensor)] = end
    buffers = []
    for index, first in made.items():
        tensor = graph.Tensors(index)
        if tensor.Type() not in _ELEMENT_BYTES or model.Buffers(tensor.Buffer()).DataLength():
            continue  # a variable's handle (a resource), or a constant
        numel = int(np.prod(tensor.ShapeAsNumpy())) if tensor.ShapeLength() else 1
        buffers.append(Buffer(tensor.Name().decode(), numel * _ELEMENT_BYTES[tensor.Type()], first,
                              read.get(index, first)))
    variables = 0
    for number in range(1, model.SubgraphsLength()):
        initialiser = model.Subgraphs(number)
        for position in range(initialiser.OperatorsLength()):
            operator = initialiser.Operators(position)
            code = model.OperatorCodes(operator.OpcodeIndex())
            if _OPERATOR_NAMES.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode())) == "ASSIGN_VARIABLE":
                value = initialiser.Tensors(int(operator.InputsAsNumpy()[1]))
                variables += int(np.prod(value.ShapeAsNumpy())) * _ELEMENT_BYTES[value.Type()]
    return FileArena(plan_arena(buffers), variables)


class _Reader:
    """One subgraph's tensors and operators."""

    def __init__(self, data: bytes, path: Path) -> None:
        self.path = path
        self.model = tflite.Model.GetRootAsModel(data, 0)
        if self.model.SubgraphsLength() != 1:
            raise ValueError(f"{path}: read_tflite reads a model of one subgraph; this one has "
                             f"{self.model.SubgraphsLength()} (a streaming model's state variables, control flow)")
        self.graph = self.model.Subgraphs(0)

    def shape(self, index: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.graph.Tensors(index).ShapeAsNumpy())

    def quantization(self, index: int) -> Quantization | None:
        tensor = self.graph.Tensors(index)
        if tensor.Type() == tflite.TensorType.FLOAT32:
            return None
        q = tensor.Quantization()
        return Quantization(float(q.ScaleAsNumpy()[0]), int(q.ZeroPointAsNumpy()[0]))

    def values(self, index: int) -> torch.Tensor:
        """A constant tensor as float32, dequantised along its quantised dimension."""
        types = tflite.TensorType
        tensor = self.graph.Tensors(index)
        dtype = {types.FLOAT32: np.float32, types.INT8: np.int8, types.INT32: np.int32, types.UINT8: np.uint8}.get(
            tensor.Type())
        raw = self.model.Buffers(tensor.Buffer()).DataAsNumpy()
        if dtype is None or isinstance(raw, int):
            raise ValueError(f"{self.path}: tensor {tensor.Name().decode()!r} is not a constant of a type read_tflite "
                             f"reads (float32, int8, uint8, int32); type {tensor.Type()}")
        values = np.frombuffer(raw.tobytes(), dtype).reshape(self.shape(index)).astype(np.float64)
        q = tensor.Quantization()
        if dtype is not np.float32 and q is not None and q.ScaleLength():
            broadcast = [1] * values.ndim
            if q.ScaleLength() > 1:
                broadcast[q.QuantizedDimension()] = -1
            values = (values - q.ZeroPointAsNumpy().reshape(broadcast)) * q.ScaleAsNumpy().reshape(broadcast)
        return torch.tensor(values, dtype=torch.float32)

    def options(self, operator, kind):
        table, options = operator.BuiltinOptions(), kind()
        options.Init(table.Bytes, table.Pos)
        return options

    def activation(self, code: int, name: str) -> list[nn.Module]:
        functions = tflite.ActivationFunctionType
        if code == functions.NONE:
            return []
        if code in (functions.RELU, functions.RELU6):
            return [nn.ReLU(inplace=True) if code == functions.RELU else nn.ReLU6(inplace=True)]
        raise ValueError(f"{self.path}: {name}'s fused activation {code} is not one read_tflite knows (ReLU, ReLU6)")


def _padded(size: tuple[int, int], kernel: tuple[int, int], options, **arguments) -> nn.Conv2d:
    """A convolution of `options`' padding, strides and dilations on an input of `size` (H, W)."""
    stride, dilation = (options.StrideH(), options.StrideW()), (options.DilationHFactor(), options.DilationWFactor())
    if options.Padding() == tflite.Padding.VALID:
        return nn.Conv2d(kernel_size=kernel, stride=stride, dilation=dilation, padding=0, **arguments)
    (top, bottom), (left, right) = (same_padding(size[axis], kernel[axis], stride[axis], dilation[axis]) for axis in (0, 1))
    if top == bottom and left == right:
        return nn.Conv2d(kernel_size=kernel, stride=stride, dilation=dilation, padding=(top, left), **arguments)
    return Conv2dSame(kernel_size=kernel, stride=stride, dilation=dilation, pads=(left, right, top, bottom), **arguments)


def _conv(reader: _Reader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    options = reader.options(operator, tflite.Conv2DOptions)
    weight = reader.values(inputs[1]).permute(0, 3, 1, 2)  # OHWI -> OIHW
    _, height, width, channels = reader.shape(inputs[0])
    conv = _padded((height, width), tuple(weight.shape[2:]), options, in_channels=channels,
                   out_channels=weight.shape[0], bias=len(inputs) > 2 and inputs[2] >= 0)
    return [_loaded(conv, weight, reader, inputs), *reader.activation(options.FusedActivationFunction(), name)]


def _depthwise(reader: _Reader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    options = reader.options(operator, tflite.DepthwiseConv2DOptions)
    weight = reader.values(inputs[1]).permute(3, 0, 1, 2)  # 1HWC -> C1HW
    _, height, width, channels = reader.shape(inputs[0])
    conv = _padded((height, width), tuple(weight.shape[2:]), options, in_channels=channels,
                   out_channels=weight.shape[0], groups=channels, bias=len(inputs) > 2 and inputs[2] >= 0)
    return [_loaded(conv, weight, reader, inputs), *reader.activation(options.FusedActivationFunction(), name)]


def _loaded(module: nn.Module, weight: torch.Tensor, reader: _Reader, inputs: list[int]) -> nn.Module:
    with torch.no_grad():
        module.weight.copy_(weight)
        if module.bias is not None:
            module.bias.copy_(reader.values(inputs[2]))
    return module


def _pool(reader: _Reader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    options = reader.options(operator, tflite.Pool2DOptions)
    kernel, stride = (options.FilterHeight(), options.FilterWidth()), (options.StrideH(), options.StrideW())
    _, height, width, _ = reader.shape(inputs[0])
    if options.Padding() == tflite.Padding.SAME and any(
            sum(same_padding(size, k, s)) for size, k, s in zip((height, width), kernel, stride)):
        raise ValueError(f"{reader.path}: {name} pads its input ('SAME'), which read_tflite does not read")
    pool = nn.AvgPool2d(kernel, stride) if name == "AVERAGE_POOL_2D" else nn.MaxPool2d(kernel, stride)
    return [pool, *reader.activation(options.FusedActivationFunction(), name)]


def _reshape(reader: _Reader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    shape = reader.shape(inputs[0])
    if len(shape) != 4 or shape[1] * shape[2] != 1:
        raise ValueError(f"{reader.path}: read_tflite reads a RESHAPE of a 1 x 1 map to (batch, channels); "
                         f"its input is {shape}")
    return [nn.Flatten()]


def _fully_connected(reader: _Reader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    options = reader.options(operator, tflite.FullyConnectedOptions)
    weight = reader.values(inputs[1])
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=len(inputs) > 2 and inputs[2] >= 0)
    return [_loaded(linear, weight, reader, inputs), *reader.activation(options.FusedActivationFunction(), name)]


def _softmax(reader: _Reader, operator, inputs: list[int], name: str) -> list[nn.Module]:
    beta = reader.options(operator, tflite.SoftmaxOptions).Beta()
    if beta != 1.0:
        raise ValueError(f"{reader.path}: read_tflite reads SOFTMAX with beta 1; got {beta}")
    return [nn.Softmax(dim=1)]


_OPERATORS = {"CONV_2D": _conv, "DEPTHWISE_CONV_2D": _depthwise, "AVERAGE_POOL_2D": _pool, "MAX_POOL_2D": _pool,
              "RESHAPE": _reshape, "FULLY_CONNECTED": _fully_connected, "SOFTMAX": _softmax}


def read_tflite(path: str | Path) -> TFLiteModel:
    """The model of a .tflite file (see the module docstring); ValueError naming what it cannot read."""
    path = Path(path)
    reader = _Reader(path.read_bytes(), path)
    graph, layers, names = reader.graph, [], []
    (first,), (last,) = graph.InputsAsNumpy(), graph.OutputsAsNumpy()
    previous = first
    for position in range(graph.OperatorsLength()):
        operator = graph.Operators(position)
        code = reader.model.OperatorCodes(operator.OpcodeIndex())
        name = _OPERATOR_NAMES.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "custom")
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
