"""TensorFlow Lite's own interpreter (the `ai-edge-litert` package, a development requirement) on a
file, the reference the readers are checked against."""

from __future__ import annotations

from pathlib import Path

import torch

from zoo.tflite.chain import TFLiteModel


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
