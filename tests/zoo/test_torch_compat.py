"""Every private torch API goes through zoo.torch_compat: no other module of the project (tests and
benchmarks included) imports a private torch module or name, reaches `torch._...`, or reads a
private attribute of torch's objects (a module's `_parameters`, an operator's `_schema`, a tensor's
`_cdata`: `PRIVATE_ATTRIBUTES`), whatever the name it is reached through; and the torch this suite
runs on is one that module was checked on."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import torch

from zoo import torch_compat

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("zoo", "trainers", "asr", "nlp", "vision", "protein", "recipes", "tests", "benchmarks")
OPERATOR_NAMESPACES = ("torch.ops", "torch._foreach_")
"""Operators, not Python APIs: torch.ops.aten.* overloads and the foreach kernels keep their names."""
PRIVATE_ATTRIBUTES = frozenset(
    name for instance in (torch.nn.Module(), torch.nn.Parameter(torch.empty(0)), torch.empty(0),
                          torch.ops.aten.add.Tensor, torch.ops.aten.add)
    for name in dir(instance) if name.startswith("_") and not name.endswith("__"))
"""The private attributes of torch's modules, parameters, tensors and operators (overloads and
their packets), as this torch has them."""


def private(dotted: str) -> bool:
    """Whether `dotted` reaches into torch through a private name (dunders such as `__version__` are public)."""
    parts = dotted.split(".")
    return (parts[0] == "torch" and not dotted.startswith(OPERATOR_NAMESPACES)
            and any(part.startswith("_") and not part.endswith("__") for part in parts))


def dotted_name(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def private_uses(path: Path, root: Path = ROOT) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            uses += [f"{path.relative_to(root)}:{node.lineno} {name}" for name in names if private(name)]
        elif isinstance(node, ast.Import):
            uses += [f"{path.relative_to(root)}:{node.lineno} {a.name}" for a in node.names if private(a.name)]
        elif isinstance(node, ast.Attribute) and (name := dotted_name(node)) and private(name):
            uses.append(f"{path.relative_to(root)}:{node.lineno} {name}")
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            uses.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
    return uses


def test_the_scan_sees_private_names(tmp_path):
    source = tmp_path / "uses.py"
    source.write_text("for name in module._parameters:\n    pass\nop._overloadpacket\nself._register_load_state_dict_pre_hook(f)\n"
                      "storage._cdata\nself._unbuilt\n")
    assert sorted(use.split(" ")[1] for use in private_uses(source, root=tmp_path)) == [
        "._cdata", "._overloadpacket", "._parameters", "._register_load_state_dict_pre_hook"]
    assert private("torch._C._storage_Use_Count") and private("torch.utils._pytree.tree_leaves")
    assert not private("torch.ops.aten._fused_rms_norm") and not private("torch._foreach_norm")
    assert not private("torch.distributed.tensor.DTensor") and not private("torch.__version__")


def test_only_the_compatibility_module_uses_private_torch_apis():
    compat = Path(torch_compat.__file__).resolve()
    found = [use for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             if path.resolve() != compat for use in private_uses(path)]
    assert found == []


def test_this_torch_is_one_the_module_was_checked_on():
    assert torch.__version__.split("+")[0] in torch_compat.CHECKED_ON, torch.__version__


def test_running_a_model_loads_no_training_machinery():
    # The inference commands (zoo transcribe, translate, classify, spot) import zoo.nn and their
    # domain; FSDP, DTensor and the memory tracker (which loads Inductor) take seconds to import.
    script = ("import sys, zoo.nn, asr.transcription, nlp.translation.decode, vision.classify\n"
              "print(sorted(m for m in sys.modules if m.startswith(('torch._inductor', 'torch.distributed.fsdp', "
              "'torch.distributed.tensor', 'torch.distributed._tools'))))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert torch_compat.MemTracker.__name__ == "MemTracker"  # asked for: imported then
    assert issubclass(torch_compat.CategoryTracker, torch_compat.MemTracker)
