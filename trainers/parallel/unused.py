"""Data-dependent parameter use under FSDP2 (ZeRO 0-3): a parameter that some ranks' micro batches
used and this rank's did not gets a zero gradient here, as DDP's unused-parameter handling gives it,
so every rank reduces the same gradients and the step equals one process's; a parameter no rank
used keeps no gradient, as in one process.

FSDP2 reduces, per unit, the gradients of the parameters that have one. When the data chooses which
parameters a forward uses (one of several heads, a mixture written by a user), ranks hold gradients
of different parameters and the collective aborts ("Received data size doesn't match expected
size") or, worse, pairs different tensors. `EveryParameterTakesPart` records which modules of the
root unit (outside the blocks) a training forward ran; at its end (ahead of FSDP2's own end of the
forward, while the root's parameters are gathered) the ranks add up those records in one small
all-reduce, and each rank adds `0 * sum(p.sum())` over the parameters of the modules other ranks ran
and it did not to the loss (the first floating-point output that needs a gradient): the value is
unchanged, and their gradients are zero here. Inside a block (whose code may be compiled or
recomputed, where no hook may record) every parameter of the block takes part so whenever the block
runs, added to its output ahead of FSDP2's end of its forward: one the data did not use there gets a
zero gradient on every rank (a parameter no rank used gets one too: AdamW then decays it).

A unit that runs on some ranks and not on others (an early exit that skips a whole block) cannot
take part so: under ZeRO-3 its gathering is itself a collective the other ranks never enter. So
before a unit runs in a training forward (ahead of FSDP2's gathering), and once at its end, every
rank says which unit comes next, in the same all-reduce; where they disagree, the forward is refused
on every rank, naming the unit's parameters, before any rank waits in a collective the others never
enter. So is a forward in which a block ran on no rank (FSDP2's post-backward expects every block
it wrapped to have run).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from trainers.memory.recompute import clean_fqn
from zoo.module_patterns import within
from zoo.torch_compat import tree_flatten, tree_unflatten


def _with_zero_term(output, term: torch.Tensor):
    """`output` with `term` added to its first floating-point tensor that needs a gradient."""
    leaves, spec = tree_flatten(output)
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            leaves[index] = leaf + term.to(leaf.dtype)
            return tree_unflatten(leaves, spec)
    return output


def _zero_term(params: list[torch.Tensor]) -> torch.Tensor:
    """0 * the sum of `params` (a split one: of its shard): 0, on the graph of every one of them."""
    return torch.stack([(p.to_local() if isinstance(p, DTensor) else p).sum() for p in params]).sum() * 0


def _own_modules(unit: nn.Module, units: set[int]) -> list[nn.Module]:
    """`unit` and the modules inside it that no other unit holds: whose parameters it gathers."""
    found, stack = [], [unit]
    while stack:
        module = stack.pop()
        found.append(module)
        stack += [child for child in module.children() if id(child) not in units]
    return found


class EveryParameterTakesPart:
    """Hooks on `model` and its FSDP2 `units` (the blocks, by name; the root holds the rest) that
    give a parameter other ranks used a zero gradient here, and refuse a training forward whose ranks
    run different units (see the module docstring). `group`: the ranks that reduce the gradients
    together; `untracked`: modules outside the blocks whose runs are not recorded (those reduced over
    other ranks, routed experts; recompute units, whose forward runs again in backward)."""

    def __init__(self, model: nn.Module, units: dict[str, nn.Module], group: dist.ProcessGroup,
                 untracked: list[str]) -> None:
        self.model, self.group, self.units = model, group, list(units)
        self.modules = [(clean_fqn(name), module) for name, module in model.named_modules()
                        if not within(clean_fqn(name), [*units, *untracked])
                        and any(p.requires_grad for p in module.parameters(recurse=False))]
        """The modules of the root unit holding trainable parameters of their own, whose runs are recorded."""
        self.ran_modules = [False] * len(self.modules)
        self.ran_units: set[int] = set()
        for index, (_, module) in enumerate(self.modules):
            module.register_forward_pre_hook(lambda *_, index=index: self._ran(index))
        ids = {id(unit) for unit in units.values()}
        for index, unit in enumerate(units.values()):
            unit.register_forward_pre_hook(lambda *_, index=index: self._agree(index), prepend=True)
            unit.register_forward_hook(self._take_part(_own_modules(unit, ids - {id(unit)})), prepend=True)
        model.register_forward_pre_hook(lambda *_: self._start())
        model.register_forward_hook(lambda _model, _args, output: self._end(output), prepend=True)

    @staticmethod
    def _take_part(own: list[nn.Module]):
        def hook(_module, _args, output):
            if not torch.is_grad_enabled():
                return output
            # read at each call: FSDP2 registers the gathered parameters while the unit runs
            params = [p for module in own for p in module.parameters(recurse=False) if p.requires_grad]
            return _with_zero_term(output, _zero_term(params)) if params else output
        return hook

    def _start(self) -> None:
        self.ran_modules, self.ran_units = [False] * len(self.modules), set()

    def _ran(self, index: int) -> None:
        if torch.is_grad_enabled():
            self.ran_modules[index] = True

    def _agree(self, next_unit: int) -> None:
        """Every rank says which unit it runs next; ValueError on every rank where they differ."""
        if torch.is_grad_enabled():
            self._exchange(next_unit)
            self.ran_units.add(next_unit)

    def _exchange(self, next_unit: int, ran: list[bool] | None = None) -> torch.Tensor:
        """The all-reduce (of one size at every call, so that a disagreement pairs up): the unit each
        rank runs next (`len(units)`: the forward's end) and, at the end, the modules each ran; returns
        the modules' counts, after refusing a disagreement."""
        said = torch.zeros(len(self.units) + 1 + len(self.modules), dtype=torch.int64)
        said[next_unit] = 1
        if ran is not None:
            said[len(self.units) + 1:] = torch.tensor(ran, dtype=torch.int64)
        dist.all_reduce(said, group=self.group)
        if said[next_unit] != dist.get_world_size(self.group):
            self._refuse([self.units[u] for u in said[:len(self.units)].nonzero().flatten().tolist()], "on some ranks only")
        return said[len(self.units) + 1:]

    def _end(self, output):
        if not torch.is_grad_enabled():
            return output
        counts = self._exchange(len(self.units), self.ran_modules).tolist()
        skipped = [name for index, name in enumerate(self.units) if index not in self.ran_units]
        if skipped:
            self._refuse(skipped, "on no rank")
        world = dist.get_world_size(self.group)
        others = [index for index, count in enumerate(counts) if 0 < count < world and not self.ran_modules[index]]
        if not others:
            return output
        params = [p for index in others for p in self.modules[index][1].parameters(recurse=False) if p.requires_grad]
        return _with_zero_term(output, _zero_term(params))

    def _refuse(self, names: list[str], where: str) -> None:
        modules = {clean_fqn(name): module for name, module in self.model.named_modules()}
        params = [clean_fqn(f"{name}.{local}") for name in names
                  for local, p in modules[name].named_parameters() if p.requires_grad][:6]
        raise ValueError(f"a training forward runs {names} {where} (the data chose to skip them), so their parameters "
                         f"cannot be gathered and reduced together: {params}; a module the data may skip must sit "
                         f"outside ModelPlan.blocks, in the part of the model every forward runs")
