"""What each block does with the activations it saves for backward, under chunked model states:
keep them in memory, swap them (to files from host memory: `trainers.memory.activations.swap`; to
host memory from the device: `trainers.memory.activations.host`), or recompute them from its input
(`trainers.memory.recompute`).

Set by hand (`Strategy.block_activations`) or chosen under a budget (`Strategy.activation_memory`):
a probe forward before the first step measures, per block, the bytes of the tensors it saves and
the seconds its forward takes, and the swap measures its seconds per byte swapped and brought back.
Blocks keep their activations while they fit the budget, those that would cost most per byte to
lose first; every other block swaps them when swapping and bringing them back takes less time than
rerunning its forward, else recomputes. The rule charges a swap its whole transfer time, although
the transfers run beside the computation (a background thread, a side stream), so it leans towards
recompute.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from trainers.memory.activations.saved import SavedTensorSwap
from trainers.memory.recompute import RecomputePolicy, recompute_units, uniform_keep
from zoo.plan import model_plan

Choice = Literal["keep", "swap", "recompute"]
CHOICES = ("keep", "swap", "recompute")
log = logging.getLogger("trainers")


@dataclass(frozen=True)
class BlockCost:
    """What a block's saved activations weigh and what losing them costs."""

    name: str
    saved_bytes: int
    """Bytes of the tensors its forward saves for backward (parameters not counted)."""
    forward_seconds: float
    """Seconds its forward takes: what recompute adds in backward."""

    def swap_seconds(self, seconds_per_byte: float) -> float:
        """Seconds to swap its saved tensors away and bring them back."""
        return self.saved_bytes * seconds_per_byte


def choose_block_activations(costs: list[BlockCost], room: int, seconds_per_byte: float) -> dict[str, Choice]:
    """Each block's choice: "keep" while the kept blocks' saved bytes fit `room`, the blocks whose
    loss would cost most time per byte first; then "swap" where swapping away and back (at
    `seconds_per_byte`) is faster than the forward, else "recompute"."""
    def lost_seconds(cost: BlockCost) -> float:
        return min(cost.forward_seconds, cost.swap_seconds(seconds_per_byte))

    plan: dict[str, Choice] = {}
    used = 0
    for cost in sorted(costs, key=lambda cost: lost_seconds(cost) / max(cost.saved_bytes, 1), reverse=True):
        if used + cost.saved_bytes <= room:
            plan[cost.name] = "keep"
            used += cost.saved_bytes
        elif cost.swap_seconds(seconds_per_byte) < cost.forward_seconds:
            plan[cost.name] = "swap"
        else:
            plan[cost.name] = "recompute"
    return {cost.name: plan[cost.name] for cost in costs}


def parse_block_activations(entries: tuple[str, ...], blocks: list[str]) -> dict[str, Choice]:
    """Strategy.block_activations ("NAME=CHOICE" each) as a plan; ValueError unless it gives every
    block of `blocks` one of `CHOICES`, once, and names no other."""
    plan: dict[str, Choice] = {}
    for entry in entries:
        name, _, choice = entry.partition("=")
        plan[name] = choice
    unknown, missing = sorted(set(plan) - set(blocks)), [name for name in blocks if name not in plan]
    if unknown or missing or len(plan) != len(entries):
        raise ValueError(f"Strategy.block_activations must give each block of the model ({', '.join(blocks)}) one of "
                         f"{', '.join(CHOICES)}, once; got {list(entries)}")
    return plan


def chunked_recompute_policy(model: nn.Module, recompute: str, per_block: bool) -> RecomputePolicy | None:
    """The recompute policy of `model` under chunked model states (which set how recomputed forwards
    run): with `per_block` activation plans, every recompute unit keeping all it saves until a plan
    is applied; else `recompute` (Strategy.recompute) for every unit; None when nothing is
    recomputed. ValueError for a per-block plan of a model that declares no blocks."""
    if not model_plan(model).block_names(model):
        if per_block:
            raise ValueError(f"Strategy.activation_memory and Strategy.block_activations choose per block, but "
                             f"{type(model).__name__} declares none (define parallel_plan() returning zoo.plan.ModelPlan)")
        return None
    if not per_block and recompute == "none":
        return None
    return RecomputePolicy(uniform_keep(recompute_units(model), "none" if per_block else recompute))


def apply_block_activations(model: nn.Module, plan: Mapping[str, Choice], policy: RecomputePolicy,
                            swap: SavedTensorSwap) -> None:
    """Make each block of `plan` do its choice from its next forward on: `policy` recomputes the
    "recompute" blocks from their inputs and keeps everything the others save; `swap` swaps only
    while a "swap" block's forward runs."""
    swap.enabled = False
    for name, choice in plan.items():
        policy.keep[name] = "inputs" if choice == "recompute" else "all"
        if choice == "swap":
            block = model.get_submodule(name)
            block.register_forward_pre_hook(lambda module, args: setattr(swap, "enabled", True))
            block.register_forward_hook(lambda module, args, output: setattr(swap, "enabled", False), always_call=True)


def measure_blocks(model: nn.Module, blocks: list[str], forward: Callable[[], object],
                   is_parameter: Callable[[torch.Tensor], bool]) -> list[BlockCost]:
    """Run `forward` (the model on one micro batch, gradients on; never backward) and measure each
    block of `blocks`: the bytes autograd saves inside it (not the tensors `is_parameter` names)
    and its forward's seconds. Nothing saved inside a block is kept, so the blocks hold no more
    than a forward without autograd; what is saved outside them is kept, for a loss that takes
    gradients within its forward (the sample-wise transducer loss through its joiner). The random
    state is put back afterwards, so that training draws as if the probe had not run."""
    saved = dict.fromkeys(blocks, 0)
    seconds = dict.fromkeys(blocks, 0.0)
    running: list[str] = []
    started: dict[str, float] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor | None:  # the probe never runs the blocks' backward
        if not running:
            return tensor
        if not is_parameter(tensor):
            saved[running[-1]] += tensor.nbytes
        return None

    def enter(name: str):
        def hook(module, args) -> None:
            running.append(name)
            started[name] = time.perf_counter()
        return hook

    def leave(name: str):
        def hook(module, args, output) -> None:
            seconds[name] += time.perf_counter() - started[name]
            running.pop()
        return hook

    handles = [handle for name in blocks for handle in (
        model.get_submodule(name).register_forward_pre_hook(enter(name)),
        model.get_submodule(name).register_forward_hook(leave(name)))]
    try:
        with _random_state_kept(), torch.autograd.graph.saved_tensors_hooks(pack, lambda nothing: nothing):
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return [BlockCost(name, saved[name], seconds[name]) for name in blocks]


class BlockActivations:
    """The per-block activation plan of `model`'s `blocks` under chunked model states: `policy`
    recomputes and `swap` swaps for the blocks that choose so; the choices are set by hand (`apply`)
    or measured and chosen before the first step (`choose`), the same on every rank. `announce`:
    log what is chosen (rank 0)."""

    def __init__(self, model: nn.Module, blocks: list[str], policy: RecomputePolicy, swap: SavedTensorSwap,
                 announce: bool) -> None:
        self.model, self.blocks, self.policy, self.swap, self.announce = model, blocks, policy, swap, announce
        self.choices: dict[str, Choice] | None = None
        """Each block's choice, once made."""
        self.costs: list[BlockCost] | None = None
        """What `choose` measured of each block (rank 0's)."""

    def apply(self, choices: dict[str, Choice]) -> None:
        apply_block_activations(self.model, choices, self.policy, self.swap)
        self.choices = choices
        if self.announce:
            counts = {choice: sum(1 for chosen in choices.values() if chosen == choice) for choice in CHOICES}
            log.info("blocks' activations: %s", ", ".join(f"{count} {choice}" for choice, count in counts.items()))

    def choose(self, forward: Callable[[], object], is_parameter: Callable[[torch.Tensor], bool], room: int,
               group: dist.ProcessGroup) -> None:
        """Measure the blocks on `forward` (one micro batch's loss) and the swap's transfers, choose
        under `room` bytes and apply rank 0's choice on every rank of `group` (collective)."""
        costs = measure_blocks(self.model, self.blocks, forward, is_parameter)
        seconds_per_byte = self.swap.seconds_per_byte()
        shared = [costs, choose_block_activations(costs, room, seconds_per_byte), seconds_per_byte]
        dist.broadcast_object_list(shared, group=group, group_src=0)
        self.costs, choices, seconds_per_byte = shared
        if self.announce:
            log.info("blocks measured (saved MiB, forward ms): %s; swap %.2f s/GiB away and back",
                     ", ".join(f"{c.name} {c.saved_bytes / 2**20:.1f} {c.forward_seconds * 1e3:.1f}"
                               for c in self.costs), seconds_per_byte * 2**30)
        self.apply(choices)


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

