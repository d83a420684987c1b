"""LoRA adapters in PEFT's folder format: `adapter_config.json` and `adapter_model.safetensors`.

The tensors are named as PEFT saves them: "base_model.model." + the adapter parameter's name in the
base model ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" for a transformers
Llama), so that `peft.PeftModel.from_pretrained(base, folder)` loads what the trainer trained, and
an adapter PEFT trained loads here. PEFT features this package does not build (DoRA, rsLoRA, per-
layer ranks, bias training, extra trained modules, fan-in-fan-out weights, other adapter types) are
refused by name when read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from zoo.adapters.lora import ALL_LINEAR, LoRA, attach_lora, is_adapter_parameter, targeted

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
"""What PEFT puts before a base model's parameter names in its adapter files."""
UNSUPPORTED = {"use_dora": False, "use_rslora": False, "fan_in_fan_out": False, "bias": "none",
               "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None}
"""PEFT LoRA settings this package reads only at these values (their defaults)."""


def save_peft_adapter(folder: str | os.PathLike, state: dict[str, torch.Tensor], lora: LoRA, adapted: list[str],
                      base_model: str | None = None, task_type: str | None = None) -> Path:
    """Write the adapter parameters of `state` (a model's whole state dict, e.g. the trainer's
    consolidated one) to `folder` in PEFT's format; `adapted`: the names of the adapted modules (their
    last name segments become target_modules where those select exactly them, else the full names).
    base_model, task_type: PEFT's base_model_name_or_path and task_type ("CAUSAL_LM", ...)."""
    tensors = {PREFIX + name: tensor.detach().contiguous().cpu() for name, tensor in state.items()
               if is_adapter_parameter(name)}
    expected = {f"{module}.lora_{which}.weight" for module in adapted for which in "AB"}
    if {name[len(PREFIX):] for name in tensors} != expected:
        raise ValueError(f"state holds adapter parameters {sorted(tensors)[:4]} ...; expected those of the adapted "
                         f"modules {adapted[:4]} ...")
    suffixes = sorted({name.rsplit(".", 1)[-1] for name in adapted})
    owners = {name.rsplit(".", 1)[0] for name in state if name.endswith(".weight") and not is_adapter_parameter(name)}
    exact = {owner for owner in owners if owner.rsplit(".", 1)[-1] in suffixes} == set(adapted)
    targets = lora.targets if isinstance(lora.targets, str) and lora.targets != ALL_LINEAR else (
        suffixes if exact else sorted(adapted))
    config = {"peft_type": "LORA", "task_type": task_type, "base_model_name_or_path": base_model, "r": lora.rank,
              "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": targets,
              "inference_mode": True, "init_lora_weights": True, **UNSUPPORTED}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder


def read_peft_config(folder: str | os.PathLike) -> tuple[LoRA, dict[str, Any]]:
    """The `LoRA` an adapter folder describes, and its whole adapter_config.json; ValueError naming
    the setting where the folder is not a PEFT LoRA adapter this package can run."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"adapter folder {folder} has no {CONFIG_FILE}: not a PEFT adapter")
    config = json.loads(path.read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{path}: peft_type must be 'LORA'; got {config.get('peft_type')!r}")
    for key, default in UNSUPPORTED.items():
        if config.get(key) not in (None, [], {}, default):
            raise ValueError(f"{path}: {key}={config[key]!r} is not supported (only {default!r})")
    targets = config["target_modules"]
    lora = LoRA(rank=config["r"], alpha=config["lora_alpha"], dropout=config.get("lora_dropout", 0.0),
                targets=targets if isinstance(targets, str) else tuple(targets))
    return lora, config


def load_peft_adapter(model: nn.Module, folder: str | os.PathLike) -> LoRA:
    """Attach the PEFT LoRA adapter in `folder` to `model` (in place; `attach_lora` freezes the rest)
    and load its weights; returns its `LoRA`. ValueError, before `model` is changed, naming the
    parameters when the adapter was trained on another base (names or shapes it lacks)."""
    lora, _ = read_peft_config(folder)
    tensors = load_file(str(Path(folder) / WEIGHTS_FILE))
    stray = sorted(name for name in tensors if not name.startswith(PREFIX) or not is_adapter_parameter(name))
    if stray:
        raise ValueError(f"{folder}: {stray[:3]} are not LoRA weights of a base model's linears")
    weights = {name[len(PREFIX):]: tensor for name, tensor in tensors.items()}
    modules = dict(model.named_modules())
    for name, tensor in weights.items():
        owner, which, _ = name.rsplit(".", 2)
        linear = modules.get(owner)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"adapter {folder} was trained on another base: {type(model).__name__} has no linear "
                             f"{owner!r} for its {name!r}")
        shape = (lora.rank, linear.in_features) if which == "lora_A" else (linear.out_features, lora.rank)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"adapter {folder} was trained on another base: its {name!r} is {tuple(tensor.shape)}, "
                             f"{type(model).__name__}'s {owner!r} takes {shape}")
    expected = {f"{module}.lora_{which}.weight" for module in targeted(model, lora.targets) for which in "AB"}
    if set(weights) != expected:
        missing = sorted(expected - set(weights))
        raise ValueError(f"adapter {folder} lacks the weights of {missing[:4]}, which its target_modules select in "
                         f"{type(model).__name__}: it was trained on another base")
    attach_lora(model, lora)
    own = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.items():
            own[name].copy_(tensor)
    return lora
