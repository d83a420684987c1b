"""The tensor-parallel invariant, proven on the model's first training forward: every trainable
parameter that meets this rank's shards is split by the plan, or kept whole with its gradient summed
over the group; otherwise the model is refused before its first update, naming the parameter.

A parameter whole on every rank that multiplies (or is added to, normalises, ...) a rank's shard of
an activation gets only that rank's part of its gradient; unless the group sums it, the replicas
drift apart without an error. A plan's patterns cannot tell where that happens (a learned gain
between a column- and a row-parallel linear, a norm over split heads, a sequence-parallel norm
outside the blocks); following the shards through the forward's operations can.

`ShardProof` follows them with a dispatch mode during the first forward after tensor parallelism
applies. Shards begin where the plan makes them: the outputs of column-parallel linears, of
row-parallel linears inside a region (their partial sums) and, under sequence parallelism, of the
`sequence_split` modules (the first argument of `sequence_split_input` ones, positional), the
row-parallel linears outside regions and the regions. Every operation
with a shard among its inputs gives shards. They end where the plan makes whole tensors again: the
outputs of the regions and row-parallel linears (without sequence parallelism) and of the
`sequence_gather` modules. A plain trainable parameter among the inputs of an operation on a shard
is a finding unless its module's gradient is summed (`replicated`, `sequence_parallel` under
sequence parallelism, axial modules) or split (its parameters are DTensors, which the check passes).
The ranks exchange their findings, so every rank raises the same error.

The forward runs eagerly while it is followed (`torch.compiler.set_stance("force_eager")`). Under
pipeline parallelism a stage's first forward is not followed (its ranks reach it at different
times); the plan's static checks (`trainers.parallel.tensor.check_plan`) still hold there.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from trainers.memory.recompute import clean_fqn
from zoo.module_patterns import within
from zoo.torch_compat import TorchDispatchMode, tree_leaves


class _ShardFollower(TorchDispatchMode):
    """Marks the outputs of every operation with a marked input; records the plain parameters that
    such operations read (`met`: parameter name -> the first operation's name)."""

    def __init__(self) -> None:
        super().__init__()
        self.shards = WeakIdKeyDictionary()
        self.parameters: dict[int, str] = {}
        """id -> name of the plain trainable parameters whose gradients nothing sums, as their
        modules run (FSDP2 gives modules their gathered parameters at that moment)."""
        self.met: dict[str, str] = {}

    def mark(self, value, sharded: bool) -> None:
        for tensor in tree_leaves(value):
            if isinstance(tensor, torch.Tensor):
                if sharded:
                    self.shards[tensor] = True
                else:
                    self.shards.pop(tensor, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(t in self.shards for t in inputs):
            for tensor in inputs:
                name = self.parameters.get(id(tensor))
                if name is not None and tensor not in self.shards:
                    self.met.setdefault(name, str(func))
            self.mark(out, True)
        return out


class ShardProof:
    """Follows the shards through `model`'s next forward (hooks removed after it) and raises
    ValueError on every rank when a parameter meets them unsummed; see the module docstring.

    names: the plan's resolved names ({field: module names}, `check_plan`'s), in the model as it
    was planned; the model may since have been wrapped (recompute, FSDP2: names compared cleaned).
    model_class: the model's class name before wrapping, for the error."""

    def __init__(self, model: nn.Module, names: dict[str, list[str]], sequence_parallel: bool, model_class: str) -> None:
        self.model_class, self.follower, self.stack = model_class, _ShardFollower(), ExitStack()
        self.handles: list = []
        summed = set(names["replicated"]) | set(names["axial"])
        summed |= set(names["sequence_parallel"]) if sequence_parallel else set()
        regions = names["regions"]
        begins = set(names["colwise"]) | {n for n in names["rowwise"] if within(n, regions)}
        whole = set(names["sequence_gather"])
        if sequence_parallel:
            for name, module in model.named_modules():  # after the split the input is (pre-hooks run in order)
                if clean_fqn(name) in names["sequence_split_input"]:
                    self.handles.append(module.register_forward_pre_hook(self._edge_input))
            begins |= set(names["sequence_split"]) | set(names["regions"])
            begins |= {n for n in names["rowwise"] if not within(n, regions)}
        else:
            whole |= set(names["regions"]) | {n for n in names["rowwise"] if not within(n, regions)}
        for raw, module in model.named_modules():
            name = clean_fqn(raw)
            if not within(name, summed):
                self.handles.append(module.register_forward_pre_hook(self._parameters_of(name)))
            if name in begins or name in whole:
                self.handles.append(module.register_forward_hook(self._edge(name in begins)))
        self.handles.append(model.register_forward_pre_hook(lambda *_: self._enter()))
        self.handles.append(model.register_forward_hook(lambda *_: self._leave(), always_call=True))

    def _parameters_of(self, name: str):
        def record(module: nn.Module, _args) -> None:
            for local, param in module.named_parameters(recurse=False):
                if param.requires_grad:
                    self.follower.parameters[id(param)] = f"{name}.{local}" if name else local
        return record

    def _edge(self, sharded: bool):
        def mark(_module, _args, output):
            self.follower.mark(output, sharded)
        return mark

    def _edge_input(self, _module, args) -> None:
        self.follower.mark(args[:1], True)

    def _enter(self) -> None:
        self.stack.enter_context(torch.compiler.set_stance("force_eager"))
        self.stack.enter_context(self.follower)

    def _leave(self) -> None:
        self.stack.close()
        for handle in self.handles:
            handle.remove()
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, self.follower.met)
        met = {name: op for ranks in found for name, op in ranks.items()}
        if met:
            listed = "; ".join(f"{name} (in {op})" for name, op in sorted(met.items())[:6])
            raise ValueError(
                f"the plan of {self.model_class} leaves trainable parameters whole on every tensor-parallel "
                f"rank that meet this rank's shards in forward, so each rank would get only its part of their "
                f"gradients and the replicas would drift apart: {listed}{' ...' if len(met) > 6 else ''}; split "
                f"their modules (ModelPlan.colwise, rowwise) or keep them whole with their gradients summed "
                f"(ModelPlan.replicated; ModelPlan.sequence_parallel for modules on sequence shards)")
