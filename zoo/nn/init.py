"""Weight initialisation shared by the zoo's transformers."""

from __future__ import annotations

import torch
from torch import nn

from zoo.nn.norm import Norm


@torch.no_grad()
def init_transformer_(model: nn.Module, std: float = 0.02, residual_std: float | None = None,
                      residual: tuple[str, ...] = ("attn.out", "mlp.fc2")) -> None:
    """Linear and embedding weights ~ N(0, std), biases zero, norms to (1, 0). Linears whose names
    end with one of `residual` (the projections into the residual stream) use `residual_std`
    instead when it is given (GPT-2: std / sqrt(2 n_layer))."""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            scaled = residual_std is not None and name.endswith(residual)
            nn.init.normal_(module.weight, mean=0.0, std=residual_std if scaled else std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, Norm):
            module.reset_parameters()
