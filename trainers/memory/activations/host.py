"""Activation swapping to host memory (Harmony; ZeRO-Infinity's activation offload on a GPU):
tensors on the compute device that autograd saves for backward, of at least `min_bytes`, are copied
to host memory as forward saves them and copied back ahead of their use in backward, so that the
device holds a step's activations only while they are in use.

Pack (forward, `saved_tensors_hooks`): the tensor's travelling region
(`trainers.memory.activations.saved.travelling_region`) is copied into a host buffer, pinned on a
GPU (torch's caching host allocator, which keeps a buffer from reuse until the copies that use it
end). On a GPU the copy runs on a side stream after the compute stream's work so far, beside the
computation that follows; the device memory is recorded on the side stream, so that the caching
allocator reuses it only once the copy has read it, and nothing else holds it back.

Unpack (backward): the tensor comes back into a new device buffer, on the side stream, and the
compute stream waits for that copy only where it uses the tensor; reads ahead follow the step's
order of packs (`trainers.memory.activations.saved`), so the copies up of the next tensors backward
needs travel while it computes. The host buffer is released once its tensor is back.

Off a GPU the device is host memory itself, and the host buffers are a second pool of host memory
beside it (the stand-in of `trainers.memory.chunks.device`'s device tier): the copies run where they
are made, and the buffers are not among the step's tensors that a tracker counts on the device
(`trainers.memory.tensor_peak`), as pinned memory is not on a GPU.

torch's `torch.autograd.graph.save_on_cpu` does not serve: it copies every saved tensor, parameters
and inputs as well as activations, and however small, on the compute stream itself, and brings each
back only where backward uses it (tests/trainers/test_host_swap.py shows the copied parameter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from trainers.memory.activations.saved import SavedTensorSwap, Swapped, travelling_region
from zoo.torch_compat import disable_current_modes

PROBE_BYTES = 16 << 20
"""Bytes of the buffer that measures a round trip to host memory."""


@dataclass(eq=False, kw_only=True)
class HostTensor(Swapped):
    """A saved tensor in host memory."""

    host: torch.Tensor | None
    """Its elements, one-dimensional (None once brought back)."""
    read: tuple[torch.Tensor, torch.cuda.Event | None] | None = field(default=None, repr=False)
    """A read ahead under way: the device buffer and the event that marks the copy's end (None off a GPU)."""


class HostSwap(SavedTensorSwap):
    """Saved tensors on `device` of at least `min_bytes` to host memory and back; on a GPU the copies
    run on a side stream (`stream`)."""

    def __init__(self, device: torch.device, min_bytes: int) -> None:
        super().__init__(min_bytes, device.type)
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        """The side stream of the copies (None off a GPU: they run where they are made)."""

    def seconds_per_byte(self) -> float:
        """Seconds per byte copied to host memory and back, measured on `PROBE_BYTES`."""
        with disable_current_modes():
            tensor = torch.ones(PROBE_BYTES, dtype=torch.uint8, device=self.device)
            self._synchronize()
            started = time.perf_counter()
            host = self._copy_down(tensor)
            back, _ = self._copy_up(host, torch.uint8, PROBE_BYTES)
            self._synchronize()
            elapsed = time.perf_counter() - started
        del back
        return elapsed / PROBE_BYTES

    def pack(self, tensor: torch.Tensor) -> torch.Tensor | HostTensor:
        """`tensor` as autograd keeps it: itself, or a record of its copy in host memory."""
        if not self.swaps(tensor):
            return tensor
        tensor = tensor.detach()
        region, stride = travelling_region(tensor)
        swapped = HostTensor(index=self._next_index(), shape=tuple(tensor.shape), stride=stride, dtype=tensor.dtype,
                             nbytes=tensor.nbytes, host=self._copy_down(region))
        self._packed(swapped)
        return swapped

    def unpack(self, saved: torch.Tensor | HostTensor) -> torch.Tensor:
        """The tensor that `pack` returned `saved` for, on the device."""
        if not isinstance(saved, HostTensor):
            return saved
        ahead = saved.read is not None
        if ahead:
            (buffer, event), saved.read = saved.read, None
        else:
            buffer, event = self._copy_up(saved.host, saved.dtype, saved.nbytes // saved.dtype.itemsize)
            saved.host = None
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            buffer.record_stream(current)
        self._used(saved, ahead)
        return buffer.as_strided(saved.shape, saved.stride)

    def _can_read(self, swapped: HostTensor) -> bool:
        return swapped.read is None and swapped.host is not None

    def _start_read(self, swapped: HostTensor) -> None:
        swapped.read = self._copy_up(swapped.host, swapped.dtype, swapped.nbytes // swapped.dtype.itemsize)
        swapped.host = None

    def _copy_down(self, region: torch.Tensor) -> torch.Tensor:
        """A host copy of the one-dimensional `region` (its copy under way on the side stream, on a GPU)."""
        with disable_current_modes():  # host memory: not one of the step's device tensors
            host = torch.empty(region.shape, dtype=region.dtype, pin_memory=self.stream is not None)
            if self.stream is None:
                host.copy_(region)
                return host
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # region's producers
            with torch.cuda.stream(self.stream):
                host.copy_(region, non_blocking=True)
            region.record_stream(self.stream)
        return host

    def _copy_up(self, host: torch.Tensor, dtype: torch.dtype, numel: int
                 ) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A device buffer of `numel` `dtype` elements and the event that marks the end of its copy
        from `host` (None off a GPU, where the copy has ended)."""
        buffer = torch.empty(numel, dtype=dtype, device=self.device)  # one of the step's tensors (a tracker counts it)
        with disable_current_modes():
            if self.stream is None:
                buffer.copy_(host)
                return buffer, None
            # The side stream waits for the compute stream's work so far: its own copy down of `host`
            # came before on the side stream, and `buffer`'s memory may have been freed by that work.
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                buffer.copy_(host, non_blocking=True)
            buffer.record_stream(self.stream)
            event = torch.cuda.Event()
            event.record(self.stream)
        return buffer, event

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
