"""Run a pipeline schedule: this rank's `Action`s over its stages, with the carries and their
gradients moved between ranks by `PipelineLink`.

Each forward keeps its stage's input and output carries until the matching backward. The last
stage's backward starts from the micro batch's loss times `loss_factor` (the loss scale over the
step's micro batch count), so gradients accumulate exactly as the one-process trainer's do. A
zero-bubble schedule's "I" pass computes only the input carry's gradients (torch's
`stage_backward_input`, which also keeps what the weight pass needs) and its "W" pass the
parameters'; on the first stage, whose input needs no gradient, "I" does
nothing and "W" runs the whole backward. The weight pass is one backward over the stage's
parameters (`trainers.pipeline.weight_pass`).

Data parallelism is switched around each action by `trainers.pipeline.sharding`.

Why not torch.distributed.pipelining's `PipelineStage` and schedule classes: a `PipelineStage`
fixes its carries' shapes at the first micro batch it runs and sizes every later transfer by them,
so carries whose shapes change from micro batch to micro batch (utterances or sentences padded to
each micro batch's own length) cannot pass; a later step of another length fails in the transport
(`tests/distributed/test_pipeline.py::test_torchs_pipeline_stage_cannot_take_carries_whose_shapes_change`).
torch's schedule classes run only such stages (they call its private set-up methods). Here each
carry travels with its shapes (`trainers.pipeline.comm`), and the schedules torch's classes
implement (GPipe, 1F1B, interleaved 1F1B, looped BFS, ZB-H1) are lists of `Action`s
(`trainers.pipeline.schedules`); the zero-bubble passes use torch's own split backward.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from trainers.pipeline.comm import PipelineLink, differentiable
from trainers.pipeline.schedules import Action, stage_rank
from trainers.pipeline.sharding import StageSharding
from trainers.pipeline.stage import StageModule
from trainers.pipeline.weight_pass import weight_pass
from zoo.plan import Carry
from zoo.torch_compat import stage_backward_input


GENERATOR_KEYS = ("generator.cpu", "generator.cuda")
"""Carry entries the runtime adds: torch's generator states after a stage's forward, which the
next stage continues from."""


@dataclass(frozen=True)
class GeneratorState:
    """torch's generator states (CPU, and the current GPU's on a GPU) where a micro batch's forward
    starts. The first stage starts from the state its forward would have met in one process (right
    after the batch was collated); each later stage continues from the state its predecessor left,
    which travels with the carry. So every random draw (augmentation, dropout) is the unpipelined
    run's, on any number of stages."""

    cpu: torch.Tensor
    cuda: torch.Tensor | None

    @classmethod
    def capture(cls, device: torch.device) -> GeneratorState:
        """The generator states now."""
        return cls(torch.get_rng_state(), torch.cuda.get_rng_state() if device.type == "cuda" else None)

    @classmethod
    def take_from(cls, carry: Carry) -> GeneratorState:
        """Remove and return the states a previous stage put in `carry`."""
        return cls(carry.pop(GENERATOR_KEYS[0]), carry.pop(GENERATOR_KEYS[1], None))

    def put_into(self, carry: Carry) -> Carry:
        """`carry` with these states added."""
        extra = {GENERATOR_KEYS[0]: self.cpu}
        if self.cuda is not None:
            extra[GENERATOR_KEYS[1]] = self.cuda
        return {**carry, **extra}

    def restore(self) -> None:
        """Make these the generators' states."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda)


@dataclass
class _Pending:
    """What a forward leaves for its backward."""

    inputs: list[torch.Tensor]
    """The input carry's differentiable entries (leaves)."""
    outputs: list[torch.Tensor]
    """The output carry's differentiable entries, or [scaled loss] on the last stage."""
    weight_pass: list[dict[str, Any]] | None = None
    """After a zero-bubble "I" pass: what its "W" pass needs."""
    grads: list[torch.Tensor] | None = None
    """On the first stage, the output gradients an "I" pass received for the "W" pass."""


@dataclass
class Span:
    """One action as it ran on this rank."""

    action: Action
    start: float
    """Seconds since the run began."""
    end: float
    waited: float
    """Seconds of [start, end] spent receiving its inputs (idle while the peer is not ready)."""


@dataclass
class Pipeline:
    """This rank's stages and its order of actions for a schedule."""

    stages: list[StageModule]
    """The stages on this rank, ascending."""
    orders: list[list[Action]]
    """Every pipeline rank's actions for one run (this rank's runs; the others' say in which
    order messages arrive)."""
    rank: int
    """This rank's pipeline coordinate."""
    pp: int
    """Pipeline ranks."""
    link: PipelineLink
    sharding: StageSharding
    """When each stage gathers parameters and reduces gradients."""
    timeline: list[Span] = field(default_factory=list)
    """The actions of the latest run."""
    run_began: float = 0.0
    """`time.perf_counter()` when the latest run began (the machine's monotonic clock: spans of
    ranks on one machine line up)."""

    def __post_init__(self) -> None:
        self._by_index = {stage.index: stage for stage in self.stages}
        self.num_stages = self.stages[0].num_stages
        self.order = self.orders[self.rank]
        self.link.follow(self.orders, self.pp, self.rank)

    def train(self, batches: list[Mapping[str, Any]], generators: list[GeneratorState], loss_factor: float,
              last_run: bool) -> list[torch.Tensor]:
        """Run forward and backward of `batches` (one per micro batch, its first stage starting
        from its entry of `generators`); return the detached losses on the rank of the last stage
        (empty elsewhere)."""
        pending: dict[tuple[int, int], _Pending] = {}
        losses: dict[int, torch.Tensor] = {}
        self.link.start_run()
        self.timeline = []
        began = self.run_began = time.perf_counter()
        for position, action in enumerate(self.order):
            start, waited = time.perf_counter() - began, self.link.waited
            stage = self._by_index[action.stage]
            data_parallel = isinstance(stage, FSDPModule)
            if data_parallel:
                self.sharding.before(position, action, stage, last_run)
            if action.kind == "F":
                pending[action.stage, action.micro] = self._forward(stage, action.micro, batches[action.micro],
                                                                    generators[action.micro], loss_factor, losses)
            elif self.sharding.split:
                self._split_backward(stage, action, pending)
            else:
                self._backward(stage, action, pending)
            if data_parallel:
                self.sharding.after(position, action, stage, last_run)
            self.timeline.append(Span(action, start, time.perf_counter() - began, self.link.waited - waited))
        self.link.wait_sends()
        return [losses[i] for i in sorted(losses)]

    def _forward(self, stage: StageModule, micro: int, batch: Mapping[str, Any], generator: GeneratorState,
                 loss_factor: float, losses: dict[int, torch.Tensor]) -> _Pending:
        if stage.is_first:
            carry, inputs = None, []
        else:
            carry = self.link.recv_carry("F", stage.index - 1, micro, stage_rank(stage.index - 1, self.pp))
            generator = GeneratorState.take_from(carry)
            inputs = [carry[key] for key in differentiable(carry)]
        generator.restore()
        output = stage(carry, batch)
        if stage.is_last:
            losses[micro] = output.detach()
            return _Pending(inputs, [output * loss_factor])
        sent = GeneratorState.capture(self.link.device).put_into(output)
        self.link.send_carry("F", sent, stage.index, micro, stage_rank(stage.index + 1, self.pp))
        return _Pending(inputs, [output[key] for key in differentiable(output)])

    def _output_grads(self, stage: StageModule, micro: int) -> list[torch.Tensor] | None:
        """The gradients of `stage`'s outputs for `micro`, from the next stage (None on the last)."""
        return None if stage.is_last else self.link.recv_grads(stage.index, micro, stage_rank(stage.index + 1, self.pp))

    def _backward(self, stage: StageModule, action: Action, pending: dict[tuple[int, int], _Pending]) -> None:
        saved = pending.pop((action.stage, action.micro))
        torch.autograd.backward(saved.outputs, self._output_grads(stage, action.micro))
        self._send_input_grads(stage, action.micro, saved.inputs)

    def _split_backward(self, stage: StageModule, action: Action, pending: dict[tuple[int, int], _Pending]) -> None:
        key = (action.stage, action.micro)
        saved = pending[key]
        if action.kind == "I":
            grads = self._output_grads(stage, action.micro)
            if stage.is_first:
                saved.grads = grads  # the "W" pass runs the whole backward
                return
            _, saved.weight_pass = stage_backward_input(saved.outputs, grads, saved.inputs, _trainable(stage))
            self._send_input_grads(stage, action.micro, saved.inputs)
        else:  # "W"
            if stage.is_first:
                torch.autograd.backward(saved.outputs, saved.grads)
            else:
                weight_pass(_trainable(stage), saved.weight_pass)
            del pending[key]

    def _send_input_grads(self, stage: StageModule, micro: int, inputs: list[torch.Tensor]) -> None:
        if stage.is_first:
            return
        grads = [x.grad if x.grad is not None else torch.zeros_like(x) for x in inputs]
        self.link.send_grads(grads, stage.index, micro, stage_rank(stage.index - 1, self.pp))

    @torch.no_grad()
    def evaluate(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The loss of one batch, run through every stage in turn, on every pipeline rank."""
        loss = torch.zeros((), dtype=torch.float32, device=self.link.device)
        for stage in self.stages:
            carry = None if stage.is_first else self.link.recv_carry("E", stage.index - 1, 0,
                                                                     stage_rank(stage.index - 1, self.pp))
            output = stage(carry, batch)
            if stage.is_last:
                loss = output.detach().float()
            else:
                self.link.send_carry("E", output, stage.index, 0, stage_rank(stage.index + 1, self.pp))
        self.link.wait_sends()
        return self.from_last_stage(loss)

    def from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as the rank of the last stage holds it (a loss), on every pipeline rank."""
        return self.link.broadcast(tensor, stage_rank(self.num_stages - 1, self.pp))


def _trainable(stage: nn.Module) -> list[nn.Parameter]:
    """The stage's parameters that take a gradient: the split backward's passes refuse a frozen one
    (a model's post-training readout, requires_grad False)."""
    return [param for param in stage.parameters() if param.requires_grad]
