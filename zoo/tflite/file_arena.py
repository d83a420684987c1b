"""The activation arena of a .tflite file's own graph, in the file's element sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tflite

from zoo.partial.arena import ArenaPlan, Buffer, plan_arena
from zoo.tflite.flatbuffer import ELEMENT_BYTES, OPERATOR_NAMES


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
        if tensor.Type() not in ELEMENT_BYTES or model.Buffers(tensor.Buffer()).DataLength():
            continue  # a variable's handle (a resource), or a constant
        numel = int(np.prod(tensor.ShapeAsNumpy())) if tensor.ShapeLength() else 1
        buffers.append(Buffer(tensor.Name().decode(), numel * ELEMENT_BYTES[tensor.Type()], first,
                              read.get(index, first)))
    variables = 0
    for number in range(1, model.SubgraphsLength()):
        initialiser = model.Subgraphs(number)
        for position in range(initialiser.OperatorsLength()):
            operator = initialiser.Operators(position)
            code = model.OperatorCodes(operator.OpcodeIndex())
            if OPERATOR_NAMES.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode())) == "ASSIGN_VARIABLE":
                value = initialiser.Tensors(int(operator.InputsAsNumpy()[1]))
                variables += int(np.prod(value.ShapeAsNumpy())) * ELEMENT_BYTES[value.Type()]
    return FileArena(plan_arena(buffers), variables)
