"""AdamW over a parallelised model, with CPU offload of the step, and a decoupled decay of chosen
parameters toward anchor weights (`TrainConfig.anchor_decay`).

The parameters may be plain tensors or FSDP2 / tensor-parallel DTensors; AdamW (torch's fused
kernel) runs on each rank's local tensors, so gradients and states are never gathered and the
update goes through no DTensor dispatch. Under ZeRO 1-3 the parameters are FSDP2's shards, so the
optimizer state is sharded with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from trainers.memory.chunks.checkpoint import ChunkedTensor
from trainers.memory.recompute import clean_fqn
from trainers.parallel.mesh import local_tensor
from trainers.config import TrainConfig

ADAMW_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")
@dataclass
class _Slot:
    fqn: str
    param: nn.Parameter
    work: torch.Tensor
    """The plain tensor AdamW updates: the parameter (a DTensor's local tensor, sharing its storage),
    or its fp32 CPU master copy when offloaded."""


def check_parameter_prefixes(model: nn.Module, config: TrainConfig, chunked: bool) -> None:
    """Refuse `config.lr_scales` and `config.anchor_decay` where they cannot hold: a prefix that names
    no trainable parameter of `model` (a typo would silently train otherwise), or chunked states
    (`chunked`), whose update runs a whole chunk at one learning rate and keeps no anchors."""
    names = [clean_fqn(name) for name, p in model.named_parameters() if p.requires_grad]
    for setting in ("lr_scales", "anchor_decay"):
        prefixes = getattr(config, setting)
        if not prefixes:
            continue
        if chunked:
            raise ValueError(f"TrainConfig.{setting} treats parameters apart, but Strategy(offload='chunks') updates a "
                             f"whole chunk at one learning rate; got {setting}={prefixes!r} with offload='chunks'")
        unmatched = [prefix for prefix in prefixes if not any(name.startswith(prefix) for name in names)]
        if unmatched:
            tops = sorted({name.split(".")[0] + "." for name in names})
            raise ValueError(f"TrainConfig.{setting} prefixes {unmatched} start no trainable parameter name of "
                             f"{type(model).__name__} (its top-level names: {', '.join(tops)})")


class TrainOptimizer:
    """AdamW with decoupled weight decay on matrices, driven by the `Trainer`.

    offload: each rank keeps an fp32 master copy of its local parameter shard on the CPU, AdamW
        runs there on a CPU copy of the gradient, and the result is copied back to the device.
    AdamW is torch's fused kernel (on CPU too), element for element what chunked states run.
    anchor: reference values of parameters under `config.anchor_decay`, full tensors by name; an
        anchored parameter missing from it is anchored at its value now. After each update each rank
        moves its piece of an anchored parameter lr x lr_scale x decay of the way back to the
        anchor's piece, which it keeps (one more copy of the parameters it owns and anchors).
    """

    def __init__(self, model: nn.Module, config: TrainConfig, *, offload: bool,
                 anchor: dict[str, torch.Tensor] | None = None) -> None:
        named = [(clean_fqn(name), p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"model {type(model).__name__} has no trainable parameters")
        self.offload = offload
        self.slots = [_Slot(fqn, p, self._master_copy(p) if offload else self._local_leaf(p)) for fqn, p in named]
        # One group per (weight decay, learning-rate scale): matrices decay, and TrainConfig.lr_scales
        # sets each parameter's share of the schedule's learning rate.
        grouped: dict[tuple[float, float], list[torch.Tensor]] = {}
        for slot in self.slots:
            decay = config.weight_decay if slot.param.ndim >= 2 else 0.0
            grouped.setdefault((decay, config.lr_scale(slot.fqn)), []).append(slot.work)
        groups = [{"params": works, "weight_decay": decay, "lr_scale": scale}
                  for (decay, scale), works in grouped.items()]
        # Fused: one kernel over all tensors of a group on CPU as on GPU, the arithmetic chunked
        # states run too.
        self.inner = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=True)
        self.anchored = self._anchors(config, anchor or {})
        """(work tensor, its anchor's piece, decay x lr_scale) of each anchored parameter."""

    def _anchors(self, config: TrainConfig, anchor: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        names = {slot.fqn for slot in self.slots if config.anchor_strength(slot.fqn)}
        stray = sorted(set(anchor) - names)
        if stray:
            raise ValueError(f"TrainOptimizer anchor names parameters TrainConfig.anchor_decay does not anchor "
                             f"(anchor_decay={config.anchor_decay!r}): {stray[:5]}")
        anchored = []
        for slot in self.slots:
            decay = config.anchor_strength(slot.fqn) * config.lr_scale(slot.fqn)
            if not decay:
                continue
            if config.lr * decay > 1:
                raise ValueError(f"TrainConfig.anchor_decay moves {slot.fqn!r} lr x lr_scale x decay = "
                                 f"{config.lr * decay:g} of the way to its anchor a step; expected at most 1")
            anchored.append((slot.work, self._anchor_piece(slot, anchor.get(slot.fqn)), decay))
        return anchored

    @staticmethod
    def _anchor_piece(slot: _Slot, full: torch.Tensor | None) -> torch.Tensor:
        """This rank's piece of `slot`'s anchor (its current value when `full` is None), laid out as
        its work tensor (on the CPU in fp32 when offloaded)."""
        param = slot.param
        if full is None:
            return slot.work.detach().clone()
        if full.shape != param.shape:
            raise ValueError(f"TrainOptimizer anchor[{slot.fqn!r}] has shape {tuple(full.shape)}; the parameter "
                             f"has {tuple(param.shape)}")
        if isinstance(param, DTensor):  # every rank holds the whole anchor: each keeps its own piece
            full = distribute_tensor(full.to(param.device, param.dtype), param.device_mesh, param.placements,
                                     src_data_rank=None).to_local()
        return full.detach().to(slot.work.device, slot.work.dtype, copy=True)

    @staticmethod
    def _local_leaf(param: nn.Parameter) -> torch.Tensor:
        """`param` itself, or for a DTensor its local tensor as a leaf of its own (the same storage,
        pointed at it again before each step)."""
        return local_tensor(param).detach() if isinstance(param, DTensor) else param

    @staticmethod
    def _master_copy(param: nn.Parameter) -> torch.Tensor:
        return local_tensor(param).detach().to("cpu", torch.float32, copy=True)

    def kept_tensors(self) -> list[torch.Tensor]:
        """What this rank keeps beside the model and `inner`'s state: its fp32 CPU masters under
        offload and its anchors' pieces (for memory probes, which file them as "other")."""
        masters = [slot.work for slot in self.slots if self.offload]
        return masters + [anchor for _, anchor, _ in self.anchored]

    @property
    def params(self) -> list[nn.Parameter]:
        """Every trainable parameter of the model, for gradient clipping."""
        return [s.param for s in self.slots]

    @torch.no_grad()
    def step(self, lr: float) -> None:
        """One AdamW update at learning rate `lr` (times each parameter's `TrainConfig.lr_scale`) from
        the parameters' current gradients."""
        self._local_step(lr)

    def _local_step(self, lr: float) -> None:
        for group in self.inner.param_groups:
            group["lr"] = lr * group["lr_scale"]
        separate = [slot for slot in self.slots if slot.work is not slot.param]  # masters, local tensors
        for slot in separate:
            if not self.offload:  # FSDP2 may give a parameter a new local tensor (at its lazy init)
                slot.work.set_(local_tensor(slot.param))
            grad = slot.param.grad
            slot.work.grad = None if grad is None else local_tensor(grad).to(slot.work.device, slot.work.dtype)
        self.inner.step()
        for work, anchor, decay in self.anchored:
            work.lerp_(anchor, lr * decay)
        for slot in separate:
            if self.offload:
                local_tensor(slot.param).copy_(slot.work)
            slot.work.grad = None

    def zero_grad(self) -> None:
        """Free every gradient (set to None)."""
        for slot in self.slots:
            slot.param.grad = None

    # Checkpoints hold state in one layout whatever the strategy: keyed by parameter name, each
    # tensor as large as the parameter (a DTensor where the parameter is sharded), so torch's
    # distributed checkpoint can reshard it onto any other stage or world size.
    def _export(self, slot: _Slot, key: str, value: torch.Tensor) -> torch.Tensor:
        if key == "step":
            return value
        param = slot.param
        if not isinstance(param, DTensor):
            return value
        return DTensor.from_local(value, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())

    def _import(self, slot: _Slot, key: str, value: torch.Tensor) -> torch.Tensor:
        if key == "step":  # the fused kernel reads it where the tensor it updates is
            return value.to(slot.work.device, torch.float32)
        return local_tensor(value)

    def checkpoint_state(self, model: nn.Module) -> tuple[dict[str, Any], dict[str, ChunkedTensor]]:
        """What a checkpoint of `model` (the module this optimizer steps) holds, {"model",
        "optimizer"} (`trainers.state.checkpoint`); every tensor is in it (none to reach elsewhere)."""
        return {"model": get_model_state_dict(model), "optimizer": self.state_dict()}, {}

    def restore_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> None:
        """After a checkpoint was loaded into `checkpoint_state`'s dict: the model's tensors, then the
        optimizer state (whose offloaded masters are copied from the loaded parameters)."""
        set_model_state_dict(model, state["model"])
        self.load_state_dict(state["optimizer"])

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """{parameter name: {"step", "exp_avg", "exp_avg_sq"}}, each as large as its parameter;
        zero-filled entries before the first step, so the dict is also a loading template."""
        state = {}
        for slot in self.slots:
            current = self.inner.state.get(slot.work) or {
                "step": torch.zeros((), dtype=torch.float32),
                "exp_avg": torch.zeros_like(slot.work),
                "exp_avg_sq": torch.zeros_like(slot.work),
            }
            state[slot.fqn] = {key: self._export(slot, key, current[key]) for key in ADAMW_STATE_KEYS}
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Install state produced by `state_dict()` (possibly under another strategy, via DCP).

        Call it after the model's parameters are loaded: under offload the fp32 CPU masters are
        copied afresh from them (parameters are fp32 at every precision, so the copy is exact);
        stale masters would overwrite the loaded weights at the next step."""
        for slot in self.slots:
            if slot.fqn not in state:
                raise ValueError(f"optimizer state has no entry for parameter {slot.fqn!r}")
            if self.offload:
                slot.work.copy_(local_tensor(slot.param))
            self.inner.state[slot.work] = {key: self._import(slot, key, state[slot.fqn][key]) for key in ADAMW_STATE_KEYS}
