"""A pipeline rank's share of a model: the model pruned to its stages' modules, and one
`StageModule` per stage that runs them.

The pruned model keeps every module a local stage needs under its original name (a block list
becomes a `ModuleDict` keyed by the kept indices), so its state-dict names are the whole model's
and distributed checkpoints reshard across pipeline layouts. Everything else is deleted before
any memory is allocated for it when the model was built on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainers.pipeline.through_forward import ThroughForward
from zoo.plan import Carry


def prune(model: nn.Module, keep: set[str]) -> None:
    """Delete every submodule of `model` that is neither named in `keep` nor an ancestor of one,
    and the parameters and buffers held directly by such ancestors unless `keep` names them. A
    `ModuleList` that loses children becomes a `ModuleDict` of the kept ones under their original
    indices."""
    _prune(model, "", keep)


def _prune(module: nn.Module, prefix: str, keep: set[str]) -> None:
    for name, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
        if prefix + name not in keep:
            delattr(module, name)
    kept: dict[str, nn.Module] = {}
    for child_name, child in list(module.named_children()):
        full = f"{prefix}{child_name}"
        if full in keep:
            kept[child_name] = child
        elif any(k.startswith(full + ".") for k in keep):
            _prune(child, full + ".", keep)
            kept[child_name] = child
    if isinstance(module, nn.ModuleList):
        # Cannot shrink a ModuleList in place without renumbering; the caller swaps it (below).
        module.__dict__["_pruned_children"] = kept
        return
    for child_name, child in list(module.named_children()):
        if child_name not in kept:
            setattr(module, child_name, None)  # nn.Module's own assignment: the child slot emptied
        elif isinstance(child, nn.ModuleList) and "_pruned_children" in child.__dict__:
            setattr(module, child_name, nn.ModuleDict(child.__dict__.pop("_pruned_children")))


class StageModule(nn.Module):
    """One pipeline stage: the model's `pipeline_enter` (first stage), a run of its blocks and its
    `pipeline_exit` (last stage). `forward(carry, batch)` returns the next carry, or the loss on
    the last stage. It is the stage's FSDP root: the blocks are their own units, the enter and
    exit modules (`held`) belong to the root's."""

    def __init__(self, model: nn.Module, index: int, num_stages: int, blocks: list[nn.Module],
                 held: list[nn.Module], through: ThroughForward | None = None) -> None:
        super().__init__()
        self.index, self.num_stages = index, num_stages
        self.blocks = nn.ModuleList(blocks)
        self.held = nn.ModuleList(held)
        self.__dict__["model"] = model  # not a child: its other modules belong to other stages
        self.through = through
        """Runs the stage through the model's own forward (`zoo.plan.PipelineSplit.through_forward`);
        None: through the model's pipeline_enter, pipeline_block and pipeline_exit."""

    @property
    def is_first(self) -> bool:
        """Whether this stage runs `pipeline_enter` on the batch."""
        return self.index == 0

    @property
    def is_last(self) -> bool:
        """Whether this stage returns the loss."""
        return self.index == self.num_stages - 1

    def forward(self, carry: Carry | None, batch: Mapping[str, Any]) -> Carry | torch.Tensor:
        """carry: the previous stage's output (None on the first stage); batch: the whole micro batch."""
        model = self.model
        if self.through is not None:
            return self.through(model, carry, batch, self.is_last)
        if self.is_first:
            carry = model.pipeline_enter(**batch)
        for block in self.blocks:
            carry = model.pipeline_block(block, carry)
        return model.pipeline_exit(carry, **batch) if self.is_last else carry
