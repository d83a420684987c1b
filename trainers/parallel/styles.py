"""The parallel styles a `ModelPlan` becomes under tensor parallelism, beside torch's own
(`ColwiseParallel`, `RowwiseParallel` for the linears and embeddings outside every region):
`parallelize_module` applies them all (`trainers.parallel.tensor`).

A region (`Region`) computes on this rank's shards: its first argument enters whole, its output
leaves as this rank's partial sum, summed over the group at its exit. Its linears hold DTensor
parameters and run as DTensor operations on the region's plain activations:

    RegionColwise   input taken as replicated; its gradient stays this rank's part (the region's
                    entry sums it, once for every linear that reads the input); output: this rank's
                    columns, a plain tensor
    RegionRowwise   input: this rank's columns; output: the partial sum, its bias's share in it

and a `zoo.nn.FusedMLP` region runs its fused kernel on the local shards through `local_map`
(`sharded_fused_mlp`, which zoo.nn routes DTensor weights to). Inside a region, and on the
sequence shards of a block, dropout draws from a stream of each rank's own (`RankStream`).

DTensor's own random-number tracker cannot serve for that stream: the regions' draws happen on
plain local tensors (the activations of the model's own code), which it never sees, and on a CPU
mesh torch does not promise it (it warns so). `tests/distributed/test_tensor_parallel.py` checks
the streams: draws inside a region differ between ranks, outside they agree.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.experimental import local_map
from torch.distributed.tensor.parallel import ParallelStyle

from trainers.parallel import collectives as tpc
from zoo.nn.mlp import fused_mlp

SEQUENCE_DIM = 1
"""Activations are (B, S, ...) everywhere a plan splits them along the sequence."""


def eager(hook: Callable) -> Callable:
    """`hook` kept out of torch.compile's graphs: the regions' collectives give storage back between
    passes and reseed the random generator, which a graph cannot express. A compiled block under
    tensor parallelism is compiled in the pieces between its regions' edges (`trainers.speed.compile`)."""
    return torch.compiler.disable(hook)


def shard_parameter(module: nn.Module, name: str, placement, mesh: DeviceMesh) -> None:
    """Replace `module`'s parameter `name` (if any) by a DTensor of `placement` over `mesh`. Every
    rank built the same whole tensor (same seed), so each keeps its slice: no communication."""
    param = getattr(module, name)
    if param is None:
        return
    sharded = distribute_tensor(param.detach(), mesh, [placement], src_data_rank=None)
    module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))


class _PartialInputGradient(torch.autograd.Function):
    """x, whole and the same on every rank, as a replicated DTensor whose gradient (each rank's part
    of it) comes back as it is: the region's entry sums it once."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mesh: DeviceMesh) -> DTensor:
        return DTensor.from_local(x, mesh, [Replicate()], run_check=False)

    @staticmethod
    def backward(ctx, grad: DTensor):
        if not grad.placements[0].is_partial():
            raise RuntimeError(f"a column-parallel linear's input gradient came back {grad.placements}; expected "
                               "each rank's part of it (Partial)")
        return grad.to_local(), None


class RankStream:
    """Gives each tensor-parallel rank its own random stream for one call: dropout on a shard
    (some heads, some feed-forward columns, some positions) must not repeat another rank's mask.

    On entry one seed is drawn from the shared generator (advancing it alike on every rank), and
    the generator is reseeded from it and the rank; on exit the shared state comes back. A recompute
    that replays the shared state replays the rank's draws too."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.saved: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def enter(self) -> None:
        seed = int(torch.randint(0, 1 << 62, ()))
        cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self.saved.append((torch.get_rng_state(), cuda))
        torch.manual_seed((seed + 1_000_003 * (self.rank + 1)) % (1 << 63))

    def leave(self) -> None:
        cpu, cuda = self.saved.pop()
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)

    def hook(self, module: nn.Module) -> None:
        """Draw from this rank's stream while `module` runs."""
        module.register_forward_pre_hook(eager(lambda *_: self.enter()))
        module.register_forward_hook(eager(lambda *_: self.leave()), always_call=True)


class OwnStream(ParallelStyle):
    """A module run on sequence shards (a block under sequence parallelism): its draws come from the
    rank's own stream."""

    def __init__(self, stream: RankStream) -> None:
        self.stream = stream

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.stream.hook(module)
        return module


class SequenceSplit(ParallelStyle):
    """A module whose output (B, S, ...) enters the sequence-sharded stretch: each rank keeps its
    shard along S (ValueError unless the group's size divides S)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group, size = device_mesh.get_group(), device_mesh.size()

        def split(_module, _args, output):
            length = output.shape[SEQUENCE_DIM]
            if length % size:
                raise ValueError(f"Strategy.sequence_parallel splits the sequence over tp={size} ranks; the sequence "
                                 f"length must be divisible by it, got {length} (from {type(module).__name__})")
            return tpc.split_to_shards(output, SEQUENCE_DIM, group)

        module.register_forward_hook(eager(split))
        return module


class SequenceSplitInput(ParallelStyle):
    """A module whose first argument (B, S, ...), positional or by keyword, enters the
    sequence-sharded stretch as it is called: each rank keeps its shard along S (ValueError unless
    the group's size divides S)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group, size, first = device_mesh.get_group(), device_mesh.size(), _first_parameter(module)

        def split(_module, args, kwargs):
            whole = args[0] if args else kwargs[first]
            length = whole.shape[SEQUENCE_DIM]
            if length % size:
                raise ValueError(f"Strategy.sequence_parallel splits the sequence over tp={size} ranks; the sequence "
                                 f"length must be divisible by it, got {length} (into {type(module).__name__})")
            shard = tpc.split_to_shards(whole, SEQUENCE_DIM, group)
            return ((shard, *args[1:]), kwargs) if args else (args, {**kwargs, first: shard})

        module.register_forward_pre_hook(eager(split), with_kwargs=True)
        return module


class SequenceGather(ParallelStyle):
    """A module whose output leaves the sequence-sharded stretch: gathered whole along S."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group = device_mesh.get_group()
        module.register_forward_hook(eager(lambda _module, _args, output: tpc.gather_whole(output, SEQUENCE_DIM, group)))
        return module


class Region(ParallelStyle):
    """A module that computes on this rank's shards (`ModelPlan.regions`), in on its first argument
    whole, out with this rank's partial sum: under sequence parallelism the input is gathered from
    the sequence shards (its storage given back after the forward and gathered again when the
    backward starts) and the output reduce-scattered along the sequence; otherwise the output is
    all-reduced and the input's gradient. Its further positional tensor arguments that need
    gradients (a decoder's memory, whole on every rank) enter whole, their gradients summed over the
    group. Its draws come from `stream`.

    A region that returns a tuple (a mixture of experts: its output and its auxiliary loss) has
    the first summed so, and the others, which every rank computes whole from the whole input,
    passed on with their gradients scaled by 1/tp: they reach the region's input and its replicated
    parameters on every rank, whose gradients the group sums."""

    def __init__(self, sequence_parallel: bool, stream: RankStream) -> None:
        self.sequence_parallel, self.stream = sequence_parallel, stream

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group = device_mesh.get_group()
        inputs: list[tpc.GatheredInput | None] = []

        first = _first_parameter(module)

        def enter(_module, args, kwargs):
            gathered = None
            if not args:  # the activation passed by keyword
                if first not in kwargs:
                    raise TypeError(f"the region {type(module).__name__} was called without its first argument "
                                    f"({first!r}), the activation it splits")
                args, kwargs = (kwargs[first],), {k: v for k, v in kwargs.items() if k != first}
            whole = tuple(_whole(a, group) for a in args[1:])
            kwargs = {key: _whole(value, group) for key, value in kwargs.items()}
            if self.sequence_parallel:
                gathered = tpc.GatheredInput(args[0], SEQUENCE_DIM, group)
                args = (gathered.full, *whole)
            else:
                args = (tpc.copy_to_group(args[0], group), *whole)
            inputs.append(gathered)
            self.stream.enter()
            return args, kwargs

        def leave(_module, args, kwargs, output):
            self.stream.leave()
            gathered = inputs.pop()
            output, *whole = output if isinstance(output, tuple) else (output,)
            whole = [tpc.scaled_gradient(value, 1 / device_mesh.size()) if isinstance(value, torch.Tensor) else value
                     for value in whole]
            if not self.sequence_parallel:
                summed = tpc.sum_over_group(output, group)
                return (summed, *whole) if whole else summed
            refill = None if gathered is None or not torch.is_grad_enabled() else gathered.refill
            output = tpc.scatter_sum(output, SEQUENCE_DIM, group, refill)
            if gathered is not None:
                gathered.release()
            return (output, *whole) if whole else output

        module.register_forward_pre_hook(eager(enter), with_kwargs=True)
        module.register_forward_hook(eager(leave), with_kwargs=True, always_call=True)
        return module


def _first_parameter(module: nn.Module) -> str | None:
    """The name of the first parameter of `module.forward`, under which a caller may pass it by keyword."""
    parameters = list(inspect.signature(module.forward).parameters.values())
    return parameters[0].name if parameters and parameters[0].kind in (parameters[0].POSITIONAL_ONLY,
                                                                      parameters[0].POSITIONAL_OR_KEYWORD) else None


def _whole(value, group):
    """A further argument of a region: a tensor needing gradients enters whole, its gradient summed."""
    return tpc.copy_to_group(value, group) if isinstance(value, torch.Tensor) and value.requires_grad else value


class RegionColwise(ParallelStyle):
    """A column-parallel `nn.Linear` inside a region: weight and bias rows sharded; see the module
    docstring."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        shard_parameter(module, "weight", Shard(0), device_mesh)
        shard_parameter(module, "bias", Shard(0), device_mesh)
        module.register_forward_pre_hook(eager(lambda _m, args: (_PartialInputGradient.apply(args[0], device_mesh),
                                                                 *args[1:])))
        module.register_forward_hook(eager(lambda _m, _args, output: output.to_local()))
        return module


class RegionRowwise(ParallelStyle):
    """A row-parallel `nn.Linear` inside a region: weight columns sharded, the bias whole (its share
    in each rank's partial sum); see the module docstring."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        shard_parameter(module, "weight", Shard(1), device_mesh)
        shard_parameter(module, "bias", Replicate(), device_mesh)
        module.register_forward_pre_hook(
            eager(lambda _m, args: (DTensor.from_local(args[0], device_mesh, [Shard(-1)], run_check=False), *args[1:])))
        module.register_forward_hook(eager(lambda _m, _args, output: output.to_local()))
        return module


def sharded_fused_mlp(x: torch.Tensor, w1: DTensor, b1: DTensor | None, w2: DTensor, b2: DTensor | None,
                      activation, p: float = 0.0, *, training: bool = True, backend=None) -> torch.Tensor:
    """`zoo.nn.mlp.fused_mlp` in a region: x (..., H) whole on every rank; w1 (F, H) and b1 (F,)
    split by rows, w2 (H2, F) by columns, b2 (H2,) whole (DTensors). Returns this rank's partial sum
    of the output (..., H2), with b2 / ranks in it: the fused kernel runs on the local shards."""
    ranks = w1.device_mesh.size()

    def local(x, w1, b1, w2, b2):
        return fused_mlp(x, w1, b1, w2, None if b2 is None else b2 / ranks, activation, p, training=training,
                         backend=backend)

    bias2 = None if b2 is None else [Replicate()]
    sharded = local_map(local, out_placements=[Partial()], device_mesh=w1.device_mesh,
                        in_placements=(None, [Shard(0)], None if b1 is None else [Shard(0)], [Shard(1)], bias2),
                        in_grad_placements=(None, [Shard(0)], None if b1 is None else [Shard(0)], [Shard(1)],
                                            None if b2 is None else [Partial()]))
    return sharded(x, w1, b1, w2, b2).to_local()
