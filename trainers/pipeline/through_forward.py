"""Pipeline stages of a model that runs its own forward (`zoo.plan.PipelineSplit.through_forward`):
transformers' decoders, whose `forward` computes positions, masks and rotary tables from the batch
between the embedding and the first block, which no `pipeline_enter` of ours could repeat for every
architecture.

Each rank keeps the model's structure: a piece another stage holds (a `pre` or `post` module, a
block) is replaced by a `StandIn`, which holds nothing, so the kept pieces keep their state-dict
names. A stage then runs `model(**batch)`:
- before the stage's first block, every stand-in called yields the carry's hidden states (an
  embedding standing in gives the mask code a tensor of the right shape and dtype), and the first
  block's input is replaced by the carry: what ran before it (which holds no parameter of this
  stage) reaches nothing;
- a stage other than the last ends at its last block, whose output becomes the next carry
  {"hidden": (B, T, C)}; the last runs the forward to its loss.
A stand-in reached anywhere else (on the first stage, or after the stage's blocks have begun) means
the pipeline plan misplaces that piece: it raises, naming it.

torch.distributed.pipelining cannot serve here: its stages are modules run one after another from
their own inputs, so the code a transformers forward runs between its pieces would have to be
written out per architecture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainers.step import model_loss
from trainers.strategy import LayoutRefused
from zoo.module_patterns import within
from zoo.plan import Carry


class _StageEnd(Exception):
    """Raised by a stage's last block (not the last stage's) to end the model's forward there."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden


class StandIn(nn.Module):
    """A piece of the model that another pipeline stage holds (`name`): no parameters, the plain
    attributes (numbers, strings) of the module it replaces; called before the running stage's first
    block it returns the carry's hidden states."""

    def __init__(self, name: str, run: StageRun, replaced: nn.Module) -> None:
        super().__init__()
        for key, value in vars(replaced).items():  # what the forward may read of it (a layer's attention type)
            if isinstance(value, (bool, int, float, str)) and not key.startswith("_") and key != "training":
                setattr(self, key, value)
        self.name = name
        self.__dict__["run"] = run  # shared, not a child

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.run.stand_in_for(self.name)


class StageRun:
    """The state of one stage's run through the model's forward, shared by the rank's stand-ins and
    the hooks on each stage's first and last block."""

    def __init__(self) -> None:
        self.hidden: torch.Tensor | None = None
        """The received carry's hidden states, while a stage other than the first runs."""
        self.stage: int | None = None
        """The running stage, None between runs."""
        self.entered = False
        """Whether the running stage's first block has begun."""

    def stand_in_for(self, name: str) -> torch.Tensor:
        if self.stage is None or self.hidden is None or self.entered:
            where = ("outside a pipeline stage's run" if self.stage is None else "on the first stage"
                     if self.hidden is None else "after the stage's blocks began")
            raise RuntimeError(f"the model's forward ran {name!r} {where}, but the pipeline plan places it on "
                               "another stage: its pieces are not in the order the forward runs them")
        return self.hidden


def stand_in(model: nn.Module, pieces: list[str], keep: set[str]) -> StageRun:
    """Replace every piece of `pieces` (module names) not in `keep` with a `StandIn`; return the run
    state they share. A block in a module list stays an (empty) element of it, so that the forward
    still iterates and slices the list; any other piece is taken out of the module tree (its
    patterns then match nothing, as on a pruned model) and left as an attribute the forward calls."""
    run = StageRun()
    for name in pieces:
        if name in keep:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        replacement = StandIn(name, run, model.get_submodule(name))
        if isinstance(parent, nn.ModuleList):
            setattr(parent, child, replacement)
        else:
            delattr(parent, child)
            parent.__dict__[child] = replacement
    return run


def check_covered(model: nn.Module, pieces: list[str]) -> None:
    """LayoutRefused naming the first parameter of `model` that no piece holds: a stand-in could not
    take the place of the module holding it."""
    for name, _ in model.named_parameters():
        if not within(name, pieces):
            raise LayoutRefused(f"Strategy.pp > 1 places each piece of {type(model).__name__}'s pipeline plan on one "
                                f"stage, but the parameter {name!r} lies in none of them (the plan's pieces: "
                                f"{pieces[0]} ... {pieces[-1]})")


class ThroughForward:
    """One stage's run of the model's forward: hooks on its first block (the carry goes in) and, on
    a stage other than the last, its last block (the carry comes out). The hooks are registered at
    the first run, after those of data parallelism, which the block's output must have been
    through before the forward ends there (FSDP2 hooks its backward onto it)."""

    def __init__(self, run: StageRun, index: int, first: nn.Module, last: nn.Module) -> None:
        self.run, self.index = run, index
        self._blocks: tuple[nn.Module, nn.Module] | None = (first, last)

    def __call__(self, model: nn.Module, carry: Carry | None, batch: Mapping[str, Any], is_last: bool,
                 ) -> Carry | torch.Tensor:
        """This stage's output: the next carry, or the loss on the last stage."""
        if self._blocks is not None:
            first, last = self._blocks
            first.register_forward_pre_hook(self._enter, with_kwargs=True)
            if not is_last:
                last.register_forward_hook(self._leave)
            self._blocks = None
        run = self.run
        run.stage, run.hidden, run.entered = self.index, None if carry is None else carry["hidden"], False
        try:
            loss = model_loss(model, type(model).__name__, batch)
        except _StageEnd as end:
            return {"hidden": end.hidden}
        finally:
            run.stage, run.hidden = None, None
        if not is_last:
            raise RuntimeError(f"stage {self.index}'s last block never ran in {type(model).__name__}'s forward")
        return loss

    def _enter(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple | None:
        run = self.run
        if run.stage != self.index:
            return None
        run.entered = True
        if run.hidden is None:  # the first stage: the block reads the embeddings
            return None
        if args:
            return (run.hidden, *args[1:]), kwargs
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": run.hidden}
        raise RuntimeError(f"a pipeline stage's first block ({type(module).__name__}) was called without its hidden "
                           "states as first argument or hidden_states=: the carry has nowhere to go")

    def _leave(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.run.stage == self.index:
            raise _StageEnd(output[0] if isinstance(output, tuple) else output)
