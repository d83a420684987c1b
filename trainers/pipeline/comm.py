"""Point-to-point transfer of carries and their gradients between pipeline ranks.

A carry (`zoo.plan.Carry`) may change shape from micro batch to micro batch (padded batches of
another length), so each forward message starts with a fixed-size header giving the carry's keys,
dtypes, shapes and which entries need gradients. Gradient messages need no header: the receiver
sent the matching carry and knows its shapes.

Messages between two ranks are received in the order they were sent (NCCL matches point-to-point
messages by order alone): given every rank's schedule (`follow`), the receiver knows that order,
and a message it needs later than one sent before it waits in a buffer. Tags, which gloo matches
on, name each message's pass, stage and micro batch too.

Sends are asynchronous, and a sent tensor must live until its send completes. Keeping every one
to the end of the run would hold a carry per micro batch (gloo calls a send complete only once it
is waited on), so the schedule says when waiting costs nothing: a message from a peer, sent by an
action the peer runs after the one that consumed ours, proves ours arrived.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from trainers.pipeline.schedules import Action, stage_rank
from zoo.plan import Carry

Message = tuple[str, int, int]
"""(kind "F" or "B", the sending stage, micro batch) of a training run's message."""

HEADER_INTS = 512
"""int64 entries of a forward message's header."""
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
           torch.uint8, torch.int8, torch.int16]
_MESSAGE_KINDS = ("F", "B", "E")
"""Forward activations, backward gradients, evaluation activations."""
_PARTS = 64
"""Tag slots per message: the header and up to 63 tensors."""


def message_tag(kind: str, stage: int, micro: int, part: int, num_stages: int) -> int:
    """Tag of part `part` (0: header) of the `kind` message of `stage` (its sender) for `micro`."""
    return ((micro * num_stages + stage) * len(_MESSAGE_KINDS) + _MESSAGE_KINDS.index(kind)) * _PARTS + part


def _encode_header(carry: Carry) -> torch.Tensor:
    header = [len(carry)]
    for key, value in carry.items():
        if value.dtype not in _DTYPES:
            raise TypeError(f"carry entry {key!r} has dtype {value.dtype}, which pipeline stages cannot send")
        name = list(key.encode())
        header += [len(name), *name, _DTYPES.index(value.dtype), int(value.requires_grad), value.ndim, *value.shape]
    if len(header) > HEADER_INTS or len(carry) >= _PARTS:
        raise ValueError(f"a carry of {len(carry)} entries ({list(carry)}) does not fit a pipeline message header")
    return torch.tensor(header + [0] * (HEADER_INTS - len(header)), dtype=torch.int64)


def _decode_header(header: list[int]) -> list[tuple[str, torch.dtype, bool, list[int]]]:
    entries, at = [], 1
    for _ in range(header[0]):
        length = header[at]
        name = bytes(header[at + 1: at + 1 + length]).decode()
        at += 1 + length
        dtype, needs_grad, ndim = _DTYPES[header[at]], bool(header[at + 1]), header[at + 2]
        entries.append((name, dtype, needs_grad, header[at + 3: at + 3 + ndim]))
        at += 3 + ndim
    return entries


def differentiable(carry: Carry) -> list[str]:
    """Keys of the carry entries that gradients flow back through."""
    return [key for key, value in carry.items() if value.requires_grad]


class PipelineLink:
    """Send and receive over the pipeline process group `group` (global ranks resolved from its
    group ranks) for a pipeline of `num_stages` stages."""

    def __init__(self, group: dist.ProcessGroup, num_stages: int, device: torch.device) -> None:
        self.group, self.num_stages, self.device = group, num_stages, device
        self._sends: list[tuple[dist.Work, torch.Tensor, Message | None, int]] = []
        self._schedule: dict[int, list[Message]] = {}
        self._sent_at: dict[Message, int] = {}
        self._consumed_at: dict[Message, int] = {}
        self._expected: dict[int, list[Message]] = {}
        self._arrived: dict[Message, Carry | list[torch.Tensor]] = {}
        self._sent_shapes: dict[tuple[int, int], list[tuple[torch.Size, torch.dtype]]] = {}
        self.waited = 0.0
        """Seconds spent in receives so far (waiting for a peer, then copying)."""

    def _peer(self, group_rank: int) -> int:
        return dist.get_global_rank(self.group, group_rank)

    def _send(self, tensor: torch.Tensor, peer: int, tag: int, message: Message | None) -> None:
        tensor = tensor.detach().contiguous()
        self._sends.append((dist.isend(tensor, self._peer(peer), group=self.group, tag=tag), tensor, message, peer))

    def _recv(self, tensor: torch.Tensor, peer: int, tag: int) -> torch.Tensor:
        started = time.perf_counter()
        dist.recv(tensor, self._peer(peer), group=self.group, tag=tag)
        self.waited += time.perf_counter() - started
        return tensor

    def follow(self, orders: list[list[Action]], pp: int, rank: int) -> None:
        """Learn the schedule (every pipeline rank's actions; this one is `rank`): which messages
        arrive from whom in which order, and when each peer sends and consumes each message."""
        schedule: dict[int, list[Message]] = {}
        for sender, order in enumerate(orders):
            for position, (kind, stage, micro) in enumerate(order):
                if kind == "F" and stage < self.num_stages - 1:
                    message, receiver = ("F", stage, micro), stage_rank(stage + 1, pp)
                elif kind in ("B", "I") and stage > 0:
                    message, receiver = ("B", stage, micro), stage_rank(stage - 1, pp)
                else:
                    continue
                self._sent_at[message] = position
                if receiver == rank:
                    schedule.setdefault(sender, []).append(message)
            for position, (kind, stage, micro) in enumerate(order):
                if kind == "F" and stage > 0:
                    self._consumed_at[("F", stage - 1, micro)] = position
                elif kind in ("B", "I") and stage < self.num_stages - 1:
                    self._consumed_at[("B", stage + 1, micro)] = position
        self._schedule = schedule

    def start_run(self) -> None:
        """Expect the messages of one run of the schedule `follow` learnt."""
        if any(self._expected.values()) or self._arrived:
            raise RuntimeError("a pipeline run left messages unreceived")
        self._expected = {peer: list(messages) for peer, messages in self._schedule.items()}

    def _receive(self, key: Message, peer: int) -> Carry | list[torch.Tensor]:
        """Message `key` from `peer`, receiving (and keeping) the ones it sent before it first."""
        queue = self._expected.get(peer)
        if not queue:  # evaluation: one message at a time, in stage order on both sides
            return self._read(key, peer)
        while key not in self._arrived:
            if not queue:
                raise RuntimeError(f"pipeline rank {peer} sends no message {key} in this run's schedule")
            head = queue.pop(0)
            self._arrived[head] = self._read(head, peer)
            self._release_consumed_before(peer, self._sent_at[head])
        return self._arrived.pop(key)

    def _release_consumed_before(self, peer: int, position: int) -> None:
        """Wait for (at once: they have arrived) and drop the sends to `peer` whose messages it
        consumed before running the action at `position` of its order."""
        kept = []
        for work, tensor, message, to in self._sends:
            if to == peer and message is not None and self._consumed_at.get(message, position) < position:
                work.wait()
            else:
                kept.append((work, tensor, message, to))
        self._sends = kept

    def _read(self, key: Message, peer: int) -> Carry | list[torch.Tensor]:
        kind, stage, micro = key
        tag = message_tag(kind, stage, micro, 0, self.num_stages)
        if kind == "B":  # gradients of what this rank sent stage `stage` for `micro`
            shapes = self._sent_shapes.pop((stage - 1, micro))
            return [self._recv(torch.empty(shape, dtype=dtype, device=self.device), peer, tag + part)
                    for part, (shape, dtype) in enumerate(shapes, start=1)]
        header = self._recv(torch.empty(HEADER_INTS, dtype=torch.int64, device=self.device), peer, tag)
        carry = {}
        for part, (name, dtype, needs_grad, shape) in enumerate(_decode_header(header.tolist()), start=1):
            value = self._recv(torch.empty(shape, dtype=dtype, device=self.device), peer, tag + part)
            carry[name] = value.requires_grad_(needs_grad)
        return carry

    def send_carry(self, kind: str, carry: Carry, stage: int, micro: int, peer: int) -> None:
        """Send `carry`, the output of `stage` for `micro`, to pipeline rank `peer`."""
        if kind == "F":
            self._sent_shapes[stage, micro] = [(carry[key].shape, carry[key].dtype) for key in differentiable(carry)]
        tag = message_tag(kind, stage, micro, 0, self.num_stages)
        message = (kind, stage, micro) if kind == "F" else None
        self._send(_encode_header(carry).to(self.device), peer, tag, message)
        for part, value in enumerate(carry.values(), start=1):
            self._send(value, peer, tag + part, message)

    def recv_carry(self, kind: str, stage: int, micro: int, peer: int) -> Carry:
        """Receive the carry `stage` sent for `micro` from pipeline rank `peer`; entries that
        needed gradients there are leaves that need gradients here."""
        return self._receive((kind, stage, micro), peer)

    def send_grads(self, grads: list[torch.Tensor], stage: int, micro: int, peer: int) -> None:
        """Send the gradients of the differentiable entries of `stage`'s input carry for `micro`."""
        tag = message_tag("B", stage, micro, 0, self.num_stages)
        for part, grad in enumerate(grads, start=1):
            self._send(grad, peer, tag + part, ("B", stage, micro))

    def recv_grads(self, stage: int, micro: int, peer: int) -> list[torch.Tensor]:
        """Receive the gradients of the differentiable entries `stage` sent for `micro`, sent
        back by stage + 1 on pipeline rank `peer`."""
        return self._receive(("B", stage + 1, micro), peer)

    def broadcast(self, tensor: torch.Tensor, source: int) -> torch.Tensor:
        """Broadcast `tensor` from pipeline rank `source` to every pipeline rank, in place."""
        dist.broadcast(tensor, self._peer(source), group=self.group)
        return tensor

    def wait_sends(self) -> None:
        """Wait until every send posted so far has left."""
        for work, *_ in self._sends:
            work.wait()
        self._sends.clear()
