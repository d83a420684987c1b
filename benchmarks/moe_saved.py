"""Saved activations of the mixture-of-experts feed-forward per routed token, beside the dense
fused feed-forward per token: 1,024 tokens of width 64, experts and the dense layer of hidden
width 256 (SiLU), 8 experts, top 2.

    python benchmarks/moe_saved.py
"""

from __future__ import annotations

import torch

from trainers.memory.saved_activations import SavedActivations
from zoo.nn import FusedMLP, MoEConfig, MoEFeedForward


def main() -> None:
    torch.manual_seed(0)
    width, hidden, tokens = 64, 256, 1024
    x = torch.randn(tokens, width, requires_grad=True)
    print("| layer | saved MiB | fp32 values a routed token |\n|---|---|---|")
    for name, layer, assignments in (
            ("dense fused feed-forward", FusedMLP(width, hidden, activation="silu"), tokens),
            ("mixture of experts, 8 experts, top 2", MoEFeedForward(MoEConfig(width=width, hidden=hidden, experts=8, top_k=2)),
             2 * tokens)):
        with SavedActivations(exclude=[x, *layer.parameters()]) as saved:
            layer(x)
        print(f"| {name} | {saved.bytes / 2**20:.2f} | {saved.bytes / assignments / 4:.0f} |")


if __name__ == "__main__":
    main()
