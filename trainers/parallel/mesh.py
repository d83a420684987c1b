"""Process group and device mesh set-up. Multi-process launch is torchrun's job, never ours."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from zoo.torch_compat import unflatten_mesh

Item = TypeVar("Item")
Result = TypeVar("Result")


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of `tensor`: the local shard of a DTensor, else the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in the job."""

    rank: int
    """Global rank of this process."""
    world_size: int
    """Number of processes."""
    device: torch.device
    """Compute device of this rank (cuda:LOCAL_RANK when a GPU is present, else cpu)."""
    mesh: DeviceMesh
    """The job's device mesh, dimensions ("pp", "dp", "tp"): pipeline ranks, data-parallel
    replicas or ZeRO shards, tensor-parallel ranks. Rank r sits at tp = r % tp, dp = r // tp % dp,
    pp = r // (tp * dp): a tensor-parallel group is consecutive ranks (one node's)."""
    expert_mesh: DeviceMesh | None = None
    """Under expert parallelism (Strategy.ep > 1), the same ranks with "dp" split in two,
    ("pp", "edp", "ep", "tp"): data-parallel rank d sits at ep = d % ep, edp = d // ep, so an
    expert-parallel group is ep consecutive data-parallel ranks, and "edp" joins the ranks that
    hold the same experts. A sibling of `mesh` (one root), as FSDP2 needs for parameters sharded
    over "ep" and "edp". None without expert parallelism."""

    @property
    def dp_rank(self) -> int:
        """Coordinate of this rank along "dp": which share of each global batch it runs."""
        return self.mesh["dp"].get_local_rank()

    @property
    def dp_size(self) -> int:
        """Number of data-parallel replicas (world size / (tp * pp))."""
        return self.mesh["dp"].size()

    @property
    def pp_rank(self) -> int:
        """Coordinate of this rank along "pp": which pipeline stages it runs."""
        return self.mesh["pp"].get_local_rank()

    @property
    def pp_size(self) -> int:
        """Number of pipeline ranks."""
        return self.mesh["pp"].size()

    @property
    def tp_size(self) -> int:
        """Number of ranks that split each layer."""
        return self.mesh["tp"].size()

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that logs and writes single-writer files."""
        return self.rank == 0


def use_cuda() -> bool:
    """Whether ranks compute on GPUs: when one is present, unless MEMZOO_DEVICE=cpu."""
    wanted = os.environ.get("MEMZOO_DEVICE", "auto")
    if wanted not in ("auto", "cpu", "cuda"):
        raise ValueError(f"MEMZOO_DEVICE must be 'auto', 'cpu' or 'cuda'; got {wanted!r}")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ValueError("MEMZOO_DEVICE='cuda' but torch sees no GPU")
    return wanted != "cpu" and torch.cuda.is_available()


def setup_distributed(tp: int = 1, pp: int = 1, ep: int = 1) -> DistEnv:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR...), or form a
    one-process group when run as plain `python`, so that one code path serves both; `tp` ranks
    form each tensor-parallel group of the mesh, `pp` ranks each pipeline, `ep` data-parallel
    ranks each expert-parallel group."""
    cuda = use_cuda()
    if not dist.is_initialized():
        # gloo carries the collectives of CPU-resident (offloaded) state; NCCL those on the GPU.
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    world_size = dist.get_world_size()
    if world_size % (tp * pp):
        degrees = f"Strategy.tp={tp}" if pp == 1 else f"Strategy.pp * Strategy.tp = {pp} * {tp}"
        raise ValueError(f"{degrees} must divide the number of ranks; got {world_size} ranks")
    dp = world_size // (tp * pp)
    if dp % ep:
        raise ValueError(f"Strategy.ep={ep} must divide the data-parallel ranks (world size / (tp * pp) = "
                         f"{world_size} / ({tp} * {pp}) = {dp})")
    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    experts = unflatten_mesh(mesh, "dp", (dp // ep, ep), ("edp", "ep")) if ep > 1 else None
    return DistEnv(rank=dist.get_rank(), world_size=world_size, device=device, mesh=mesh, expert_mesh=experts)


def from_main_rank(value: Any) -> Any:
    """Rank 0's `value` (any picklable object) on every rank; collective. `value` itself outside a
    process group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def map_over_ranks(function: Callable[[Item], Result], items: Sequence[Item]) -> list[Result]:
    """[function(item) for item in items] with the items shared out over the ranks (item i on rank
    i mod world size) and every result gathered on every rank, in order; collective, and every rank
    must pass the same items. List them costliest first for an even share. A plain map outside a
    process group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [function(item) for item in items]
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [function(item) for item in items[rank::world]]
    shares: list[list[Result]] = [[] for _ in range(world)]
    dist.all_gather_object(shares, mine)
    return [shares[i % world][i // world] for i in range(len(items))]


def shutdown_distributed() -> None:
    """Leave the process group once every rank is done with it, then destroy it."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


_AT_EXIT: list[Callable[[], Any]] = []


def at_exit_process(cleanup: Callable[[], Any]) -> None:
    """Run `cleanup` when `exit_process` ends the process (which skips `atexit`'s handlers and
    `weakref.finalize`'s), first registered last; a cleanup that already ran must do nothing."""
    _AT_EXIT.append(cleanup)


def exit_process(code: int = 0) -> None:
    """End a launched rank without running C++ static destructors, after the cleanups registered
    with `at_exit_process` (chunk files removed).

    After `destroy_process_group`, torch 2.13's gloo threads stay alive (DTensor's sharding caches
    keep the mesh, hence the group, referenced), and tearing them down at interpreter exit aborts
    now and then ("terminate called without an active exception", SIGABRT) after all work is done.
    Entry points that own the process (the `zoo` CLI, test workers) exit through here instead."""
    while _AT_EXIT:
        _AT_EXIT.pop()()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
