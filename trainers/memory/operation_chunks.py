"""The chunk size of chunked operations (attention scores, logits, a model's own chunked passes):
the memory knob the budget planner turns besides recompute."""

from __future__ import annotations

from torch import nn

from zoo.nn import chunk_memory
from zoo.plan import model_plan


def set_chunk_bytes(model: nn.Module, nbytes: int | None) -> None:
    """Chunk the fused layers (`zoo.nn.chunk_memory`) and the model's own chunked operations (the
    config field its plan names, `zoo.plan.ModelPlan.chunk_memory`) within `nbytes` per chunk;
    None: the fused layers' default, the model's field as it is."""
    chunk_memory.set_chunk_bytes(nbytes)
    name = model_plan(model).chunk_memory
    if nbytes is not None and name is not None:
        setattr(model.config, name, nbytes)
