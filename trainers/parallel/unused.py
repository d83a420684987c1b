"""Data-dependent parameter use under FSDP2 (ZeRO 0-3): a parameter some rank's micro batch did not
use gets a zero gradient there, as DDP's unused-parameter handling gives it, so every rank reduces
the same gradients and the step equals one process's.

FSDP2 reduces, per unit, the gradients of the parameters that have one. When the data chooses which
parameters a forward uses (one of several heads, a mixture written by a user), ranks hold gradients
of different parameters and the collective aborts ("Received data size doesn't match expected
size") or, worse, pairs different tensors. `EveryParameterTakesPart` adds `0 * sum(p.sum())` over a
unit's own parameters to a tensor the unit returns, while FSDP2 still holds them gathered (a forward
hook ahead of FSDP2's own): the output's value is unchanged, and every parameter of a unit that ran
gets a gradient, zero where the data did not use it.

A unit that runs on some ranks and not on others (an early exit that skips a whole block) cannot
take part so: under ZeRO-3 its gathering is itself a collective the other ranks never enter. So
before a unit runs in a training forward (ahead of FSDP2's gathering), and once at its end, every
rank says which unit comes next, in one small all-reduce; where they disagree, the forward is
refused on every rank, naming the unit's parameters, before any rank waits in a collective the
others never enter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from zoo.torch_compat import tree_flatten, tree_unflatten


def _own_modules(unit: nn.Module, units: set[int]) -> list[nn.Module]:
    """`unit` and the modules inside it that no other unit holds: whose parameters it gathers."""
    found, stack = [], [unit]
    while stack:
        module = stack.pop()
        found.append(module)
        stack += [child for child in module.children() if id(child) not in units]
    return found


def _with_zero_term(output, term: torch.Tensor):
    """`output` with `term` added to its first floating-point tensor that needs a gradient."""
    leaves, spec = tree_flatten(output)
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            leaves[index] = leaf + term.to(leaf.dtype)
            return tree_unflatten(leaves, spec)
    return output


class EveryParameterTakesPart:
    """Hooks on `model`'s FSDP2 `units` (blocks and the root, `model` last; by name) that give every
    parameter of a unit that ran a gradient, and refuse a training forward whose ranks run different
    units (see the module docstring). `group`: the ranks that reduce the units' gradients together;
    `others`: units reduced over other ranks (routed experts), whose parameters no unit here holds;
    `agree`: False gives the parameters their part without the ranks' agreement on the units (the
    estimator's trace, whose ranks are traced one by one)."""

    def __init__(self, model: nn.Module, units: dict[str, nn.Module], group: dist.ProcessGroup,
                 others: list[nn.Module], agree: bool = True) -> None:
        self.group, self.units = group, units
        self.skippable: set[int] = set()
        """The units other than the root that train: each must run in every training forward."""
        self.ran: set[int] = set()
        """The units the current training forward has run."""
        ids = {id(unit) for unit in [*units.values(), *others]}
        for index, unit in enumerate(units.values()):
            own = _own_modules(unit, ids - {id(unit)})
            if not any(p.requires_grad for module in own for p in module.parameters(recurse=False)):
                continue
            unit.register_forward_hook(self._take_part(own), prepend=True)
            if agree and unit is not model:  # the root runs on every rank
                self.skippable.add(index)
                unit.register_forward_pre_hook(lambda *_, index=index: self._agree(index), prepend=True)
        if agree:
            model.register_forward_hook(lambda *_: self._agree(len(units)))

    @staticmethod
    def _take_part(own: list[nn.Module]):
        def hook(_module, _args, output):
            if not torch.is_grad_enabled():
                return output
            # read at each call: FSDP2 registers the gathered parameters while the unit runs
            params = [p for module in own for p in module.parameters(recurse=False) if p.requires_grad]
            sums = [(p.to_local() if isinstance(p, DTensor) else p).sum() for p in params]  # a split one: its shard
            return _with_zero_term(output, torch.stack(sums).sum() * 0)
        return hook

    def _agree(self, next_unit: int) -> None:
        """Every rank says which unit it runs next (`len(units)`: the forward's end); ValueError on
        every rank where they differ, or at the end where a unit other than the root did not run."""
        if not torch.is_grad_enabled():
            return
        said = torch.zeros(len(self.units) + 1, dtype=torch.int64)
        said[next_unit] = 1
        dist.all_reduce(said, group=self.group)
        if said[next_unit] == dist.get_world_size(self.group):
            if next_unit < len(self.units):
                self.ran.add(next_unit)
                return
            skipped, self.ran = sorted(self.skippable - self.ran), set()
            if skipped:  # FSDP2 fails on a unit no rank ran (its post-backward expects it gathered)
                self._refuse(skipped, "on no rank")
            return
        self.ran = set()
        self._refuse([index for index in said.nonzero().flatten().tolist() if index < len(self.units)],
                     "on some ranks only")

    def _refuse(self, indices: list[int], where: str) -> None:
        names = list(self.units)
        partly = [names[index] for index in indices]
        params = [f"{name}.{local}" if name else local for name in partly
                  for local, p in self.units[name].named_parameters() if p.requires_grad][:6]
        raise ValueError(f"a training forward runs the data-parallel units {partly} {where} (the data chose to skip "
                         f"them), so their parameters cannot be gathered and reduced together: {params}; a unit the "
                         f"data may skip must sit inside one that always runs (leave it out of ModelPlan.blocks)")
