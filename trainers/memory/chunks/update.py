"""AdamW over chunked model states: each chunk this rank owns updated where its parameters are, by
torch's fused AdamW (one kernel per weight-decay group of the chunk).

On a GPU (or with a device budget; `trainers.memory.chunks.device`) the update of a chunk runs on
the device when its parameters are there and the placement leaves room for its gradients and
moments beside them (after the first step), its gradients and moments copied up; in host memory
otherwise, its gradients copied down; so that no chunk goes down and up again just for the update.
"""

from __future__ import annotations

import torch
from torch.optim.adamw import adamw

from trainers.config import TrainConfig
from trainers.memory.chunks.gradients import ChunkGradients
from trainers.memory.chunks.ownership import ChunkOwnership
from trainers.memory.chunks.parameters import ChunkedParameters
from trainers.memory.chunks.residency import ChunkResidency

KINDS = ("param", "grad", "exp_avg", "exp_avg_sq")
"""The chunk lists, one layout for all: parameters, gradients, AdamW's two moments."""


class ChunkAdamW:
    """AdamW with `config`'s hyper-parameters over `parameters`' chunks that `ownership` gives this rank."""

    def __init__(self, config: TrainConfig, parameters: ChunkedParameters, residency: ChunkResidency,
                 ownership: ChunkOwnership, gradients: ChunkGradients) -> None:
        self.config, self.parameters, self.residency = config, parameters, residency
        self.ownership, self.gradients = ownership, gradients
        self.steps = [0] * len(parameters.members)
        """AdamW steps taken by each parameter."""
        self.updates_on_device = 0
        """Chunk updates run on the device so far (under a device tier)."""
        self.updates_on_host = 0
        """Chunk updates run in host memory so far."""

    @torch.no_grad()
    def step(self, lr: float, grad_factor: float) -> None:
        """One update of every chunk this rank owns at learning rate `lr`, of the parameters that
        received a gradient, the gradients first multiplied by `grad_factor` (clipping)."""
        has_grad = self.gradients.has_grad
        with self.ownership.gathering_off():
            for chunk, members in enumerate(self.parameters.chunk_members):
                updated = [i for i in members if has_grad[i]]
                if updated and self.ownership.owns(chunk):
                    self._update(chunk, updated, lr, grad_factor)

    def _update(self, chunk: int, updated: list[int], lr: float, grad_factor: float) -> None:
        config, residency, members = self.config, self.residency, self.parameters.members
        keys = frozenset((kind, chunk) for kind in KINDS)
        device, placement = residency.device, residency.placement
        on_device = (device is not None and placement.planned and ("param", chunk) in device.memory
                     and sum(map(residency.nbytes, keys)) <= placement.current_capacity(device=True))
        if on_device:
            self.updates_on_device += 1
        else:
            self.updates_on_host += 1
        with residency.holding(keys, host=not on_device) as chunks:
            param, grad, exp_avg, exp_avg_sq = (chunks[(kind, chunk)] for kind in KINDS)
            if grad_factor != 1.0:
                grad.mul_(grad_factor)
            for decay in (True, False):  # one fused kernel per weight-decay group of the chunk
                group = [index for index in updated if members[index].decay == decay]
                if not group:
                    continue
                views = [[members[index].view(buffer) for index in group]
                         for buffer in (param, grad, exp_avg, exp_avg_sq)]
                # one copy to the device for the group's steps (a tensor each would be a copy, and a wait, each)
                steps = list(torch.tensor([float(self.steps[index]) for index in group], device=param.device).unbind())
                adamw(*views, [], steps, fused=True, amsgrad=False, beta1=config.betas[0], beta2=config.betas[1],
                      lr=lr, weight_decay=config.weight_decay if decay else 0.0, eps=config.eps, maximize=False)
                for index in group:
                    self.steps[index] += 1
            for kind in ("param", "exp_avg", "exp_avg_sq"):
                residency.changed((kind, chunk))
