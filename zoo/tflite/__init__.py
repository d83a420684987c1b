"""TensorFlow Lite files (`.tflite`) in torch.

- `flatbuffer`: reading the file (operators, tensors, constants dequantised, quantisation).
- `chain`: a chain of operators read as an `nn.Sequential` in NCHW (`read_tflite`).
- `graph`: any graph, a streaming model's state variables included, as one module (`read_tflite_graph`).
- `file_arena`: the activation arena of the file's own graph in its element sizes.
- `interpreter`: TensorFlow Lite's interpreter on the file, the reference.
"""

from zoo.tflite.chain import TFLiteModel, read_tflite
from zoo.tflite.file_arena import FileArena, file_arena
from zoo.tflite.flatbuffer import Quantization
from zoo.tflite.graph import TFLiteGraph, read_tflite_graph
from zoo.tflite.interpreter import interpreter_outputs

__all__ = ["FileArena", "Quantization", "TFLiteGraph", "TFLiteModel", "file_arena", "interpreter_outputs", "read_tflite",
           "read_tflite_graph"]
