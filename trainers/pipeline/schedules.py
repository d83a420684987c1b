"""Pipeline schedules: the order in which each pipeline rank runs its stages' passes.

A schedule is, for every pipeline rank, a list of `Action`s: the forward ("F"), backward ("B"),
or, split as zero-bubble schedules do, input-gradient ("I") and weight-gradient ("W") pass of one
stage on one micro batch. The runtime (`trainers.pipeline.runtime`) runs each rank's list in order
and waits only for the activations or gradients an action needs, so any list that respects each
micro batch's dependencies runs; `simulate` checks that it cannot deadlock and times it with unit
costs, which gives each schedule's ideal bubble.

Stage s of pp * v lives on pipeline rank s % pp (the looping placement of interleaved 1F1B and
breadth-first pipelines; with v = 1, stage s is rank s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

PASS_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
"""Unit costs of the passes for `simulate`: a backward is two forwards (input and weight gradients)."""


class Action(NamedTuple):
    """One pass of one stage on one micro batch."""

    kind: str
    """"F" forward, "B" backward, "I" input-gradient half of a backward, "W" its weight-gradient half."""
    stage: int
    """Global stage index, 0 .. pp * stages_per_rank - 1."""
    micro: int
    """Micro batch index within the pipeline run."""


def stage_rank(stage: int, pp: int) -> int:
    """Pipeline rank that holds `stage` (looping placement)."""
    return stage % pp


def schedule_orders(name: str, pp: int, stages_per_rank: int, microbatches: int) -> list[list[Action]]:
    """Each pipeline rank's actions for schedule `name` (a `trainers.strategy.PipelineSchedule`)."""
    check_schedule(name, pp, stages_per_rank, microbatches)
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved_1f1b": _interleaved, "looped_bfs": _looped_bfs,
             "zero_bubble": _zero_bubble}[name]
    return [build(rank, pp, stages_per_rank, microbatches) for rank in range(pp)]


def check_schedule(name: str, pp: int, stages_per_rank: int, microbatches: int) -> None:
    """ValueError naming the field when `name` cannot run `microbatches` on this layout."""
    if name == "interleaved_1f1b" and microbatches % pp:
        raise ValueError(f"Strategy.pp_schedule='interleaved_1f1b' runs micro batches in rounds of pp={pp}, so "
                         f"Strategy.microbatches must be a multiple of {pp}; got {microbatches}")
    if name not in ("interleaved_1f1b", "looped_bfs") and stages_per_rank != 1:
        raise ValueError(f"Strategy.pp_schedule={name!r} runs one stage per rank; got stages_per_rank={stages_per_rank}")


def _gpipe(rank: int, pp: int, v: int, m: int) -> list[Action]:
    return [Action("F", rank, i) for i in range(m)] + [Action("B", rank, i) for i in range(m)]


def _one_f_one_b(rank: int, pp: int, v: int, m: int) -> list[Action]:
    warmup = min(pp - rank - 1, m)
    order = [Action("F", rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [Action("F", rank, warmup + i), Action("B", rank, i)]
    return order + [Action("B", rank, i) for i in range(m - warmup, m)]


def _interleaved(rank: int, pp: int, v: int, m: int) -> list[Action]:
    """Megatron's interleaved 1F1B: micro batches in rounds of pp go through this rank's stages in
    turn; warm-up long enough that the first backward's inputs have arrived."""
    total = m * v

    def forward(k: int) -> Action:
        chunk, micro = (k // pp) % v, (k // (pp * v)) * pp + k % pp
        return Action("F", chunk * pp + rank, micro)

    def backward(k: int) -> Action:
        chunk, micro = v - 1 - (k // pp) % v, (k // (pp * v)) * pp + k % pp
        return Action("B", chunk * pp + rank, micro)

    warmup = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    return order + [backward(k) for k in range(total - warmup, total)]


def _looped_bfs(rank: int, pp: int, v: int, m: int) -> list[Action]:
    """Breadth-first: every micro batch through one local stage before the next stage."""
    stages = [chunk * pp + rank for chunk in range(v)]
    forwards = [Action("F", s, i) for s in stages for i in range(m)]
    return forwards + [Action("B", s, i) for s in reversed(stages) for i in range(m)]


def _zero_bubble(rank: int, pp: int, v: int, m: int) -> list[Action]:
    """ZB-H1 (Qi et al. 2023): 1F1B's order with each backward split, its input-gradient pass in
    the backward's place (the critical path) and its weight pass deferred by `rank` passes, so the
    later ranks, which feed every gradient upstream, send first and fill the cool-down with weight
    passes. At most pp micro batches wait between forward and weight pass on any rank (1F1B's
    peak); at unit costs the run takes 3m + p - 1 passes for m >= p, against 1F1B's 3m + 3(p - 1)."""
    warmup = min(pp - rank - 1, m)
    order = [Action("F", rank, i) for i in range(warmup)]
    deferred: list[int] = []
    for i in range(m):
        if warmup + i < m:
            order.append(Action("F", rank, warmup + i))
        order.append(Action("I", rank, i))
        deferred.append(i)
        if len(deferred) > rank:
            order.append(Action("W", rank, deferred.pop(0)))
    return order + [Action("W", rank, i) for i in deferred]


def _needs(action: Action, num_stages: int) -> list[Action]:
    """The actions whose results `action` consumes."""
    kind, stage, micro = action
    if kind == "F":
        return [Action("F", stage - 1, micro)] if stage > 0 else []
    if kind == "W":
        return [Action("I", stage, micro)]
    later = [] if stage == num_stages - 1 else [Action("B", stage + 1, micro), Action("I", stage + 1, micro)]
    return [Action("F", stage, micro), *later]


def _ready_at(action: Action, num_stages: int, done: dict[Action, float]) -> float:
    """When the inputs of `action` are all there, given when each action `done` ended (inf while
    one is missing). A backward needs the next stage's "B" or "I": whichever that schedule runs."""
    needs = _needs(action, num_stages)
    forward = [done.get(a, float("inf")) for a in needs if a.kind == "F"]
    gradient = [done[a] for a in needs if a.kind != "F" and a in done]
    if len(needs) > len(forward) and not gradient:
        return float("inf")
    return max([*forward, *gradient], default=0.0)


@dataclass(frozen=True)
class Timeline:
    """Unit-cost run of a schedule: when each action starts and ends, per rank."""

    spans: list[list[tuple[Action, float, float]]]
    """Per pipeline rank, (action, start, end) in the order run."""

    @property
    def makespan(self) -> float:
        """Time from the first start to the last end."""
        return max(end for rank in self.spans for _, _, end in rank)

    def bubble(self) -> float:
        """Mean over ranks of the idle fraction of the makespan."""
        busy = [sum(end - start for _, start, end in rank) for rank in self.spans]
        return sum(1 - b / self.makespan for b in busy) / len(busy)


def simulate(orders: list[list[Action]], stages_per_rank: int, costs: dict[str, float] | None = None) -> Timeline:
    """Run `orders` with each pass taking its `costs` (default `PASS_COSTS`) and communication
    free; ValueError if they deadlock or a micro batch's passes are missing or repeated."""
    costs = costs or PASS_COSTS
    pp = len(orders)
    num_stages = pp * stages_per_rank
    seen = [a for order in orders for a in order]
    if len(set(seen)) != len(seen):
        raise ValueError("a schedule runs some action twice")
    done: dict[Action, float] = {}
    position, clock = [0] * pp, [0.0] * pp
    spans: list[list[tuple[Action, float, float]]] = [[] for _ in range(pp)]
    progressed = True
    while progressed:
        progressed = False
        for rank in range(pp):
            while position[rank] < len(orders[rank]):
                action = orders[rank][position[rank]]
                if stage_rank(action.stage, pp) != rank:
                    raise ValueError(f"{action} is scheduled on pipeline rank {rank}, not its stage's rank")
                ready = _ready_at(action, num_stages, done)
                if ready == float("inf"):
                    break
                start = max(clock[rank], ready)
                end = start + costs[action.kind]
                spans[rank].append((action, start, end))
                done[action], clock[rank] = end, end
                position[rank] += 1
                progressed = True
    if any(position[rank] < len(orders[rank]) for rank in range(pp)):
        stuck = [orders[rank][position[rank]] for rank in range(pp) if position[rank] < len(orders[rank])]
        raise ValueError(f"the schedule deadlocks: ranks wait on {stuck}")
    return Timeline(spans)


def in_flight(order: list[Action]) -> int:
    """The most micro batches (of any stage) whose forward has run on a rank following `order`
    and whose backward (weight pass, where split) has not: how many sets of stage activations it
    holds at once."""
    held = most = 0
    for kind, _, _ in order:
        held += {"F": 1, "B": -1, "W": -1}.get(kind, 0)
        most = max(most, held)
    return most


def analytic_bubble(name: str, pp: int, stages_per_rank: int, microbatches: int) -> float:
    """The textbook bubble fraction at equal forward, input-gradient and weight-gradient costs:
    (p - 1) / (m + p - 1) for GPipe and 1F1B, (p - 1) / (v m + p - 1) with v stages per rank for
    interleaved and breadth-first, and ZB-H1's (p - 1) / (3m + p - 1) for zero-bubble (idle time
    (p - 1)(F + I - W), a third of 1F1B's; m >= p)."""
    if name == "zero_bubble":
        return (pp - 1) / (3 * microbatches + pp - 1)
    rounds = microbatches * (stages_per_rank if name in ("interleaved_1f1b", "looped_bfs") else 1)
    return (pp - 1) / (rounds + pp - 1)
