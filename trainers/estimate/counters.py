"""What a piece of code computes and sends: the floating-point operations of its matrix
multiplies, convolutions and attention, the bytes its other operators read and write, its operator
calls, and every c10d collective it calls, with its payload and its group.

The estimator counts a traced step's work with them (the planner's cost model); benchmarks count
measured steps' traffic with the same instrument. Both only watch: no operation is decomposed and
no hook is installed, so the memory of the step they watch is unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from zoo.torch_compat import TorchDispatchMode, group_of_name, tree_leaves

KINDS = {"c10d::allreduce_": "all_reduce", "c10d::_allgather_base_": "all_gather",
         "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::alltoall_base_": "all_to_all",
         "c10d::broadcast_": "broadcast"}
"""c10d operators by the collective they run; any other c10d operator is logged under its own name."""
FUNCTIONAL_KINDS = {"_c10d_functional::all_reduce": "all_reduce", "_c10d_functional::all_gather_into_tensor": "all_gather",
                    "_c10d_functional::reduce_scatter_tensor": "reduce_scatter",
                    "_c10d_functional::all_to_all_single": "all_to_all"}
"""torch's functional collectives (DTensor's redistributions) by the collective they run."""


class CollectiveLog(TorchDispatchMode):
    """Payload bytes and calls of every c10d collective called inside, by kind and by group: the
    whole tensor of an all-reduce or broadcast, the gathered output of an all-gather, the input of
    a reduce-scatter or all-to-all."""

    def __init__(self) -> None:
        super().__init__()
        self.by_group: dict[tuple[str, tuple[int, ...]], list[int]] = defaultdict(lambda: [0, 0])
        """(kind, the group's global ranks) -> [bytes, calls]."""

    def counts(self) -> dict[tuple[str, tuple[int, ...]], tuple[int, int]]:
        """(payload bytes, calls) by (kind, the group's global ranks), a copy."""
        return {key: (nbytes, calls) for key, (nbytes, calls) in self.by_group.items()}

    @property
    def bytes(self) -> dict[str, int]:
        """Payload bytes by kind, all groups together."""
        return self._by_kind(0)

    @property
    def calls(self) -> dict[str, int]:
        """Calls by kind, all groups together."""
        return self._by_kind(1)

    def _by_kind(self, field: int) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for (kind, _), record in self.by_group.items():
            totals[kind] += record[field]
        return dict(totals)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:  # DTensor runs its local operations (and collectives), which come back here
            return NotImplemented
        name = func.name().partition(".")[0] if hasattr(func, "overloadpacket") else str(func)  # "aten::add"
        if name.startswith("_c10d_functional::") and name in FUNCTIONAL_KINDS:
            self._functional(FUNCTIONAL_KINDS[name], args)
        elif name.startswith("c10d::"):
            kind = KINDS.get(name, name)
            tensors = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
            tensors = [t for item in tensors for t in (item if isinstance(item, (list, tuple)) else [item])]
            size = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
            if kind in ("reduce_scatter", "all_to_all"):  # the input: what is reduced / sent
                inputs = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
                inputs = [t for item in inputs for t in (item if isinstance(item, (list, tuple)) else [item])]
                size = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
            group = next((a for a in args if isinstance(a, torch.ScriptObject)), None)  # the first is the group
            ranks = tuple(dist.get_process_group_ranks(dist.ProcessGroup.unbox(group))) if group is not None else ()
            record = self.by_group[kind, ranks]
            record[0] += size
            record[1] += 1
        return func(*args, **(kwargs or {}))

    def _functional(self, kind: str, args: tuple) -> None:
        """Count one of torch's functional collectives: (input, ..., group name), an all-gather's
        payload being its input times the group's size."""
        group = group_of_name(next(arg for arg in reversed(args) if isinstance(arg, str)))
        size = args[0].numel() * args[0].element_size()
        if kind == "all_gather":
            size *= dist.get_world_size(group)
        record = self.by_group[kind, tuple(dist.get_process_group_ranks(group))]
        record[0] += size
        record[1] += 1


def _cpu_attention_flops(query, key, value, *args, out_val=None, **kwargs) -> int:  # type: ignore[no-untyped-def]
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_attention_backward_flops(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:  # type: ignore[no-untyped-def]
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


def _grouped_mm_flops(a, b, *args, out_val=None, **kwargs) -> int:  # type: ignore[no-untyped-def]
    """A grouped product's FLOPs: each row of a (A, K) times its group's (K, M) of b (G, K, M), or
    each group's columns of a (K, A) times its rows of b (A, M): 2 A K M either way."""
    return 2 * a.shape[0] * a.shape[1] * b.shape[-1]


FLOP_FORMULAS = {**flop_registry,
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops,
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward_flops,
                 torch.ops.aten._grouped_mm: _grouped_mm_flops}
"""FLOPs by operator: `torch.utils.flop_counter`'s formulas, and the CPU flash-attention kernels and
the grouped product (a mixture of experts' products) it lacks (counted as torch counts the others)."""


MOVES_NO_MEMORY = ("c10d", "_c10d_functional", "profiler", "prim")
"""Operator namespaces whose calls are not element-wise work: collectives (`CollectiveLog`),
profiler marks, metadata queries (`prim::device`, which fake tensors answer through dispatch)."""


@dataclass(frozen=True)
class Work:
    """What operators compute, from their shapes (`WorkCount`)."""

    flops: int = 0
    """Floating-point operations of the matrix multiplies, convolutions and attention kernels."""
    memory_bytes: int = 0
    """Bytes the other operators read and write: each tensor argument and result once (element-wise
    operators, reductions, copies, the optimizer's updates); views and collectives move none."""
    calls: int = 0
    """Operator calls, views and collectives excluded."""

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.memory_bytes + other.memory_bytes, self.calls + other.calls)

    def __mul__(self, times: int) -> Work:
        return Work(self.flops * times, self.memory_bytes * times, self.calls * times)


class WorkCount(TorchDispatchMode):
    """The `Work` of the operators called inside: FLOPs of those `FLOP_FORMULAS` knows,
    memory traffic and calls of the rest, from shapes alone, so it works on fake tensors. (torch's
    `FlopCounterMode` also tracks modules with gradient hooks and decomposes other operators, which
    changes what a step holds.)"""

    def __init__(self) -> None:
        super().__init__()
        self.work = Work()

    @property
    def flops(self) -> int:
        return self.work.flops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:  # DTensor runs its local operations, which come back here
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = FLOP_FORMULAS.get(func.overloadpacket)
        if count is not None:
            self.work += Work(flops=count(*args, **kwargs, out_val=out), calls=1)
        elif not func.is_view and func.namespace not in MOVES_NO_MEMORY:
            self.work += Work(memory_bytes=_tensor_bytes((args, kwargs, out)), calls=1)
        return out


def _tensor_bytes(tree: object) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor))
