"""Memory accounting: what each rank really holds, measured (the ZeRO paper's prediction is
`trainers.estimate.zero`).

Measurements come from torch's `MemTracker`, a dispatch-mode tracker that follows every live
tensor's storage and files it under parameters, gradients, optimizer state, activations (created
in forward), temporaries (created in backward) or other. On a GPU the CUDA allocator's peak is
reported beside it.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from zoo.torch_compat import CategoryTracker, clear_cublas_workspaces

_CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Activation": "activations",
    "Temp": "temporaries",
    "Optstate": "optimizer",
    "Other": "other",
}


@dataclass
class RankMemory:
    """Bytes one rank held during one measured training step, summed over its devices."""

    rank: int
    """Global rank."""
    parameters: int
    """Parameter storage at rest (after the optimizer step)."""
    gradients: int
    """Gradient storage after backward, before the optimizer step."""
    optimizer: int
    """Optimizer state at rest (AdamW moments and step counters)."""
    other: int
    """Other long-lived tensors: the fp32 CPU master copies under offload="optimizer", the anchors
    of `TrainConfig.anchor_decay`."""
    activation_peak: int
    """Activations and backward temporaries alive at the step's peak."""
    peak: int
    """All tracked bytes at the step's peak."""
    by_device: dict[str, dict[str, int]]
    """The same categories at the peak, per device ("cpu", "cuda:0")."""
    cuda_max_allocated: int | None
    """`torch.cuda.max_memory_allocated` over the step; None without a GPU."""

    @property
    def model_states(self) -> int:
        """Parameters + gradients + optimizer state (+ offloaded master copies and anchors): the ZeRO
        paper's "model states"."""
        return self.parameters + self.gradients + self.optimizer + self.other


def _by_category(snapshot: dict[Any, dict[Any, int]]) -> dict[str, dict[str, int]]:
    return {
        str(device): {_CATEGORIES[str(getattr(key, "value", key))]: value for key, value in stats.items() if key != "Total"}
        for device, stats in snapshot.items()
    }


def _total(per_device: dict[str, dict[str, int]], *categories: str) -> int:
    return sum(stats.get(category, 0) for stats in per_device.values() for category in categories)


class StepMemoryProbe(AbstractContextManager):
    """Measure one training step. Use as a context around the step and call `after_backward()`
    between backward and the optimizer step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, extra: Iterable[torch.Tensor],
                 device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.tracker = CategoryTracker()
        self.tracker.track_external(model, *([optimizer] if optimizer is not None else []), *extra)
        self.gradients = 0

    def __enter__(self) -> "StepMemoryProbe":
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.tracker.__enter__()
        return self

    def after_backward(self) -> None:
        """Record the gradient bytes held now."""
        self.gradients = _total(_by_category(self.tracker.get_tracker_snapshot("current")), "gradients")

    def __exit__(self, *exc: Any) -> None:
        self.tracker.__exit__(*exc)

    def report(self, rank: int) -> RankMemory:
        """The measurement, once the step has finished."""
        current = _by_category(self.tracker.get_tracker_snapshot("current"))
        peak = _by_category(self.tracker.get_tracker_snapshot("peak"))
        return RankMemory(
            rank=rank,
            parameters=_total(current, "parameters"),
            gradients=self.gradients,
            optimizer=_total(current, "optimizer"),
            other=_total(current, "other"),
            activation_peak=_total(peak, "activations", "temporaries"),
            peak=sum(sum(stats.values()) for stats in peak.values()),
            by_device=peak,
            cuda_max_allocated=torch.cuda.max_memory_allocated() if self.cuda else None,
        )


def gather_reports(report: RankMemory) -> list[dict[str, Any]]:
    """Every rank's report, in rank order, on every rank."""
    reports: list[dict[str, Any]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(reports, asdict(report))
    return reports


def live_tensor_bytes() -> dict[str, int]:
    """Bytes of every tensor storage the garbage collector can reach now, each storage counted
    once, by device. A census that needs no tracker installed beforehand, so it measures any
    framework's state at rest (e.g. DeepSpeed's flat partitions) with the same instrument."""
    gc.collect()
    storages: dict[tuple[str, int], int] = {}
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):  # type(), not isinstance: no __class__ lookups
            continue
        tensor = obj.to_local() if isinstance(obj, DTensor) else obj
        if tensor.is_meta or tensor.layout != torch.strided:
            continue
        storage = tensor.untyped_storage()
        key = (str(storage.device), storage.data_ptr())
        storages[key] = max(storages.get(key, 0), storage.nbytes())
    totals: dict[str, int] = defaultdict(int)
    for (device, _), nbytes in storages.items():
        totals[device] += nbytes
    return dict(totals)


def cuda_workspace_bytes(device: torch.device, dtype: torch.dtype) -> int:
    """Bytes that a training step's matrix products hold in the CUDA caching allocator beside
    their tensors: cuBLAS keeps a workspace per thread and stream, allocated at its first product
    and kept (the forward runs on this thread, the backward on autograd's device thread). A step's
    `torch.cuda.max_memory_allocated` counts them, a trace of its tensors does not: on the H200 it
    stood 65 to 83 MiB above the traced peak in all 24 cases of `benchmarks/memory_estimate.py`, and
    this function measured 65.0 MiB there in float32 and bfloat16. Measured: the workspaces are
    released, a linear layer in `dtype` runs forward and backward, and what the allocator still
    holds once its tensors are gone is theirs."""
    torch.cuda.synchronize(device)
    clear_cublas_workspaces()
    before = torch.cuda.memory_allocated(device)
    weight = torch.ones(64, 64, device=device, dtype=dtype, requires_grad=True)
    bias = torch.zeros(64, device=device, dtype=dtype, requires_grad=True)
    inputs = torch.ones(8, 64, device=device, dtype=dtype, requires_grad=True)
    nn.functional.linear(inputs, weight, bias).sum().backward()
    del weight, bias, inputs  # and their gradients
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device) - before


