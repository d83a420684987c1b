"""A pipeline rank's step traced alone: what its peers would have sent, made up from shapes.

The memory estimator traces one rank at a time in a fake process group, whose receives return
at once with nothing in them. A pipeline stage's forward needs the previous stage's carry, which
the traced rank never computes: `carry_specs` runs the whole (fake) model's pieces once, before
it is cut into stages, and records each block's output carry (keys, shapes, dtypes, which
entries need gradients, and the values of the small entries computed for real from the batch:
lengths a later stage reads on the host). `TracedLink` then receives, for every forward message,
fake tensors of the sending stage's carry, allocated as the real link allocates its receive
buffers, and copies of the real entries; sends, gradient receives and the schedule's bookkeeping
are the real link's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainers.pipeline.comm import Message, PipelineLink
from trainers.pipeline.runtime import GeneratorState
from zoo.plan import Carry, model_plan
from zoo.torch_compat import FakeTensor

CarrySpec = dict[str, torch.Tensor]
"""A carry's entries: key -> a fake tensor of the entry's shape, dtype and `requires_grad`, or
the entry itself where it is real (`trainers.estimate.fake.HostFakeMode`)."""


def carry_specs(model: nn.Module, batch: Mapping[str, Any]) -> list[CarrySpec]:
    """Per block of `model` (`ModelPlan.blocks`, in order): the carry its `pipeline_block`
    returns for the micro batch `batch`. Each block starts from detached copies of the previous
    carry, its entries needing gradients where they did, as a pipeline stage receives them."""
    plan = model_plan(model)
    blocks = [model.get_submodule(name) for name in plan.block_names(model)]
    if plan.pipeline is not None and plan.pipeline.through_forward:
        return block_outputs(model, blocks, batch)
    specs = []
    with torch.enable_grad():
        carry = model.pipeline_enter(**batch)
        for block in blocks:
            carry = _received(model.pipeline_block(block, _received(carry)))
            specs.append(carry)
    return specs


def block_outputs(model: nn.Module, blocks: list[nn.Module], batch: Mapping[str, Any]) -> list[CarrySpec]:
    """`carry_specs` of a model whose stages run its own forward (`PipelineSplit.through_forward`):
    {"hidden": each block's output} from one run of that forward."""
    specs: list[CarrySpec] = []
    record = lambda module, args, output: specs.append(  # noqa: E731
        _received({"hidden": output[0] if isinstance(output, tuple) else output}))
    handles = [block.register_forward_hook(record) for block in blocks]
    try:
        with torch.enable_grad():
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return specs


def _received(carry: Carry) -> Carry:
    return {key: value.detach().requires_grad_(value.requires_grad) for key, value in carry.items()}


class TracedLink(PipelineLink):
    """A `PipelineLink` whose forward messages hold fake carries of the shapes `specs` gives the
    sending stage's last block (`ranges`: each stage's blocks)."""

    def __init__(self, group: dist.ProcessGroup, ranges: list[range], device: torch.device,
                 specs: list[CarrySpec]) -> None:
        super().__init__(group, len(ranges), device)
        self._stage_outputs = [specs[blocks[-1]] for blocks in ranges]

    def _read(self, key: Message, peer: int) -> Carry | list[torch.Tensor]:
        kind, stage, _ = key
        if kind != "F":  # gradients: shaped like what this rank sent
            return super()._read(key, peer)
        carry = {name: _like(entry, self.device) for name, entry in self._stage_outputs[stage].items()}
        return GeneratorState.capture(self.device).put_into(carry)


def _like(entry: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A received copy of a carry entry: a new (fake) buffer of its shape, or a copy of its values."""
    if isinstance(entry, FakeTensor):
        return torch.empty(entry.shape, dtype=entry.dtype, device=device).requires_grad_(entry.requires_grad)
    return entry.detach().clone().requires_grad_(entry.requires_grad)
