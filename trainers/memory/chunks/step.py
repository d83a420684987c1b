"""One training step with the model states in chunks (`trainers.memory.chunks.states`): forward and
backward of the step's micro batches, the global gradient norm, and the AdamW update chunk by chunk;
and the chunk traffic the step caused, for its record."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from trainers.memory.chunks.states import ChunkedStates
from trainers.state.gradients import clip_factor

log = logging.getLogger("trainers")
DEVICE_RERUNS = 2
"""Times a step runs again after its forward or backward ran out of device memory."""


def traffic_counters(chunks: ChunkedStates) -> dict[str, int]:
    """The chunk store's, the activation swap's and the device tier's running byte and event counts,
    by the name a step's record gives their growth over the step."""
    store, swap, device = chunks.store, chunks.swap, chunks.device
    counters = {"offload_read_bytes": store.bytes_read, "offload_written_bytes": store.bytes_written,
                "offload_read_ahead_bytes": store.bytes_prefetched}
    if swap is not None:
        counters["swapped_activation_bytes"] = swap.bytes_written
    if device is not None:
        counters.update(device_up_bytes=device.bytes_up, device_down_bytes=device.bytes_down,
                        device_up_ahead_bytes=device.bytes_ahead, device_updated_chunks=chunks.updates_on_device,
                        host_updated_chunks=chunks.updates_on_host, device_allocated_chunks=device.allocations,
                        device_out_of_memory_retries=device.out_of_memory_retries)
    return counters


def chunked_step(chunks: ChunkedStates, model: nn.Module, step: int,
                 forward_backward: Callable[[Iterator[Any]], tuple[torch.Tensor, int]],
                 make_batches: Callable[[], Iterator[Any]], lr: float, grad_clip: float
                 ) -> tuple[torch.Tensor, int, float, bool, dict[str, int]]:
    """Optimizer step `step` (0-based): `forward_backward(batches)` over `make_batches()` (the step's
    micro batches, drawn afresh for a rerun) returns the sum of their losses and the input_ids they
    held; then the update at `lr` with the gradients clipped to `grad_clip`, unless their norm is
    not finite. A step whose forward or backward runs out of device memory runs again from its first
    micro batch, with more of the device budget left to the allocator, up to `DEVICE_RERUNS` times
    (where `ChunkedStates.can_rerun_step`). Returns (loss sum, input_ids, gradient norm, whether the
    update was taken, the step's record of reruns and traffic)."""
    before = traffic_counters(chunks)
    batches = make_batches()
    for rerun in itertools.count():
        backward_done = False
        try:
            with chunks.step_region():
                loss_sum, units = forward_backward(batches)
                grad_norm = chunks.finish_backward()
                backward_done = True
                take_step = math.isfinite(grad_norm)
                if take_step:
                    chunks.step(lr, clip_factor(grad_norm, grad_clip))
                else:
                    chunks.discard_gradients()
            break
        except torch.OutOfMemoryError:
            if backward_done or rerun == DEVICE_RERUNS or not chunks.can_rerun_step():
                raise
        # Out of the `except` clause: the failed pass's tensors, which its traceback held, are freed.
        for param in model.parameters():
            param.grad = None
        chunks.prepare_rerun()
        log.warning("step %d ran out of device memory; running it again with %s bytes of the device budget left "
                    "to the allocator", step + 1, f"{chunks.allocator_slack:,}")
        batches = make_batches()
    after = traffic_counters(chunks)
    record = {"device_step_reruns": rerun, **{name: after[name] - count for name, count in before.items()}}
    return loss_sum, units, grad_norm, take_step, record
