"""Every private torch API memzoo uses, in one place: names torch does not promise to keep
(modules, functions and attributes whose names start with "_", `torch.testing._internal`). Code
elsewhere imports them from here (tests/zoo/test_torch_compat.py checks it), so a torch release
that moves one breaks this module, not code spread over the project. Checked on the releases in
`CHECKED_ON`; pyproject.toml allows those alone. The names from FSDP, pipelining and the memory
tracker are imported when first asked for (`_IMPORTED_WHEN_ASKED`): their modules take seconds to
load (the memory tracker loads Inductor), which a process that only runs a model never pays.

What each is, and why no public API serves:
- FakeTensorMode and its kin: shapes without memory, for the estimator's traces (no public twin).
- TorchDispatchMode, disable_current_modes, current_dispatch_modes: dispatch modes, whose only
  home is torch.utils._python_dispatch.
- tree_flatten, tree_leaves, tree_unflatten: torch's pytree (no public module in the releases checked).
- MemTracker, ModTracker and `CategoryTracker`: torch's live-tensor tracker by category, whose
  hooks `CategoryTracker` overrides (no public twin).
- replicate: FSDP2's data-parallel twin (ZeRO-0 on FSDP2's DTensor parameters).
- checkpoint_wrapper: the recompute wrapper that composes with FSDP2.
- stage_backward_input/weight: the split backward of zero-bubble pipeline schedules.
- `fsdp_post_backward`: FSDP2's post-backward, run where a pipeline stage's backward ends.
- FakeStore: the store of torch's "fake" process group, on which the estimator traces a rank.
- unsafe_preserve_version_counter: a gathered buffer refilled in place without bumping its
  version (autograd would refuse its saved copy otherwise).
- `graph_task_keeps_graph`, `storage_use_count`, `storage_identity`, `clear_cublas_workspaces`,
  `clear_dtensor_sharding_caches`: torch._C's, said in their docstrings.
- `operator_schema`: an operator overload's schema (whether it mutates or aliases), which
  OpOverload keeps in a private attribute.
- grouped_mm: torch's grouped matrix product (a mixture of experts' per-expert products in one
  call; None where this torch lacks it).
- `group_of_name`: the process group a functional collective names (DTensor's redistributions
  pass groups by name; the step counters count their traffic by ranks).
- `cpu_bf16_native`: whether this CPU has bf16 instructions (torch.cpu's checks are private).
- `partitioner_memory_budget`: the activation budget of torch.compile's forward/backward
  partitioner, a torch._functorch.config setting (torch.compile takes no such option).
- `unflatten_mesh`: a mesh dimension split in two under one root (DeviceMesh._unflatten), the
  expert-parallel mesh beside the data-parallel one.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.autograd import _unsafe_preserve_version_counter as unsafe_preserve_version_counter
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor,
                                           FakeTensorMode, unset_fake_temporarily)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as current_dispatch_modes
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule

_IMPORTED_WHEN_ASKED = {
    "replicate": ("torch.distributed._composable.replicate_with_fsdp", "replicate"),
    "MemTracker": ("torch.distributed._tools.mem_tracker", "MemTracker"),
    "MemRefType": ("torch.distributed._tools.mem_tracker", "_MemRefType"),
    "ModTracker": ("torch.distributed._tools.mod_tracker", "ModTracker"),
    "checkpoint_wrapper": ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "checkpoint_wrapper"),
    "stage_backward_input": ("torch.distributed.pipelining._backward", "stage_backward_input"),
    "stage_backward_weight": ("torch.distributed.pipelining._backward", "stage_backward_weight"),
    "FakeStore": ("torch.testing._internal.distributed.fake_pg", "FakeStore"),
}
"""Names whose torch modules take a second or more to import (FSDP, DTensor, the memory tracker,
which loads Inductor): imported when first asked for, so that a process that only runs a model
(zoo.nn, the inference commands) does not load them. name -> (module, attribute)."""


def __getattr__(name: str) -> Any:
    if name == "CategoryTracker":
        value = _category_tracker()
    elif name in _IMPORTED_WHEN_ASKED:
        module, attribute = _IMPORTED_WHEN_ASKED[name]
        value = getattr(importlib.import_module(module), attribute)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


grouped_mm = getattr(torch, "_grouped_mm", None)
"""torch._grouped_mm(a, b, offs=...) where this torch has it, else None."""

CHECKED_ON = ("2.13.0",)
"""The torch releases this module's names were checked on."""

__all__ = [  # noqa: F822 (the names of _IMPORTED_WHEN_ASKED and CategoryTracker come from __getattr__)
    "CHECKED_ON", "CategoryTracker", "DataDependentOutputException", "DynamicOutputShapeException", "FakeStore",
    "FakeTensor", "FakeTensorMode", "MemRefType", "MemTracker", "ModTracker", "TorchDispatchMode",
    "checkpoint_wrapper", "clear_cublas_workspaces", "clear_dtensor_sharding_caches", "cpu_bf16_native", "current_dispatch_modes",
    "disable_current_modes", "fsdp_post_backward", "graph_task_keeps_graph", "partitioner_memory_budget", "replicate", "stage_backward_input",
    "stage_backward_weight", "storage_use_count", "storage_identity", "operator_schema", "group_of_name", "grouped_mm",
    "tree_flatten", "tree_leaves", "tree_unflatten", "unflatten_mesh", "unsafe_preserve_version_counter",
    "unset_fake_temporarily"]


def unflatten_mesh(mesh: DeviceMesh, dim: str, sizes: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
    """`mesh` with dimension `dim` split into dimensions `names` of `sizes` (row-major), sharing
    `mesh`'s root, so that FSDP2 takes parameters sharded over the new dimensions with meshes
    sliced from either (torchtitan's expert-parallel mesh); DeviceMesh has no public form of it."""
    return mesh._unflatten(mesh.mesh_dim_names.index(dim), sizes, names)


def group_of_name(name: str) -> torch.distributed.ProcessGroup:
    """The process group registered under `name` (the group argument of torch's functional collectives)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def graph_task_keeps_graph() -> bool:
    """Whether the backward running now keeps its graph (`retain_graph=True`): a fused loss that
    stores its gradients from the forward scales them in place only when it does not."""
    return torch._C._autograd._get_current_graph_task_keep_graph()


def cpu_bf16_native() -> bool:
    """Whether this CPU computes bf16 natively: AVX-512 BF16 or AMX tiles (x86; False elsewhere)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def partitioner_memory_budget(fraction: float) -> contextlib.AbstractContextManager:
    """Within the block, graphs torch.compile partitions keep `fraction` of the activations its
    speed-first default would, between 0 (recompute all it can) and 1 (the default). The budget
    weighs every input of a graph; script objects among them count zero bytes: in the graphs
    compiled here they are process groups (tensor parallelism's collectives), which hold no tensors."""
    import torch._functorch.config

    return torch._functorch.config.patch(activation_memory_budget=fraction,
                                         unsafe_treat_script_objects_as_zero_size=True)


def storage_use_count(tensor: torch.Tensor) -> int:
    """How many references hold `tensor`'s storage (the check torch's CUDA graph trees make before
    reusing an output's memory); `tensor` and the storage object asked count two."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def storage_identity(storage: torch.UntypedStorage) -> int:
    """The address of the C++ storage object behind `storage` (the same for two Python wrappers of one
    storage: `untyped_storage()` makes a new wrapper each call)."""
    return storage._cdata


def operator_schema(op: torch._ops.OpOverload) -> torch._C.FunctionSchema:
    """The schema of the operator overload `op`: its arguments and returns with their alias
    information, `is_mutable`."""
    return op._schema


def clear_cublas_workspaces() -> None:
    """Free cuBLAS's per-thread workspaces (so that the next product's allocation shows them)."""
    torch._C._cuda_clearCublasWorkspaces()


def clear_dtensor_sharding_caches() -> None:
    """Clear DTensor's caches of sharding decisions, whose results hold the meshes they were made on."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._redistribute import _gen_transform_infos

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch's
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    _gen_transform_infos.cache_clear()


def fsdp_post_backward(module: FSDPModule) -> None:
    """Run FSDP2's post-backward on every parameter group of `module`'s FSDP state and its root's
    final callback: what the last backward of a step triggers, for a pipeline stage whose backward
    passes end where FSDP cannot tell (torch's own pipeline runtime does the same)."""
    state = module._get_fsdp_state()
    for module_state in state._state_ctx.all_states:
        for param_group in module_state._fsdp_param_groups:
            param_group.post_backward()
    state._root_post_backward_final_callback()


def _category_tracker() -> type:
    """`CategoryTracker`, defined on first use (its base class loads the memory tracker)."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType as MemRefType
    from torch.distributed._tools.mod_tracker import ModTracker

    class _ForwardModTracker(ModTracker):
        """`ModTracker` calling the user's forward pre-hook only. The stock one also hangs a gradient
        hook on every module's inputs that waits for all of their gradients: a zero-bubble backward
        (input gradients, then weight gradients, in two autograd calls) never completes such a wait,
        and the hooks keep every micro batch's tensors alive (or fail outright on a leaf input under
        `autograd.grad`). Forward or backward still follows from the autograd engine (`is_bw`)."""

        def _fw_pre_hook(self, mod: nn.Module, input: Any) -> None:
            self._user_pre_fw_hook(mod, input)

        def _fw_post_hook(self, mod: nn.Module, input: Any, output: Any) -> None:
            pass

    class CategoryTracker(MemTracker):
        """`MemTracker` keeping only its per-category totals and peaks: no per-module records, which
        allow one forward per module between backwards, where pipeline schedules run several. Each
        module's parameters (swapped in by FSDP when gathered) are still tracked, with the gradients of
        those that take one: the stock tracker hangs a gradient hook on every parameter, which a frozen
        one (requires_grad False) refuses."""

        def __init__(self) -> None:
            super().__init__()
            self._mod_tracker = _ForwardModTracker()

        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            self._track_module_params_and_buffers(module, install_grad_hooks=False)
            for param in module.parameters():
                if param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:
                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(self._track_gradient),
                        param.register_post_accumulate_grad_hook(lambda p: self._track_gradient(p.grad)))

        def _track_gradient(self, grad: torch.Tensor) -> None:
            self._update_and_maybe_create_winfos(grad, MemRefType.GRAD)

    return CategoryTracker
