"""Activation recompute per block, chosen per operator and changeable between steps.

Every block of the model's plan runs through one `RecomputePolicy`, which decides at each forward
what the block keeps for its backward (`Keep`):
- "all": nothing is recomputed (the block's autograd graph keeps what it saves);
- "inputs": the block keeps only its inputs and reruns its forward in backward
  (`torch.utils.checkpoint`, non-reentrant);
- "matmuls": the outputs of matrix multiplies and attention kernels are kept, the rest rerun
  (selective activation checkpointing);
- a frozenset of `OpKey`s: exactly those operators' outputs are kept, the rest rerun. A memory
  budget picks them (`choose_saved_ops`): the knapsack of saved bytes against recomputed FLOPs.

The policy is read at every forward, so a trainer holding a budget can tighten it after a step
without rebuilding the model. Recompute reruns the same operators on the same inputs with the
same random state: gradients are those of the plain forward.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import (SAC_IGNORED_OPS, CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

from trainers.estimate.counters import FLOP_FORMULAS
from zoo.plan import model_plan, resolve
from zoo.torch_compat import TorchDispatchMode, checkpoint_wrapper, operator_schema, tree_leaves

OpKey = tuple[str, int]
"""An operator call inside a block's forward: (operator name, its occurrence among that
operator's calls), e.g. ("aten.mm.default", 3), the same in forward and in the rerun."""

Keep = Literal["all", "inputs", "matmuls"] | frozenset
"""What a block keeps for backward (see the module docstring); a frozenset holds `OpKey`s."""

MATMUL_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}
"""Operators whose outputs "matmuls" keeps: matrix multiplies and attention kernels."""


@dataclass(frozen=True)
class OpCost:
    """One operator call of a block's forward that recompute could skip by keeping its output."""

    key: OpKey
    bytes: int
    """Bytes of its outputs, held from the block's forward to its backward when kept."""
    flops: int
    """Its floating-point operations, rerun in backward when not kept."""


def _matmul_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in MATMUL_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class _KeyedPolicy:
    """Selective-checkpoint policy keeping the outputs of the calls in `saved`. One instance per
    checkpointed call: it numbers each operator's calls, separately in forward and in the rerun."""

    def __init__(self, saved: frozenset) -> None:
        self.saved = saved
        self.calls = (Counter(), Counter())

    def __call__(self, ctx, op, *args, **kwargs) -> CheckpointPolicy:
        counter = self.calls[ctx.is_recompute]
        name = str(op)
        key = (name, counter[name])
        counter[name] += 1
        return CheckpointPolicy.MUST_SAVE if key in self.saved else CheckpointPolicy.PREFER_RECOMPUTE


def _skippable(op) -> bool:
    """Whether recompute can skip `op` by keeping its output: it computes (has a FLOP formula), and
    it neither writes into a tensor nor returns a view (keeping those would skip a side effect)."""
    if op.overloadpacket not in FLOP_FORMULAS or operator_schema(op).is_mutable:
        return False
    return not any(ret.alias_info is not None for ret in operator_schema(op).returns)


class _OpRecorder(TorchDispatchMode):
    """Records the `OpCost` of each skippable operator call of a block's forward, numbered as
    `_KeyedPolicy` numbers them (selective checkpointing sees the same calls: it skips
    `SAC_IGNORED_OPS`, which are never skippable)."""

    def __init__(self, costs: list[OpCost]) -> None:
        super().__init__()
        self.costs = costs
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:  # DTensor runs its local operations, which come back here
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in SAC_IGNORED_OPS:
            name = str(func)
            index = self.calls[name]
            self.calls[name] += 1
            if _skippable(func):
                nbytes = sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
                flops = FLOP_FORMULAS[func.overloadpacket](*args, **kwargs, out_val=out)
                self.costs.append(OpCost((name, index), nbytes, int(flops)))
        return out


class RecomputePolicy:
    """What each block keeps for backward (block name -> `Keep`), read at each forward. With
    `profile` set, blocks that keep only their inputs record their operators' costs in
    `profiles` (block name -> `OpCost`s of its last forward). `recompute_context`, when set, makes
    the context each recomputed forward runs in: the rerun happens inside backward, where the
    torch-function modes the first forward ran under are not active (chunked states find their
    parameters through one, `trainers.memory.chunks.access`)."""

    def __init__(self, keep: Mapping[str, Keep], profile: bool = False) -> None:
        for name, choice in keep.items():
            if not isinstance(choice, frozenset) and choice not in ("all", "inputs", "matmuls"):
                raise ValueError(f"block {name!r}: keep must be 'all', 'inputs', 'matmuls' or a frozenset of "
                                 f"operator keys; got {choice!r}")
        self.keep = dict(keep)
        self.profile = profile
        self.profiles: dict[str, list[OpCost]] = {}
        self.recompute_context: Callable[[], AbstractContextManager] | None = None

    def run(self, name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)`, the forward of block `name`, keeping what the policy says."""
        keep = self.keep[name]
        if keep == "all":
            return function(*args, **kwargs)
        if keep == "matmuls":
            context_fn = partial(create_selective_checkpoint_contexts, _matmul_policy)
        elif isinstance(keep, frozenset):
            context_fn = partial(_keyed_contexts, keep)
        elif self.profile:
            costs = self.profiles[name] = []
            context_fn = lambda: (_OpRecorder(costs), nullcontext())  # noqa: E731
        else:
            context_fn = None
        if self.recompute_context is not None:
            context_fn = partial(_recomputed_in, context_fn or (lambda: (nullcontext(), nullcontext())),
                                 self.recompute_context)
        extra = {} if context_fn is None else {"context_fn": context_fn}
        return checkpoint(function, *args, use_reentrant=False, preserve_rng_state=True, **extra, **kwargs)


def _keyed_contexts(saved: frozenset) -> tuple[AbstractContextManager, AbstractContextManager]:
    """Selective-checkpoint contexts keeping the calls of `saved`, with a fresh count of calls (a
    module-level function: torch.compile takes a checkpoint's context_fn only as a function or a
    partial of one)."""
    return create_selective_checkpoint_contexts(_KeyedPolicy(saved))


def _recomputed_in(context_fn: Callable[[], tuple[AbstractContextManager, AbstractContextManager]],
                   outer: Callable[[], AbstractContextManager]) -> tuple[AbstractContextManager, AbstractContextManager]:
    """`context_fn`'s forward and recompute contexts, the recompute one inside `outer()`."""
    forward, recompute = context_fn()
    return forward, _nested(outer(), recompute)


@contextmanager
def _nested(outer: AbstractContextManager, inner: AbstractContextManager) -> Iterator[None]:
    with outer, inner:
        yield


class _BlockRun:
    """`checkpoint_fn` of one block's wrapper: its forward through the policy."""

    def __init__(self, policy: RecomputePolicy, name: str) -> None:
        self.policy, self.name = policy, name

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.policy.run(self.name, function, *args, **kwargs)


def apply_recompute(model: nn.Module, policy: RecomputePolicy, names: Iterable[str] | None = None) -> None:
    """Wrap each block of `names` (default: every block the policy names) so that its forward runs
    through the policy (state-dict keys unchanged)."""
    for name in policy.keep if names is None else names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, checkpoint_wrapper(getattr(parent, child), checkpoint_fn=_BlockRun(policy, name)))


def uniform_keep(block_names: Iterable[str], recompute: str) -> dict[str, Keep]:
    """Every block's `Keep` under `Strategy.recompute` ("none", "blocks" or "selective")."""
    keep = {"none": "all", "blocks": "inputs", "selective": "matmuls"}[recompute]
    return dict.fromkeys(block_names, keep)


def choose_saved_ops(profiles: Mapping[str, list[OpCost]], capacity: int, resolution: int = 2048) -> dict[str, frozenset]:
    """Per block, the operator calls whose outputs to keep so that the FLOPs recompute skips are
    largest while the kept bytes stay within `capacity`: a 0/1 knapsack over every block's calls,
    solved exactly by dynamic programming over bytes rounded up to capacity / `resolution`."""
    items = [(block, cost) for block, costs in profiles.items() for cost in costs if cost.flops > 0]
    chosen: dict[str, set[OpKey]] = {block: set() for block in profiles}
    if capacity <= 0 or not items:
        return {block: frozenset(keys) for block, keys in chosen.items()}
    unit = max(1, -(-capacity // resolution))
    slots = capacity // unit
    best = np.zeros(slots + 1)
    taken = np.zeros((len(items), slots + 1), dtype=bool)
    for index, (_, cost) in enumerate(items):
        weight = -(-cost.bytes // unit)
        if weight > slots:
            continue
        candidate = np.full(slots + 1, -1.0)
        candidate[weight:] = best[: slots + 1 - weight] + cost.flops
        taken[index] = candidate > best
        best = np.maximum(best, candidate)
    room = slots
    for index in range(len(items) - 1, -1, -1):
        if taken[index, room]:
            block, cost = items[index]
            chosen[block].add(cost.key)
            room -= -(-cost.bytes // unit)
    return {block: frozenset(keys) for block, keys in chosen.items()}


def recompute_units(model: nn.Module) -> list[str]:
    """The modules a recompute policy decides for, without pipeline parallelism: the blocks of the
    model's plan, then the other units its plan names for recompute."""
    plan = model_plan(model)
    return plan.block_names(model) + resolve(model, plan.recompute, "recompute")


WRAPPER_PREFIX = "_checkpoint_wrapped_module."
"""What the recompute wrapper (`checkpoint_wrapper`) puts before the names of a wrapped module's tensors."""


def clean_fqn(name: str) -> str:
    """Parameter name without the recompute wrapper's prefix, as in the model's state dict."""
    return name.replace(WRAPPER_PREFIX, "")
