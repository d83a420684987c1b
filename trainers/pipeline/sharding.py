"""When a pipeline stage's data parallelism (FSDP2 / replicate) gathers parameters and reduces
gradients, given the order the schedule runs its passes in.

- Depth-first schedules (GPipe, 1F1B, interleaved 1F1B) keep FSDP's own behaviour per micro
  batch: ZeRO-3 gathers a block's parameters for each forward and each backward, ZeRO 2-3
  reduce-scatter the gradients after each backward (keeping only a shard), ZeRO 0-1 reduce them
  (all-reduce; reduce-scatter) after the stage's last backward of the step.
- Breadth-first (looped BFS) runs all of a stage's forwards back to back, and later all its
  backwards: the stage's parameters are gathered once for the forwards and once for the
  backwards, and its gradients are reduced once, right after its last backward of the step, while
  the rank goes on with its other stages (Lamy-Poirier 2022). Between its first and last backward
  a stage holds its whole gradient (one stage's, not the rank's).
- Zero-bubble schedules split each backward into an input pass and a weight pass that FSDP's
  hooks cannot follow: the stage keeps its parameters gathered and its gradients unreduced from
  its first forward to its last weight pass of the step, then reduces and reshards (as torch's
  pipeline runtime does).
"""

from __future__ import annotations

from torch.distributed.fsdp import FSDPModule

from trainers.pipeline.schedules import Action
from zoo.torch_compat import fsdp_post_backward


def _blocks(stage: FSDPModule) -> list[FSDPModule]:
    """The stage's FSDP units other than its root (the root keeps its own reshard setting)."""
    return [m for m in stage.modules() if isinstance(m, FSDPModule) and m is not stage]


class StageSharding:
    """Sets each stage's FSDP switches around the actions of one rank's order."""

    def __init__(self, order: list[Action], zero: int, schedule: str) -> None:
        self.zero = zero
        self.split = any(a.kind == "W" for a in order)
        """Whether the order splits backwards into input- and weight-gradient passes."""
        self.mode = "split" if self.split else "breadth_first" if schedule == "looped_bfs" else "per_micro_batch"
        self.first_forward: dict[int, int] = {}
        self.last_forward: dict[int, int] = {}
        self.last_backward: dict[int, int] = {}
        for position, action in enumerate(order):
            if action.kind == "F":
                self.first_forward.setdefault(action.stage, position)
                self.last_forward[action.stage] = position
            elif action.kind in ("B", "W"):
                self.last_backward[action.stage] = position

    def before(self, position: int, action: Action, stage: FSDPModule, last_run: bool) -> None:
        """Switches for `action`, the `position`-th of the order, in the step's last run or not."""
        if action.kind == "F":
            if self.zero == 3 and self.mode != "per_micro_batch" and position == self.first_forward[action.stage]:
                stage.set_reshard_after_forward(False)
            return
        ends_step = last_run and position == self.last_backward[action.stage]
        if self.mode == "split":
            stage.set_requires_gradient_sync(False)
            stage.set_reshard_after_backward(False)
            stage.set_is_last_backward(False)
        elif self.mode == "breadth_first":
            stage.set_requires_gradient_sync(ends_step)
            stage.set_reshard_after_backward(position == self.last_backward[action.stage])
        else:
            stage.set_requires_gradient_sync(self.zero >= 2 or ends_step)

    def after(self, position: int, action: Action, stage: FSDPModule, last_run: bool) -> None:
        """Resharding or reduction due once `action` has run."""
        if action.kind == "F":
            if self.mode == "breadth_first" and position == self.last_forward[action.stage] and self.zero == 3:
                for block in _blocks(stage):
                    block.reshard()
                    block.set_reshard_after_forward(True, recurse=False)
            return
        if self.mode == "split" and last_run and position == self.last_backward[action.stage]:
            _reduce_held_gradients(stage)
            if self.zero == 3:
                for block in _blocks(stage):
                    block.set_reshard_after_forward(True, recurse=False)


def _reduce_held_gradients(stage: FSDPModule) -> None:
    """Reduce (ZeRO 2-3: reduce-scatter) the held gradients over the data-parallel ranks and
    reshard, as FSDP's post-backward would have; torch's pipeline runtime does the same."""
    stage.set_requires_gradient_sync(True)
    stage.set_reshard_after_backward(True)
    stage.set_is_last_backward(True)
    fsdp_post_backward(stage)
