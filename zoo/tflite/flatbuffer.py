"""Reading a .tflite flatbuffer with the `tflite` package (the schema's Python reader): operator
names, tensor shapes, constants dequantised, quantisation of activations, builtin options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tflite
import torch

from zoo.nn.conv import same_padding

OPERATOR_NAMES = {value: name for name, value in vars(tflite.BuiltinOperator).items() if not name.startswith("_")}
ELEMENT_BYTES = {tflite.TensorType.FLOAT32: 4, tflite.TensorType.INT32: 4, tflite.TensorType.INT16: 2,
                  tflite.TensorType.INT8: 1, tflite.TensorType.UINT8: 1, tflite.TensorType.BOOL: 1}


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


class FlatbufferReader:
    """A .tflite file's tensors and operators; `graph` is subgraph `subgraph`."""

    def __init__(self, path: str | Path, subgraph: int = 0) -> None:
        self.path = Path(path)
        self.model = tflite.Model.GetRootAsModel(self.path.read_bytes(), 0)
        self.graph = self.model.Subgraphs(subgraph)

    def operator_name(self, operator) -> str:
        """The builtin operator's name ("CONV_2D"), or "custom"."""
        code = self.model.OperatorCodes(operator.OpcodeIndex())
        return OPERATOR_NAMES.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "custom")

    def is_constant(self, index: int) -> bool:
        """Whether a buffer of the file holds the tensor's values (a weight)."""
        return bool(self.model.Buffers(self.graph.Tensors(index).Buffer()).DataLength())

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

    def activation(self, code: int, name: str) -> tuple[float, float] | None:
        """A fused activation as the (low, high) it clamps to, or None; ValueError for any other."""
        functions = tflite.ActivationFunctionType
        if code == functions.NONE:
            return None
        if code in (functions.RELU, functions.RELU6):
            return (0.0, float("inf")) if code == functions.RELU else (0.0, 6.0)
        raise ValueError(f"{self.path}: {name}'s fused activation {code} is not one zoo.tflite reads (ReLU, ReLU6)")


def conv_geometry(options, size: tuple[int, int], kernel: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int],
                                                                                   tuple[int, int, int, int]]:
    """(stride, dilation, pads (left, right, top, bottom)) of a convolution's builtin `options` on an
    input of `size` (H, W) with a `kernel` (H, W): "VALID" pads nothing, "SAME" as TensorFlow does."""
    stride, dilation = (options.StrideH(), options.StrideW()), (options.DilationHFactor(), options.DilationWFactor())
    if options.Padding() == tflite.Padding.VALID:
        return stride, dilation, (0, 0, 0, 0)
    (top, bottom), (left, right) = (same_padding(size[axis], kernel[axis], stride[axis], dilation[axis]) for axis in (0, 1))
    return stride, dilation, (left, right, top, bottom)
