"""Gradients in gradient chunks: accumulated as autograd computes them (the parameter's own `.grad`
is freed at once), averaged over the data-parallel ranks chunk by chunk, their norms taken.

The collectives follow one order on every rank, whatever each rank's data did: gradient chunk c
is reduced only after chunks N-1 .. c+1 (backward reaches the chunks from the last), as soon as
the last micro batch has brought the gradients of all its parameters, or else when backward ends,
when every chunk not reduced yet is (as DDP reduces its buckets in a fixed order; a chunk that got
no gradient on a rank reduces its zeros). Then one all-reduce of each parameter's "received a
gradient" flag tells every rank which parameters any rank trained, so that the owner updates every
parameter that received a gradient anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from trainers.memory.chunks.ownership import ChunkOwnership
from trainers.memory.chunks.parameters import ChunkedParameters
from trainers.memory.chunks.residency import ChunkResidency
from trainers.memory.chunks.store import ChunkKey


class ChunkGradients:
    """The gradient chunks of `parameters`, kept in `residency`, reduced over `ownership`'s group."""

    def __init__(self, parameters: ChunkedParameters, residency: ChunkResidency, ownership: ChunkOwnership) -> None:
        self.parameters, self.residency, self.ownership = parameters, residency, ownership
        chunks = len(parameters.chunk_members)
        self.has_grad = [False] * len(parameters.members)
        """Whether each parameter received a gradient this step (on any rank, once backward ended)."""
        self._received = [0] * chunks
        self._last_micro_batch = True
        self._next = chunks - 1
        """The chunk the next reduction is of: every chunk above it has been reduced this step."""
        self._ready = [False] * chunks
        self._held: ChunkKey | None = None
        """The gradient chunk accumulated into last, kept pinned until another one is."""
        self._norm_squares: list[torch.Tensor] = []
        for index, member in enumerate(parameters.members):
            member.param.register_hook(self._before_accumulation(index))
            member.param.register_post_accumulate_grad_hook(self._accumulated)

    def begin_micro_batch(self, last: bool) -> None:
        """A micro batch's backward follows; `last`: the step's last (its gradients complete the chunks)."""
        self.release()
        self._last_micro_batch = last
        self._received = [0] * len(self._received)

    def _before_accumulation(self, index: int) -> Callable[[torch.Tensor], None]:
        keys = frozenset([("param", self.parameters.members[index].chunk)])

        def bring_parameter(grad: torch.Tensor) -> None:  # autograd accumulates into the parameter's shape
            self.residency.pin(keys)
            self.residency.unpin(keys)
        return bring_parameter

    @torch.no_grad()
    def _accumulated(self, param: nn.Parameter) -> None:
        index = self.parameters.index[id(param)]
        member, residency = self.parameters.members[index], self.residency
        residency.busy = True
        grad, param.grad = param.grad, None
        residency.busy = False
        key = ("grad", member.chunk)
        if key != self._held:  # backward reaches a chunk's tensors one after another
            self.release()
            residency.pin(frozenset([key]))
            self._held = key
        residency.busy = True
        try:
            member.view(residency.compute_memory[key]).add_(grad)
            residency.changed(key)
            self.has_grad[index] = True
            if self._last_micro_batch:
                self._received[member.chunk] += 1
                if self._received[member.chunk] == len(self.parameters.chunk_members[member.chunk]):
                    self._ready[member.chunk] = True
                    self._reduce_ready()
        finally:
            residency.busy = False

    def _reduce_ready(self) -> None:
        """Reduce the chunks from `_next` down while they are ready (the order every rank follows)."""
        while self._next >= 0 and self._ready[self._next]:
            key = ("grad", self._next)
            if key == self._held:  # in memory, pinned
                self._reduce(self._next)
            else:
                with self.residency.holding(frozenset([key])):
                    self._reduce(self._next)
            self._next -= 1

    def release(self) -> None:
        """Unpin the gradient chunk that the last accumulation kept in memory."""
        if self._held is not None:
            self.residency.unpin([self._held])
            self._held = None

    def _reduce(self, chunk: int) -> None:
        """Chunk `chunk`'s gradients are final: average them over the ranks (on its owner, when
        sharded: the others drop theirs) and take their norms."""
        ownership, residency = self.ownership, self.residency
        key = ("grad", chunk)
        buffer = residency.compute_memory[key]
        if ownership.world > 1:
            if ownership.sharded:
                dist.reduce(buffer, group=ownership.group, group_dst=ownership.owners[chunk])
                if not ownership.owns(chunk):
                    residency.drop(key)
                    return
            else:
                dist.all_reduce(buffer, group=ownership.group)
            buffer.div_(ownership.world)
            residency.changed(key)  # the file, if any, holds this rank's own gradients
        grads = [self.parameters.members[i].view(buffer) for i in self.parameters.chunk_members[chunk]]
        self._norm_squares.append(torch.stack(torch._foreach_norm(grads, 2.0)).double().pow(2).sum())

    @torch.no_grad()
    def finish_backward(self) -> float:
        """After the last micro batch's backward: the global gradient norm. The chunks not reduced
        yet are reduced here, in the same order on every rank, then which parameters received a
        gradient on any rank is agreed (for the update)."""
        self.release()
        ownership, received, members = self.ownership, self.has_grad, self.parameters.chunk_members
        for chunk in range(self._next, -1, -1):  # alone, a rank skips the chunks it has no gradients in
            if ownership.world > 1 or any(received[i] for i in members[chunk]):
                with self.residency.holding(frozenset([("grad", chunk)])):
                    self._reduce(chunk)
        self._next = -1
        if ownership.world > 1:
            anywhere = torch.tensor(received, dtype=torch.int32, device=self.parameters.device)
            dist.all_reduce(anywhere, op=dist.ReduceOp.MAX, group=ownership.group)
            self.has_grad = [bool(flag) for flag in anywhere.tolist()]
        total = (torch.stack(self._norm_squares).sum() if self._norm_squares
                 else torch.zeros((), dtype=torch.float64, device=self.parameters.device))
        self._norm_squares = []
        if ownership.sharded:
            dist.all_reduce(total, group=ownership.group)
        return math.sqrt(total.item())

    def discard(self) -> None:
        """Drop every gradient chunk (a skipped step, or after the update) and start the next step's order."""
        for chunk in range(len(self._ready)):
            self.residency.drop(("grad", chunk))
        self.has_grad = [False] * len(self.has_grad)
        self._ready = [False] * len(self._ready)
        self._next = len(self._ready) - 1
        self._norm_squares = []
